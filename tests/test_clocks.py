"""One clock decides order and liveness (issue 29, item 5: skewed clocks).

A worker whose clock is off stamps what it stores and its heartbeats with
its clock corrected by its offset to the servers' (crawler.frontier.clock),
so a worker an hour fast neither hides the newer content of correct workers
(``mongo/stale``) nor stores a time in the future.
"""

from __future__ import annotations

import glob
import json
import logging
import shutil
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
import redis
from scrapy.settings import Settings

from crawler.frontier.clock import CLOCK, Clock, configure
from devtools.replay import Page
from tests.workers import crawl

if TYPE_CHECKING:
    from pathlib import Path

HOUR = 3600.0


def _faketime_env(offset: str) -> dict[str, str]:
    """The environment that runs a process with its clock moved by
    ``offset`` (libfaketime, e.g. ``"+1h"``); skips when it is missing."""
    libs = glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1") + glob.glob(
        "/usr/lib/faketime/libfaketimeMT.so.1"
    )
    if shutil.which("faketime") is None or not libs:
        pytest.skip("libfaketime is not installed (Debian package faketime: make faketime)")
    return {"LD_PRELOAD": libs[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def _page(title: str) -> Page:
    body = f"<html><head><title>{title}</title></head><body><p>{title}</p></body></html>"
    return Page(200, [("Content-Type", "text/html")], body.encode())


def _datetimes(value: Any) -> list[datetime]:
    """Every datetime in a stored document, nested ones included."""
    if isinstance(value, datetime):
        return [value]
    if isinstance(value, dict):
        return [d for v in value.values() for d in _datetimes(v)]
    if isinstance(value, list):
        return [d for v in value for d in _datetimes(v)]
    return []


@pytest.mark.workers
@pytest.mark.faults
def test_a_worker_an_hour_fast_neither_hides_later_content_nor_stores_the_future(
    env: dict[str, str], rds: redis.Redis, db: Any, mongo_uri: str, site_factory: Any,
    tmp_path: Path,
) -> None:
    fast_env = {**env, **_faketime_env("+1h")}
    pages = {"/": _page("first version")}
    site = site_factory(pages)
    site.conditional_get = False
    url = f"{site.url}/" if not site.url.endswith("/") else site.url
    settings = {"FRONTIER_HEARTBEAT_INTERVAL": 0.5}

    rds.lpush("pages:start_urls", url)
    [fast] = crawl("pages", fast_env, tmp_path, settings=settings)
    assert fast.returncode == 0, fast.log[-3000:]

    rds.flushdb()  # a new crawl of the same page (the dupefilter forgotten)
    pages["/"] = _page("second version")
    rds.lpush("pages:start_urls", url)
    [correct] = crawl("pages", env, tmp_path, settings=settings)
    assert correct.returncode == 0, correct.log[-3000:]
    assert "FRONTIER_CLOCK_SKEW_WARN" not in correct.log

    [doc] = list(db.pages.find({}))
    assert doc["title"] == "second version", doc
    assert correct.stats.get("mongo/stale", 0) == 0
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_uri, tz_aware=True)
    try:
        server_now = client.admin.command("hello")["localTime"]
    finally:
        client.close()
    if server_now.tzinfo is None:
        server_now = server_now.replace(tzinfo=UTC)
    stored = [d.replace(tzinfo=d.tzinfo or UTC) for d in _datetimes(doc)]
    assert stored and all(d <= server_now for d in stored), (stored, server_now)
    assert "clock is 3600" in fast.log or "clock is 359" in fast.log, fast.log[-3000:]
    assert "FRONTIER_CLOCK_SKEW_WARN" in fast.log


class _FakeRedis:
    """A stand-in for the clock arithmetic only: the reading TIME returns."""

    def __init__(self, reading: tuple[int, int]) -> None:
        self.reading = reading

    def time(self) -> tuple[int, int]:
        return self.reading


def test_the_corrected_clock_follows_redis_time(redis_url: str) -> None:
    clock = Clock()
    server = redis.Redis.from_url(redis_url)
    try:
        clock.measure_redis(server)
        seconds, micros = server.time()
    finally:
        server.close()
    assert clock.measured
    assert abs(clock.now() - (seconds + micros / 1e6)) < 0.5


def test_a_clock_an_hour_fast_is_corrected_never_ahead_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    now = time.time()
    with caplog.at_level(logging.WARNING, logger="crawler.frontier.clock"):
        clock.record(now - HOUR, now - 0.01, now, "Redis")
        clock.record(now - HOUR, now - 0.01, now, "Redis")
    assert clock.offset == pytest.approx(-HOUR, abs=0.001)
    assert clock.now() <= time.time() - HOUR + 0.001
    assert abs(clock.utcnow() - datetime.now(UTC) + timedelta(hours=1)) < timedelta(seconds=1)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "3600.0s ahead of Redis" in warnings[0].getMessage()


def test_a_small_offset_is_corrected_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    configure_settings = Settings({"FRONTIER_CLOCK_SKEW_WARN": 5.0})
    saved = CLOCK.warn_after
    try:
        configure(configure_settings)
        assert CLOCK.warn_after == 5.0
    finally:
        CLOCK.warn_after = saved
    now = time.time()
    with caplog.at_level(logging.WARNING, logger="crawler.frontier.clock"):
        clock.record(now + 1.5, now, now, "Redis")
    assert clock.offset == pytest.approx(1.5)
    assert not caplog.records


def test_a_cluster_clients_time_reply_is_read_from_one_node() -> None:
    clock = Clock()
    reading = (int(time.time()) - 100, 0)
    fake: Any = _FakeRedis(reading)
    fake.time = lambda: {"node-1": reading}
    clock.measure_redis(fake)
    assert clock.offset == pytest.approx(-100, abs=1.0)


def test_the_mongodb_clock_is_measured(mongo_uri: str) -> None:
    clock = Clock()
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_uri, tz_aware=True)
    try:
        clock.measure_mongo(client)
    finally:
        client.close()
    assert clock.measured and abs(clock.offset) < 1.0


def test_a_heartbeat_of_a_clock_an_hour_fast_is_stamped_on_redis_time(
    rds: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The heartbeat measures the offset to Redis TIME and stamps
    last_heartbeat with the corrected clock: a worker an hour fast is not
    taken for alive for an hour after it died."""
    from scrapy.utils.test import get_crawler

    from crawler.extensions import ClusterStats
    from crawler.keys import CrawlKeys

    fast = SimpleNamespace(time=lambda: time.time() + HOUR)
    monkeypatch.setattr("crawler.frontier.clock.time", fast)
    monkeypatch.setattr(CLOCK, "offset", 0.0)
    monkeypatch.setattr(CLOCK, "_warned", True)
    settings = Settings({"REDIS_URL": redis_url})
    crawler = get_crawler(settings_dict={"REDIS_URL": redis_url})
    ext = ClusterStats(crawler, rds, CrawlKeys.for_spider("t", settings), "w", 5.0)
    ext._write({}, {"last_heartbeat": fast.time()}, False)
    beat = json.loads(rds.hget(ext.keys.workers, "w") or b"{}")["last_heartbeat"]
    seconds, micros = rds.time()
    assert seconds + micros / 1e6 - 1.0 <= beat <= seconds + micros / 1e6
    assert CLOCK.offset == pytest.approx(-HOUR, abs=1.0)


def test_the_status_judges_liveness_on_redis_time(
    rds: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A status read on a host whose clock is an hour fast still counts a
    worker that beat a moment ago (by Redis's clock) as live, and one that
    beat an hour ago as dead."""
    from crawler.status import StatusReader

    seconds, micros = rds.time()
    redis_now = seconds + micros / 1e6
    rds.hset("{x}:workers", mapping={
        "fresh": json.dumps({"pid": 1, "host": "h", "spider": "x", "last_heartbeat": redis_now}),
        "gone": json.dumps({"pid": 2, "host": "h", "spider": "x",
                            "last_heartbeat": redis_now - HOUR + 5}),
    })
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + HOUR)  # this host's clock
    monkeypatch.setattr(CLOCK, "offset", 0.0)
    monkeypatch.setattr(CLOCK, "_warned", True)
    spiders = StatusReader(rds, None, "unused", ["x"], worker_timeout=30.0).read().spiders
    assert [w.id for w in spiders["x"].live_workers] == ["fresh"]
