"""Priority across all due sites (``lua/lease.lua``'s ready index), against a
real Redis: the best request of any due site first, first in turn among
equals, bounded work per lease however many sites are due, and no lease
call that says "try again now" without progress."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider, signals

from crawler.frontier import store
from crawler.frontier.store import Commit, Frontier, Lease, NotDue, Push, Retry
from tests import scheduler_harness as harness
from tests.waiting import wait_for

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "t"


def _frontier(rds: redis.Redis, **kwargs: Any) -> Frontier:
    frontier = Frontier(rds, "t", **{"default_concurrency": 8, **kwargs})
    frontier.load_scripts()
    return frontier


def _p(url: str, priority: int = 0) -> Push:
    return Push(url.encode(), url.split("/")[2], priority, url.encode(), False)


def _leased(result: list[Lease] | NotDue) -> list[Lease]:
    assert isinstance(result, list), result
    return result


def _urls(leases: list[Lease]) -> list[str]:
    return [lease.data.decode() for lease in leases]


def _one_by_one(frontier: Frontier, worker: str = "w#1") -> list[str]:
    """Lease one request per call until nothing is due; the URLs in order."""
    out, n = [], 0
    while isinstance(result := frontier.lease_many([f"{worker}:{n}"]), list):
        out += _urls(result)
        n += 1
    return out


def _prio(rds: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in rds.hgetall("{t}:prio").items()}


def _until_expired(rds: redis.Redis) -> None:
    """Wait until every lease's deadline has passed on Redis's clock."""

    def expired() -> bool:
        seconds, micros = rds.time()
        last = rds.zrange("{t}:leases", -1, -1, withscores=True)
        return not last or last[0][1] < seconds * 1000 + micros // 1000

    wait_for(expired, 5, "the leases to expire", 0.005)


# -- priority and order -------------------------------------------------------------


@pytest.mark.parametrize("sites", [40, 1000])
def test_a_priority_9_request_on_a_late_due_site_is_served_before_every_priority_0_one(
    rds: redis.Redis, sites: int
) -> None:
    frontier = _frontier(rds)
    late = f"https://s{sites}.example/9"
    # Each site becomes due in turn: the priority-9 one is the last of them.
    frontier.push_many([_p(f"https://s{i}.example/0") for i in range(1, sites)] + [_p(late, 9)])
    assert _urls(_leased(frontier.lease_many(["w#1:0"]))) == [late]
    # In one call of many leases, too: it comes first, then the rest.
    frontier.push_many([_p(f"https://s{i}.example/9", 9) for i in (7, 3)])
    leases = _leased(frontier.lease_many([f"w#1:{n}" for n in range(1, 17)]))
    assert _urls(leases)[:2] == ["https://s7.example/9", "https://s3.example/9"]
    assert all(url.endswith("/0") for url in _urls(leases)[2:])


def test_equal_priorities_are_served_first_in_first_out_across_sites(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    for url in ("https://c.example/1", "https://a.example/1", "https://b.example/1",
                "https://d.example/1"):
        frontier.push_many([_p(url)])
    assert _one_by_one(frontier) == [
        "https://c.example/1", "https://a.example/1", "https://b.example/1",
        "https://d.example/1",
    ]


# -- the priority range: +-PRIORITY_LIMIT keeps its order, the rest is refused -------


def test_priorities_to_the_ends_of_the_range_keep_their_order(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    order = [1_000_000, 999_999, 500_000, 1, 0, -1, -999_999, -1_000_000]
    pushes = [_p(f"https://s{i}.example/{p}", p) for i, p in enumerate(reversed(order))]
    frontier.push_many(pushes)
    # And within one site.
    frontier.push_many([_p(f"https://one.example/{p}", p) for p in (-1_000_000, 1_000_000, 0)])
    served = [int(url.rsplit("/", 1)[1]) for url in _one_by_one(frontier)]
    assert served == sorted(served, reverse=True)
    assert served.count(1_000_000) == 2 and served.count(-1_000_000) == 2


def test_a_priority_outside_the_range_is_refused_by_the_frontier_not_clamped(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    for priority in (3_000_000, 1_000_001, -1_000_001):
        with pytest.raises(ValueError, match=f"priority {priority} is outside the frontier's"):
            frontier.push_many([_p("https://a.example/ok", 0), _p("https://b.example/x", priority)])
    assert int(rds.get("{t}:count") or 0) == 0  # nothing of the batch was written


def test_priorities_scrapy_accepts_outside_the_range_are_refused_when_scheduled(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # 3,000,000, 2,000,000 and 1,500,000 were clamped to 1,000,000 and served
    # first in, first out: each is now refused loudly, as Scrapy's scheduler
    # refuses what it cannot queue, and the rest keeps its order.
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider)
    caplog.set_level(logging.INFO)
    for priority in (1_500_000, 2_000_000, 3_000_000, -(10**20)):
        request = Request(f"https://a.example/{priority}", priority=priority)
        assert scheduler.enqueue_request(request) is False
    for priority in (999_999, 1_000_000, -1_000_000):
        assert scheduler.enqueue_request(Request(f"https://a.example/{priority}",
                                                 priority=priority))
    assert scheduler.flush_outbox()

    served = [r.priority for r in harness.lease_all(scheduler)]
    assert served == [1_000_000, 999_999, -1_000_000]
    assert crawler.stats.get_value("scheduler/priority_out_of_range") == 4
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors[0] == (
        "cannot queue request https://a.example/1500000: its priority 1500000 is outside "
        "the frontier's range, -1000000 to 1000000 (see docs/requests.md)"
    )
    assert len(errors) == 4


def test_the_scripts_and_python_agree_on_the_priority_range() -> None:
    lib = (Path(store.__file__).parent / "lua" / "lib.lua").read_text()
    match = re.search(r"^local PRIO_MAX = (\d+)$", lib, re.MULTILINE)
    assert match is not None
    assert int(match.group(1)) == store.PRIORITY_LIMIT
    # The ready score, -priority * 2^32 + turn, is exact in a double.
    assert (store.PRIORITY_LIMIT + 1) * 2**32 < 2**53


def test_a_queued_priority_past_the_range_is_not_taken_by_the_scripts(
    rds: redis.Redis,
) -> None:
    # A lease's data edited by hand to a priority no worker writes: given
    # back, it is buried as a dead letter rather than ranked wrongly.
    frontier = _frontier(rds)
    frontier.push_many([_p("https://a.example/x", 1_000_000)])
    [lease] = _leased(frontier.lease_many(["w#1:0"]))
    data = rds.hget("{t}:ldata", lease.lease_id)
    assert data is not None and data.startswith(b"1000000\t")
    rds.hset("{t}:ldata", lease.lease_id, b"1000001" + data[len(b"1000000"):])
    frontier.commit(Commit(givebacks=[lease.lease_id]))
    assert rds.llen("{t}:dead") == 1
    assert _one_by_one(frontier) == []


def test_a_site_with_several_requests_takes_turns_with_the_others(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    for url in ("https://a.example/1", "https://a.example/2", "https://b.example/1",
                "https://a.example/3", "https://c.example/1"):
        frontier.push_many([_p(url)])
    # Within a site first in, first out; after each request a site goes
    # behind the sites of its priority that were waiting.
    assert _one_by_one(frontier) == [
        "https://a.example/1", "https://b.example/1", "https://c.example/1",
        "https://a.example/2", "https://a.example/3",
    ]


def test_a_push_at_a_better_priority_raises_its_site_among_the_due_ones(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    frontier.push_many([_p("https://a.example/0"), _p("https://b.example/0")])
    frontier.push_many([_p("https://b.example/3", 3)])
    assert _one_by_one(frontier) == [
        "https://b.example/3", "https://a.example/0", "https://b.example/0",
    ]


def test_a_request_given_back_or_expired_raises_its_site_again(rds: redis.Redis) -> None:
    frontier = _frontier(rds, lease_timeout=0.05)
    frontier.push_many([_p("https://a.example/5", 5), _p("https://b.example/0")])
    [lease] = _leased(frontier.lease_many(["w#1:0"]))
    assert lease.data == b"https://a.example/5"
    frontier.push_many([_p("https://a.example/0")])  # a.example is due at priority 0 now
    frontier.release([lease.lease_id])
    assert _urls(_leased(frontier.lease_many(["w#1:1"]))) == ["https://a.example/5"]
    # A lease that expires (its worker died) puts it back on top the same way.
    _until_expired(rds)
    assert _urls(_leased(frontier.lease_many(["w#2:0"]))) == ["https://a.example/5"]


def test_a_sites_delay_still_holds(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    rds.hset("{t}:delay", "slow.example", 10_000)
    frontier.push_many([_p("https://slow.example/1", 9), _p("https://slow.example/2", 9),
                        _p("https://fast.example/1"), _p("https://fast.example/2")])
    leases = _leased(frontier.lease_many([f"w#1:{n}" for n in range(4)]))
    assert _urls(leases) == [
        "https://slow.example/1", "https://fast.example/1", "https://fast.example/2",
    ]
    later = frontier.lease_many(["w#1:9"])
    assert isinstance(later, NotDue)
    assert later.wait is not None and 9 < later.wait <= 11  # 10 s, stretched by 10 %


def test_concurrency_and_fair_share_still_hold_on_many_sites(rds: redis.Redis) -> None:
    frontier = _frontier(rds, default_concurrency=2)
    frontier.alive("v#1")  # two live workers: one slot of each site each
    frontier.push_many([_p(f"https://s{i}.example/{j}") for i in range(50) for j in range(3)])
    mine = _leased(frontier.lease_many([f"w#1:{n}" for n in range(100)]))
    assert sorted(lease.site for lease in mine) == sorted(f"s{i}.example" for i in range(50))
    theirs = _leased(frontier.lease_many([f"v#1:{n}" for n in range(100)]))
    assert len(theirs) == 50
    # Every site is at its concurrency now.
    for worker in ("w#1", "v#1"):
        result = frontier.lease_many([f"{worker}:x"])
        assert isinstance(result, NotDue) and result.wait is not None and result.wait > 0
    frontier.ack([lease.lease_id for lease in mine])
    again = _leased(frontier.lease_many([f"w#1:{n}" for n in range(200, 300)]))
    assert len(again) == 50
    assert int(rds.get("{t}:count") or 0) == 0


# -- never "try again now" without progress --------------------------------------


def test_with_its_share_of_every_due_site_taken_a_lease_says_how_long_to_wait(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds, default_concurrency=2)
    frontier.alive("v#1")
    frontier.push_many([_p(f"https://s{i}.example/{j}") for i in range(40) for j in range(3)])
    assert len(_leased(frontier.lease_many([f"w#1:{n}" for n in range(64)]))) == 40
    result = frontier.lease_many(["w#1:x"])
    assert isinstance(result, NotDue)
    # No site waits for a delay: until one of its downloads ends (the
    # scheduler knows) or a second, at most a lease's length.
    assert result.wait is not None and 0 < result.wait <= frontier.lease_timeout_ms / 1000
    # Another site with a delay, where this worker holds no slot, comes due
    # sooner: that is the wait.
    rds.hset("{t}:delay", "slow.example", 300)
    frontier.push_many([_p("https://slow.example/1", 1), _p("https://slow.example/2", 1)])
    assert _urls(_leased(frontier.lease_many(["v#1:y"]))) == ["https://slow.example/1"]
    result = frontier.lease_many(["w#1:z"], held=40)
    assert isinstance(result, NotDue) and result.wait is not None and 0 < result.wait <= 0.33
    # (where it holds its share of that site too, it is not woken for it:
    # tests/test_lease_variants.py)


def test_with_fair_share_filtering_every_due_site_a_worker_asks_a_few_times_a_second(
    redis_url: str,
) -> None:
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider, FRONTIER_CONCURRENCY=2)
    frontier = scheduler.queue.frontier
    frontier.alive("other#1")  # a second live worker: one slot of each site each
    frontier.push_many([_p(f"https://s{i}.example/{j}") for i in range(40) for j in range(3)])
    held = _leased(frontier.lease_many([f"{scheduler.holder}:h{n}" for n in range(64)]))
    assert len(held) == 40  # this worker's share of every site
    # As the spider's idle loop does: lease, then wait what the scheduler
    # says (FRONTIER_IDLE_WAIT, 1 s, at most), for 2 seconds.
    deadline = time.monotonic() + 2.0
    while (now := time.monotonic()) < deadline:
        assert scheduler.next_request() is None
        due = scheduler.next_due
        time.sleep(min(1.0 if due is None else due, 1.0, deadline - now))
    calls = crawler.stats.get_value("frontier/lease_calls/not_due")
    assert 1 <= calls <= 4, calls


def test_a_worker_asks_again_as_soon_as_one_of_its_downloads_ends(redis_url: str) -> None:
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider, FRONTIER_CONCURRENCY=2)
    scheduler.queue.frontier.alive("other#1")
    for i in range(3):
        scheduler.enqueue_request(Request(f"https://a.example/{i}"))
    first = scheduler.next_request()
    assert first is not None and scheduler.next_request() is None  # its share: 1 of 2
    assert scheduler.next_due is not None and scheduler.next_due > 0.5
    crawler.signals.send_catch_log(
        signals.request_left_downloader, request=first, spider=crawler.spider
    )
    assert scheduler.next_due == 0
    # The slot is freed in the same round trip as the lease, before it.
    second = scheduler.next_request()
    assert second is not None and second.url == "https://a.example/1"


# -- bounded work ----------------------------------------------------------------------


def _commands(rds: redis.Redis) -> int:
    """Commands Redis ran since the last CONFIG RESETSTAT (scripts' included)."""
    return sum(int(v["calls"]) for v in rds.info("commandstats").values())


def test_a_lease_on_100000_due_sites_does_bounded_work(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    sites = 100_000
    step = 5_000
    for start in range(0, sites, step):
        frontier.push_many([_p(f"https://s{i}.example/0") for i in range(start, start + step)])
    frontier.push_many([_p(f"https://s{sites}.example/9", 9)])
    rds.config_resetstat()
    leases = _leased(frontier.lease_many([f"w#1:{n}" for n in range(16)]))
    work = _commands(rds)
    assert _urls(leases)[0] == f"https://s{sites}.example/9"
    assert len(leases) == 16
    # About 25 commands per lease, each O(log N), plus the call's own:
    # independent of the 100,001 sites.
    assert work < 800, work
    # The same holds with the sites all in wait, as a crawl upgraded from
    # the index before ready left them: a call moves a bounded number.
    due = {site: 1 for site in rds.zrange("{t}:ready", 0, -1)}
    rds.delete("{t}:ready")
    rds.zadd("{t}:wait", due)
    rds.config_resetstat()
    leases = _leased(frontier.lease_many([f"w#1:{n}" for n in range(16, 32)]))
    assert len(leases) == 16
    assert _commands(rds) < 800 + 8 * frontier.candidates


# -- the count per priority, and a crawl upgraded mid-way ---------------------------------


def test_the_turns_are_rebased_before_they_wrap_keeping_the_order_of_the_ready_sites(
    rds: redis.Redis,
) -> None:
    """Once ``{s}:seq`` reaches 2^31 the call that took it there renumbers
    the ready sites in their order, so a turn never wraps at 2^32 (where
    the sites that joined just before the wrap would rank behind every
    later one). A score no frontier writes is left as it is."""
    frontier = _frontier(rds)
    rds.set("{t}:seq", 2**31 - 3)
    frontier.push_many([_p("https://a.example/1"), _p("https://b.example/1", 5),
                        _p("https://c.example/1"), _p("https://d.example/1", -2)])
    rds.zadd("{t}:ready", {"odd.example": float("inf")})  # a hand-made entry
    frontier.push_many([_p("https://e.example/1", 5), _p("https://f.example/1")])
    assert int(rds.get("{t}:seq") or 0) == 6  # re-based: one turn per ready site
    scores = dict(rds.zrange("{t}:ready", 0, -1, withscores=True))
    assert scores[b"odd.example"] == float("inf")
    assert [s.decode() for s in rds.zrange("{t}:ready", 0, -1)] == [
        "b.example", "e.example", "a.example", "c.example", "f.example", "d.example",
        "odd.example",
    ]
    rds.zrem("{t}:ready", "odd.example")
    frontier.push_many([_p("https://g.example/1", 5)])
    assert int(rds.get("{t}:seq") or 0) == 7
    hosts = [lease.data.decode().split("/")[2] for n in range(7)
             for lease in _leased(frontier.lease_many([f"w#1:{n}"]))]
    assert hosts == ["b.example", "e.example", "g.example", "a.example", "c.example",
                     "f.example", "d.example"]


def test_equal_priorities_stay_first_in_first_out_when_the_turn_counter_passes_2_32(
    rds: redis.Redis,
) -> None:
    """Found by a review: with ``{s}:seq`` at 2^32 - 2, a site that took its
    turn just before the wrap was served after every later one (starved)."""
    frontier = _frontier(rds)
    rds.set("{t}:seq", 2**32 - 2)
    frontier.push_many([_p("https://old.example/1")])  # its turn: 2^32 - 1
    # Two busy sites that join after it and keep taking turns.
    frontier.push_many([_p(f"https://busy{k}.example/{j}") for j in range(10) for k in (1, 2)])
    served, n = [], 0
    while isinstance(result := frontier.lease_many([f"w#1:{n}"]), list):
        served += [lease.data.decode() for lease in result]
        n += 1
    assert served.index("https://old.example/1") == 0, served.index("https://old.example/1")


def test_the_count_per_priority_follows_every_path(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    frontier.push_many([_p("https://a.example/1", 3), _p("https://a.example/2", 3),
                        _p("https://b.example/1"), _p("https://b.example/2", -2)])
    assert _prio(rds) == {"3": 2, "0": 1, "-2": 1}
    leases = _leased(frontier.lease_many(["w#1:0", "w#1:1"]))
    assert _prio(rds) == {"0": 1, "-2": 1}  # fields at 0 are deleted
    frontier.release([leases[0].lease_id])  # given back
    assert _prio(rds) == {"3": 1, "0": 1, "-2": 1}
    frontier.commit(Commit(acks=[leases[1].lease_id],
                           retries=[Retry(b"https://c.example/1", "c.example", 7, 60.0)]))
    assert _prio(rds) == {"3": 1, "0": 1, "-2": 1}  # a retry waits outside the queues
    # Leases that expire, past FRONTIER_MAX_DELIVERIES: dead-lettered, never
    # counted again.
    short = _frontier(rds, lease_timeout=0.05, max_deliveries=1)
    rest = _leased(short.lease_many([f"w#2:{n}" for n in range(8)]))
    assert _prio(rds) == {} and len(rest) == 3
    _until_expired(rds)
    result = short.lease_many(["w#3:0"])
    assert isinstance(result, NotDue) and result.dead == 3
    assert _prio(rds) == {}
    assert frontier.audit() == {}


def test_sites_waiting_in_the_index_of_the_previous_version_lose_nothing(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    frontier.push_many([_p(f"https://s{i}.example/{j}", j % 2) for i in range(100)
                        for j in range(3)])
    # As the previous version left them: every site in wait (due long ago),
    # no ready index, no turn counter, no count per priority.
    due = {site: n for n, site in enumerate(rds.zrange("{t}:ready", 0, -1))}
    rds.delete("{t}:ready", "{t}:seq", "{t}:prio")
    rds.zadd("{t}:wait", due)
    leases: list[Lease] = []
    n = 0
    while isinstance(result := frontier.lease_many([f"w#1:{n + i}" for i in range(16)]), list):
        leases += result
        n += 16
        frontier.ack([lease.lease_id for lease in result])
    assert len({lease.data for lease in leases}) == len(leases) == 300
    assert int(rds.get("{t}:count") or 0) == 0
    assert frontier.audit() == {}
