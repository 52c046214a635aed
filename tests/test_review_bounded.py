"""Review of issue 13's "Bounded state" on the workers' side: held-back cases.

Housekeeping bounds what Redis holds per site; these tests check that a
worker's own per-site memory is bounded too, and agrees with Redis once
a site was forgotten. Real Redis (the session's server), the middlewares
built on a Scrapy crawler, no mocks.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from crawler.frontier.housekeeping import Housekeeper
from crawler.frontier.store import Frontier, Lease
from crawler.politeness import (
    RULES_SWEEP_MIN,
    AdaptiveSlowdownMiddleware,
    SharedRobotsTxtMiddleware,
)
from crawler.spiders.pages import PagesSpider

if TYPE_CHECKING:
    import redis
    from scrapy.crawler import Crawler

SITES = 3 * RULES_SWEEP_MIN


def crawler_for(redis_url: str, **settings: Any) -> Crawler:
    crawler = get_crawler(PagesSpider, {"REDIS_URL": redis_url, "ROBOTSTXT_OBEY": True, **settings})
    crawler.spider = crawler._create_spider()
    assert crawler.stats is not None
    crawler.stats.open_spider()
    return crawler


def store_robots(rds: redis.Redis, n: int) -> None:
    """robots.txt of sites ``s<i>.example`` in Redis, as a worker stores it."""
    stamp = time.time()
    rds.hset("{pages}:robots", mapping={
        f"s{i}.example": f"{stamp}\nUser-agent: *\nDisallow: /private/\n" for i in range(n)
    })


def hgets(rds: redis.Redis) -> int:
    return int(rds.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))


def test_a_worker_drops_the_expired_robots_rules_of_sites_it_no_longer_crawls(
    redis_url: str, rds: redis.Redis
) -> None:
    """Each site's parsed robots.txt (about 1.5 KB) was kept in the worker
    forever, even once expired (then Redis is read again anyway): a worker
    that met a million sites held a million parsers. With
    FRONTIER_SITE_FORGET_AFTER = 0 every copy expires at once: the worker
    keeps a bounded number of them, and still obeys every site's rules."""
    store_robots(rds, SITES)
    mw = SharedRobotsTxtMiddleware(crawler_for(redis_url, FRONTIER_SITE_FORGET_AFTER=0))

    async def run() -> None:
        for i in range(SITES):
            await mw.process_request(Request(f"http://s{i}.example/"))
        with pytest.raises(IgnoreRequest):
            await mw.process_request(Request("http://s0.example/private/x"))

    asyncio.run(run())
    assert len(mw._rules) <= 2 * RULES_SWEEP_MIN, len(mw._rules)


def test_fresh_robots_rules_are_kept_whatever_their_number(
    redis_url: str, rds: redis.Redis
) -> None:
    """The other side: copies still fresh are never dropped (no Redis read
    for a site used again within FRONTIER_SITE_FORGET_AFTER / 2)."""
    store_robots(rds, SITES)
    mw = SharedRobotsTxtMiddleware(crawler_for(redis_url))

    async def run() -> None:
        for i in range(SITES):
            await mw.process_request(Request(f"http://s{i}.example/"))

    asyncio.run(run())
    assert len(mw._rules) == SITES
    before = hgets(rds)
    asyncio.run(run())
    assert hgets(rds) == before


def answer(mw: AdaptiveSlowdownMiddleware, url: str, status: int) -> None:
    request = Request(url)
    mw.process_response(request, Response(url, status=status))


def test_a_forgotten_slow_mark_is_not_written_back_by_a_workers_memory(
    redis_url: str, rds: redis.Redis
) -> None:
    """A site slowed by a 503, then idle: housekeeping deletes its slow mark
    (a forgotten site starts afresh). The worker that slowed it kept its
    own copy of the delay and wrote three quarters of it back to Redis at
    the site's next ordinary response: the forgotten mark came back, and
    the site was crawled slowly again for a dozen responses."""
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
    """Every site a worker ever slowed stayed in its memory (at 0 once
    cleared): bounded by the sites slowed now."""
    mw = AdaptiveSlowdownMiddleware(crawler_for(redis_url))
    for i in range(50):
        answer(mw, f"http://s{i}.example/", 429)
    assert rds.hlen("{pages}:slow") == 50
    for _ in range(12):  # 1000 ms shrinks by a quarter each time: below 50 ms after 11
        for i in range(50):
            answer(mw, f"http://s{i}.example/", 200)
    assert rds.hlen("{pages}:slow") == 0
    assert len(mw._slow) == 0


def test_dead_letters_listed_requeued_purged_after_trimming_the_count_stays(
    rds: redis.Redis,
) -> None:
    """Three shards, 300 dead letters of 60 sites, capped at 10 (4 a shard):
    the status counts what was trimmed; ``deadletters list``, ``requeue`` and
    ``purge`` act on the 12 kept; the count of the trimmed ones outlives a
    purge (it says what was lost, not what is left)."""
    from crawler.commands.deadletters import dead_letters, purge, requeue
    from crawler.frontier.shards import FrontierShards
    from crawler.status import StatusReader

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


def test_a_site_whose_only_work_waits_in_the_retry_set_is_not_forgotten(
    rds: redis.Redis,
) -> None:
    """A 503 with Retry-After: 600 slowed the site and sent its request to the
    retry set; the operator forgets sites after 300 s. 301 s after its last
    request, the site still has work (due in 299 s) and is forgotten: the
    retry reaches the site without the slow mark the 503 set."""
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
