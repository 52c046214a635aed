"""Held-back cases for the renewed robots.txt lock (8d7be08)."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from devtools.replay import Page
from tests import waiting
from tests.faultproxy import FaultProxy
from tests.test_robots_rfc import FAST, RULES, TEXT, assert_nothing_lost, pages, wait_for
from tests.workers import start_worker, wait_workers

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from tests.conftest import SiteFactory

LOCK_S = 1.5


def _bad(log: str) -> list[str]:
    return [line for line in log.splitlines()
            if "] ERROR:" in line or "] CRITICAL:" in line or "Traceback" in line
            or "Task was destroyed" in line or "never retrieved" in line]


def _lock_pexpires(proxy: FaultProxy, lock: str) -> list[float]:
    return [c.at for c in proxy.commands("PEXPIRE") if c.args and c.args[0] == lock.encode()]


@pytest.mark.parametrize("outcome", ["503", "redirects", "timeout", "200"])
def test_a_slow_robots_fetch_that_ends_any_way_stops_renewing_and_lets_go(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    redis_url: str, outcome: str,
) -> None:
    ended: list[float] = []

    def handler(path: str, nth: int) -> Page | None:  # noqa: PLR0911
        if path != "/robots.txt":
            return None
        if nth == 1:
            time.sleep(3.0)
            ended.append(time.monotonic())
            if outcome == "503":
                return Page(503, TEXT, b"busy")
            if outcome == "redirects":
                return Page(302, [("Location", "/robots.txt?again")], b"")
            if outcome == "timeout":
                return Page(200, TEXT, RULES)  # too late: DOWNLOAD_TIMEOUT 2
            return Page(200, TEXT, RULES)
        if outcome == "redirects" and nth < 10:
            return Page(302, [("Location", f"/robots.txt?{nth}")], b"")
        return Page(200, TEXT, RULES)

    site = site_factory(pages(), handler=handler)
    host = site.url.split("//")[1]
    lock = "{pages}:robots:lock:" + host
    settings: dict[str, Any] = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2,
                                "FRONTIER_ROBOTS_LOCK_SECONDS": LOCK_S, **FAST}
    if outcome == "timeout":
        settings["DOWNLOAD_TIMEOUT"] = 2
    with FaultProxy(redis_url) as proxy:
        penv = {**env, "REDIS_URL": proxy.url}
        rds.lpush("pages:start_urls", site.url + "/")
        log = tmp_path / "w.log"
        [worker] = wait_workers([start_worker("pages", penv, log, settings)], [log])
        renewals = _lock_pexpires(proxy, lock)
    assert worker.returncode == 0, worker.log[-3000:]
    assert _bad(worker.log) == [], _bad(worker.log)
    assert len(renewals) >= 2, renewals  # renewed during the 3 s fetch
    if ended:
        late = [t - ended[0] for t in renewals if t > ended[0] + 0.3]
        assert late == [], late
    assert not rds.exists(lock)
    assert_nothing_lost(rds)


def test_a_worker_stopped_while_fetching_robots_txt(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    redis_url: str,
) -> None:
    """SIGTERM while robots.txt is fetched (slowly): the worker closes
    cleanly, renews no more after the fetch, the lock is gone."""
    asked: list[float] = []
    ended: list[float] = []

    def handler(path: str, nth: int) -> Page | None:
        if path == "/robots.txt":
            asked.append(time.monotonic())
            if nth == 1:
                time.sleep(3.0)
                ended.append(time.monotonic())
            return Page(200, TEXT, RULES)
        return None

    site = site_factory(pages(), handler=handler)
    lock = "{pages}:robots:lock:" + site.url.split("//")[1]
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "FRONTIER_ROBOTS_LOCK_SECONDS": LOCK_S, **FAST}
    with FaultProxy(redis_url) as proxy:
        penv = {**env, "REDIS_URL": proxy.url}
        rds.lpush("pages:start_urls", site.url + "/")
        log = tmp_path / "w.log"
        proc = start_worker("pages", penv, log, settings)
        wait_for(lambda: bool(asked), 30, "the robots.txt request", rds)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        [worker] = wait_workers([proc], [log])
        renewals = _lock_pexpires(proxy, lock)
    assert worker.returncode == 0, worker.log[-3000:]
    assert _bad(worker.log) == [], _bad(worker.log)
    assert ended
    late = [t - ended[0] for t in renewals if t > ended[0] + 0.3]
    assert late == [], late
    time.sleep(LOCK_S + 0.2)
    assert not rds.exists(lock)


def test_redis_lost_while_renewing(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    redis_url: str,
) -> None:
    """The replies to renewals are lost, then Redis is cut off for a while
    during the fetch: the crawl goes on, nothing logged as an error, nothing lost."""
    asked: list[float] = []

    def handler(path: str, nth: int) -> Page | None:
        if path == "/robots.txt":
            asked.append(time.monotonic())
            if nth == 1:
                time.sleep(4.0)
            return Page(200, TEXT, RULES)
        return None

    site = site_factory(pages(), handler=handler)
    lock = "{pages}:robots:lock:" + site.url.split("//")[1]
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "FRONTIER_ROBOTS_LOCK_SECONDS": LOCK_S, **FAST}
    with FaultProxy(redis_url) as proxy:
        penv = {**env, "REDIS_URL": proxy.url}
        rule = proxy.lose_replies(command="PEXPIRE", times=2)
        rds.lpush("pages:start_urls", site.url + "/")
        log = tmp_path / "w.log"
        proc = start_worker("pages", penv, log, settings)
        wait_for(lambda: rule.acted >= 2, 30, "two renewals lost", rds)
        proxy.begin_outage(1.0)
        [worker] = wait_workers([proc], [log])
    assert worker.returncode == 0, worker.log[-3000:]
    assert _bad(worker.log) == [], _bad(worker.log)
    assert not rds.exists(lock)
    assert_nothing_lost(rds)
    assert sorted(h.path for h in site.hits() if h.path != "/robots.txt") == ["/", "/public/y"]


@pytest.mark.parametrize("value", ["0", "-1", "x", "0.5"])
def test_a_bad_lock_seconds_exits_2_in_one_line(
    tmp_path: Path, mongo_uri: str, value: str
) -> None:
    from tests.test_config_errors import log_errors, run_worker
    from tests.workers import worker_env

    env = worker_env("redis://127.0.0.1:1/0", mongo_uri, "unused")
    status, log, _ = run_worker(env, tmp_path, FRONTIER_ROBOTS_LOCK_SECONDS=value)
    assert status == 2, log[-3000:]
    errors = log_errors(log)
    assert len(errors) == 1, errors
    assert errors[0].endswith(f"FRONTIER_ROBOTS_LOCK_SECONDS={value}: must be a number of "
                              "seconds >= 1"), errors
    assert "Traceback" not in log


def test_a_cluster_that_cannot_be_reached_during_a_renewal_does_not_end_the_renewals() -> None:
    """On a Redis Cluster an outage is a RedisClusterException (no
    RedisError): the renewal that meets it is tried again at the next turn,
    as on one Redis; the task does not die (and log "Task exception was
    never retrieved" when collected) leaving the lock to expire mid-fetch."""
    import asyncio
    import os

    from redis.cluster import RedisCluster
    from scrapy.utils.test import get_crawler

    from crawler.politeness import SharedRobotsTxtMiddleware
    from crawler.spiders.pages import PagesSpider
    from tests.cluster import RedisClusterServers

    with RedisClusterServers(masters=3) as cluster:
        crawler = get_crawler(PagesSpider, {
            "REDIS_URL": cluster.url, "FRONTIER_REDIS_CLUSTER": True, "ROBOTSTXT_OBEY": True,
            "FRONTIER_ROBOTS_LOCK_SECONDS": 1,
            "REDIS_PARAMS": {"socket_timeout": 0.2, "socket_connect_timeout": 0.2},
        })
        middleware = SharedRobotsTxtMiddleware(crawler)
        rc = RedisCluster.from_url(cluster.url)
        lock = "{pages}:robots:lock:a.example"

        async def run() -> None:
            rc.set(lock, "1", px=900)
            renew = asyncio.ensure_future(middleware._renew(lock))
            await asyncio.sleep(0.1)
            for pid in cluster.pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(0.3)  # the renewal at 0.3 s meets the outage
            finally:
                for pid in cluster.pids:
                    os.kill(pid, signal.SIGCONT)
            rc.set(lock, "1", px=900)  # (held again: the fetch goes on)
            await asyncio.sleep(1.5)  # past the lock's life: renewed, or gone
            try:
                assert not renew.done(), renew.exception()
                assert rc.pttl(lock) > 0
            finally:
                renew.cancel()

        try:
            asyncio.run(run())
        finally:
            rc.close()


def test_two_sites_robots_fetched_at_once_each_renewed_and_let_go(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    redis_url: str,
) -> None:
    ended: dict[str, float] = {}

    def slow(name: str) -> Any:
        def handler(path: str, nth: int) -> Page | None:
            if path != "/robots.txt":
                return None
            if nth == 1:
                time.sleep(3.0 if name == "a" else 2.0)
                ended[name] = time.monotonic()
                return Page(503, TEXT, b"busy") if name == "a" else Page(200, TEXT, RULES)
            return Page(200, TEXT, RULES)
        return handler

    a, b = site_factory(pages(), handler=slow("a")), site_factory(pages(), handler=slow("b"))
    locks = {n: "{pages}:robots:lock:" + s.url.split("//")[1] for n, s in (("a", a), ("b", b))}
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "FRONTIER_ROBOTS_LOCK_SECONDS": LOCK_S, **FAST}
    with FaultProxy(redis_url) as proxy:
        penv = {**env, "REDIS_URL": proxy.url}
        rds.lpush("pages:start_urls", a.url + "/", b.url + "/")
        log = tmp_path / "w.log"
        [worker] = wait_workers([start_worker("pages", penv, log, settings)], [log])
        renewals = {n: _lock_pexpires(proxy, lock) for n, lock in locks.items()}
    assert worker.returncode == 0, worker.log[-3000:]
    assert _bad(worker.log) == [], _bad(worker.log)
    for name in ("a", "b"):
        assert len(renewals[name]) >= 1, renewals
        late = [t - ended[name] for t in renewals[name] if t > ended[name] + 0.3]
        assert late == [], (name, late)
        assert not rds.exists(locks[name])
    assert_nothing_lost(rds)
    for site in (a, b):
        assert sorted(h.path for h in site.hits() if h.path != "/robots.txt") == ["/", "/public/y"]


def test_a_worker_forced_to_stop_while_fetching_robots_txt(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
) -> None:
    """Two SIGTERMs (a forced stop) while robots.txt is fetched: nothing
    logged about a destroyed renewal task; the lock expires within its life."""
    asked: list[float] = []

    def handler(path: str, nth: int) -> Page | None:
        if path == "/robots.txt":
            asked.append(time.monotonic())
            if nth == 1:
                time.sleep(6.0)
            return Page(200, TEXT, RULES)
        return None

    site = site_factory(pages(), handler=handler)
    lock = "{pages}:robots:lock:" + site.url.split("//")[1]
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "FRONTIER_ROBOTS_LOCK_SECONDS": LOCK_S, **FAST}
    rds.lpush("pages:start_urls", site.url + "/")
    log = tmp_path / "w.log"
    proc = start_worker("pages", env, log, settings)
    wait_for(lambda: bool(asked), 30, "the robots.txt request", rds)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    [worker] = wait_workers([proc], [log])
    stopped = time.monotonic()
    bad = [x for x in _bad(worker.log) if "Task" in x or "Traceback" in x]
    assert bad == [], worker.log[-4000:]
    waiting.wait_for(lambda: not rds.exists(lock), LOCK_S + 1, "the lock to expire", 0.05)
    assert time.monotonic() - stopped < LOCK_S + 1


def test_a_request_whose_robots_txt_is_read_while_the_cluster_is_out_of_reach_waits() -> None:
    """On one Redis an outage while robots.txt is read makes the request
    wait (backoff) until Redis is back; on a cluster the outage is a
    RedisClusterException (no RedisError), and it escaped process_request:
    the request failed as if its download had."""
    import asyncio
    import os

    from redis.cluster import RedisCluster
    from scrapy import Request
    from scrapy.utils.test import get_crawler

    from crawler.keys import CLUSTER_SHARDS, site_prefix
    from crawler.politeness import SharedRobotsTxtMiddleware
    from crawler.spiders.pages import PagesSpider
    from tests.cluster import RedisClusterServers

    with RedisClusterServers(masters=3) as cluster:
        crawler = get_crawler(PagesSpider, {
            "REDIS_URL": cluster.url, "FRONTIER_REDIS_CLUSTER": True, "ROBOTSTXT_OBEY": True,
            "REDIS_PARAMS": {"socket_timeout": 0.2, "socket_connect_timeout": 0.2},
        })
        crawler.spider = crawler._create_spider()
        crawler.stats.open_spider()
        middleware = SharedRobotsTxtMiddleware(crawler)
        rc = RedisCluster.from_url(cluster.url)
        site = "a.example"
        rc.hset(site_prefix("pages", site, CLUSTER_SHARDS) + "robots", site,
                f"{time.time()}\n".encode() + RULES)
        middleware.redis.ping()

        async def run() -> None:
            for pid in cluster.pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                task = asyncio.ensure_future(middleware.process_request(
                    Request(f"https://{site}/public")))
                await asyncio.sleep(1.0)
                assert not task.done() or task.exception() is None, task.exception()
            finally:
                for pid in cluster.pids:
                    os.kill(pid, signal.SIGCONT)
            assert await asyncio.wait_for(task, 30) is None  # allowed, once Redis is back

        try:
            asyncio.run(run())
        finally:
            rc.close()
