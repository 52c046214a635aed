"""Variants of the sharded frontier's acceptance (priority across all due
sites and shards, fair-share call rates, a forgotten site that gets work
again, bad values in the new keys), against real Redis servers."""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

import pytest
from scrapy import Request, Spider
from twisted.internet.defer import maybeDeferred

from crawler.config import config_error_of
from crawler.frontier import router as router_module
from crawler.frontier.store import Frontier, Push
from crawler.keys import shard_of
from devtools.replay import Page
from tests import scheduler_harness as harness
from tests.scheduler_harness import finish
from tests.waiting import wait_for
from tests.workers import start_worker, wait_workers

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from crawler.frontier.scheduler import FrontierScheduler
    from tests.conftest import SiteFactory

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "t"


def _serve(scheduler: FrontierScheduler, n: int) -> list[Request]:
    """Lease and handle ``n`` requests, one after another."""
    out = []
    for _ in range(n):
        request = scheduler.next_request()
        assert request is not None, out
        out.append(request)
        finish(scheduler, request)
    return out


@pytest.mark.parametrize("shards", [1, 2, 5])
@pytest.mark.parametrize("nth", [33, 41, 500])
def test_priority_9_on_the_nth_due_site_comes_first(
    redis_url: str, rds: redis.Redis, shards: int, nth: int
) -> None:
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    for i in range(1, nth):
        scheduler.enqueue_request(Request(f"https://s{i}.example/0"))
    scheduler.enqueue_request(Request(f"https://s{nth}.example/9", priority=9))
    assert scheduler.flush_outbox()
    got = [r.priority for r in _serve(scheduler, 8)]
    assert got == [9] + [0] * 7, got


@pytest.mark.parametrize("shards", [1, 2, 5])
def test_mixed_priorities_on_distinct_sites_are_served_best_first(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """Priorities 0..9 on 50 sites spread over the shards, pushed in a
    shuffled order: served in order of priority, every one once (a lease
    call's batch does not take one shard's lower priorities before another
    shard's better ones)."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    prios = [(i * 7) % 10 for i in range(50)]
    for i, p in enumerate(prios):
        scheduler.enqueue_request(Request(f"https://m{i}.example/{p}", priority=p))
    assert scheduler.flush_outbox()
    got = [r.priority for r in _serve(scheduler, 50)]
    assert got == sorted(prios, reverse=True), str(got)


@pytest.mark.parametrize("shards", [1, 2, 5])
def test_equal_priorities_on_distinct_sites_first_in_first_out(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """Twenty sites, one request each at priority 0, pushed one after
    another: served in the order they were pushed."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    urls = [f"https://f{i}.example/0" for i in range(20)]
    for url in urls:
        scheduler.enqueue_request(Request(url))
        assert scheduler.flush_outbox()
    got = [r.url for r in _serve(scheduler, 20)]
    assert got == urls, str([u.split("/")[2] for u in got])
    for shard in scheduler.queue.shards:  # (a site's join time leaves with it)
        assert rds.exists(shard.key("joined"), shard.key("ready")) == 0


def _hosts(requests: list[Request]) -> list[str]:
    return [r.url.split("/")[2] for r in requests]


def _sites_of(shard: int, shards: int, n: int, tag: str) -> list[str]:
    """``n`` site names of shard ``shard`` (of ``shards``)."""
    names = (f"{tag}{i}.example" for i in range(100_000))
    return [site for site in names if shard_of(site, shards) == shard][:n]


@pytest.mark.parametrize("shards", [1, 3, 8])
@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize("seed", [7, 2026])
def test_equal_priorities_first_in_first_out_whatever_the_shards_and_push_order(
    redis_url: str, rds: redis.Redis, shards: int, levels: int, seed: int
) -> None:
    """Thirty sites named at random (a seeded RNG: their shards come in any
    order), one request each, pushed one after another, at one priority or
    two interleaved at random: served by priority, then in the order they
    were pushed."""
    rng = random.Random(seed)
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    pushed = [
        (f"{rng.getrandbits(40):x}.example", rng.randrange(levels)) for _ in range(30)
    ]
    for site, priority in pushed:
        scheduler.enqueue_request(Request(f"https://{site}/", priority=priority))
        assert scheduler.flush_outbox()
    got = [(r.url.split("/")[2], r.priority) for r in _serve(scheduler, 30)]
    assert got == sorted(pushed, key=lambda sp: -sp[1]), got


@pytest.mark.parametrize("shards", [2, 3])
@pytest.mark.parametrize("concurrent", [4, 16])
def test_a_batch_stops_before_a_site_of_another_shard_that_joined_earlier(
    redis_url: str, rds: redis.Redis, shards: int, concurrent: int
) -> None:
    """Sites pushed in runs of three per shard (a0 a1 a2 b0 b1 b2 c0 ...):
    served in push order, each run in one lease call (the batch goes on
    while its shard's sites joined before every other shard's head, and
    stops at the first that joined after one)."""
    runs = 8
    per = {k: iter(_sites_of(k, shards, runs * 3, "b")) for k in range(shards)}
    order = [next(per[run % shards]) for run in range(runs) for _ in range(3)]
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=concurrent
    )
    for site in order:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        assert scheduler.flush_outbox()
    got = _hosts(_serve(scheduler, len(order)))
    assert got == order, got
    assert crawler.stats.get_value("frontier/lease_calls") == runs


def test_a_slack_lets_a_batch_go_on_past_another_shards_head(
    redis_url: str, rds: redis.Redis
) -> None:
    """With FRONTIER_FIFO_SLACK a batch goes on through sites that joined
    up to that long after another shard's head: sites pushed alternating
    between two shards are leased in batches of 16, not one by one."""
    a, b = _sites_of(0, 2, 16, "z"), _sites_of(1, 2, 16, "z")
    order = [site for pair in zip(a, b, strict=True) for site in pair]
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=2, CONCURRENT_REQUESTS=16, FRONTIER_FIFO_SLACK=60
    )
    for site in order:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        assert scheduler.flush_outbox()
    got = _hosts(_serve(scheduler, len(order)))
    assert sorted(got) == sorted(order)
    assert crawler.stats.get_value("frontier/lease_calls") == 2


def test_one_shard_keeps_no_join_times(redis_url: str, rds: redis.Redis) -> None:
    """One frontier needs only its turns: ``{s}:joined`` is never written
    (no byte per site, no write per lease)."""
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, CONCURRENT_REQUESTS=4)
    for i in range(5):
        scheduler.enqueue_request(Request(f"https://n{i}.example/0"))
        scheduler.enqueue_request(Request(f"https://n{i}.example/1"))
    assert scheduler.flush_outbox()
    assert scheduler.next_request() is not None
    assert rds.exists("{t}:joined") == 0


def test_a_batch_stops_before_a_site_that_joined_after_another_shards_head(
    rds: redis.Redis,
) -> None:
    """lease.lua itself: with ARGV[13] the other shards' best priority and
    ARGV[14] when their head joined, a batch takes the sites of that
    priority that joined until then, none after; the reply tells when its
    own head joined (``Lease.head``)."""
    frontier = Frontier(rds, "t", default_concurrency=8, join_times=True)
    frontier.load_scripts()
    sites = [f"j{i}.example" for i in range(4)]
    for site in sites:
        frontier.push(f"https://{site}/".encode(), site=site, priority=0,
                      fingerprint=None, dont_filter=True)
    joined = [int(rds.hget("{t}:joined", site) or 0) for site in sites]
    assert joined == sorted(joined) and len(set(joined)) == 4, joined
    leases = frontier.lease_many([f"w#1:{n}" for n in range(4)], least=0,
                                 least_joined=joined[1])
    assert isinstance(leases, list)
    assert [lease.site for lease in leases] == sites[:2]
    assert (leases[0].best, leases[0].head) == (0, joined[2])
    # a better priority elsewhere: one lease; a worse one: no limit
    one = frontier.lease_many(["w#1:a", "w#1:b"], least=1, least_joined=0)
    assert isinstance(one, list) and [lease.site for lease in one] == sites[2:3]
    assert rds.hkeys("{t}:joined") == [sites[3].encode()]
    last = frontier.lease_many(["w#1:c", "w#1:d"], least=-1, least_joined=0)
    assert isinstance(last, list) and [lease.site for lease in last] == sites[3:]
    assert (last[0].best, last[0].head) == (None, None)
    assert rds.exists("{t}:joined", "{t}:ready") == 0
    rds.hset("{t}:joined", "gone.example", 1)  # one left behind: the audit tells
    assert frontier.audit().get("joined") == ["gone.example"]


def test_a_stale_shard_peeked_at_is_served_first_when_its_site_joined_first(
    redis_url: str, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard 1 was found empty; another worker then queues a site there,
    before this worker queues four on shard 0. The peek at the stale shard
    tells when its site joined: it is served first, and this worker's batch
    on shard 0 (16 wanted) holds the four."""
    monkeypatch.setattr(router_module, "EMPTY_SHARD_RECHECK", 0.0)
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=2, CONCURRENT_REQUESTS=16
    )
    assert scheduler.next_request() is None  # both shards empty
    [other] = _sites_of(1, 2, 1, "o")
    mine = _sites_of(0, 2, 4, "m")
    shards = scheduler.queue.shards
    shards.for_site(other).push_many([
        Push(f"https://{other}/".encode(), other, 0, None, True)
    ])
    for site in mine:
        scheduler.enqueue_request(Request(f"https://{site}/"))
    assert scheduler.flush_outbox()
    got = _hosts(_serve(scheduler, 5))
    assert got == [other, *mine], got
    assert crawler.stats.get_value("frontier/lease_calls") == 2


@pytest.mark.parametrize(
    "value", ["abc", "-5", "1e15", "", "9" * 17, "12.5", "1.5e3", " 5", "0x10", "+7", "9" * 20]
)
@pytest.mark.parametrize("shards", [2, 4])
def test_a_malformed_join_time_is_left_reported_and_repaired_by_the_worker_and_nothing_lost(
    redis_url: str, rds: redis.Redis, value: str, shards: int, caplog: pytest.LogCaptureFixture
) -> None:
    """``{s}:joined`` edited by hand: a site's value is not whole µs. The
    scripts count the site as joined long ago, leave the value as it is and
    report it; the worker runs the audit's repair of it (deleted) and logs
    one WARNING naming the key and ``scrapy frontier audit --repair``.
    Every request is served once; the key is empty at the end."""
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    # (the repair runs at once, not in the reactor's thread pool: the
    # harness turns no reactor)
    scheduler.reports.run_off_reactor = maybeDeferred
    urls = [f"https://x{i}.example/{j}" for i in range(6) for j in range(2)]
    for url in urls:
        scheduler.enqueue_request(Request(url))
    assert scheduler.flush_outbox()
    edited = []
    for shard in scheduler.queue.shards:
        for site in rds.zrange(shard.key("ready"), 0, -1):
            rds.hset(shard.key("joined"), site, value)
            edited.append(f"{shard.key('joined')} {site.decode()}")
    with caplog.at_level(logging.WARNING, logger="crawler.frontier.scheduler"):
        got = [r.url for r in _serve(scheduler, len(urls))]
    assert sorted(got) == sorted(urls)
    assert scheduler.next_request() is None
    assert crawler.stats.get_value("frontier/repaired")
    lines = [r.getMessage() for r in caplog.records if "Damaged frontier value" in r.getMessage()]
    assert lines and all("scrapy frontier audit --repair t" in x for x in lines), lines
    assert {x.split(", one the")[0].removeprefix("Damaged frontier value ") for x in lines} <= \
        set(edited), lines
    for shard in scheduler.queue.shards:
        assert rds.exists(shard.key("joined"), shard.key("ready")) == 0


@pytest.mark.parametrize("kind", ["string", "list"])
@pytest.mark.parametrize("shards", [2, 3, 4])
def test_a_joined_key_of_the_wrong_type_is_reported_and_nothing_lost(
    redis_url: str, rds: redis.Redis, shards: int, kind: str
) -> None:
    """``{s}:joined`` replaced by a string or a list: join times are not
    kept there (reported), no call is refused, every request is served
    once, and the key is left for the operator."""
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    for shard in scheduler.queue.shards:
        if kind == "string":
            rds.set(shard.key("joined"), "oops")
        else:
            rds.rpush(shard.key("joined"), "a", "b")
    urls = [f"https://y{i}.example/{j}" for i in range(6) for j in range(2)]
    for url in urls:
        scheduler.enqueue_request(Request(url))
    assert scheduler.flush_outbox()
    got = [r.url for r in _serve(scheduler, len(urls))]
    assert sorted(got) == sorted(urls)
    assert scheduler.next_request() is None
    assert crawler.stats.get_value("frontier/problems")
    for shard in scheduler.queue.shards:
        if kind == "string":
            assert rds.get(shard.key("joined")) == b"oops"  # left for the operator
        else:
            assert rds.lrange(shard.key("joined"), 0, -1) == [b"a", b"b"]


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sites_queued_by_the_previous_version_count_as_joined_long_ago(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """A frontier written before ``{s}:joined`` existed: sites in ready
    without a join time. They are served before every site queued since
    (they joined before it), without a problem reported; then the newer
    ones in the order they were pushed."""
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    old = [f"old{i}.example" for i in range(9)]
    for site in old:
        scheduler.enqueue_request(Request(f"https://{site}/"))
    assert scheduler.flush_outbox()
    for shard in scheduler.queue.shards:
        rds.delete(shard.key("joined"))  # (as the previous version left it)
    new = [f"new{i}.example" for i in range(9)]
    for site in new:
        scheduler.enqueue_request(Request(f"https://{site}/"))
        assert scheduler.flush_outbox()
    got = _hosts(_serve(scheduler, len(old) + len(new)))
    assert sorted(got[: len(old)]) == sorted(old), got
    assert got[len(old):] == new, got
    assert not crawler.stats.get_value("frontier/problems")
    for shard in scheduler.queue.shards:
        assert rds.exists(shard.key("joined"), shard.key("ready")) == 0


# -- bounded state: a forgotten site crawled again ---------------------------------------

ROBOTS_DELAY = b"User-agent: *\nCrawl-delay: 1\n"


@pytest.mark.workers
def test_a_forgotten_site_that_gets_new_work_keeps_its_crawl_delay(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis
) -> None:
    """One worker crawls a site whose robots.txt says Crawl-delay: 1; the
    site is idle, housekeeping forgets its state (robots.txt and Crawl-delay
    among it); then two new pages of the site are seeded: they are fetched
    1 s apart, as before the site was forgotten."""
    html = [("Content-Type", "text/html")]
    site = site_factory({
        "/robots.txt": Page(200, [("Content-Type", "text/plain")], ROBOTS_DELAY),
        "/": Page(200, html, b"<title>root</title>"),
        "/a": Page(200, html, b"<title>a</title>"),
        "/b": Page(200, html, b"<title>b</title>"),
    })
    name = site.url[len("http://"):]
    log = tmp_path / "worker.log"
    proc = start_worker("pages", env, log, {
        "MAX_IDLE_TIME_BEFORE_CLOSE": 5, "FRONTIER_SITE_FORGET_AFTER": 0,
        "FRONTIER_HOUSEKEEPING_INTERVAL": 0.2, "FRONTIER_DELAY": 0, "FRONTIER_IDLE_WAIT": 0.2,
    })
    try:
        rds.lpush("pages:start_urls", site.url_for("/"))
        wait_for(lambda: rds.hexists("{pages}:rdelay", name) or None, 30, "Crawl-delay stored")
        wait_for(lambda: not rds.hexists("{pages}:rdelay", name) or None, 30, "the site forgotten")
        assert not rds.hexists("{pages}:robots", name)
        rds.lpush("pages:start_urls", site.url_for("/a"), site.url_for("/b"))
        wait_for(lambda: {"/a", "/b"} <= {h.path for h in site.hits()} or None, 30,
                 "the new pages fetched")
    finally:
        [worker] = wait_workers([proc], [log])
    assert worker.returncode == 0, worker.log[-3000:]
    started = {h.path: h.started for h in site.hits()}
    assert abs(started["/a"] - started["/b"]) >= 0.95, site.hits()
    # (fetched again for the cluster: the frontier knows its rules)
    assert [h.path for h in site.hits()].count("/robots.txt") == 2


# -- malformed values in the new keys --------------------------------------------------


@pytest.mark.parametrize("score", [float("inf"), float("-inf"), 1e300, -1e300])
@pytest.mark.parametrize("shards", [1, 2])
def test_a_site_in_ready_with_a_score_no_frontier_writes_is_reported_and_nothing_lost(
    redis_url: str, rds: redis.Redis, score: float, shards: int
) -> None:
    """``{s}:ready`` edited by hand: a site with an infinite or huge score.
    Every request is still served once, the worker goes on, and the bad
    value is reported (it was: ValueError on b'-inf' reading the reply)."""
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    urls = [f"https://r{i}.example/{j}" for i in range(6) for j in range(2)]
    for url in urls:
        scheduler.enqueue_request(Request(url))
    assert scheduler.flush_outbox()
    for shard in scheduler.queue.shards:
        rds.zadd(shard.key("ready"), {"ghost.example": score})
    got = [r.url for r in _serve(scheduler, len(urls))]
    assert sorted(got) == sorted(urls)
    assert scheduler.next_request() is None
    if score > 0 or shards > 1:  # (a lease call met it first on top: it left unread)
        assert crawler.stats.get_value("frontier/problems")
    assert all(rds.zcard(shard.key("ready")) == 0 for shard in scheduler.queue.shards)


@pytest.mark.parametrize("recorded", ["abc", "0", "-2", "4.5"])
def test_a_malformed_shard_count_stops_the_worker_with_a_configuration_error(
    redis_url: str, rds: redis.Redis, recorded: str
) -> None:
    """``{t}:shards`` edited by hand: the worker stops with a configuration
    error naming the key (it raised ValueError out of the scheduler's open)."""
    rds.set("{t}:shards", recorded)
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=2)
    message = config_error_of(crawler)
    assert message is not None
    assert "{t}:shards" in message and repr(recorded) in message, message
    assert scheduler.next_request() is None  # no frontier call
    assert rds.get("{t}:shards") == recorded.encode()  # left for the operator


def test_a_better_priority_this_worker_may_not_lease_does_not_cut_its_batches(
    redis_url: str, rds: redis.Redis
) -> None:
    """Shard 0's best due site (priority 9) is one where this worker holds
    its share: its batches on the other shard are not cut to one request
    per lease call by that priority."""
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=2, FRONTIER_CONCURRENCY=2, CONCURRENT_REQUESTS=8
    )
    shards = scheduler.queue.shards
    shards.alive("other#1")  # a second live worker: one slot of each site each
    top = next(f"h{i}.example" for i in range(100) if shard_of(f"h{i}.example", 2) == 0)
    low = [f"l{i}.example" for i in range(200) if shard_of(f"l{i}.example", 2) == 1][:16]
    for j in range(3):
        scheduler.enqueue_request(Request(f"https://{top}/{j}", priority=9))
    for site in low:
        scheduler.enqueue_request(Request(f"https://{site}/0"))
    assert scheduler.flush_outbox()
    first = scheduler.next_request()
    assert first is not None and first.priority == 9  # its share of the top site
    got = [first] + [r for r in iter(scheduler.next_request, None)]
    assert [r.priority for r in got] == [9] + [0] * 16, [r.url for r in got]
    # 16 requests of shard 1 in batches of 8, not one by one
    assert crawler.stats.get_value("frontier/lease_calls") <= 4


@pytest.mark.parametrize("shards", [1, 3])
def test_fair_share_on_every_due_site_costs_a_few_calls_a_second_per_shard(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """Two live workers, this one holding its share of every due site (60
    sites over the shards): for 2 s, about one call per shard a second."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_CONCURRENCY=2, FRONTIER_SHARDS=shards
    )
    frontier_shards = scheduler.queue.shards
    frontier_shards.alive("other#1")
    for i in range(60):
        site = f"s{i}.example"
        frontier_shards.for_site(site).push_many([
            Push(f"https://{site}/{j}".encode(), site, 0, f"https://{site}/{j}".encode(), False)
            for j in range(3)
        ])
    held = 0
    for k in range(shards):
        result = frontier_shards[k].lease_many([f"{scheduler.holder}:h{k}-{n}" for n in range(64)])
        held += len(result) if isinstance(result, list) else 0
    assert held == 60
    rds.config_resetstat()
    deadline = time.monotonic() + 2.0
    while (now := time.monotonic()) < deadline:
        assert scheduler.next_request() is None
        due = scheduler.next_due
        time.sleep(min(1.0 if due is None else due, 1.0, deadline - now))
    calls = int(rds.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    assert calls <= shards * 3 * 2, calls
