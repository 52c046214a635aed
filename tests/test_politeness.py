"""Polite and fair at any number of workers, measured from the server's side."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
import redis
from scrapy.utils.test import get_crawler

from crawler.politeness import AdaptiveSlowdownMiddleware
from devtools.replay import Hit, Page, generated_site
from tests.workers import PROJECT_DIR, crawl

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import SiteFactory

HTML = [("Content-Type", "text/html")]


def max_in_window(hits: list[Hit], window: float = 1.0) -> int:
    """Most requests that started within any ``window`` seconds."""
    starts = sorted(h.started for h in hits)
    best, j = 0, 0
    for i, start in enumerate(starts):
        while start - starts[j] >= window:
            j += 1
        best = max(best, i - j + 1)
    return best


def pages_of(hits: list[Hit]) -> list[Hit]:
    return [h for h in hits if h.path != "/robots.txt"]


@pytest.mark.workers
def test_rate_and_concurrency_hold_for_the_cluster_unlike_stock_scrapy_redis(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, capsys: Any
) -> None:
    limits = {"DOWNLOAD_DELAY": 0.25, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
    site = generated_site(30)
    rds = redis.Redis.from_url(env["REDIS_URL"])
    # The same crawl for both: every page seeded, four workers, same limits.
    ours = site_factory(site, latency=0.05)
    rds.lpush("pages:start_urls", *[ours.url_for(path) for path in site])
    crawl("pages", env, tmp_path, workers=4, settings=limits)

    stock = site_factory(site, latency=0.05)
    rds.lpush("stockpages:start_urls", *[stock.url_for(path) for path in site])
    stock_env = {**env, "SCRAPY_SETTINGS_MODULE": "tests.stock.settings"}
    crawl("stockpages", stock_env, tmp_path, workers=4,
          settings={**limits, "MAX_IDLE_TIME_BEFORE_CLOSE": 10})

    ours_hits, stock_hits = pages_of(ours.hits()), pages_of(stock.hits())
    figures = {
        "ours": (max_in_window(ours_hits), ours.max_concurrency()),
        "stock": (max_in_window(stock_hits), stock.max_concurrency()),
    }
    with capsys.disabled():
        print(f"\nmost requests in 1 s, most at once (limit 4, 2): {figures}")
    assert len({h.path for h in ours_hits}) == 31
    assert figures["ours"][0] <= 4
    assert figures["ours"][1] <= 2
    assert figures["stock"][0] > 4 or figures["stock"][1] > 2


@pytest.mark.workers
def test_small_sites_finish_before_a_big_one_is_half_done(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path
) -> None:
    big = site_factory(generated_site(2000), host="127.0.0.2")
    small = [site_factory(generated_site(20), host=f"127.0.0.{i}") for i in range(3, 8)]
    rds = redis.Redis.from_url(env["REDIS_URL"])
    rds.lpush("pages:start_urls", big.url_for("/"), *[s.url_for("/") for s in small])

    crawl("pages", env, tmp_path, workers=4, settings={"ROBOTSTXT_OBEY": False})

    big_hits = sorted(h.started for h in big.hits())
    assert len(big_hits) == 2001
    half_done = big_hits[1000]
    for site in small:
        hits = sorted(h.started for h in site.hits())
        assert len(hits) == 21
        assert hits[-1] < half_done


@pytest.mark.workers
def test_higher_priority_seeds_first_equal_priorities_in_push_order(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path
) -> None:
    leaves = {f"/{p}{i}": Page(200, HTML, b"<title>leaf</title>") for p in "ab" for i in range(15)}
    site = site_factory(leaves)
    rds = redis.Redis.from_url(env["REDIS_URL"])
    # Pushed into a stopped crawl: priority 0 first, then priority 9.
    for p, priority in (("a", 0), ("b", 9)):
        for i in range(15):
            rds.lpush("pages:start_urls",
                      json.dumps({"url": site.url_for(f"/{p}{i}"), "priority": priority}))

    crawl("pages", env, tmp_path, workers=4,
          settings={"CONCURRENT_REQUESTS_PER_DOMAIN": 1})

    order = [h.path for h in sorted(pages_of(site.hits()), key=lambda h: h.started)]
    assert order == [f"/b{i}" for i in range(15)] + [f"/a{i}" for i in range(15)]


@pytest.mark.workers
def test_crawl_delay_holds_all_workers_together(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, mongo_uri: str, mongo_db: str
) -> None:
    pages = {f"/{i}": Page(200, HTML, b"<title>p</title>") for i in range(5)}
    pages["/robots.txt"] = Page(200, [("Content-Type", "text/plain")],
                                b"User-agent: *\nCrawl-delay: 2\n")
    site = site_factory(pages)
    rds = redis.Redis.from_url(env["REDIS_URL"])
    rds.lpush("pages:start_urls", *[site.url_for(f"/{i}") for i in range(5)])

    crawl("pages", env, tmp_path, workers=3, settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 4})

    assert pymongo.MongoClient(mongo_uri)[mongo_db].pages.count_documents({}) == 5
    hits = site.hits()
    assert [h.path for h in hits].count("/robots.txt") == 1  # once for the cluster
    starts = sorted(h.started for h in pages_of(hits))
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 4
    assert min(gaps) >= 2.0, gaps


def test_429_and_503_slow_a_site_for_every_worker(redis_url: str) -> None:
    from scrapy import Request, Spider
    from scrapy.http import Response

    class _Spider(Spider):
        name = "t"

    crawler = get_crawler(_Spider, {"REDIS_URL": redis_url})
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    mw = AdaptiveSlowdownMiddleware.from_crawler(crawler)
    rds = redis.Redis.from_url(redis_url)
    request = Request("http://a.example/")

    def answer(status: int) -> float:
        asyncio.run(mw.process_response(request, Response(request.url, status=status)))
        return float(rds.hget("{t}:slow", "a.example") or 0)

    assert answer(429) == 1000
    assert answer(503) == 2000
    assert answer(200) == 1500
    # Another worker's 429 doubles what is in Redis, not what it knew.
    rds.hset("{t}:slow", "a.example", 8000)
    assert answer(429) == 16000


@pytest.mark.workers
def test_the_adaptive_slowdown_makes_no_redis_call_on_the_reactor_thread(redis_url: str) -> None:
    """On a running reactor, every Redis command the slowdown sends runs in
    the reactor's thread pool (recorded per command by a hook on redis-py's
    connection), and it still slows the site as on no reactor; two 429s of
    a site answered at once double its delay twice (one at a time)."""
    run = subprocess.run(
        [sys.executable, "-m", "tests.slowdown_threads", redis_url],
        cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60, check=False,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert "error" not in out, out["error"]
    assert out["on_reactor"] is True
    assert out["a"] == [1000, 2000, 1500]
    assert out["b"] == 2000
    names = [name for _, name in out["commands"]]
    assert "HGET" in names and "HSET" in names, names
    assert all(thread != out["reactor"] for thread, _ in out["commands"]), out["commands"]
