"""Bounded state: dead workers forgotten, dead letters capped, idle sites forgotten.

Real Redis; the frontier is written through :class:`crawler.frontier.store.Frontier`
and the housekeeping runs its Lua scripts (:mod:`crawler.frontier.housekeeping`).
A worker's own per-site memory (the slow marks of
:class:`~crawler.politeness.AdaptiveSlowdownMiddleware`, built on a Scrapy
crawler) is bounded too, and agrees with Redis once a site was forgotten;
the parsed robots.txt rules: ``tests/test_robots_compact.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from redis.cluster import RedisCluster
from scrapy import Request
from scrapy.http import Response
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from crawler.commands.deadletters import dead_letters, purge, requeue
from crawler.frontier import housekeeping
from crawler.frontier.connection import get_redis
from crawler.frontier.housekeeping import Housekeeper
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Commit, Frontier, Lease, Retry
from crawler.keys import shard_of, shard_prefixes
from crawler.politeness import RULES_SWEEP_MIN, AdaptiveSlowdownMiddleware
from crawler.spiders.pages import PagesSpider
from crawler.status import StatusReader
from tests.faultproxy import FaultProxy
from tests.waiting import wait_for
from tests.workers import PROJECT_DIR

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

SITE_KEYS = ("due", "slow", "rdelay", "robots", "robots:down", "joined", "retryat")
#: More sites than a worker's memory sweeps at (its per-site copies then bounded).
SITES = 3 * RULES_SWEEP_MIN
PROJECT_LUA = PROJECT_DIR / "crawler" / "frontier" / "lua"


def record(beat: float) -> str:
    return json.dumps({"pid": 1, "host": "h", "last_heartbeat": beat, "pages": 0})


def redis_ms(client: redis.Redis) -> int:
    """The Redis server's clock, ms (the scripts' clock)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def finish_one(frontier: Frontier, site: str) -> None:
    """Queue a request on ``site``, lease it, acknowledge it and free its
    slot: the site is finished (idle)."""
    push(frontier, site)
    lease = frontier.lease("w#n:1")
    assert isinstance(lease, Lease)
    frontier.ack([lease.lease_id])
    frontier.release_slots([lease.lease_id])


def sites_on_shard(shards: int, want: int, n: int) -> list[str]:
    """The first ``n`` sites ``s<i>.example`` that fall on shard ``want`` of ``shards``."""
    out = []
    for i in range(1000):
        site = f"s{i}.example"
        if shard_of(site, shards) == want:
            out.append(site)
            if len(out) == n:
                return out
    raise AssertionError


def push(frontier: Frontier, site: str, n: int = 1) -> None:
    for i in range(n):
        assert frontier.push(
            f'{{"u":"https://{site}/{i}"}}'.encode(), site=site, priority=0,
            fingerprint=None, dont_filter=True,
        )


def test_dead_workers_are_forgotten_and_a_worker_that_came_back_is_kept(
    rds: redis.Redis,
) -> None:
    now = time.time()
    rds.hset(
        "{s}:workers",
        mapping={
            "dead": record(now - 2 * 86400),
            "live": record(now - 5),
            "bad": "not json",
        },
    )
    keeper = Housekeeper(rds, "s", worker_forget_after=86400)
    removed, problems = keeper.forget_workers()
    assert (removed, problems) == (1, [])
    assert set(rds.hkeys("{s}:workers")) == {b"live", b"bad"}
    # A worker the caller found stale but that beat since: the script reads
    # its record again and keeps it.
    rds.hset("{s}:workers", "back", record(now))
    reply = keeper._forget_workers(keys=["{s}:workers"], args=[86400, "back", "bad"])
    assert reply[0] == 0
    assert [p.decode() for p in reply[1]] == [
        "{s}:workers bad has no readable last_heartbeat: kept"
    ]
    assert rds.hexists("{s}:workers", "back")


@pytest.mark.parametrize("shards", [1, 3])
def test_dead_letters_are_capped_and_counted_once(rds: redis.Redis, shards: int) -> None:
    frontier = FrontierShards.build(rds, "s", shards)
    frontier.check_count()  # as the first worker: the status reads the count
    for shard in frontier:
        for i in range(25):
            shard.dead_letter({"url": f"https://d.example/{i}", "reason": "r", "attempts": 3})
    keeper = Housekeeper(rds, "s", shards=shards, dead_max=10 * shards)
    assert keeper.dead_max_per_shard == 10
    assert keeper.trim_dead() == 15 * shards
    assert keeper.trim_dead() == 0  # a second run (or a resent call) counts nothing
    assert keeper.run().dead_trimmed == 0
    for prefix in shard_prefixes("s", shards):
        kept = [json.loads(x)["url"] for x in rds.lrange(prefix + "dead", 0, -1)]
        assert kept == [f"https://d.example/{i}" for i in range(15, 25)]  # the newest
        # counted in the shard's own slot, beside its list
        assert rds.get(prefix + "dead:trimmed") == b"15"
    assert not rds.hexists("{s}:stats", "dead/trimmed")
    spider = StatusReader(rds, None, "unused", ["s"]).read().spiders["s"]
    assert (spider.shards, spider.dead_letters, spider.dead_trimmed) == (
        shards, 10 * shards, 15 * shards
    )
    # What a version before shards counted in the crawl-wide stats is added.
    rds.hset("{s}:stats", "dead/trimmed", 4)
    spider = StatusReader(rds, None, "unused", ["s"]).read().spiders["s"]
    assert spider.dead_trimmed == 15 * shards + 4
    assert Housekeeper(rds, "s", shards=shards, dead_max=0).trim_dead() == 0  # no cap


@pytest.mark.parametrize("shards", [1, 3])
def test_trim_refuses_a_bad_counter_before_writing(rds: redis.Redis, shards: int) -> None:
    prefixes = shard_prefixes("s", shards)
    for prefix in prefixes:
        rds.rpush(prefix + "dead", *[b"{}"] * 5)
    bad = prefixes[-1]
    rds.set(bad + "dead:trimmed", "x")
    keeper = Housekeeper(rds, "s", shards=shards, dead_max=2 * shards)
    with pytest.raises(redis.ResponseError, match="nothing was written"):
        keeper.trim_dead_shard(shards - 1)
    assert rds.llen(bad + "dead") == 5
    # A run names the refused shard and trims the others all the same.
    swept = keeper.run()
    assert swept.dead_trimmed == 3 * (shards - 1)
    assert [p for p in swept.problems if "dead:trimmed" in p] == [
        f'refused: frontier key {bad}dead:trimmed = "x" is not a whole number: '
        "nothing was written"
    ]
    assert [rds.llen(p + "dead") for p in prefixes] == [2] * (shards - 1) + [5]


def test_dead_letters_listed_requeued_purged_after_trimming_the_count_stays(
    rds: redis.Redis,
) -> None:
    """Three shards, 300 dead letters of 60 sites, capped at 10 (4 a shard):
    the status counts what was trimmed; ``deadletters list``, ``requeue`` and
    ``purge`` act on the 12 kept; the count of the trimmed ones outlives a
    purge (it says what was lost, not what is left)."""
    frontier = FrontierShards.build(rds, "pages", 3)
    frontier.check_count()
    for i in range(300):
        site = f"d{i % 60}.example"
        frontier.for_site(site).dead_letter({
            "url": f"http://{site}/{i}", "reason": "r", "attempts": 3, "site": site,
            "entry": f'{{"u":"http://{site}/{i}"}}', "priority": 0,
        })
    swept = Housekeeper(rds, "pages", shards=3, dead_max=10).run()
    assert swept.dead_trimmed == 300 - 12
    reader = StatusReader(rds, None, "unused", ["pages"])
    try:
        spider = reader.read().spiders["pages"]
        assert (spider.dead_letters, spider.dead_trimmed) == (12, 288)
        assert len(list(dead_letters(frontier))) == 12
        assert requeue(frontier, limit=5) == (5, 0)
        assert sum(int(rds.get(f.key("count")) or 0) for f in frontier) == 5
        assert purge(frontier) == 7
        spider = reader.read().spiders["pages"]
        assert (spider.dead_letters, spider.dead_trimmed, spider.queued) == (0, 288, 5)
    finally:
        reader.close()


def test_idle_sites_are_forgotten_busy_ones_kept(rds: redis.Redis) -> None:
    frontier = Frontier(rds, "s", default_concurrency=1)
    for site in ("done.example", "queued.example", "leased.example"):
        push(frontier, site, 2 if site == "queued.example" else 1)
    leases = frontier.lease_many(["w#n:1", "w#n:2", "w#n:3"])
    assert isinstance(leases, list)
    by_site = {lease.site: lease for lease in leases}
    assert set(by_site) == {"done.example", "queued.example", "leased.example"}
    frontier.ack([by_site["done.example"].lease_id, by_site["queued.example"].lease_id])
    frontier.release_slots([by_site["done.example"].lease_id,
                            by_site["queued.example"].lease_id])
    sites = ("done.example", "queued.example", "leased.example")
    for site in sites:
        rds.hset("{s}:slow", site, 100)
        rds.hset("{s}:rdelay", site, 100)
        rds.hset("{s}:robots", site, b"1.0\nUser-agent: *\nDisallow: /x")
        rds.hset("{s}:robots:down", site, b"1 1 1")
        rds.hset("{s}:joined", site, 1)  # (done.example's: left by a hand edit)
        rds.hset("{s}:retryat", site, 1)  # a retry due long ago
    rds.hset("{s}:delay", "done.example", 500)  # an operator's override stays
    keeper = Housekeeper(rds, "s", site_forget_after=0, batch=10)
    # due was set when the site was leased: forgotten once a ms has passed
    wait_for(lambda: keeper.forget_sites()[0] == 1 or None, 5, "the idle site forgotten")
    for key in SITE_KEYS:
        assert not rds.hexists("{s}:" + key, "done.example"), key
        for busy in ("queued.example", "leased.example"):
            assert rds.hexists("{s}:" + key, busy), (key, busy)
    assert rds.hget("{s}:delay", "done.example") == b"500"
    assert rds.exists("{s}:forget")
    # The forgotten site is crawled again as any new site.
    push(frontier, "done.example")
    lease = frontier.lease("w#n:4")
    assert isinstance(lease, Lease) and lease.site in ("done.example", "queued.example")


def test_every_shard_is_swept_with_a_bounded_batch(rds: redis.Redis) -> None:
    frontier = FrontierShards.build(rds, "s", 3, default_concurrency=1)
    sites = [f"s{i}.example" for i in range(12)]
    for site in [*sites, "busy.example"]:
        push(frontier.for_site(site), site, 2 if site == "busy.example" else 1)
    for n, site in enumerate([*sites, "busy.example"]):
        shard = frontier.for_site(site)
        lease = shard.lease(f"w#n:{n}")
        assert isinstance(lease, Lease)
        shard.ack([lease.lease_id])
        shard.release_slots([lease.lease_id])
        rds.hset(shard.key("rdelay"), lease.site, 100)
    assert len({frontier.index_of(site) for site in sites}) == 3
    keeper = Housekeeper(rds, "s", shards=3, site_forget_after=0, batch=3)
    assert keeper.site_batch == 1
    forgotten = 0

    def swept() -> bool | None:
        nonlocal forgotten
        run = keeper.run()
        assert run.problems == ()
        forgotten += run.sites
        return forgotten == len(sites) or None

    wait_for(swept, 10, "every idle site of every shard forgotten")
    for index, shard in enumerate(frontier):
        assert rds.exists(keeper.key("forget", index))  # a cursor per shard
        assert set(rds.hkeys(shard.key("due"))) <= {b"busy.example"}
        assert set(rds.hkeys(shard.key("rdelay"))) <= {b"busy.example"}
    busy = frontier.for_site("busy.example")
    assert rds.hexists(busy.key("due"), "busy.example")  # still has a request queued


def test_a_site_that_got_work_after_the_scan_is_not_touched(rds: redis.Redis) -> None:
    frontier = Frontier(rds, "s")
    finish_one(frontier, "a.example")
    rds.hset("{s}:rdelay", "a.example", 100)
    keeper = Housekeeper(rds, "s", site_forget_after=0)
    due = int(rds.hget("{s}:due", "a.example") or 0)
    wait_for(lambda: redis_ms(rds) > due, 5, "a ms past the site's due time")
    push(frontier, "a.example")  # work arrives between the HSCAN and the script
    assert keeper.forget(["a.example"]) == (0, [])
    assert rds.hexists("{s}:due", "a.example") and rds.hexists("{s}:rdelay", "a.example")


def test_not_idle_for_long_enough_is_kept(rds: redis.Redis) -> None:
    frontier = Frontier(rds, "s")
    finish_one(frontier, "a.example")
    keeper = Housekeeper(rds, "s", site_forget_after=3600)
    assert keeper.forget_sites() == (0, [])
    assert rds.hexists("{s}:due", "a.example")


def retry_one(frontier: Frontier, site: str, delay: float) -> list[str]:
    """Lease a request of ``site`` and send it to the retry set for ``delay``
    seconds in the commit that acknowledges it (as a worker does after a
    503): the site's only work then waits in the retry set. Returns the
    commit's problems."""
    push(frontier, site)
    lease = frontier.lease("w#n:1")
    assert isinstance(lease, Lease)
    return frontier.commit(Commit(
        retries=[Retry(b'{"u":"https://%s/r"}' % site.encode(), site, 0, delay)],
        acks=[lease.lease_id],
    )).problems


def test_a_site_whose_only_work_waits_in_the_retry_set_is_not_forgotten(
    rds: redis.Redis,
) -> None:
    """A 503 with Retry-After: 600 slowed the site and sent its request to the
    retry set; the operator forgets sites after 300 s. 301 s after its last
    request the site still has work (its retry, due in 299 s): it is not
    forgotten, so the retry reaches the site with the slow mark the 503 set."""
    frontier = Frontier(rds, "pages")
    site = "r.example"
    assert frontier.push(b'{"u":"http://r.example/"}', site=site, priority=0,
                         fingerprint=None, dont_filter=True)
    lease = frontier.lease("w#n:1")
    assert isinstance(lease, Lease)
    frontier.push_retry(b'{"u":"http://r.example/"}', site=site, priority=0, delay=600)
    frontier.ack([lease.lease_id])
    frontier.release_slots([lease.lease_id])
    rds.hset("{pages}:slow", site, 4000)
    seconds, micros = rds.time()
    rds.hset("{pages}:due", site, int(seconds) * 1000 + int(micros) // 1000 - 301_000)
    assert rds.zcard("{pages}:retries") == 1
    Housekeeper(rds, "pages", site_forget_after=300).forget([site])
    assert rds.hget("{pages}:slow", site) == b"4000"


def test_a_site_whose_only_work_is_a_retry_is_kept_until_the_retry_is_due(
    rds: redis.Redis,
) -> None:
    """The site has work as long as a retry of it waits (as in
    test_a_site_whose_only_work_waits_in_the_retry_set_is_not_forgotten, with
    other numbers): forgotten only once its
    latest retry is due and FRONTIER_SITE_FORGET_AFTER more has passed."""
    frontier = Frontier(rds, "s")
    assert retry_one(frontier, "r.example", 30.0) == []
    rds.hset("{s}:slow", "r.example", 4000)
    at = int(rds.hget("{s}:retryat", "r.example") or 0)
    assert 29_000 <= at - redis_ms(rds) <= 30_000
    # An earlier retry written later does not bring the site's time forward.
    frontier.push_retry(b'{"u":"https://r.example/s"}', site="r.example", priority=0, delay=10.0)
    assert int(rds.hget("{s}:retryat", "r.example") or 0) == at
    # due is long past; the retry is due in 30 s: kept, with no forget bound
    rds.hset("{s}:due", "r.example", redis_ms(rds) - 3_600_000)
    assert Housekeeper(rds, "s", site_forget_after=0).forget(["r.example"]) == (0, [])
    assert Housekeeper(rds, "s", site_forget_after=20).forget(["r.example"]) == (0, [])
    assert rds.hget("{s}:slow", "r.example") == b"4000"
    # Once the retry time is 20 s past, the site is idle for a 20 s bound.
    rds.hset("{s}:retryat", "r.example", redis_ms(rds) - 20_001)
    assert Housekeeper(rds, "s", site_forget_after=20).forget(["r.example"]) == (1, [])
    for key in SITE_KEYS:
        assert not rds.hexists("{s}:" + key, "r.example"), key


def test_a_site_whose_due_retry_was_not_moved_yet_keeps_its_state(rds: redis.Redis) -> None:
    """A retry comes due but no lease call moves it to
    its queue (every worker paused, say): while it waits there, no site
    with a retry time is forgotten, however long ago that time is; once a
    lease call moved it, the site counts as busy by its queue, and idle
    again after its request."""
    frontier = Frontier(rds, "s")
    finish_one(frontier, "q.example")  # a site without retries is forgotten
    assert retry_one(frontier, "r.example", 0.0) == []
    rds.hset("{s}:slow", "r.example", 4000)
    rds.hset("{s}:rdelay", "r.example", 10_000)
    at = int(rds.hget("{s}:retryat", "r.example") or 0)
    rds.hset("{s}:due", "r.example", at - 10_000)
    wait_for(lambda: redis_ms(rds) > max(at, int(rds.hget("{s}:due", "q.example") or 0)), 5,
             "the retry due, and q.example's due time past")
    keeper = Housekeeper(rds, "s", site_forget_after=0)
    assert keeper.forget(["r.example", "q.example"]) == (1, [])
    assert rds.zcard("{s}:retries") == 1
    assert (rds.hget("{s}:slow", "r.example"), rds.hget("{s}:rdelay", "r.example")) == (
        b"4000", b"10000")
    # A lease call moves the retry and leases it: the site is busy, then idle.
    lease = frontier.lease("w#n:2")
    assert isinstance(lease, Lease) and lease.site == "r.example"
    assert keeper.forget(["r.example"]) == (0, [])
    frontier.ack([lease.lease_id])
    frontier.release_slots([lease.lease_id])
    rds.hset("{s}:due", "r.example", redis_ms(rds) - 1)  # (its pace is 14 s: as if past)
    assert keeper.forget(["r.example"]) == (1, [])
    assert not rds.hexists("{s}:retryat", "r.example")


def test_a_bad_retry_time_is_reported_and_never_loses_the_retry(rds: redis.Redis) -> None:
    """A malformed field of {s}:retryat counts as no retry (reported) in the
    sweep and is replaced by the next retry; a {s}:retryat of another type
    is reported and left alone, and the retry is written all the same."""
    frontier = Frontier(rds, "s")
    finish_one(frontier, "a.example")
    rds.hset("{s}:due", "a.example", redis_ms(rds) - 10_000)
    rds.hset("{s}:retryat", "a.example", "soon")
    assert Housekeeper(rds, "s", site_forget_after=5).forget(["a.example"]) == (1, [
        '{s}:retryat a.example = "soon" is not whole ms: counted as 0'
    ])
    rds.hset("{s}:retryat", "b.example", "9" * 16)
    assert retry_one(frontier, "b.example", 60.0) == [
        f'{{s}}:retryat b.example = "{"9" * 16}" ignored (replaced)'
    ]
    assert 59_000 <= int(rds.hget("{s}:retryat", "b.example") or 0) - redis_ms(rds) <= 60_000
    rds.delete("{s}:retryat")
    rds.rpush("{s}:retryat", "x")
    assert retry_one(frontier, "c.example", 60.0) == [
        "{s}:retryat holds a list, not a hash: left alone"
    ]
    assert rds.zcard("{s}:retries") == 2
    assert rds.lrange("{s}:retryat", 0, -1) == [b"x"]
    rds.hset("{s}:due", "c.example", redis_ms(rds) - 10_000)
    forgotten, problems = Housekeeper(rds, "s", site_forget_after=5).forget(["c.example"])
    assert (forgotten, problems) == (1, ["{s}:retryat holds a list, not a hash: left alone"])
    assert rds.lrange("{s}:retryat", 0, -1) == [b"x"]


def test_a_retry_set_of_the_wrong_type_is_reported_and_the_sweep_goes_on(
    rds: redis.Redis,
) -> None:
    """{s}:retries of another type (a hand edit) cannot tell whether a due
    retry waits: the sweep says so and judges sites by their times alone."""
    frontier = Frontier(rds, "s")
    finish_one(frontier, "a.example")
    rds.hset("{s}:due", "a.example", redis_ms(rds) - 10_000)
    rds.hset("{s}:retryat", "a.example", redis_ms(rds) - 10_000)
    rds.delete("{s}:retries")
    rds.set("{s}:retries", "x")
    assert Housekeeper(rds, "s", site_forget_after=5).forget(["a.example"]) == (1, [
        "{s}:retries holds a string, not a zset: not read"
    ])
    assert rds.get("{s}:retries") == b"x"


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
    [r0] = sites_on_shard(shards, 0, 1)
    [r1] = sites_on_shard(shards, 1, 1)
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


def test_the_extension_reads_its_settings_and_can_be_switched_off(redis_url: str) -> None:
    from scrapy import Spider
    from scrapy.exceptions import NotConfigured
    from scrapy.utils.test import get_crawler

    from crawler.frontier.housekeeping import FrontierHousekeeping

    class S(Spider):
        name = "s"

    crawler = get_crawler(S, {
        "REDIS_URL": redis_url, "FRONTIER_DEAD_LETTERS_MAX": 7,
        "FRONTIER_SITE_FORGET_AFTER": 2.5, "FRONTIER_WORKER_FORGET_AFTER": 90,
        "FRONTIER_HOUSEKEEPING_BATCH": 3,
    })
    ext = FrontierHousekeeping.from_crawler(crawler)
    keeper = ext.housekeeper
    assert (keeper.dead_max, keeper.site_forget_after_ms, keeper.worker_forget_after,
            keeper.batch, keeper.prefix) == (7, 2500, 90.0, 3, "{s}:")
    assert keeper.prefixes == ["{s}:"]
    sharded = FrontierHousekeeping.from_crawler(get_crawler(S, {
        "REDIS_URL": redis_url, "FRONTIER_SHARDS": 3, "FRONTIER_DEAD_LETTERS_MAX": 7,
    })).housekeeper
    assert sharded.prefixes == shard_prefixes("s", 3)
    assert (sharded.dead_max_per_shard, sharded.site_batch) == (3, 67)
    off = get_crawler(S, {"REDIS_URL": redis_url, "FRONTIER_HOUSEKEEPING_INTERVAL": 0})
    with pytest.raises(NotConfigured):
        FrontierHousekeeping.from_crawler(off)


def test_a_sharded_crawl_is_swept_on_a_cluster(redis_cluster_url: str) -> None:
    """Each shard's list and count are in its own slot (on its own master):
    no call crosses slots."""
    cluster = RedisCluster.from_url(redis_cluster_url)
    try:
        frontier = FrontierShards.build(cluster, "s", 3)
        frontier.check_count()
        for shard in frontier:
            for i in range(6):
                shard.dead_letter({"url": f"https://d.example/{i}", "reason": "r", "attempts": 1})
        keeper = Housekeeper(cluster, "s", shards=3, dead_max=6, site_forget_after=0)
        swept = keeper.run()
        assert (swept.dead_trimmed, swept.problems) == (12, ())
        assert keeper.run().dead_trimmed == 0
        spider = StatusReader(cluster, None, "unused", ["s"]).read().spiders["s"]
        assert (spider.shards, spider.dead_letters, spider.dead_trimmed) == (3, 6, 12)
    finally:
        cluster.close()


# -- a worker's own per-site memory ---------------------------------------------------


def crawler_for(redis_url: str, **settings: Any) -> Crawler:
    """A ``pages`` crawler on ``redis_url`` obeying robots.txt, its spider made
    and its stats open: enough to build the worker's middlewares on."""
    crawler = get_crawler(PagesSpider, {"REDIS_URL": redis_url, "ROBOTSTXT_OBEY": True, **settings})
    crawler.spider = crawler._create_spider()
    assert crawler.stats is not None
    crawler.stats.open_spider()
    return crawler


def answer(mw: AdaptiveSlowdownMiddleware, url: str, status: int) -> None:
    """``mw`` sees a response of ``status`` to a request of ``url``."""
    request = Request(url)
    asyncio.run(mw.process_response(request, Response(url, status=status)))


def test_a_forgotten_slow_mark_is_not_written_back_by_a_workers_memory(
    redis_url: str, rds: redis.Redis
) -> None:
    """A site slowed by a 503, then idle: housekeeping deletes its slow mark
    (a forgotten site starts afresh). The worker that slowed it must not
    write three quarters of its own copy of the delay back to Redis at the
    site's next ordinary response: the forgotten mark would come back, and
    the site be crawled slowly again for a dozen responses."""
    mw = AdaptiveSlowdownMiddleware(crawler_for(redis_url, FRONTIER_SITE_FORGET_AFTER=0))
    site = "a.example"
    answer(mw, f"http://{site}/1", 503)
    assert rds.hget("{pages}:slow", site) == b"1000"
    frontier = Frontier(rds, "pages")
    assert frontier.push(b'{"u":"http://a.example/2"}', site=site, priority=0,
                         fingerprint=None, dont_filter=True)
    lease = frontier.lease("w#n:1")
    assert isinstance(lease, Lease)
    frontier.ack([lease.lease_id])
    frontier.release_slots([lease.lease_id])
    rds.hset("{pages}:due", site, 0)  # its last request long ago (no clock to wait for)
    assert Housekeeper(rds, "pages", site_forget_after=0).forget([site]) == (1, [])
    assert not rds.hexists("{pages}:slow", site)
    answer(mw, f"http://{site}/3", 200)  # new work, an ordinary answer
    assert rds.hget("{pages}:slow", site) is None
    # Slowed again, then not heard from for long while another worker
    # slowed it further: it shrinks from what Redis holds, not its copy.
    answer(mw, f"http://{site}/4", 503)
    assert rds.hget("{pages}:slow", site) == b"1000"
    rds.hset("{pages}:slow", site, 8000)
    answer(mw, f"http://{site}/5", 200)
    assert rds.hget("{pages}:slow", site) == b"6000"


def test_sites_no_longer_slowed_leave_the_workers_memory(
    redis_url: str, rds: redis.Redis
) -> None:
    """A site whose slow mark shrank away leaves the worker's memory: it
    holds the sites slowed now, not every site it ever slowed (at 0)."""
    mw = AdaptiveSlowdownMiddleware(crawler_for(redis_url))
    for i in range(50):
        answer(mw, f"http://s{i}.example/", 429)
    assert rds.hlen("{pages}:slow") == 50
    for _ in range(12):  # 1000 ms shrinks by a quarter each time: below 50 ms after 11
        for i in range(50):
            answer(mw, f"http://s{i}.example/", 200)
    assert rds.hlen("{pages}:slow") == 0
    assert len(mw._slow) == 0


def test_sites_left_slowed_leave_the_workers_memory_once_not_heard_from(
    redis_url: str, rds: redis.Redis
) -> None:
    """Sites slowed and never heard from again (they finished slowed) are
    dropped from the worker's memory once their copies are stale (with
    FRONTIER_SITE_FORGET_AFTER = 0, at once); Redis keeps their marks for
    housekeeping to forget."""
    mw = AdaptiveSlowdownMiddleware(crawler_for(redis_url, FRONTIER_SITE_FORGET_AFTER=0))
    for i in range(SITES):
        answer(mw, f"http://s{i}.example/", 503)
    assert rds.hlen("{pages}:slow") == SITES
    assert len(mw._slow) <= 2 * RULES_SWEEP_MIN, len(mw._slow)


# -- round trips -----------------------------------------------------------------------


def fill_for_a_run(rds: redis.Redis, shards: int) -> FrontierShards:
    """A dead worker's record, 25 dead letters and a site idle (due long
    past) in every shard."""
    rds.hset("{s}:workers", "dead", record(time.time() - 2 * 86400))
    frontier = FrontierShards.build(rds, "s", shards)
    for index, shard in enumerate(frontier):
        for i in range(25):
            shard.dead_letter({"url": f"https://d.example/{i}", "reason": "r", "attempts": 3})
        rds.hset(shard.key("due"), f"idle{index}.example", 1)
        rds.hset(shard.key("rdelay"), f"idle{index}.example", 100)
    return frontier


def sent_by_name(proxy: FaultProxy) -> dict[str, int]:
    """Commands the client sent through ``proxy``, by name."""
    counts: dict[str, int] = {}
    for command in proxy.commands():
        name = command.name.decode()
        counts[name] = counts.get(name, 0) + 1
    return counts


def load_scripts(client: Any, keeper: Housekeeper) -> None:
    for lua in (keeper._forget_workers, keeper._trim_dead, keeper._forget_sites):
        client.script_load(lua.source)


@pytest.mark.parametrize("shards", [1, 4])
def test_a_run_takes_three_round_trips_whatever_the_shard_count(
    redis_url: str, rds: redis.Redis, shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round sends its independent calls (every shard's) in one
    pipeline per Redis node, every call once."""
    fill_for_a_run(rds, shards)
    rounds: list[int] = []
    pipelines = housekeeping.node_pipelines

    def counted(client: Any, keys: list[str]) -> Any:
        groups = pipelines(client, keys)
        if keys:
            rounds.append(len(groups))
        return groups

    monkeypatch.setattr(housekeeping, "node_pipelines", counted)
    with FaultProxy(redis_url) as proxy:  # (no fault: it records what is sent)
        client = get_redis(Settings({"REDIS_URL": proxy.url}))
        keeper = Housekeeper(
            client, "s", shards=shards, dead_max=10 * shards, site_forget_after=0
        )
        load_scripts(client, keeper)
        before = sent_by_name(proxy)
        swept = keeper.run()
        after = sent_by_name(proxy)
        client.close()

    assert swept == housekeeping.Swept(1, 15 * shards, shards, ())
    assert rounds == [1, 1, 1]  # three round trips, one pipeline each (one Redis)
    sent = {name: n - before.get(name, 0) for name, n in after.items()}
    # The registry's page, then per shard: trim, cursor, page of due, sweep.
    assert {k: n for k, n in sent.items() if n} == {
        "EVALSHA": 1 + 2 * shards, "HSCAN": 1 + shards, "GET": shards,
    }
    assert not rds.hexists("{s}:workers", "dead")
    for prefix in shard_prefixes("s", shards):
        assert rds.llen(prefix + "dead") == 10 and rds.get(prefix + "dead:trimmed") == b"15"
        assert rds.hlen(prefix + "due") == 0 and rds.hlen(prefix + "rdelay") == 0


def test_scripts_redis_forgot_are_sent_again_alone_and_run_once(
    redis_url: str, rds: redis.Redis
) -> None:
    """After a restart Redis has no scripts: the pipelined calls answer
    NOSCRIPT (they did not run) and each is sent once more alone, loading
    its script."""
    fill_for_a_run(rds, 3)
    rds.script_flush()
    with FaultProxy(redis_url) as proxy:
        client = get_redis(Settings({"REDIS_URL": proxy.url}))
        keeper = Housekeeper(client, "s", shards=3, dead_max=30, site_forget_after=0)
        assert keeper.run() == housekeeping.Swept(1, 45, 3, ())
        first = sent_by_name(proxy)
        assert keeper.run() == housekeeping.Swept(0, 0, 0, ())  # loaded now
        second = sent_by_name(proxy)
        client.close()
    # Each pipelined script call met NOSCRIPT, then went alone: the first of
    # each script loaded it (one SCRIPT LOAD per script), and each ran once.
    assert first["SCRIPT"] == 3
    assert [rds.get(p + "dead:trimmed") for p in shard_prefixes("s", 3)] == [b"15"] * 3
    # The second run: trims and sweeps only (no stale worker left), once each.
    assert second["EVALSHA"] - first["EVALSHA"] == 2 * 3
    assert second["SCRIPT"] == first["SCRIPT"]


def test_a_lost_reply_to_a_round_is_never_resent_by_the_client(
    redis_url: str, rds: redis.Redis
) -> None:
    """The trims' pipeline ran in Redis and its reply was lost: the run
    fails (the extension retries it at its next tick), no call was sent
    twice, and each dead letter trimmed is counted once."""
    fill_for_a_run(rds, 3)
    rds.script_flush()
    with FaultProxy(redis_url) as proxy:
        client = get_redis(Settings({"REDIS_URL": proxy.url}))  # the workers' client
        keeper = Housekeeper(client, "s", shards=3, dead_max=30, site_forget_after=0)
        load_scripts(client, keeper)  # (through the proxy, which learns their SHA1s)
        trim = (PROJECT_LUA / "trim_dead.lua").read_bytes()
        rule = proxy.lose_replies(script=trim, skip=2)  # the last shard's trim
        with pytest.raises(redis.ConnectionError):
            keeper.run()
        assert rule.acted == 1
        assert len(proxy.commands(script=trim)) == 3  # one per shard, none resent
        assert len(proxy.commands("GET")) == 3  # the cursors, in the same round
        assert proxy.commands("HSCAN")[1:] == []  # (only the registry's page)
        counted = [rds.get(p + "dead:trimmed") for p in shard_prefixes("s", 3)]
        assert counted == [b"15"] * 3  # every trim ran once
        swept = keeper.run()  # the next tick
        client.close()
    assert (swept.workers, swept.dead_trimmed, swept.sites) == (1, 0, 3)
    assert [rds.get(p + "dead:trimmed") for p in shard_prefixes("s", 3)] == [b"15"] * 3
