"""``DOWNLOAD_DELAY_JITTER`` (Scrapy's default 0.5; the deprecated
``RANDOMIZE_DOWNLOAD_DELAY``) and ``DOWNLOAD_SLOTS``' ``jitter`` (the
deprecated ``randomize_delay``) hold for the whole cluster: each gap between
two leases of a site is drawn in [1, 1 + jitter) times its delay (stretched
by ``FRONTIER_DELAY_MARGIN``), so the delay stays the floor however many
workers run; with no jitter the gap is the delay."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.settings import Settings

from crawler.frontier.slots import SitePolicy
from devtools.replay import Page
from tests.scheduler_harness import finish, lease_all, open_scheduler
from tests.test_scrapy_politeness import HTML, ROBOTS, gaps_of, pages_of
from tests.workers import crawl

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import SiteFactory


class _Spider(Spider):
    name = "t"

    def parse(self, response: Any) -> None:
        pass


ADDON = {"ADDONS": {"crawler.addon.FrontierAddon": 0},
         "FRONTIER_DELAY": None, "FRONTIER_CONCURRENCY": None,
         "FRONTIER_DELAY_MARGIN": 0.1}


def paces_of(redis_url: str, rds: redis.Redis, site: str, n: int, **settings: Any) -> list[int]:
    """The pace (ms from the lease to the site's next due time) that each of
    ``n`` leases of ``site`` set, the delay made to pass between them."""
    scheduler, _ = open_scheduler(redis_url, _Spider, **{**ADDON, **settings})
    for i in range(n):
        scheduler.enqueue_request(Request(f"https://{site}/{i}"))
    assert scheduler.flush_outbox()
    paces = []
    for _ in range(n):
        seconds, micros = rds.time()
        before = int(seconds) * 1000 + int(micros) // 1000
        [request] = lease_all(scheduler)
        seconds, micros = rds.time()
        after = int(seconds) * 1000 + int(micros) // 1000
        due = int(rds.hget("{t}:due", site) or 0)
        paces.append(due - (before + after) // 2)
        rds.hset("{t}:due", site, 0)  # the delay has passed
        finish(scheduler, request)
        rds.hset("{t}:due", site, 0)
        rds.zadd("{t}:wait", {site: 0}, xx=True)
    return paces


def test_download_delay_jitter_draws_each_gap_between_the_delay_and_one_and_a_half_times_it(
    redis_url: str, rds: redis.Redis
) -> None:
    """``DOWNLOAD_DELAY = 1`` with Scrapy's default jitter (0.5): each
    lease sets the site due 1.1 to 1.65 s later (1 to 1.5 times the delay,
    times the margin), not the same each time."""
    paces = paces_of(redis_url, rds, "a.example", 12, DOWNLOAD_DELAY=1,
                     DOWNLOAD_DELAY_JITTER=0.5, CONCURRENT_REQUESTS_PER_DOMAIN=1)
    assert all(1090 <= p <= 1660 for p in paces), paces
    assert max(paces) - min(paces) > 100, paces


def test_without_jitter_each_gap_is_the_delay(
    redis_url: str, rds: redis.Redis
) -> None:
    paces = paces_of(redis_url, rds, "a.example", 6, DOWNLOAD_DELAY=1,
                     DOWNLOAD_DELAY_JITTER=0, CONCURRENT_REQUESTS_PER_DOMAIN=1)
    assert all(1090 <= p <= 1110 for p in paces), paces


@pytest.mark.parametrize(("default", "slot", "spread"), [(0.5, 0, False), (0, 0.5, True)])
def test_a_download_slots_jitter_wins_over_the_default(
    redis_url: str, rds: redis.Redis, default: float, slot: float, spread: bool
) -> None:
    slots = {"a.example": {"delay": 1, "concurrency": 1, "jitter": slot}}
    paces = paces_of(redis_url, rds, "a.example", 12, DOWNLOAD_DELAY_JITTER=default,
                     DOWNLOAD_SLOTS=slots)
    assert all(1090 <= p <= 1660 for p in paces), paces
    assert (max(paces) - min(paces) > 100) is spread, paces


def crawl_gaps(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, randomize: bool
) -> list[float]:
    """Two workers crawl 8 pages of one host whose ``DOWNLOAD_SLOTS`` entry
    has delay 1 s and a jitter of 0.5 or 0; the gaps between the pages'
    starts at the HTTP server, s."""
    pages = {f"/r{i}": Page(200, HTML, b"<title>r</title>") for i in range(8)}
    site = site_factory({**pages, "/robots.txt": ROBOTS}, host="127.0.0.2", latency=0.05)
    rds = redis.Redis.from_url(env["REDIS_URL"])
    rds.lpush("pages:start_urls", *[site.url_for(p) for p in pages])
    workers = crawl("pages", env, tmp_path, workers=2, settings={
        "DOWNLOAD_SLOTS": json.dumps(
            {"127.0.0.2": {"delay": 1, "concurrency": 1, "jitter": 0.5 if randomize else 0}}
        ),
        "MAX_IDLE_TIME_BEFORE_CLOSE": 3,
    })
    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    hits = pages_of(site.hits())
    assert len({h.path for h in hits}) == 8
    rds.flushdb()
    return gaps_of(hits)


@pytest.mark.workers
def test_two_workers_keep_a_randomized_slot_delay_as_the_floor(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, capsys: Any
) -> None:
    """Delay 1 s, jitter 0.5: no two pages closer than 0.9 s,
    and the gaps spread over more than 0.1 s; jitter 0: every gap about 1 s."""
    random_gaps = crawl_gaps(env, site_factory, tmp_path, randomize=True)
    fixed_gaps = crawl_gaps(env, site_factory, tmp_path, randomize=False)
    with capsys.disabled():
        print(f"\nrandomized gaps {[round(g, 3) for g in random_gaps]}; "
              f"fixed gaps {[round(g, 3) for g in fixed_gaps]}")
    assert min(random_gaps) >= 0.9, random_gaps
    assert max(random_gaps) - min(random_gaps) > 0.1, random_gaps
    assert all(0.9 <= g <= 1.5 for g in fixed_gaps), fixed_gaps


@pytest.mark.parametrize(("settings", "jitter", "slot"), [
    ({}, 0.5, None),
    ({"RANDOMIZE_DOWNLOAD_DELAY": False}, 0.0, None),
    ({"DOWNLOAD_DELAY_JITTER": 0.2}, 0.2, None),
    ({"DOWNLOAD_SLOTS": {"a.example": {"randomize_delay": False}}}, 0.5, 0.0),
    ({"DOWNLOAD_SLOTS": {"a.example": {"jitter": 0.3, "randomize_delay": False}}}, 0.5, 0.3),
])
def test_the_jitter_is_read_as_scrapys_downloader_reads_it(
    settings: dict[str, Any], jitter: float, slot: float | None
) -> None:
    """Scrapy's names, deprecated ones included (0.5 or 0)."""
    policy = SitePolicy.from_settings(Settings({**settings}, priority="project"))
    assert policy.jitter == jitter
    assert policy.slot_jitter.get("a.example") == slot
