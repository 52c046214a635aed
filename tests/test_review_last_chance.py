"""A reviewer's cases (who did not write the code) for the lease call that
names the site a worker drained for (lease.lua ARGV[17]) and for
housekeeping keeping sites with a retry time while a due retry waits
unmoved (forget_sites.lua). The two that failed when written (lease ids
read from ARGV[17]; a malformed retry time counted as no retry) pass since
the fixes; the others held from the start."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider

from crawler.frontier.housekeeping import Housekeeper
from crawler.frontier.store import Frontier, Lease, NotDue
from crawler.keys import shard_of, shard_prefixes, site_prefix
from tests import scheduler_harness as harness
from tests.test_frontier_faults import _lose_replies, _until_expired
from tests.test_housekeeping import redis_ms, retry_one
from tests.test_last_chance import _until_past, behind_better_work, rounds_until
from tests.waiting import wait_for

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "t"


def _frontier(rds: redis.Redis, name: str = "t", **kwargs: Any) -> Frontier:
    frontier = Frontier(rds, name, **{"default_concurrency": 8, "lease_timeout": 0.05,
                                      "max_deliveries": 3, **kwargs})
    frontier.load_scripts()
    return frontier


def _leased(result: list[Lease] | NotDue) -> list[Lease]:
    assert isinstance(result, list), result
    return result


def _push(frontier: Frontier, url: str, priority: int = 0) -> None:
    assert frontier.push(url.encode(), site=url.split("/")[2], priority=priority,
                         fingerprint=None, dont_filter=True)


def _make_last_chance(rds: redis.Redis, frontier: Frontier, url: str) -> None:
    """``url`` (the only request due on its frontier) dies twice: one death
    short of max_deliveries=3."""
    _push(frontier, url)
    for n in (1, 2):
        [lease] = _leased(frontier.lease_many([f"dies{n}#x:0"]))
        assert lease.data == url.encode()
        _until_past(rds, lease.lease_id)
    # (a busy call requeues it, and puts it back: first in its site's line)
    res = frontier.lease_many(["busy#x:0"], held_all=1)
    assert isinstance(res, NotDue) and res.last_passed == url.split("/")[2], res


# -- 1717460: lease.lua ARGV[17] ----------------------------------------------------


def test_the_drained_for_argument_is_not_counted_as_a_lease_id(rds: redis.Redis) -> None:
    """The lease ids are ARGV[18..]: the drained-for site (ARGV[17], or "")
    is no lease id, so a call looks at no more than ARGV[6] + its lease ids
    sites. Two stale sites on top of the ready index, ARGV[6]=1, one lease
    id: the call looks at those 2 and leases nothing (it looked at a third
    when ARGV[17] was counted as an id)."""
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
    assert scheduler._drained_for is not None
    _lose_replies(scheduler)
    assert scheduler.next_request() is None
    scheduler._down_until = 0.0
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


def _sites_on(shards: int, want: int, n: int) -> list[str]:
    out = []
    for i in range(1000):
        site = f"s{i}.example"
        if shard_of(site, shards) == want:
            out.append(site)
            if len(out) == n:
                return out
    raise AssertionError


def test_sharded_after_draining_the_worker_takes_the_last_chance_on_its_shard(
    redis_url: str, rds: redis.Redis,
) -> None:
    """Two shards: the last chance on one, a big site of better priority on
    the other and on the same one. Drained, the worker takes the last
    chance alone in its next round (not better work on the other shard)."""
    [lc_site] = _sites_on(2, 0, 1)
    [big0] = _sites_on(2, 0, 2)[1:]
    [big1] = _sites_on(2, 1, 1)
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


# -- 111268f / 37cfd48: forget_sites.lua and {s}:retryat -------------------------------


def test_a_malformed_retry_time_counted_as_0_still_keeps_the_site_while_a_retry_waits(
    rds: redis.Redis,
) -> None:
    """A malformed {s}:retryat field is reported and counted as 0: a retry
    time all the same, so while a due retry waits unmoved the site is kept
    (it was counted as no retry: the site forgotten, its slow mark and
    Crawl-delay gone before its retry ran)."""
    frontier = Frontier(rds, "s")
    assert retry_one(frontier, "r.example", 0.0) == []
    rds.hset("{s}:slow", "r.example", 4000)
    rds.hset("{s}:rdelay", "r.example", 10_000)
    rds.hset("{s}:retryat", "r.example", "soon")
    rds.hset("{s}:due", "r.example", redis_ms(rds) - 10_000)
    wait_for(lambda: rds.zrangebyscore("{s}:retries", "-inf", redis_ms(rds)), 5, "retry due")
    keeper = Housekeeper(rds, "s", site_forget_after=0)
    forgotten, problems = keeper.forget(["r.example"])
    assert any("counted as 0" in p for p in problems), problems
    assert rds.zcard("{s}:retries") == 1  # its retry still waits
    assert (forgotten, rds.hget("{s}:slow", "r.example")) == (0, b"4000")


@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_sweep_reads_each_shards_own_retries(rds: redis.Redis, shards: int) -> None:
    """An unmoved due retry on one shard keeps that shard's sites with a
    retry time; another shard's sites with an old retry time and no due
    retry of their own are forgotten."""
    [r0] = _sites_on(shards, 0, 1)
    [r1] = _sites_on(shards, 1, 1)
    f0 = Frontier(rds, "s", prefix=shard_prefixes("s", shards)[0])
    f1 = Frontier(rds, "s", prefix=shard_prefixes("s", shards)[1])
    assert retry_one(f0, r0, 0.0) == []
    assert retry_one(f1, r1, 0.0) == []
    # shard 0's retry was moved and done; shard 1's waits unmoved
    p0, p1 = shard_prefixes("s", shards)[:2]
    lease = f0.lease("w#n:9")
    assert isinstance(lease, Lease) and lease.site == r0
    f0.ack([lease.lease_id])
    f0.release_slots([lease.lease_id])
    for p, s in ((p0, r0), (p1, r1)):
        rds.hset(p + "slow", s, 100)
        rds.hset(p + "due", s, redis_ms(rds) - 60_000)
    wait_for(lambda: rds.zrangebyscore(p1 + "retries", "-inf", redis_ms(rds)), 5, "retry due")
    keeper = Housekeeper(rds, "s", site_forget_after=0, shards=shards)
    assert keeper.forget([r0], shard=0) == (1, [])
    assert keeper.forget([r1], shard=1) == (0, [])
    assert not rds.hexists(p0 + "slow", r0) and rds.hexists(p1 + "slow", r1)


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
    for frontier, hint in ((named, "a.example"), (plain, None)):
        res = frontier.lease_many(["w#x:0", "w#x:1", "w#x:2"], held_all=0, drained_for=hint)
        got.append((
            [(lease.data, lease.deliveries) for lease in res] if isinstance(res, list)
            else ("not due", res.wait is None),
            sorted(p.replace("{u}", "{t}") for p in (res[0] if isinstance(res, list)
                                                     else res).problems),
            frontier.pending(),
        ))
    if tweak == "malformed_queue":  # (repaired from its chunks: still a last chance)
        assert got[0][0] == [(b"https://a.example/1", 3)], got
        return
    assert got[0] == got[1], got
