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
from scrapy.utils.test import get_crawler

from crawler.politeness import RULES_SWEEP_MIN, SharedRobotsTxtMiddleware
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
