"""robots.txt kept small, in Redis and in each worker.

In Redis it is stored compact, only the group protego picks for our agent:
:func:`crawler.politeness.compact_robots` must give the same decisions
(allowed or not, Crawl-delay, Request-rate) as the full body for the
crawl's user agent, in a few KiB where the body had hundreds. In a worker,
:class:`~crawler.politeness.SharedRobotsTxtMiddleware` keeps the parsed
rules of a bounded number of sites once their copies expire (real Redis,
the middleware built on a Scrapy crawler).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING

import pytest
from protego import Protego
from scrapy import Request
from scrapy.exceptions import IgnoreRequest

from crawler.politeness import (
    ROBOTS_MAX_BYTES,
    RULES_SWEEP_MIN,
    SharedRobotsTxtMiddleware,
    compact_robots,
)
from tests.test_housekeeping import SITES, crawler_for

if TYPE_CHECKING:
    import redis

AGENT = "crawler (+https://docs.scrapy.org/en/latest/topics/practices.html)"


def big_robots(ours: str | None, size: int = 400 * 1024) -> str:
    """A robots.txt of about ``size`` bytes: many groups of other agents,
    with our group (``User-agent: <ours>``) in the middle when given."""
    rnd = random.Random(13)
    parts: list[str] = ["# a large robots.txt\nSitemap: https://x.example/sitemap.xml\n"]
    n = 0
    while sum(map(len, parts)) < size:
        n += 1
        if ours is not None and n == 400:
            parts.append(
                f"User-agent: Other-{n}\nUser-agent: {ours}\n"
                "Disallow: /private/\nAllow: /private/open$\nAllow: /private/dir/index.html\n"
                "Disallow: /*.pdf$\nDisallow: /tmp  # comment\ndisalow: /misspelt\n"
                "Crawl-delay: 2.5\nRequest-rate: 3/10s\n\n"
            )
            continue
        rules = "".join(
            f"{rnd.choice(['Allow', 'Disallow'])}: /{rnd.randrange(10**6)}/"
            f"{'*' * rnd.randrange(2)}\n"
            for _ in range(20)
        )
        parts.append(f"User-agent: bot-{n}\n{rules}Crawl-delay: {n % 7}\n\n")
    if ours is None or ours != "*":
        parts.append("User-agent: *\nDisallow: /star-only/\nCrawl-delay: 9\n")
    return "".join(parts)


URLS = [
    f"https://x.example{path}"
    for path in (
        "/", "/private/", "/private/x", "/private/open", "/private/open2", "/private/dir/",
        "/private/dir/index.html", "/private/dir/other", "/a.pdf", "/a.pdf?x", "/tmp",
        "/tmpx", "/misspelt/1", "/star-only/", "/robots.txt", "/123/", "/%7Euser",
        "/private/%7E", "/ok",
    )
]


@pytest.mark.parametrize("ours", ["crawler", "*", None], ids=["named", "star", "none"])
def test_compact_robots_gives_the_same_answers_in_a_few_kib(ours: str | None) -> None:
    full = big_robots(ours)
    assert len(full.encode()) >= 400 * 1024
    compact = compact_robots(full.encode(), AGENT)
    assert len(compact) < 2048, compact[:300]
    before, after = Protego.parse(full), Protego.parse(compact.decode())
    for url in URLS:
        assert before.can_fetch(url, AGENT) == after.can_fetch(url, AGENT), url
    assert before.crawl_delay(AGENT) == after.crawl_delay(AGENT)
    assert before.request_rate(AGENT) == after.request_rate(AGENT)
    if ours == "crawler":
        assert not after.can_fetch("https://x.example/private/x", AGENT)
        assert after.can_fetch("https://x.example/private/open", AGENT)
        assert after.crawl_delay(AGENT) == 2.5
    if ours is None:  # only "*" applies
        assert not after.can_fetch("https://x.example/star-only/", AGENT)
        assert after.crawl_delay(AGENT) == 9


def test_robots_without_a_group_for_us_compacts_to_nothing() -> None:
    body = b"User-agent: otherbot\nDisallow: /\n"
    assert compact_robots(body, AGENT) == b""
    assert Protego.parse("").can_fetch("https://x.example/", AGENT)


def test_compact_robots_stays_under_the_cap() -> None:
    body = "User-agent: *\n" + "".join(f"Disallow: /{i:09d}/\n" for i in range(40_000))
    compact = compact_robots(body.encode(), AGENT)
    assert len(body) > ROBOTS_MAX_BYTES >= len(compact)
    assert compact.endswith(b"\n")


# -- a worker's parsed rules -------------------------------------------------------


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
    """A worker keeps each site's parsed robots.txt (about 1.5 KB) only while
    it is fresh (an expired copy is read from Redis again anyway), not for
    every site it ever met. With FRONTIER_SITE_FORGET_AFTER = 0 every copy
    expires at once: the worker keeps a bounded number of them, and still
    obeys every site's rules."""
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
