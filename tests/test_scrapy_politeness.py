"""Scrapy's own politeness settings hold for the whole cluster of workers.

``DOWNLOAD_DELAY``, ``CONCURRENT_REQUESTS_PER_DOMAIN``, ``DOWNLOAD_SLOTS``,
the spider's ``download_delay`` and ``max_concurrent_requests`` and
``meta["download_slot"]``: a request's site is the download slot Scrapy's
downloader gives it, and that slot's delay and concurrency are kept by all
workers together, measured at the HTTP server.
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from crawler import settings as project_settings
from crawler.frontier.sites import SLOT_META, slot_of
from crawler.frontier.slots import FrontierDownloader, SitePolicy
from devtools.replay import Hit, Page, generated_site
from tests.workers import crawl

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import SiteFactory

HTML = [("Content-Type", "text/html")]
ROBOTS = Page(200, [("Content-Type", "text/plain")], b"User-agent: *\nAllow: /\n")
SCRAPY_ROBOTS = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"
OUR_ROBOTS = "crawler.politeness.SharedRobotsTxtMiddleware"


def pages_of(hits: list[Hit]) -> list[Hit]:
    return [h for h in hits if h.path != "/robots.txt"]


def most_in_flight(hits: list[Hit]) -> int:
    """Most of ``hits`` being served at once, from their start and end times."""
    events = sorted(
        [(h.started, 1) for h in hits] + [(h.finished, -1) for h in hits],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def gaps_of(hits: list[Hit]) -> list[float]:
    starts = sorted(h.started for h in hits)
    return [b - a for a, b in itertools.pairwise(starts)]


def with_scrapy_robots() -> str:
    """The project's DOWNLOADER_MIDDLEWARES with Scrapy's own robots.txt
    middleware enabled instead of ours, as JSON for ``-s``."""
    middlewares: dict[str, Any] = dict(project_settings.DOWNLOADER_MIDDLEWARES)
    middlewares[SCRAPY_ROBOTS] = 100
    middlewares[OUR_ROBOTS] = None
    return json.dumps(middlewares)


@pytest.mark.workers
def test_download_slots_hold_for_two_workers_with_scrapys_robots_middleware(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, capsys: Any
) -> None:
    """Two workers, ``DOWNLOAD_SLOTS`` delay 1.5 s and concurrency 1 on one
    host: never 2 of its pages in flight, no two closer than 1.35 s; another
    host at concurrency 4 (``CONCURRENT_REQUESTS_PER_DOMAIN``) reaches 3 or
    4 in flight, with Scrapy's own robots.txt middleware and
    ``ROBOTSTXT_OBEY = True``."""
    slow_pages = {f"/s{i}": Page(200, HTML, b"<title>s</title>") for i in range(7)}
    slow = site_factory({**slow_pages, "/robots.txt": ROBOTS}, host="127.0.0.2", latency=0.2)
    fast = site_factory(
        {**generated_site(30), "/robots.txt": ROBOTS}, host="127.0.0.3", latency=0.3
    )
    rds = redis.Redis.from_url(env["REDIS_URL"])
    rds.lpush("pages:start_urls", fast.url_for("/"), *[slow.url_for(p) for p in slow_pages])

    workers = crawl("pages", env, tmp_path, workers=2, settings={
        "ROBOTSTXT_OBEY": True,
        "DOWNLOADER_MIDDLEWARES": with_scrapy_robots(),
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "DOWNLOAD_SLOTS": json.dumps({"127.0.0.2": {"delay": 1.5, "concurrency": 1}}),
        "MAX_IDLE_TIME_BEFORE_CLOSE": 4,
    })

    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    slow_hits, fast_hits = pages_of(slow.hits()), pages_of(fast.hits())
    gaps = gaps_of(slow_hits)
    with capsys.disabled():
        print(f"\nDOWNLOAD_SLOTS host: most in flight {most_in_flight(slow_hits)}, "
              f"smallest gap {min(gaps):.3f} s; other host: most in flight "
              f"{most_in_flight(fast_hits)}; pages per worker "
              f"{[w.stats.get('downloader/response_count', 0) for w in workers]}")
    assert len({h.path for h in slow_hits}) == 7
    assert len({h.path for h in fast_hits}) == 31
    assert most_in_flight(slow_hits) == 1
    assert min(gaps) >= 1.35, gaps
    assert most_in_flight(fast_hits) in (3, 4)
