"""A request's last delivery is made alone (``lease.lua``, ARGV[16]).

A worker that dies takes every request it holds with it, and each counts a
delivery: before this, a healthy request leased beside a poison one reached
``FRONTIER_MAX_DELIVERIES`` with it and was dead-lettered too. Now a
request one death short of the limit is leased only to a worker holding
nothing, as its only lease, and that worker leases nothing more until it is
done: the death that dead-letters a request is one it died alone.

A worker that drained for a last chance names its site in its next lease
call (``drained_for``, ``lease.lua`` ARGV[17]): that call takes the last
chance alone, ahead of better work, on one frontier or on the site's shard;
a named site without a last chance, or one that cannot be served, changes
nothing the call leases. (The whole crawl with a worker killed by a poison
download: ``tests/test_sharded_crawl_faults.py``.)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider

from crawler.frontier.audit import repair_damage
from crawler.frontier.lifecycle import SUSPECT
from crawler.frontier.protocol import Damage
from crawler.frontier.store import Frontier, Lease, NotDue
from crawler.keys import site_prefix
from tests import scheduler_harness as harness
from tests.test_frontier_faults import _lose_replies, _until_expired
from tests.test_housekeeping import redis_ms, sites_on_shard
from tests.waiting import wait_for

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "t"


def _frontier(rds: redis.Redis, name: str = "t", **kwargs: Any) -> Frontier:
    """Spider ``name``'s frontier: 8 at once per site, 50 ms leases, 3 deliveries."""
    frontier = Frontier(rds, name, **{"default_concurrency": 8, "lease_timeout": 0.05,
                                      "max_deliveries": 3, **kwargs})
    frontier.load_scripts()
    return frontier


def _push(frontier: Frontier, url: str, priority: int = 0) -> None:
    """Queue ``url`` on its host's site; fails if it was filtered as seen."""
    assert frontier.push(url.encode(), site=url.split("/")[2], priority=priority,
                         fingerprint=url.encode(), dont_filter=False)


def _leased(result: list[Lease] | NotDue) -> list[Lease]:
    assert isinstance(result, list), result
    return result


def _die_twice_together(rds: redis.Redis, frontier: Frontier, urls: list[str]) -> None:
    """Lease ``urls`` in one call twice, the worker dying each time: each
    is then one death short of max_deliveries=3."""
    for n in (1, 2):
        leases = _leased(frontier.lease_many([f"dies#{n}:{j}" for j in range(len(urls))]))
        assert sorted(lease.data.decode() for lease in leases) == sorted(urls)
        assert {lease.deliveries for lease in leases} == {n}
        _until_expired(rds)


def _until_past(rds: redis.Redis, lease_id: str) -> None:
    """Wait until the deadline of ``lease_id`` has passed on Redis's clock."""

    def past() -> bool:
        seconds, micros = rds.time()
        deadline = rds.zscore("{t}:leases", lease_id)
        return deadline is None or deadline < seconds * 1000 + micros // 1000

    wait_for(past, 5, f"lease {lease_id} to expire", 0.005)


def _dead(rds: redis.Redis) -> list[tuple[str, int]]:
    return [(d["url"], d["deliveries"])
            for d in (json.loads(x) for x in rds.lrange("{t}:dead", 0, -1))]


def test_a_last_chance_goes_alone_to_a_worker_holding_nothing_and_only_its_death_counts(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    poison, healthy = "https://a.example/poison", "https://b.example/fine"
    _push(frontier, poison)
    _push(frontier, healthy)
    _die_twice_together(rds, frontier, [poison, healthy])
    _push(frontier, "https://c.example/new")

    # A worker holding a lease gets the new request only: both last chances
    # are put back where they were, and the reply says so.
    [new] = _leased(frontier.lease_many(["busy#1:0", "busy#1:1", "busy#1:2"], held_all=1))
    assert new.data == b"https://c.example/new" and new.last_passed
    assert rds.get("{t}:count") == b"2"
    again = frontier.lease_many(["busy#1:3"], held_all=2)
    assert isinstance(again, NotDue) and again.last_passed
    frontier.ack([new.lease_id])

    # A worker holding nothing gets one of them, alone, though it asks for two.
    [first] = _leased(frontier.lease_many(["empty#1:0", "empty#1:1"], held_all=0))
    assert first.deliveries == 3 and not first.last_passed
    if first.data.decode() == healthy:
        frontier.ack([first.lease_id])
        [first] = _leased(frontier.lease_many(["empty#2:0", "empty#2:1"], held_all=0))
    assert first.data.decode() == poison
    _until_expired(rds)  # the poison killed its worker, alone this time

    # Only the poison is dead-lettered; the other one is served, alone.
    rest = _leased(frontier.lease_many(["empty#3:0", "empty#3:1"], held_all=0))
    assert _dead(rds) == [(poison, 3)]
    if rest[0].data.decode() == healthy:  # (not served before the poison)
        assert [lease.deliveries for lease in rest] == [3]
        frontier.ack([rest[0].lease_id])
    assert frontier.pending() == 0
    assert frontier.audit() == {}


def test_a_last_chance_put_back_keeps_its_place_in_its_sites_queue(rds: redis.Redis) -> None:
    """Put back at the front of its queue, a last chance is still the next
    request of its site; the site's other requests wait behind it."""
    frontier = _frontier(rds, default_concurrency=1)
    _push(frontier, "https://a.example/1")
    _die_twice_together(rds, frontier, ["https://a.example/1"])
    _push(frontier, "https://a.example/2")
    assert isinstance(frontier.lease_many(["busy#1:0"], held_all=3), NotDue)
    assert frontier.pending() == 2
    [lease] = _leased(frontier.lease_many(["empty#1:0", "empty#1:1"], held_all=0))
    assert (lease.data, lease.deliveries) == (b"https://a.example/1", 3)
    frontier.ack([lease.lease_id])
    [lease] = _leased(frontier.lease_many(["empty#2:0"], held_all=0))
    assert (lease.data, lease.deliveries) == (b"https://a.example/2", 1)
    frontier.ack([lease.lease_id])
    assert frontier.audit() == {}


def test_the_site_drained_for_is_looked_at_first_only_for_its_last_chance(
    rds: redis.Redis,
) -> None:
    """The reply names the site of the last chance it put back; a lease call
    holding nothing that names it (drained_for) takes it first, ahead of
    better priorities. When another worker took it meanwhile, the site's
    next request keeps its turn: the better work goes first."""
    frontier = _frontier(rds, default_concurrency=1)
    _push(frontier, "https://a.example/1")
    _die_twice_together(rds, frontier, ["https://a.example/1"])
    assert frontier.push(b"https://h.example/1", site="h.example", priority=10,
                         fingerprint=None, dont_filter=True)
    [h1] = _leased(frontier.lease_many(["busy#1:0", "busy#1:1"], held_all=0))
    assert h1.data == b"https://h.example/1" and h1.last_passed == "a.example"
    frontier.ack([h1.lease_id])
    for i in (2, 3):
        assert frontier.push(f"https://h.example/{i}".encode(), site="h.example", priority=10,
                             fingerprint=None, dont_filter=True)
    rds.hset("{t}:due", "h.example", 0)  # (h.example due again at once)
    [last] = _leased(frontier.lease_many(["busy#2:0", "busy#2:1"], held_all=0,
                                         drained_for="a.example"))
    assert (last.data, last.deliveries, last.last_passed) == (b"https://a.example/1", 3, None)
    frontier.ack([last.lease_id])
    # a.example's next request is no last chance: named again, it waits its turn
    _push(frontier, "https://a.example/2")
    rds.hset("{t}:due", "a.example", 0)
    [first] = _leased(frontier.lease_many(["busy#3:0"], held_all=0, drained_for="a.example"))
    assert first.data == b"https://h.example/2"
    frontier.ack([first.lease_id])
    # (named by a worker that holds leases, the site is not looked at first)
    rds.hset("{t}:due", "h.example", 0)
    [third] = _leased(frontier.lease_many(["busy#4:0"], held_all=1, drained_for="a.example"))
    assert third.data == b"https://h.example/3"
    frontier.ack([third.lease_id])
    assert frontier.pending() == 1
    assert frontier.audit() == {}


@pytest.mark.parametrize("limit", [0, 1])
def test_without_redeliveries_nothing_is_held_back(rds: redis.Redis, limit: int) -> None:
    """max_deliveries 0 (no limit) or 1 (no second delivery): no request is
    ever on a last chance, so a busy worker leases as before."""
    frontier = _frontier(rds, max_deliveries=limit)
    _push(frontier, "https://a.example/1")
    _push(frontier, "https://b.example/1")
    for n in (1, 2):
        leases = _leased(frontier.lease_many([f"w#{n}:0", f"w#{n}:1"], held_all=5))
        if limit == 1:
            assert len(leases) == 2 and not leases[0].last_passed
            frontier.ack([lease.lease_id for lease in leases])
            break
        assert [lease.deliveries for lease in leases] == [n, n]
        _until_expired(rds)
    assert _dead(rds) == []


def test_the_scheduler_drains_for_a_last_chance_then_leases_nothing_beside_it(
    redis_url: str, rds: redis.Redis,
) -> None:
    """A worker holding a request when a last chance is put back leases
    nothing more until it holds nothing; then it takes the last chance,
    and nothing else until that one is done."""
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3)
    frontier.load_scripts()
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3)
    scheduler.enqueue_request(Request("https://c.example/held"))
    assert scheduler.flush_outbox()
    [held] = harness.lease_all(scheduler)

    scheduler.enqueue_request(Request("https://a.example/last"))
    assert scheduler.flush_outbox()
    for n in (1, 2):  # another worker dies twice with it
        [lease] = _leased(frontier.lease_many([f"dies#{n}:0"]))
        _until_past(rds, lease.lease_id)
    scheduler.enqueue_request(Request("https://b.example/fresh"))
    assert scheduler.flush_outbox()

    # The lease call takes the fresh request and puts the last chance back;
    # from then on the worker drains.
    [fresh] = harness.lease_all(scheduler)
    assert fresh.url == "https://b.example/fresh"
    scheduler.enqueue_request(Request("https://d.example/later"))
    assert scheduler.flush_outbox()
    assert scheduler.next_request() is None
    harness.finish(scheduler, held)
    assert scheduler.next_request() is None  # (it still holds one)
    harness.finish(scheduler, fresh)

    # Holding nothing: the last chance, alone; nothing beside it.
    last = scheduler.next_request()
    assert last is not None and last.url == "https://a.example/last"
    assert scheduler.next_request() is None
    assert scheduler.stats.get_value("frontier/last_chance/leased") == 1
    assert scheduler.stats.get_value("frontier/last_chance/drains") == 1
    harness.finish(scheduler, last)
    later = scheduler.next_request()
    assert later is not None and later.url == "https://d.example/later"
    harness.finish(scheduler, later)
    assert frontier.audit() == {}


def test_a_last_chance_whose_lease_reply_was_lost_is_found_out_and_still_held_alone(
    redis_url: str, rds: redis.Redis,
) -> None:
    """The reply of the lease call that took a last chance is lost: the
    lease is found out (not leased twice), and the worker still leases
    nothing beside it until it is done."""
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3)
    frontier.load_scripts()
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3)
    scheduler.enqueue_request(Request("https://a.example/last"))
    assert scheduler.flush_outbox()
    for n in (1, 2):  # another worker dies twice with it
        [lease] = _leased(frontier.lease_many([f"dies#{n}:0"]))
        _until_past(rds, lease.lease_id)
    # (a call that holds leases requeues it and leaves it: first in line)
    assert frontier.lease_many(["busy#1:0"], held_all=1).last_passed
    scheduler.enqueue_request(Request("https://b.example/fresh"))
    assert scheduler.flush_outbox()

    _lose_replies(scheduler)
    assert scheduler.next_request() is None  # the reply was lost; the call ran
    scheduler.session.down_until = 0.0  # Redis answers again
    last = scheduler.next_request()
    assert last is not None and last.url == "https://a.example/last"
    assert [e.split(b"#")[1] for e in rds.hvals("{t}:ldata")] == [b"3"]  # leased once
    assert scheduler.next_request() is None  # nothing beside it
    harness.finish(scheduler, last)
    fresh = scheduler.next_request()
    assert fresh is not None and fresh.url == "https://b.example/fresh"
    harness.finish(scheduler, fresh)
    assert frontier.audit() == {}


def rounds_until(scheduler: Any, url: str, most: int) -> list[list[str]]:
    """Lease all the scheduler gives, finish it, and again, until ``url``
    was served or ``most`` rounds: the URLs of each round."""
    rounds: list[list[str]] = []
    for _ in range(most):
        got = harness.lease_all(scheduler)
        rounds.append([r.url for r in got])
        for request in got:
            harness.finish(scheduler, request)
        if url in rounds[-1]:
            break
    return rounds


def behind_better_work(redis_url: str, rds: redis.Redis) -> tuple[Frontier, Any]:
    """A frontier and a scheduler (16 requests at once, 4 per site) on a frontier where
    ``https://a.example/last`` is one death short of max_deliveries=3 and
    ``h.example`` has 40 requests of better priority (10) queued."""
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3)
    frontier.load_scripts()
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3, CONCURRENT_REQUESTS=16,
        FRONTIER_CONCURRENCY=4,
    )
    scheduler.enqueue_request(Request("https://a.example/last", priority=0))
    assert scheduler.flush_outbox()
    _make_last_chance(rds, frontier, 2)
    for i in range(40):
        scheduler.enqueue_request(Request(f"https://h.example/{i}", priority=10))
    assert scheduler.flush_outbox()
    return frontier, scheduler


def _make_last_chance(rds: redis.Redis, frontier: Frontier, deaths: int) -> None:
    """Another worker leases the (only due) request ``deaths`` times and
    dies each time."""
    for n in range(1, deaths + 1):
        [lease] = _leased(frontier.lease_many([f"dies#{n}:0"]))
        _until_past(rds, lease.lease_id)


def test_after_draining_for_a_last_chance_the_worker_takes_it_despite_higher_priority_work(
    redis_url: str, rds: redis.Redis,
) -> None:
    """The worker meets the last chance after the 4
    requests of a site of better priority it may take (its concurrency),
    and drains. Drained, it asks with the site it drained for (lease.lua's
    ARGV[17]) and takes the last chance alone, though better work is still
    queued: else it would lease that first, meet the last chance beside it
    and drain again, for as long as better work is queued."""
    _, scheduler = behind_better_work(redis_url, rds)
    rounds = rounds_until(scheduler, "https://a.example/last", 4)
    drains = scheduler.stats.get_value("frontier/last_chance/drains")
    # round 1: 4 of h.example (its concurrency), the last chance put back:
    # a drain. Drained, the worker holds nothing: the last chance, alone.
    assert rounds[1] == ["https://a.example/last"], (rounds, drains)


def test_two_workers_draining_for_one_last_chance_both_go_on(
    redis_url: str, rds: redis.Redis,
) -> None:
    """Two workers each hold a request when they meet the same last chance:
    both drain. The first to hold nothing takes it alone; the other, once
    drained, goes on leasing the rest (neither starves)."""
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3)
    frontier.load_scripts()
    a, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3,
                                  CONCURRENT_REQUESTS=1)
    b, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3,
                                  CONCURRENT_REQUESTS=1)
    a.enqueue_request(Request("https://c.example/a"))
    a.enqueue_request(Request("https://d.example/b"))
    assert a.flush_outbox()
    held_a, held_b = a.next_request(), b.next_request()
    assert held_a is not None and held_b is not None
    a.enqueue_request(Request("https://a.example/last"))
    assert a.flush_outbox()
    _make_last_chance(rds, frontier, 2)
    for i in range(8):
        a.enqueue_request(Request(f"https://e.example/{i}"))
    assert a.flush_outbox()
    more_a, more_b = harness.lease_all(a), harness.lease_all(b)
    assert a.stats.get_value("frontier/last_chance/drains") == 1
    assert b.stats.get_value("frontier/last_chance/drains") == 1
    for r in [held_a, *more_a]:
        harness.finish(a, r)
    last = a.next_request()
    assert last is not None and last.url == "https://a.example/last"
    assert a.next_request() is None
    for r in [held_b, *more_b]:
        harness.finish(b, r)
    rest = harness.lease_all(b)
    assert rest, "b leases nothing after its drain"
    for r in rest:
        harness.finish(b, r)
    harness.finish(a, last)
    while (r := a.next_request()) is not None:
        harness.finish(a, r)
    while (r := b.next_request()) is not None:
        harness.finish(b, r)
    assert frontier.pending() == 0
    assert frontier.audit() == {}


# -- the site drained for (lease.lua ARGV[17]) -----------------------------------------


def test_the_drained_for_argument_is_not_counted_as_a_lease_id(rds: redis.Redis) -> None:
    """The lease ids are ARGV[18..]: the drained-for site (ARGV[17], or "")
    is no lease id, so a call looks at no more than ARGV[6] + its lease ids
    sites. Two stale sites on top of the ready index, ARGV[6]=1, one lease
    id: the call looks at those 2 and leases nothing (were ARGV[17] counted
    as an id, it would look at a third and lease it)."""
    frontier = _frontier(rds, candidates=1)
    _push(frontier, "https://real.example/1", priority=0)
    # two stale entries (no queued work) ranked above it
    rds.zadd("{t}:ready", {"stale1.example": -(10 << 32) + 1, "stale2.example": -(10 << 32) + 2})
    res = frontier.lease_many(["w#1:0"], held_all=0)
    assert isinstance(res, NotDue), (
        "a call with 1 lease id and ARGV[6]=1 looked at 3 sites: ARGV[17] counted as a lease id")


def _build(rds: redis.Redis, name: str) -> Frontier:
    frontier = _frontier(rds, name, default_concurrency=2)
    for i in range(3):
        _push(frontier, f"https://h.example/{i}", priority=10)
    for i in range(2):
        _push(frontier, f"https://b.example/{i}", priority=10)
    _push(frontier, "https://a.example/1", priority=0)   # the site named: no last chance
    _push(frontier, "https://a.example/2", priority=5)
    for i in range(2):
        _push(frontier, f"https://c.example/{i}", priority=5)
    return frontier


def _drain_order(frontier: Frontier, rds: redis.Redis, tag: str, first_hint: str | None,
                 batch: int) -> list[list[tuple[bytes, int]]]:
    rounds = []
    hint = first_hint
    for n in range(20):
        res = frontier.lease_many([f"{tag}#{n}:{j}" for j in range(batch)], held_all=0,
                                  drained_for=hint)
        hint = None
        if isinstance(res, NotDue):
            if res.wait is None:
                break
            for site in ("h.example", "b.example", "a.example", "c.example"):
                rds.hset(frontier.key("due"), site, 0)
            continue
        rounds.append([(lease.data, lease.deliveries) for lease in res])
        frontier.ack([lease.lease_id for lease in res])
        frontier.release_slots([lease.lease_id for lease in res])
        for site in ("h.example", "b.example", "a.example", "c.example"):
            rds.hset(frontier.key("due"), site, 0)
    return rounds


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_hint_for_a_site_without_a_last_chance_changes_no_order(
    rds: redis.Redis, batch: int
) -> None:
    """The same queues leased by calls that name a site without a last
    chance first, and by calls that name nothing: the same leases in the
    same order (priority, FIFO across sites), the same end state."""
    hinted, plain = _build(rds, "t"), _build(rds, "u")
    got_h = _drain_order(hinted, rds, "h", "a.example", batch)
    got_p = _drain_order(plain, rds, "p", None, batch)
    assert got_h == got_p
    assert hinted.pending() == plain.pending() == 0
    assert hinted.audit() == {} and plain.audit() == {}


def test_several_last_chances_each_leased_alone_by_name(rds: redis.Redis) -> None:
    """Two last chances on two sites, better work elsewhere: a call naming
    the second takes it alone although the first ranks higher; the next
    call holding nothing takes better work and puts the first back; named,
    it is taken alone; the rest is then leased in order."""
    frontier = _frontier(rds, default_concurrency=1)
    _push(frontier, "https://a.example/1")
    _push(frontier, "https://b.example/1")
    for n in (1, 2):
        leases = _leased(frontier.lease_many([f"dies#{n}:0", f"dies#{n}:1"]))
        assert len(leases) == 2
        _until_expired(rds)
    for i in range(3):
        _push(frontier, f"https://h.example/{i}", priority=10)
    [b] = _leased(frontier.lease_many(["w#1:0", "w#1:1"], held_all=0,
                                      drained_for="b.example"))
    assert (b.data, b.deliveries) == (b"https://b.example/1", 3)
    frontier.ack([b.lease_id])
    frontier.release_slots([b.lease_id])
    # holding nothing, unnamed: h's first (priority 10), a's put back beside it
    [h0] = _leased(frontier.lease_many(["w#2:0", "w#2:1"], held_all=0))
    assert (h0.data, h0.last_passed) == (b"https://h.example/0", "a.example")
    frontier.ack([h0.lease_id])
    frontier.release_slots([h0.lease_id])
    rds.hset("{t}:due", "h.example", 0)
    [a] = _leased(frontier.lease_many(["w#3:0", "w#3:1"], held_all=0,
                                      drained_for="a.example"))
    assert (a.data, a.deliveries) == (b"https://a.example/1", 3)
    frontier.ack([a.lease_id])
    frontier.release_slots([a.lease_id])
    rest = []
    for n in range(10):
        res = frontier.lease_many([f"w#{n + 3}:0", f"w#{n + 3}:1"], held_all=0)
        if isinstance(res, NotDue):
            if res.wait is None:
                break
            rds.hset("{t}:due", "h.example", 0)
            continue
        rest += [lease.data for lease in res]
        frontier.ack([lease.lease_id for lease in res])
        frontier.release_slots([lease.lease_id for lease in res])
        rds.hset("{t}:due", "h.example", 0)
    assert rest == [f"https://h.example/{i}".encode() for i in (1, 2)]
    assert frontier.pending() == 0
    assert frontier.audit() == {}


def test_the_named_call_whose_reply_is_lost_still_takes_the_last_chance_alone(
    redis_url: str, rds: redis.Redis,
) -> None:
    """The scheduler drains for a last chance behind better work, then its
    named lease call (ARGV[17]) runs but its reply is lost: recovery finds
    the last chance leased once, and nothing is leased beside it."""
    frontier, scheduler = behind_better_work(redis_url, rds)
    got = harness.lease_all(scheduler)
    assert "https://a.example/last" not in [r.url for r in got]
    assert scheduler.stats.get_value("frontier/last_chance/drains") == 1
    for r in got:
        harness.finish(scheduler, r)
    assert scheduler.book.drained_for is not None
    _lose_replies(scheduler)
    assert scheduler.next_request() is None
    scheduler.session.down_until = 0.0
    last = scheduler.next_request()
    assert last is not None and last.url == "https://a.example/last"
    assert scheduler.next_request() is None  # nothing beside it
    ldata = list(rds.hvals("{t}:ldata"))
    assert len(ldata) == 1 and ldata[0].split(b"#")[1] == b"3", ldata
    harness.finish(scheduler, last)
    while (r := scheduler.next_request()) is not None:
        harness.finish(scheduler, r)
    assert frontier.pending() == 0
    assert frontier.audit() == {}


def test_sharded_after_draining_the_worker_takes_the_last_chance_on_its_shard(
    redis_url: str, rds: redis.Redis,
) -> None:
    """Two shards: the last chance on one, a big site of better priority on
    the other and on the same one. Drained, the worker takes the last
    chance alone in its next round (not better work on the other shard)."""
    [lc_site] = sites_on_shard(2, 0, 1)
    [big0] = sites_on_shard(2, 0, 2)[1:]
    [big1] = sites_on_shard(2, 1, 1)
    prefix = site_prefix("t", lc_site, 2)
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3, prefix=prefix,
                        join_times=True)
    frontier.load_scripts()
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3, CONCURRENT_REQUESTS=16,
        FRONTIER_CONCURRENCY=4, FRONTIER_SHARDS=2,
    )
    scheduler.enqueue_request(Request(f"https://{lc_site}/last", priority=0))
    assert scheduler.flush_outbox()
    for n in (1, 2):
        [lease] = _leased(frontier.lease_many([f"dies#{n}:0"]))
        wait_for(lambda lid=lease.lease_id: (rds.zscore(prefix + "leases", lid) or 0)
                 < redis_ms(rds), 5, "lease expired", 0.005)
    for i in range(40):
        scheduler.enqueue_request(Request(f"https://{big1}/{i}", priority=10))
        scheduler.enqueue_request(Request(f"https://{big0}/{i}", priority=10))
    assert scheduler.flush_outbox()
    rounds = rounds_until(scheduler, f"https://{lc_site}/last", 6)
    assert [f"https://{lc_site}/last"] in rounds[:3], rounds
    assert scheduler.stats.get_value("frontier/last_chance/drains") == 1, rounds
    while (r := scheduler.next_request()) is not None:
        harness.finish(scheduler, r)


def _lc_state(rds: redis.Redis, name: str, tweak: str) -> Frontier:
    frontier = _frontier(rds, name, default_concurrency=2)
    p = frontier.key("")
    _push(frontier, "https://a.example/1")
    for n in (1, 2):
        [lease] = _leased(frontier.lease_many([f"dies{n}#x:0"]))
        wait_for(lambda lid=lease.lease_id: (rds.zscore(p + "leases", lid) or 0)
                 < redis_ms(rds), 5, "lease expired", 0.005)
    for i in range(4):
        _push(frontier, f"https://h.example/{i}", priority=10)
    _push(frontier, "https://b.example/1", priority=5)
    # (the expired lease requeued: a's last chance first in its queue)
    res = frontier.lease_many(["busy#x:0"], held_all=1)
    assert isinstance(res, list) and res[0].site == "h.example"
    frontier.ack([res[0].lease_id])
    frontier.release_slots([res[0].lease_id])
    rds.hset(p + "due", "h.example", 0)
    if tweak == "at_concurrency":
        rds.hset(p + "conc", "a.example", 1)
        rds.hset(p + "active", "a.example", 1)
    elif tweak == "not_due":
        rds.hset(p + "due", "a.example", redis_ms(rds) + 60_000)
    elif tweak == "malformed_queue":
        rds.hset(p + "qm", "a.example\t0", "x y")
    elif tweak == "fair_share":
        rds.zadd(p + "alive", {"other#x": redis_ms(rds) + 60_000})
        rds.hset(p + "wactive", "w#x\ta.example", 1)  # (this holder's share of 2/2)
    # (the same live workers on both: the fair shares do not depend on timing)
    rds.zrem(p + "alive", "dies1#x", "dies2#x", "busy#x")
    return frontier


@pytest.mark.parametrize("tweak", ["at_concurrency", "not_due", "malformed_queue", "fair_share"])
def test_a_named_site_that_cannot_be_served_leases_as_an_unnamed_call(
    rds: redis.Redis, tweak: str
) -> None:
    """The site named (drained for) is at its concurrency, not due, has a
    malformed queue, or has this worker's fair share taken: the named call
    leases what the same call without the name leases, and leaves the same
    problems and pending count."""
    named, plain = _lc_state(rds, "t", tweak), _lc_state(rds, "u", tweak)
    got = []
    results = []
    for frontier, hint in ((named, "a.example"), (plain, None)):
        res = frontier.lease_many(["w#x:0", "w#x:1", "w#x:2"], held_all=0, drained_for=hint)
        results.append(res)
        got.append((
            [(lease.data, lease.deliveries) for lease in res] if isinstance(res, list)
            else ("not due", res.wait is None),
            sorted(p.replace("{u}", "{t}") for p in (res[0] if isinstance(res, list)
                                                     else res).problems),
            frontier.pending(),
        ))
    assert got[0] == got[1], got
    if tweak == "malformed_queue":
        # (its queue's bounds are left as they are and reported: both calls
        # pass the site over alike; the worker's repair rebuilds them from
        # the chunks, and the request is still a last chance, leased alone)
        first = results[0][0] if isinstance(results[0], list) else results[0]
        assert Damage("qm", "a.example\t0") in first.damaged, first
        assert [x.repaired for x in repair_damage(named, Damage("qm", "a.example\t0"))] == [True]
        if isinstance(results[0], list):
            named.ack([lease.lease_id for lease in results[0]])
        for n in range(3, 9):
            res = named.lease_many([f"w#x:{n}"], held_all=0)
            assert isinstance(res, list), res
            named.ack([res[0].lease_id])
            if res[0].site == "a.example":
                assert (res[0].data, res[0].deliveries, res[0].state) == (
                    b"https://a.example/1", 3, SUSPECT)
                break
        else:
            pytest.fail("a.example's last chance was not leased after the repair")
