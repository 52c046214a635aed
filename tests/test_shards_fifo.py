"""Held-back cases of first in, first out among equal priorities across the
shards of a sharded frontier (``{s}:joined``, the lease replies' head join
time, batches cut at another shard's head), against a real Redis: orders
checked against one frontier (``FRONTIER_SHARDS=1``) given the same pushes
and leases."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.cluster import RedisCluster
from scrapy import Request, Spider
from scrapy.settings import Settings

from crawler.commands.frontier import clear_frontier
from crawler.frontier.housekeeping import Housekeeper
from crawler.keys import CLUSTER_SHARDS, shard_of, shard_prefixes
from tests import scheduler_harness as harness
from tests.faultproxy import FaultProxy
from tests.scheduler_harness import finish
from tests.test_shards import _assert_stored_once, served_sites
from tests.test_shards_variants import _serve
from tests.workers import crawl, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from crawler.frontier.scheduler import FrontierScheduler

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "t"


def _hosts(requests: list[Request]) -> list[str]:
    return [r.url.split("/")[2] for r in requests]


def _random_sites(rng: random.Random, n: int) -> list[str]:
    return [f"{rng.getrandbits(40):x}.example" for _ in range(n)]


@pytest.mark.parametrize("shards", [4, 6, 7])
def test_pushed_one_by_one_after_every_shard_was_found_empty_first_in_first_out(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """The worker has just asked every shard (all empty: it knows their
    best as "nothing due"); it then queues 50 sites one after another, each
    commit on its own: they are served in the order they were pushed. (Each
    push raised its shard's best past what the worker knew, and left its
    head unknown: shards of unknown heads tied and were asked in turn.)"""
    rng = random.Random(shards)
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=16
    )
    assert scheduler.next_request() is None
    sites = _random_sites(rng, 50)
    for site in sites:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        assert scheduler.flush_outbox()
    got = _hosts(_serve(scheduler, len(sites)))
    assert got == sites, got


@pytest.mark.parametrize("shards", [4, 7])
def test_mixed_priorities_pushed_after_every_shard_was_found_empty(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """As above with priorities -3, 0, 2 and 5 mixed on 60 sites: served
    best priority first, first in, first out within each."""
    rng = random.Random(shards)
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=16
    )
    assert scheduler.next_request() is None
    pushed = [(site, rng.choice([-3, 0, 2, 5])) for site in _random_sites(rng, 60)]
    for site, priority in pushed:
        scheduler.enqueue_request(Request(f"https://{site}/", priority=priority))
        assert scheduler.flush_outbox()
    got = [(r.url.split("/")[2], r.priority) for r in _serve(scheduler, len(pushed))]
    assert got == sorted(pushed, key=lambda sp: -sp[1]), got


def _script(seed: int) -> list[tuple[Any, ...]]:
    """A seeded run of pushes (each committed on its own) and leases: 5 to
    40 sites, requests at priorities 0 to 2, sites with several requests."""
    rng = random.Random(seed)
    sites = _random_sites(rng, rng.randrange(5, 40))
    ops: list[tuple[Any, ...]] = []
    for n in range(rng.randrange(20, 100)):
        ops.append(("push", rng.choice(sites), f"p{n}", rng.choice([0, 0, 0, 1, 2])))
        if rng.random() < 0.2:
            ops.append(("serve", rng.randrange(1, 5)))
    ops.append(("serve", 10**6))
    return ops


def _push(scheduler: FrontierScheduler, op: tuple[Any, ...]) -> None:
    """Queue the request of a ``("push", site, path, priority)`` step."""
    _, site, path, priority = op
    scheduler.enqueue_request(Request(f"https://{site}/{path}", priority=priority))


def _play(
    redis_url: str, rds: redis.Redis, shards: int, ops: list[tuple[Any, ...]],
    counts: list[int] | None = None,
) -> list[str]:
    """The URLs served, in order, by one worker leasing one at a time
    (``counts``: given, gets how many were served after each serve step)."""
    rds.flushall()
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=1,
        FRONTIER_CONCURRENCY=64,
    )
    got: list[str] = []
    for op in ops:
        if op[0] == "push":
            _push(scheduler, op)
            assert scheduler.flush_outbox()
            continue
        for _ in range(op[1]):
            request = scheduler.next_request()
            if request is None:
                break
            got.append(request.url)
            finish(scheduler, request)
        if counts is not None:
            counts.append(len(got))
    assert scheduler.next_request() is None
    harness.stop_opened()
    return got


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("shards", [4, 7])
def test_pushes_and_leases_interleaved_served_as_one_frontier_serves_them(
    redis_url: str, rds: redis.Redis, shards: int, seed: int
) -> None:
    """Seeded runs of pushes and leases (sites with several requests take
    turns, better priorities raise a site, shards found empty get work
    again): the sharded frontier serves them in the order one frontier
    does."""
    ops = _script(seed)
    one = _play(redis_url, rds, 1, ops)
    got = _play(redis_url, rds, shards, ops)
    assert len(got) == len(set(got)) == sum(op[0] == "push" for op in ops)
    assert got == one


# -- faults ----------------------------------------------------------------------------

LUA = Path(__file__).resolve().parent.parent / "crawler" / "frontier" / "lua"


@pytest.fixture
def proxy(redis_url: str, rds: redis.Redis) -> Iterator[FaultProxy]:
    rds.script_flush()
    with FaultProxy(redis_url) as fault_proxy:
        yield fault_proxy


def _drain(scheduler: FrontierScheduler) -> list[Request]:
    """Lease and handle requests until none comes for 20 calls in a row
    (a backoff after a lost reply is skipped)."""
    out: list[Request] = []
    misses = 0
    while misses < 20:
        request = scheduler.next_request()
        if request is None:
            scheduler.session.down_until = 0.0
            misses += 1
            continue
        misses = 0
        out.append(request)
        finish(scheduler, request)
    return out


@pytest.mark.parametrize("mode", ["drop", "hold"])
@pytest.mark.parametrize("shards", [4, 6])
@pytest.mark.parametrize("calls", [0, 2, 5])
def test_a_lost_lease_reply_then_first_in_first_out_goes_on(
    proxy: FaultProxy, rds: redis.Redis, mode: str, shards: int, calls: int
) -> None:
    """40 sites pushed one by one; the reply to a lease call (batches of
    4, after ``calls`` lease calls) is lost. The leases it took are found
    out and handed out, then the rest in the order they were pushed:
    nothing lost, nothing twice. (The next lease call went to the shard
    chosen by what the worker knew before the lost call, whose head that
    call had taken, and its first lease is never cut: a site that joined
    after other shards' heads came first.)"""
    rng = random.Random(shards + calls)
    scheduler, _ = harness.open_scheduler(
        proxy.url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4,
        REDIS_PARAMS={"socket_timeout": 0.5, "socket_connect_timeout": 2},
    )
    sites = _random_sites(rng, 40)
    for site in sites:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        assert scheduler.flush_outbox()
    # (the first next_request peeks at every shard: lease.lua calls too)
    rule = proxy.lose_replies(
        script=(LUA / "lease.lua").read_text(), mode=mode, hold=3, skip=shards + calls
    )
    got = _hosts(_drain(scheduler))
    assert rule.acted == 1
    assert sorted(got) == sorted(sites)
    assert got == sites, got
    assert scheduler.queue.shards.audit() == {}


@pytest.mark.parametrize("mode", ["drop", "hold"])
@pytest.mark.parametrize("shards", [4, 6])
@pytest.mark.parametrize("nth", [0, 2, 7])
def test_a_lost_commit_reply_then_first_in_first_out_goes_on(
    proxy: FaultProxy, rds: redis.Redis, mode: str, shards: int, nth: int
) -> None:
    """The worker found every shard empty, then pushes 30 sites one by one;
    the reply to the ``nth`` commit is lost (it ran: found out). They are
    served in the order they were pushed. (The commit's reply told when its
    site joined; lost, the shard's head stayed unknown: ranked after every
    shard of a known head at that priority.)"""
    rng = random.Random(shards + nth)
    scheduler, _ = harness.open_scheduler(
        proxy.url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4,
        REDIS_PARAMS={"socket_timeout": 0.5, "socket_connect_timeout": 2},
    )
    assert scheduler.next_request() is None
    rule = proxy.lose_replies(
        script=(LUA / "commit.lua").read_text(), mode=mode, hold=3, skip=nth
    )
    sites = _random_sites(rng, 30)
    for site in sites:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        while not scheduler.flush_outbox():
            scheduler.session.down_until = 0.0
    assert rule.acted == 1
    got = _hosts(_drain(scheduler))
    assert sorted(got) == sorted(sites)
    assert got == sites, got


@pytest.mark.parametrize("mode", ["drop", "hold"])
@pytest.mark.parametrize("shards", [4, 6])
def test_a_lost_peek_reply_then_first_in_first_out_goes_on(
    proxy: FaultProxy, rds: redis.Redis, mode: str, shards: int
) -> None:
    """40 sites pushed one by one; the reply to the worker's first peeks at
    the shards is lost (an outage: the worker backs off). Once Redis
    answers again they are served in the order they were pushed. (The
    first lease call after the backoff went out knowing no shard, and the
    shards stayed unknown for a second: asked in turn, batches not cut.)"""
    rng = random.Random(shards)
    scheduler, _ = harness.open_scheduler(
        proxy.url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4,
        REDIS_PARAMS={"socket_timeout": 0.5, "socket_connect_timeout": 2},
    )
    sites = _random_sites(rng, 40)
    for site in sites:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        assert scheduler.flush_outbox()
    rule = proxy.lose_replies(script=(LUA / "lease.lua").read_text(), mode=mode, hold=3)
    assert scheduler.next_request() is None
    assert rule.acted == 1
    got = _hosts(_drain(scheduler))
    assert sorted(got) == sorted(sites)
    assert got == sites, got


@pytest.mark.parametrize("shards", [4, 6])
@pytest.mark.parametrize("served", [0, 7])
def test_scripts_forgotten_then_first_in_first_out_goes_on(
    redis_url: str, rds: redis.Redis, shards: int, served: int
) -> None:
    """40 sites pushed one by one; after ``served`` of them, Redis forgets
    its scripts (a restart, a failover): the rest are served in the order
    they were pushed, each once. (With 0 served, the peeks at the shards
    met NOSCRIPT and were passed over: every shard's best and head stayed
    unknown for a second, so the shards were asked in turn and their
    batches not cut.)"""
    rng = random.Random(shards + served)
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    sites = _random_sites(rng, 40)
    for site in sites:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        assert scheduler.flush_outbox()
    got = _serve(scheduler, served)
    # (what the worker learnt of the shards is a second old: peeked at)
    for view in scheduler.router.views:
        view.best_at = 0.0
    rds.script_flush()
    got += _serve(scheduler, len(sites) - served)
    assert scheduler.next_request() is None
    assert _hosts(got) == sites, _hosts(got)
    assert scheduler.queue.shards.audit() == {}


@pytest.mark.xfail(strict=True, reason=(
    "a limitation: each shard's commit of one round trip has one time, so "
    "requests queued in one outbox (a page's links, a batch of seeds) are "
    "served shard by shard across shards, not in the order they were queued"
))
@pytest.mark.parametrize("shards", [4, 6])
def test_pushes_sent_in_one_round_trip_first_in_first_out(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """30 sites queued, then sent in one round trip (one commit per
    shard): one frontier serves them in the order they were queued."""
    rng = random.Random(shards)
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=16
    )
    sites = _random_sites(rng, 30)
    for site in sites:
        scheduler.enqueue_request(Request(f"https://{site}/"))
    assert scheduler.flush_outbox()
    assert _hosts(_serve(scheduler, len(sites))) == sites


def _play_lossy(url: str, shards: int, ops: list[tuple[Any, ...]]) -> list[str]:
    """As :func:`_play`, through Redis replies that may be lost: every
    backoff is skipped, each push is sent until it is in, each lease served
    is acknowledged until that is in."""
    scheduler, _ = harness.open_scheduler(
        url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=1, FRONTIER_CONCURRENCY=64,
        REDIS_PARAMS={"socket_timeout": 0.5, "socket_connect_timeout": 2},
    )

    def flush() -> None:
        for _ in range(50):
            scheduler.session.down_until = 0.0
            if scheduler.flush_outbox():
                return
        raise AssertionError("the outbox was never sent")

    got: list[str] = []
    for op in ops:
        if op[0] == "push":
            _push(scheduler, op)
            flush()
            continue
        misses = 0
        while len(got) < op[2] and misses < 100:
            scheduler.session.down_until = 0.0
            request = scheduler.next_request()
            if request is None:
                misses += 1
                continue
            misses = 0
            got.append(request.url)
            scheduler.crawler.engine._slot.remove_request(request)
            flush()
    harness.stop_opened()
    return got


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shards", [4, 7])
def test_replies_lost_at_random_served_as_one_frontier_serves_them(
    redis_url: str, rds: redis.Redis, shards: int, seed: int
) -> None:
    """Pushes and leases as above with about one reply in five lost
    (commits, leases, peeks, recoveries): nothing lost, nothing twice, and
    the order one frontier serves them in without faults."""
    ops = _script(seed)
    counts: list[int] = []
    one = _play(redis_url, rds, 1, ops, counts)
    # (each serve step goes on until as many were served as without faults)
    steps = iter(counts)
    marked = [("serve", op[1], next(steps)) if op[0] == "serve" else op for op in ops]
    rds.flushall()
    rds.script_flush()
    with FaultProxy(redis_url) as proxy:
        proxy.lose_randomly(5, seed=seed)
        got = _play_lossy(proxy.url, shards, marked)
    assert proxy.lost > 0
    assert sorted(got) == sorted(one)
    assert got == one


# -- bad values, housekeeping, clear ---------------------------------------------------


def test_housekeeping_and_clear_leave_no_join_time_behind(
    redis_url: str, rds: redis.Redis
) -> None:
    """Sites with two requests each over 4 shards, housekeeping run between
    and after (every idle site forgotten at once): join times only for
    sites in ready, none at the end; ``frontier clear`` deletes the rest."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=4, CONCURRENT_REQUESTS=4
    )
    keeper = Housekeeper(rds, "t", shards=4, site_forget_after=0, batch=100)
    sites = [f"h{i}.example" for i in range(20)]
    for site in sites:
        scheduler.enqueue_request(Request(f"https://{site}/a"))
        scheduler.enqueue_request(Request(f"https://{site}/b"))
        assert scheduler.flush_outbox()
    got = _serve(scheduler, 20)
    keeper.run()
    for shard in scheduler.queue.shards:
        assert set(rds.hkeys(shard.key("joined"))) == set(rds.zrange(shard.key("ready"), 0, -1))
    got += _serve(scheduler, 20)
    keeper.run()
    assert sorted(r.url for r in got) == sorted(
        f"https://{site}/{p}" for site in sites for p in "ab"
    )
    assert scheduler.queue.shards.audit() == {}
    for site in sites[:8]:
        scheduler.enqueue_request(Request(f"https://{site}/c"))
    assert scheduler.flush_outbox()
    assert any(rds.exists(shard.key("joined")) for shard in scheduler.queue.shards)
    clear_frontier(rds, "t", Settings({"FRONTIER_SHARDS": 4}))
    assert rds.keys("*joined*") == []


# -- a Redis Cluster -------------------------------------------------------------------


@pytest.mark.parametrize("found_empty", [False, True])
def test_first_in_first_out_across_the_default_shards_of_a_cluster(
    redis_cluster_url: str, found_empty: bool
) -> None:
    """The real three-master cluster, its default 16 shards: 60 sites
    pushed one by one are served in that order (the masters share this
    machine's clock), with or without the shards found empty first."""
    rng = random.Random(3)
    scheduler, _ = harness.open_scheduler(
        redis_cluster_url, _Spider, FRONTIER_REDIS_CLUSTER=True, CONCURRENT_REQUESTS=16
    )
    assert len(scheduler.queue.shards) == CLUSTER_SHARDS
    if found_empty:
        assert scheduler.next_request() is None
    sites = _random_sites(rng, 60)
    for site in sites:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        assert scheduler.flush_outbox()
    assert _hosts(_serve(scheduler, len(sites))) == sites
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        assert all(rc.exists(shard.key("joined")) == 0 for shard in scheduler.queue.shards)
    finally:
        rc.close()


@pytest.mark.workers
def test_a_cluster_crawl_with_exact_fifo_stores_every_page_once(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, db: Any, tmp_path: Path
) -> None:
    """Two workers crawl 80 sites on the cluster's default 16 shards with
    FRONTIER_FIFO_SLACK 0 (batches cut at other shards' heads): every page
    stored once, no error, no join time left."""
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        with served_sites() as sites:
            rc.lpush("pages:start_urls", *sites.urls(80))
            env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db),
                   "FRONTIER_REDIS_CLUSTER": "1"}
            done = crawl("pages", env, tmp_path, workers=2,
                         settings={"FRONTIER_FIFO_SLACK": 0})
            _assert_stored_once(db, sites, 80, done)
        assert all("] ERROR:" not in w.log and "Traceback" not in w.log for w in done)
        assert not any(rc.exists(p + "joined") for p in shard_prefixes("pages", CLUSTER_SHARDS))
    finally:
        rc.close()


# -- cost ------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 4])
def test_work_on_one_shard_costs_no_more_lease_calls_than_one_frontier(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """100 sites of one shard (of 4), three requests each, pushed one by
    one: leased in batches of 16 with as many lease calls as one frontier
    takes (the other shards, empty, cut no batch)."""
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=16
    )
    names = (f"c{i}.example" for i in range(10_000))
    sites = [site for site in names if shard_of(site, 4) == 0][:100]
    for site in sites:
        for j in range(3):
            scheduler.enqueue_request(Request(f"https://{site}/{j}"))
        assert scheduler.flush_outbox()
    got = harness.lease_all(scheduler)
    assert len(got) == 300
    assert crawler.stats.get_value("frontier/lease_calls") == 19  # ceil(300 / 16)
    if shards == 1:
        assert rds.exists("{t}:joined") == 0
