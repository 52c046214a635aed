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
from redis.cluster import RedisCluster
from scrapy import Request, Spider

from crawler.config import config_error_of
from devtools.embedded import RedisServer
from devtools.replay import Page
from tests import scheduler_harness as harness
from tests.waiting import wait_for
from tests.workers import crawl, start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from crawler.frontier.scheduler import FrontierScheduler
    from tests.conftest import SiteFactory

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
    scheduler.eviction.checked(scheduler.eviction.check())
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
    scheduler.eviction.checked(scheduler.eviction.check())
    message = config_error_of(crawler)
    assert message is not None and "changed its maxmemory-policy to volatile-lru" in message
    assert scheduler.next_request() is None


def test_noeviction_lets_the_crawl_go_on(small_redis: RedisServer) -> None:
    scheduler, crawler = harness.open_scheduler(small_redis.url, _Spider)
    _seed(scheduler, 5)
    scheduler.eviction.checked(scheduler.eviction.check())
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
    scheduler.eviction.checked(scheduler.eviction.check())
    assert config_error_of(crawler) is None
    assert len(harness.lease_all(scheduler)) == 2


@pytest.mark.workers
@pytest.mark.faults
def test_scrapy_crawl_stops_when_redis_evicts_mid_crawl(
    small_redis: RedisServer, mongo_uri: str, mongo_db: str, tmp_path: Path,
    site_factory: SiteFactory,
) -> None:
    """Another client fills an evicting Redis while a worker crawls: the
    worker's heartbeat sees the evictions, it stops leasing with one line
    and exits 1, long before the site is crawled."""
    pages = 300
    site = site_factory(
        {f"/{i}": Page(200, [("Content-Type", "text/html")], b"<title>x</title>")
         for i in range(pages)},
        latency=0.1,
    )
    admin = redis.Redis.from_url(small_redis.url)
    admin.lpush("pages:start_urls", *[site.url_for(f"/{i}") for i in range(pages)])
    log = tmp_path / "worker.log"
    proc = start_worker("pages", worker_env(small_redis.url, mongo_uri, mongo_db), log, {
        "MAX_IDLE_TIME_BEFORE_CLOSE": 2, "FRONTIER_LEASE_TIMEOUT": 3,
        "CONCURRENT_REQUESTS": 2, "FRONTIER_CONCURRENCY": 2,
    })
    try:
        wait_for(lambda: len(site.hits()) >= 5, 60, "the worker to fetch pages")
        admin.config_set("maxmemory-policy", "allkeys-lru")
        _fill(small_redis.url)
    finally:
        [worker] = wait_workers([proc], [log], timeout=60)
    assert worker.returncode == 1, worker.log[-3000:]
    stops = [line for line in worker.log.splitlines()
             if "] ERROR:" in line and "during the crawl" in line]
    assert len(stops) == 1, worker.log[-3000:]
    assert "leasing stopped" in stops[0] and "noeviction" in stops[0], stops
    assert len(site.hits()) < pages
    assert "Traceback" not in worker.log


@pytest.mark.cluster
def test_a_cluster_with_one_evicting_master_is_refused(redis_cluster_url: str) -> None:
    client = RedisCluster.from_url(redis_cluster_url)
    node = client.get_redis_connection(client.get_primaries()[-1])
    node.config_set("maxmemory-policy", "allkeys-lru")
    try:
        _, crawler = harness.open_scheduler(redis_cluster_url, _Spider,
                                            FRONTIER_REDIS_CLUSTER=True)
        message = config_error_of(crawler)
        assert message is not None and "maxmemory-policy allkeys-lru" in message, message
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        client.close()
    _, crawler = harness.open_scheduler(redis_cluster_url, _Spider, FRONTIER_REDIS_CLUSTER=True)
    assert config_error_of(crawler) is None
