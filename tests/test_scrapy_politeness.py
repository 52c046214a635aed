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
import warnings
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.robotstxt import ProtegoRobotParser
from scrapy.utils.misc import build_from_crawler

from crawler import settings as project_settings
from crawler.frontier.slots import FrontierDownloader
from crawler.politeness import SharedRobotsTxtMiddleware
from devtools.replay import Hit, Page, generated_site
from tests.scheduler_harness import finish, lease_all, open_scheduler
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


class _Spider(Spider):
    name = "t"

    def parse(self, response: Any) -> None:
        pass


class _PoliteSpider(_Spider):
    download_delay = 1
    max_concurrent_requests = 2


#: The frontier as crawler/settings.py sets it up: its add-on, the cluster's
#: delay and concurrency left to Scrapy's settings.
ADDON = {"ADDONS": {"crawler.addon.FrontierAddon": 0},
         "FRONTIER_DELAY": None, "FRONTIER_CONCURRENCY": None}


def due_in_ms(rds: redis.Redis, site: str) -> int:
    seconds, micros = rds.time()
    return int(rds.hget("{t}:due", site) or 0) - (int(seconds) * 1000 + int(micros) // 1000)


def test_a_spiders_download_delay_and_max_concurrent_requests_hold_for_the_cluster(
    redis_url: str, rds: redis.Redis
) -> None:
    """``download_delay = 1`` and ``max_concurrent_requests = 2`` on the
    spider are the site's pace and capacity in Redis, without Scrapy's
    warning that they are ignored, and the worker's downloader adds no
    delay of its own."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler, crawler = open_scheduler(redis_url, _PoliteSpider, **ADDON)
    assert not [w for w in caught if "ignored" in str(w.message)], [str(w.message) for w in caught]
    for i in range(4):
        scheduler.enqueue_request(Request(f"https://a.example/{i}"))
    assert scheduler.flush_outbox()
    [first] = lease_all(scheduler)
    assert 1000 <= due_in_ms(rds, "a.example") <= 1100  # 1 s, times FRONTIER_DELAY_MARGIN
    assert rds.hget("{t}:active", "a.example") == b"1"
    rds.hset("{t}:due", "a.example", 0)  # the delay has passed
    rds.zadd("{t}:wait", {"a.example": 0}, xx=True)
    assert len(lease_all(scheduler)) == 1  # a second one: concurrency 2
    rds.hset("{t}:due", "a.example", 0)
    rds.zadd("{t}:wait", {"a.example": 0}, xx=True)
    assert lease_all(scheduler) == []  # a third would be over 2 at once
    finish(scheduler, first)
    slot = FrontierDownloader(crawler)._get_slot(first)[1]
    assert (slot.delay, slot.jitter) == (0.0, 0.0)


def test_meta_download_slot_is_the_requests_site(redis_url: str, rds: redis.Redis) -> None:
    """Requests to two hosts that share ``meta["download_slot"]`` share one
    site in the frontier: ``DOWNLOAD_SLOTS``' concurrency 1 for that slot
    holds across both hosts, and a leased request carries its slot."""
    scheduler, _ = open_scheduler(
        redis_url, _Spider, **ADDON, DOWNLOAD_SLOTS={"shared": {"concurrency": 1}}
    )
    for host in ("a.example", "b.example"):
        scheduler.enqueue_request(Request(f"https://{host}/x", meta={"download_slot": "shared"}))
    assert scheduler.flush_outbox()
    assert rds.hget("{t}:conc", "shared") == b"1"
    [first] = lease_all(scheduler)
    assert first.meta["download_slot"] == "shared"
    finish(scheduler, first)
    [second] = lease_all(scheduler)
    assert {first.url, second.url} == {"https://a.example/x", "https://b.example/x"}


def test_a_slot_name_the_frontier_cannot_keep_is_refused_with_one_line(
    redis_url: str, caplog: Any
) -> None:
    scheduler, crawler = open_scheduler(redis_url, _Spider, **ADDON)
    assert not scheduler.enqueue_request(Request("https://a.example/", meta={"download_slot": 3}))
    assert not scheduler.enqueue_request(
        Request("https://a.example/", meta={"download_slot": "a\tb"})
    )
    assert crawler.stats.get_value("scheduler/unencodable") == 2
    assert "meta['download_slot'] must be text" in caplog.text


def test_scrapys_robots_middleware_lets_a_site_reach_its_full_concurrency(
    redis_url: str, rds: redis.Redis
) -> None:
    """``ROBOTSTXT_OBEY`` with Scrapy's own RobotsTxtMiddleware (ours off):
    the frontier does not serve the site one request at a time waiting for a
    robots.txt that only our middleware would store."""
    scheduler, _ = open_scheduler(
        redis_url, _Spider, **ADDON, ROBOTSTXT_OBEY=True, CONCURRENT_REQUESTS_PER_DOMAIN=4,
        DOWNLOADER_MIDDLEWARES={SCRAPY_ROBOTS: 100, OUR_ROBOTS: None},
    )
    for i in range(6):
        scheduler.enqueue_request(Request(f"https://a.example/{i}"))
    assert scheduler.flush_outbox()
    assert len(lease_all(scheduler)) == 4


def test_our_robots_middleware_opens_the_gate_of_a_slot_that_is_not_a_host(
    redis_url: str, rds: redis.Redis
) -> None:
    """With SharedRobotsTxtMiddleware, a ``meta["download_slot"]`` site is
    served one at a time until the robots.txt of a host it serves is known,
    then at its full concurrency (the host's Crawl-delay with it)."""
    scheduler, crawler = open_scheduler(
        redis_url, _Spider, **ADDON, ROBOTSTXT_OBEY=True, CONCURRENT_REQUESTS_PER_DOMAIN=4,
        DOWNLOADER_MIDDLEWARES={SCRAPY_ROBOTS: None, OUR_ROBOTS: 100},
    )
    for i in range(6):
        scheduler.enqueue_request(Request(f"https://a.example/{i}", meta={"download_slot": "g"}))
    assert scheduler.flush_outbox()
    [first] = lease_all(scheduler)  # robots.txt not known yet: one at a time
    assert lease_all(scheduler) == []
    middleware = build_from_crawler(SharedRobotsTxtMiddleware, crawler)
    rules = ProtegoRobotParser(b"User-agent: *\nAllow: /\n", None)
    middleware._open_gate("g", rules, first)
    finish(scheduler, first)
    assert len(lease_all(scheduler)) == 4
    assert rds.hget("{t}:robots", "\tg") == b"1"
