"""A crawl whose keys vanished (a flush, an eviction, a restart without
persistence) is reported as such by ``frontier status`` and the frontier's
audit, not as a clean, empty crawl (issue 29, item 1); a fresh or cleared
crawl never is."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import redis
from rich.console import Console
from scrapy import Request, Spider
from scrapy.settings import Settings

from crawler.commands.frontier import clear_frontier, render
from crawler.keys import created_key, shards_key
from crawler.status import StatusReader
from devtools.embedded import RedisServer
from tests import scheduler_harness as harness

if TYPE_CHECKING:
    from crawler.frontier.scheduler import FrontierScheduler

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "gone"


def _seed(scheduler: FrontierScheduler, n: int) -> None:
    for i in range(n):
        assert scheduler.enqueue_request(Request(f"http://site{i % 3}.test/{i}"))
    assert scheduler.flush_outbox()


def _status(client: redis.Redis) -> tuple[list[str], str]:
    """The spider's missing keys and the status as printed."""
    reader = StatusReader(client, None, "unused", ["gone"])
    status = reader.read()
    console = Console(width=200, record=True)
    console.print(render(status))
    return status.spiders["gone"].missing, console.export_text()


def test_a_flushed_crawl_is_reported_vanished_not_clean(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Spider)
    _seed(scheduler, 6)
    assert len(harness.lease_all(scheduler)) == 6
    rds.flushdb()  # FLUSHDB, or Redis restarted without persistence
    scheduler.heartbeats.beat()  # the worker goes on: its heartbeat writes again
    missing, printed = _status(rds)
    assert missing == [created_key("gone")]
    assert "structures missing: {gone}:created" in printed and "evicted or flushed?" in printed
    problems = scheduler.queue.shards.audit()
    assert problems.get("missing") == [created_key("gone")], problems


def test_an_evicted_crawl_is_reported_vanished_not_clean() -> None:
    """A real ``allkeys-lru`` Redis (accepted with FRONTIER_ALLOW_EVICTION)
    that another client fills: the crawl's cold keys go first."""
    args = ("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
    with RedisServer(args=args) as server:
        scheduler, _ = harness.open_scheduler(server.url, _Spider, FRONTIER_ALLOW_EVICTION=True)
        _seed(scheduler, 6)
        client = redis.Redis.from_url(server.url)
        blob = os.urandom(64 * 1024)
        for i in range(4000):
            client.set(f"cache:{i}", blob)
            if not client.exists(created_key("gone")) or not client.exists(shards_key("gone")):
                break
        else:
            raise AssertionError("Redis evicted neither the marker nor the shard count")
        missing, printed = _status(client)
        assert missing, printed
        assert "structures missing" in printed
        assert scheduler.queue.shards.audit().get("missing") == missing


def test_a_fresh_a_finished_and_a_cleared_crawl_miss_nothing(
    redis_url: str, rds: redis.Redis
) -> None:
    # an operator's override before any worker started: no crawl yet
    rds.hset("{gone}:delay", "site0.test", 2000)
    assert _status(rds)[0] == []
    scheduler, _ = harness.open_scheduler(redis_url, _Spider)
    missing, printed = _status(rds)
    assert missing == [] and "structures missing" not in printed
    assert scheduler.queue.shards.audit() == {}
    _seed(scheduler, 4)
    for request in harness.lease_all(scheduler):
        harness.finish(scheduler, request)
    assert _status(rds)[0] == []
    assert scheduler.queue.shards.audit() == {}
    scheduler.close("finished")
    clear_frontier(rds, "gone", Settings())
    assert _status(rds)[0] == []


def test_a_sharded_crawl_missing_its_shard_count_is_reported(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=3)
    _seed(scheduler, 6)
    assert _status(rds)[0] == []
    rds.delete(shards_key("gone"))  # as an eviction of the cold key would
    missing, _ = _status(rds)
    assert missing == [shards_key("gone")]
    assert scheduler.queue.shards.audit().get("missing") == [shards_key("gone")]


def test_a_crawl_flushed_on_start_keeps_its_marker(redis_url: str, rds: redis.Redis) -> None:
    """``SCHEDULER_FLUSH_ON_START`` deletes the frontier, marker included,
    then the worker records the marker and the shard count again."""
    first, _ = harness.open_scheduler(redis_url, _Spider)
    _seed(first, 3)
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, SCHEDULER_FLUSH_ON_START=True)
    assert rds.exists(created_key("gone"), shards_key("gone")) == 2
    _seed(scheduler, 2)
    assert _status(rds)[0] == []
