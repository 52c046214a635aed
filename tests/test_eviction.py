"""A Redis that may evict the crawl's keys (issue 29, item 1): refused at
start unless the operator accepts losing work; evictions during the crawl
stop leasing. Each test starts its own redis-server with a small
``maxmemory`` (never the session's, never port 6379)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import pytest
import redis
from scrapy import Request, Spider

from crawler.config import config_error_of
from devtools.embedded import RedisServer
from tests import scheduler_harness as harness
from tests.workers import crawl, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from crawler.frontier.scheduler import FrontierScheduler

pytestmark = pytest.mark.usefixtures("stop_heartbeats")

#: Enough for a few hundred requests, small enough to fill in a second.
MAXMEMORY = "8mb"


class _Spider(Spider):
    name = "evict"


def _server(policy: str, *more: str) -> RedisServer:
    return RedisServer(args=("--maxmemory", MAXMEMORY, "--maxmemory-policy", policy, *more))


@pytest.fixture
def lru_redis() -> Iterator[RedisServer]:
    """A Redis shared with a cache: ``allkeys-lru``."""
    with _server("allkeys-lru") as server:
        yield server


@pytest.fixture
def small_redis() -> Iterator[RedisServer]:
    """A Redis with ``noeviction`` and a small ``maxmemory``."""
    with _server("noeviction") as server:
        yield server


def _fill(url: str) -> int:
    """Fill Redis from another client until it evicted keys (under an
    evicting policy); returns ``evicted_keys``."""
    client = redis.Redis.from_url(url)
    try:
        blob = os.urandom(64 * 1024)
        for i in range(2000):
            client.set(f"cache:{i}", blob)
            if i % 16 == 0 and (evicted := int(client.info("stats")["evicted_keys"])):
                return evicted
        raise AssertionError("Redis evicted nothing")
    finally:
        client.close()


def _seed(scheduler: FrontierScheduler, n: int) -> None:
    for i in range(n):
        assert scheduler.enqueue_request(Request(f"http://site{i % 7}.test/{i}"))
    assert scheduler.flush_outbox()


def test_a_redis_that_may_evict_is_refused_at_start(lru_redis: RedisServer) -> None:
    scheduler, crawler = harness.open_scheduler(lru_redis.url, _Spider)
    message = config_error_of(crawler)
    assert message is not None
    assert "maxmemory-policy allkeys-lru" in message, message
    assert "CONFIG SET maxmemory-policy noeviction" in message, message
    assert "FRONTIER_ALLOW_EVICTION=True" in message, message
    assert "\n" not in message
    # refused before the crawl wrote anything
    assert redis.Redis.from_url(lru_redis.url).keys("*") == []
    assert scheduler.next_request() is None


def test_a_managed_redis_without_config_is_refused_by_its_info() -> None:
    """``CONFIG`` renamed away (as managed services do): the policy is read
    from ``INFO memory``."""
    with _server("allkeys-lru", "--rename-command", "CONFIG", '""') as server:
        with pytest.raises(redis.ResponseError):
            redis.Redis.from_url(server.url).config_get("maxmemory-policy")
        _, crawler = harness.open_scheduler(server.url, _Spider)
        message = config_error_of(crawler)
        assert message is not None and "maxmemory-policy allkeys-lru" in message, message


def test_the_opt_in_runs_on_an_evicting_redis_with_one_warning(
    lru_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        scheduler, crawler = harness.open_scheduler(
            lru_redis.url, _Spider, FRONTIER_ALLOW_EVICTION=True
        )
    assert config_error_of(crawler) is None
    warnings = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "allkeys-lru" in warnings[0] and "FRONTIER_ALLOW_EVICTION=True" in warnings[0]
    _seed(scheduler, 3)
    assert len(harness.lease_all(scheduler)) == 3


def test_keys_evicted_mid_crawl_stop_leasing_with_one_line(small_redis: RedisServer) -> None:
    scheduler, crawler = harness.open_scheduler(small_redis.url, _Spider)
    assert config_error_of(crawler) is None
    _seed(scheduler, 40)
    assert scheduler.next_request() is not None
    # another client switches the policy and fills memory: Redis evicts
    admin = redis.Redis.from_url(small_redis.url)
    admin.config_set("maxmemory-policy", "allkeys-lru")
    evicted = _fill(small_redis.url)
    assert evicted > 0
    # the heartbeat's check (run in a thread by the heartbeat)
    scheduler._evictions_checked(scheduler.eviction.check())
    message = config_error_of(crawler)
    assert message is not None
    assert "evicted" in message and "maxmemory-policy allkeys-lru" in message, message
    assert "leasing stopped" in message and "noeviction" in message, message
    calls = crawler.stats.get_value("frontier/lease_calls", 0)
    assert scheduler.next_request() is None
    assert crawler.stats.get_value("frontier/lease_calls", 0) == calls  # no lease call sent


def test_a_policy_changed_mid_crawl_stops_leasing(small_redis: RedisServer) -> None:
    scheduler, crawler = harness.open_scheduler(small_redis.url, _Spider)
    _seed(scheduler, 5)
    redis.Redis.from_url(small_redis.url).config_set("maxmemory-policy", "volatile-lru")
    scheduler._evictions_checked(scheduler.eviction.check())
    message = config_error_of(crawler)
    assert message is not None and "changed its maxmemory-policy to volatile-lru" in message
    assert scheduler.next_request() is None


def test_noeviction_lets_the_crawl_go_on(small_redis: RedisServer) -> None:
    scheduler, crawler = harness.open_scheduler(small_redis.url, _Spider)
    _seed(scheduler, 5)
    scheduler._evictions_checked(scheduler.eviction.check())
    assert config_error_of(crawler) is None
    assert len(harness.lease_all(scheduler)) == 5


@pytest.mark.workers
def test_scrapy_crawl_on_an_evicting_redis_exits_1_with_one_line(
    lru_redis: RedisServer, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    [worker] = crawl("pages", worker_env(lru_redis.url, mongo_uri, mongo_db), tmp_path,
                     timeout=60)
    assert worker.returncode == 1, worker.log[-3000:]
    errors = [line for line in worker.log.splitlines() if "] ERROR:" in line]
    assert len(errors) == 1, errors
    assert "maxmemory-policy allkeys-lru" in errors[0], errors
    assert "CONFIG SET maxmemory-policy noeviction" in errors[0], errors
    assert "'finish_reason': 'config_error'" in worker.log
    assert "Traceback" not in worker.log


def test_a_user_forbidden_config_and_info_is_warned_not_refused(
    small_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing says that Redis evicts: the crawl runs, the operator is told
    to check the policy."""
    admin = redis.Redis.from_url(small_redis.url)
    admin.execute_command("ACL", "SETUSER", "crawler", "on", ">pw-1", "~*", "&*", "+@all",
                          "-config", "-info")
    url = f"redis://crawler:pw-1@{small_redis.host}:{small_redis.port}/0"
    with caplog.at_level(logging.WARNING):
        scheduler, crawler = harness.open_scheduler(url, _Spider)
    assert config_error_of(crawler) is None
    assert "cannot tell whether it may evict" in caplog.text
    _seed(scheduler, 2)
    scheduler._evictions_checked(scheduler.eviction.check())
    assert config_error_of(crawler) is None
    assert len(harness.lease_all(scheduler)) == 2
