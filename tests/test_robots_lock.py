"""Held-back cases for the renewed robots.txt lock (8d7be08)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from devtools.replay import Page
from tests import waiting
from tests.faultproxy import FaultProxy
from tests.test_robots_rfc import FAST, RULES, TEXT, assert_nothing_lost, pages, wait_for
from tests.workers import start_worker, wait_workers

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Iterator
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


class _SlowRobots:
    """A site handler whose first ``/robots.txt`` request hangs until
    :attr:`release` is set (the test sets it once it saw what it waits
    for), then answers ``answer``; later ones answer the rules."""

    def __init__(self, answer: Page | None = None) -> None:
        self.release = threading.Event()
        self.asked: list[float] = []  # time.monotonic() of each robots.txt request
        self.answer = answer or Page(200, TEXT, RULES)

    def __call__(self, path: str, nth: int) -> Page | None:
        if path != "/robots.txt":
            return None
        self.asked.append(time.monotonic())
        if nth == 1:
            self.release.wait(30)
            return self.answer
        return Page(200, TEXT, RULES)


def _lock_of(site: Any) -> str:
    return "{pages}:robots:lock:" + site.url.split("//")[1]


#: The workers' settings: a short lock, fast robots.txt backoff; an idle
#: limit longer than the slow fetches take before the tests release them
#: (a worker that only waits for a robots.txt gives it up at its idle limit).
SETTINGS: dict[str, Any] = {"MAX_IDLE_TIME_BEFORE_CLOSE": 5,
                            "FRONTIER_ROBOTS_LOCK_SECONDS": LOCK_S, **FAST}


@contextlib.contextmanager
def _through_proxy(
    env: dict[str, str], redis_url: str, rds: redis.Redis, seeds: list[str], log: Path,
    settings: dict[str, Any] = SETTINGS,
) -> Iterator[tuple[FaultProxy, subprocess.Popen[bytes]]]:
    """A ``pages`` worker whose Redis is behind a fault proxy, ``seeds`` pushed."""
    with FaultProxy(redis_url) as proxy:
        rds.lpush("pages:start_urls", *seeds)
        yield proxy, start_worker("pages", {**env, "REDIS_URL": proxy.url}, log, settings)


def _assert_clean(worker: Any, renewals: list[float], ended: float) -> None:
    """The worker ended well, logged no error, renewed nothing after ``ended``."""
    assert worker.returncode == 0, worker.log[-3000:]
    assert _bad(worker.log) == [], _bad(worker.log)
    late = [t - ended for t in renewals if t > ended + 0.3]
    assert late == [], late


def _gone(rds: redis.Redis, lock: str) -> float:
    """Wait until ``lock`` is deleted (its fetch ended); when, monotonic."""
    wait_for(lambda: not rds.exists(lock), 30, f"{lock} to go", rds)
    return time.monotonic()


def _renewed_then_gone(
    proxy: FaultProxy, proc: subprocess.Popen[bytes], log: Path, rds: redis.Redis,
    robots: _SlowRobots, lock: str, renewals: int, act: Callable[[], None],
) -> tuple[Any, list[float], float]:
    """Wait for ``renewals`` renewals of ``lock``, ``act``, wait until the
    lock goes (the fetch is let go in any case), then for the worker.

    :returns: the worker, the times of every renewal, when the lock went.
    """
    try:
        wait_for(lambda: len(_lock_pexpires(proxy, lock)) >= renewals, 30,
                 f"{renewals} renewals", rds)
        act()
        ended = _gone(rds, lock)
    finally:
        robots.release.set()
    [worker] = wait_workers([proc], [log])
    return worker, _lock_pexpires(proxy, lock), ended


@pytest.mark.workers
@pytest.mark.parametrize("outcome", ["503", "redirects", "timeout", "200"])
def test_a_slow_robots_fetch_that_ends_any_way_stops_renewing_and_lets_go(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    redis_url: str, outcome: str,
) -> None:
    """robots.txt answers after two renewals of the lock (or never: the
    download times out): the lock is let go and renewed no more."""
    answers = {"503": Page(503, TEXT, b"busy"),
               "redirects": Page(302, [("Location", "/robots.txt?again")], b"")}
    robots = _SlowRobots(answers.get(outcome))
    site = site_factory(pages(), handler=robots)
    lock = _lock_of(site)
    settings = dict(SETTINGS)
    if outcome == "timeout":
        settings["DOWNLOAD_TIMEOUT"] = 2
    log = tmp_path / "w.log"
    with _through_proxy(env, redis_url, rds, [site.url + "/"], log, settings) as (proxy, proc):

        def answer() -> None:
            if outcome != "timeout":
                robots.release.set()

        worker, renewals, ended = _renewed_then_gone(proxy, proc, log, rds, robots, lock, 2,
                                                     answer)
    _assert_clean(worker, renewals, ended)
    assert not rds.exists(lock)
    assert_nothing_lost(rds)


@pytest.mark.workers
def test_a_worker_stopped_while_fetching_robots_txt(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    redis_url: str,
) -> None:
    """SIGTERM while robots.txt is fetched (slowly): the worker closes
    cleanly, renews no more after the fetch, the lock is gone."""
    robots = _SlowRobots()
    site = site_factory(pages(), handler=robots)
    lock = _lock_of(site)
    log = tmp_path / "w.log"
    with _through_proxy(env, redis_url, rds, [site.url + "/"], log) as (proxy, proc):

        def stop() -> None:
            proc.send_signal(signal.SIGTERM)
            robots.release.set()  # the fetch ends while the worker closes

        worker, renewals, ended = _renewed_then_gone(proxy, proc, log, rds, robots, lock, 1, stop)
    _assert_clean(worker, renewals, ended)
    assert not rds.exists(lock)


@pytest.mark.workers
def test_redis_lost_while_renewing(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    redis_url: str,
) -> None:
    """The replies to renewals are lost, then Redis is cut off for a while
    during the fetch: the crawl goes on, nothing logged as an error, nothing lost."""
    robots = _SlowRobots()
    site = site_factory(pages(), handler=robots)
    lock = _lock_of(site)
    log = tmp_path / "w.log"
    # (an idle limit longer than the fetch: a worker that only waits for a
    # robots.txt gives it up at its idle limit)
    settings = {**SETTINGS, "MAX_IDLE_TIME_BEFORE_CLOSE": 30}
    with _through_proxy(env, redis_url, rds, [site.url + "/"], log, settings) as (proxy, proc):
        # (set before the worker's first renewal: it fetches robots.txt after start-up)
        rule = proxy.lose_replies(command="PEXPIRE", times=2)
        try:
            wait_for(lambda: rule.acted >= 2, 30, "two renewals lost", rds)
            cut = time.monotonic()
            proxy.begin_outage(1.0)
            # (the fetch goes on until a renewal reaches Redis after the outage)
            wait_for(lambda: any(t > cut + 1.0 for t in _lock_pexpires(proxy, lock)), 30,
                     "a renewal after the outage", rds)
        finally:
            robots.release.set()
        [worker] = wait_workers([proc], [log])
    assert worker.returncode == 0, worker.log[-3000:]
    assert _bad(worker.log) == [], _bad(worker.log)
    assert not rds.exists(lock)
    assert_nothing_lost(rds)
    assert sorted(h.path for h in site.hits() if h.path != "/robots.txt") == ["/", "/public/y"]


@pytest.mark.workers
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


@pytest.mark.cluster
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


@pytest.mark.workers
def test_two_sites_robots_fetched_at_once_each_renewed_and_let_go(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    redis_url: str,
) -> None:
    """Two sites' robots.txt fetched at once, ending at different times
    (503, then 200): each lock renewed while its fetch runs, then let go."""
    robots = {"a": _SlowRobots(Page(503, TEXT, b"busy")), "b": _SlowRobots()}
    sites = {n: site_factory(pages(), handler=r) for n, r in robots.items()}
    locks = {n: _lock_of(site) for n, site in sites.items()}
    ended: dict[str, float] = {}
    log = tmp_path / "w.log"
    seeds = [site.url + "/" for site in sites.values()]
    with _through_proxy(env, redis_url, rds, seeds, log) as (proxy, proc):
        try:
            for name in ("b", "a"):
                wait_for(lambda n=name: len(_lock_pexpires(proxy, locks[n])) >= 1, 30,
                         f"a renewal of {name}'s lock", rds)
                robots[name].release.set()
                ended[name] = _gone(rds, locks[name])
        finally:
            for r in robots.values():
                r.release.set()
        [worker] = wait_workers([proc], [log])
        renewals = {n: _lock_pexpires(proxy, lock) for n, lock in locks.items()}
    for name in ("a", "b"):
        _assert_clean(worker, renewals[name], ended[name])
        assert not rds.exists(locks[name])
    assert_nothing_lost(rds)
    for site in sites.values():
        assert sorted(h.path for h in site.hits() if h.path != "/robots.txt") == ["/", "/public/y"]


@pytest.mark.workers
def test_a_worker_forced_to_stop_while_fetching_robots_txt(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
) -> None:
    """Two SIGTERMs (a forced stop) while robots.txt is fetched: nothing
    logged about a destroyed renewal task; the lock expires within its life."""
    robots = _SlowRobots()
    site = site_factory(pages(), handler=robots)
    lock = _lock_of(site)
    rds.lpush("pages:start_urls", site.url + "/")
    log = tmp_path / "w.log"
    proc = start_worker("pages", env, log, {**SETTINGS, "MAX_IDLE_TIME_BEFORE_CLOSE": 60})
    try:
        wait_for(lambda: bool(robots.asked), 30, "the robots.txt request", rds)
        first = rds.pttl(lock)
        wait_for(lambda: rds.pttl(lock) > first, 30, "a renewal (its expiry rises)", rds)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "shutting down gracefully" in log.read_text(), 30,
                 "the first SIGTERM taken", rds)
        proc.send_signal(signal.SIGTERM)
        [worker] = wait_workers([proc], [log])
    finally:
        robots.release.set()
    stopped = time.monotonic()
    bad = [x for x in _bad(worker.log) if "Task" in x or "Traceback" in x]
    assert bad == [], worker.log[-4000:]
    waiting.wait_for(lambda: not rds.exists(lock), LOCK_S + 1, "the lock to expire", 0.05)
    assert time.monotonic() - stopped < LOCK_S + 1


@pytest.mark.cluster
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
