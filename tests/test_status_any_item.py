"""``scrapy frontier status`` and the metrics count every collection and
feed a crawl wrote to, dict items included; a worker opening on a frontier
that holds requests says ``Resuming crawl (N requests scheduled)``."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from rich.console import Console
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from crawler.commands.frontier import _spider_table
from crawler.extensions import ClusterStats
from crawler.metrics import StatusCollector
from crawler.status import StatusReader
from crawler.storage import ADDED_STAT_PREFIX
from tests.scheduler_harness import open_scheduler, reactor_loop

if TYPE_CHECKING:
    import redis


class DictSpider(Spider):
    """Yields plain dicts (no ``collection`` attribute)."""

    name = "dicts"


def _crawl_stats(redis_url: str, mongo_uri: str, mongo_db: str, **settings: Any) -> ClusterStats:
    crawler = get_crawler(DictSpider, {
        "REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db, **settings,
    })
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    return ClusterStats.from_crawler(crawler)


def _sent(ext: ClusterStats) -> None:
    """Send the worker's stats to Redis as its last heartbeat does."""
    ext._write(ext._deltas(), ext._record(), True)


def _status(redis_url: str, mongo_uri: str, mongo_db: str) -> Any:
    crawler = get_crawler(DictSpider, {
        "REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db,
    })
    reader = StatusReader.from_settings(crawler.settings, ["dicts"])
    try:
        return reader, reader.read()
    finally:
        reader.close()


def test_status_counts_dict_items_in_the_collection_named_after_the_spider(
    redis_url: str, mongo_uri: str, mongo_db: str, db: Any
) -> None:
    ext = _crawl_stats(redis_url, mongo_uri, mongo_db,
                       ITEM_PIPELINES={"crawler.pipelines.MongoPipeline": 300})
    for n in range(100):
        ext.item_scraped({"n": n})
    # What MongoPipeline stores for them (the spider's name is their
    # collection) and counts as it adds them.
    db.dicts.insert_many([{"n": n} for n in range(100)])
    ext.crawler.stats.inc_value(f"{ADDED_STAT_PREFIX}dicts", 100)
    _sent(ext)

    _, status = _status(redis_url, mongo_uri, mongo_db)

    assert status.spiders["dicts"].items == {"dicts": 100}
    assert status.items["dicts"] == 100


def test_without_mongodb_storage_no_collection_is_counted(
    redis_url: str, mongo_uri: str, mongo_db: str
) -> None:
    ext = _crawl_stats(redis_url, mongo_uri, mongo_db, ITEM_PIPELINES={})
    ext.item_scraped({"n": 1})
    _sent(ext)

    _, status = _status(redis_url, mongo_uri, mongo_db)

    assert status.spiders["dicts"].items == {}
    assert "item_scraped_count/dicts" not in status.spiders["dicts"].stats


def test_status_and_metrics_count_the_items_of_every_feed_the_workers_wrote(
    redis_url: str, mongo_uri: str, mongo_db: str
) -> None:
    loop = reactor_loop()
    for feed, count in (("items-1.jsonl", 60), ("items-2.jsonl", 40),
                        ("ftp://user:secret@ftp.example/items.csv", 7)):
        ext = _crawl_stats(redis_url, mongo_uri, mongo_db, ITEM_PIPELINES={})
        slot = SimpleNamespace(uri=feed, itemcount=count)
        loop.run_until_complete(asyncio.ensure_future(ext.feed_slot_closed(slot)))
        _sent(ext)

    reader, status = _status(redis_url, mongo_uri, mongo_db)

    assert status.spiders["dicts"].feeds == {
        "items-1.jsonl": 60, "items-2.jsonl": 40, "ftp://user:****@ftp.example/items.csv": 7,
    }
    assert "secret" not in str(status.as_dict())
    assert status.as_dict()["spiders"]["dicts"]["feeds"]["items-2.jsonl"] == 40
    reader = StatusReader.from_settings(reader.settings, ["dicts"])
    try:
        families = {f.name: f for f in StatusCollector(reader).collect()}
    finally:
        reader.close()
    samples = {s.labels["feed"]: s.value for s in families["crawler_feed_items"].samples}
    assert samples == {"items-1.jsonl": 60, "items-2.jsonl": 40,
                       "ftp://user:****@ftp.example/items.csv": 7}


@pytest.mark.usefixtures("stop_heartbeats")
def test_a_worker_opening_on_a_frontier_with_requests_logs_resuming_crawl(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    first, _ = open_scheduler(redis_url, DictSpider)
    assert not [r for r in caplog.records if "Resuming crawl" in r.getMessage()]
    for n in range(3):
        assert first.enqueue_request(Request(f"http://127.0.0.1:9/{n}"))
    assert first.flush_outbox()

    open_scheduler(redis_url, DictSpider)

    lines = [r.getMessage() for r in caplog.records if "Resuming crawl" in r.getMessage()]
    assert lines == ["Resuming crawl (3 requests scheduled)"]


@pytest.mark.usefixtures("stop_heartbeats")
def test_a_malformed_request_counter_does_not_stop_the_scheduler_opening(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The count behind ``Resuming crawl`` meets a counter that is no number:
    no line, and the scheduler opens (the frontier's calls report the value)."""
    caplog.set_level(logging.INFO)
    rds.set("{dicts}:count", "x")
    scheduler, _ = open_scheduler(redis_url, DictSpider)
    assert scheduler.queue is not None
    assert not [r for r in caplog.records if "Resuming crawl" in r.getMessage()]


def _closed(ext: ClusterStats, reason: str) -> None:
    """What the worker's ``spider_closed`` writes (its last send, in the
    test's thread)."""
    ext._finish_reason = reason
    _sent(ext)


def _table(status: Any) -> str:
    console = Console(record=True, width=200)
    console.print(_spider_table(status.spiders["dicts"]))
    return console.export_text()


def test_the_crawl_state_follows_workers_work_left_and_flags(
    redis_url: str, mongo_uri: str, mongo_db: str, rds: redis.Redis
) -> None:
    """Never started: ``idle``; no live worker and work left: ``stopped``;
    a live worker and work left: ``running``; a live worker and nothing
    left: ``idle``; no live worker and nothing left: ``finished``, whatever
    reason the last worker closed with; the pause and stop flags win."""
    _, status = _status(redis_url, mongo_uri, mongo_db)
    assert status.spiders["dicts"].state == "idle"
    assert "not started" in _table(status)

    rds.lpush("dicts:start_urls", "https://a.example/")
    _, status = _status(redis_url, mongo_uri, mongo_db)
    assert status.spiders["dicts"].state == "stopped"
    assert " stopped " in _table(status)
    assert "no live worker, 1 seeds and requests left: start workers" in _table(status)
    assert status.as_dict()["spiders"]["dicts"]["state"] == "stopped"

    ext = _crawl_stats(redis_url, mongo_uri, mongo_db)
    ext._write({}, ext._record(), False)  # a heartbeat: the worker is live
    _, status = _status(redis_url, mongo_uri, mongo_db)
    assert status.spiders["dicts"].state == "running"

    rds.delete("dicts:start_urls")
    _, status = _status(redis_url, mongo_uri, mongo_db)
    assert status.spiders["dicts"].state == "idle"
    assert "1 live worker waits for seeds" in _table(status)

    _closed(ext, "shutdown")
    _, status = _status(redis_url, mongo_uri, mongo_db)
    assert status.spiders["dicts"].state == "finished"
    assert " finished " in _table(status)
    assert not status.spiders["dicts"].live_workers
    assert status.spiders["dicts"].workers[0].finish_reason == "shutdown"

    rds.set("{dicts}:control", "paused")
    _, status = _status(redis_url, mongo_uri, mongo_db)
    assert status.spiders["dicts"].state == "paused"
    assert " paused " in _table(status)
    rds.set("{dicts}:control", "stopped")
    _, status = _status(redis_url, mongo_uri, mongo_db)
    assert status.spiders["dicts"].state == "stopped"
    assert "set by scrapy frontier stop" in _table(status)


def test_feed_counts_are_labelled_as_totals_over_all_runs(
    redis_url: str, mongo_uri: str, mongo_db: str
) -> None:
    loop = reactor_loop()
    for _run in range(2):
        ext = _crawl_stats(redis_url, mongo_uri, mongo_db, ITEM_PIPELINES={})
        slot = SimpleNamespace(uri="items.jsonl", itemcount=5)
        loop.run_until_complete(asyncio.ensure_future(ext.feed_slot_closed(slot)))
        _sent(ext)
    _, status = _status(redis_url, mongo_uri, mongo_db)
    assert status.spiders["dicts"].feeds == {"items.jsonl": 10}
    assert "items in feed, all runs" in _table(status)
