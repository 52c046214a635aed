"""Nothing is lost: killed workers, restarted Redis, stopped MongoDB, retries."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
import redis

from devtools.embedded import MongoServer, RedisServer
from devtools.replay import Page, default_warc_path, load_warc
from tests.waiting import wait_for
from tests.workers import PROJECT_DIR, start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from devtools.replay import SiteServer
    from tests.conftest import SiteFactory

#: Short leases so that a killed worker's requests come back within seconds.
pytestmark = [pytest.mark.workers, pytest.mark.faults]


FAST = {"FRONTIER_LEASE_TIMEOUT": 3, "MAX_IDLE_TIME_BEFORE_CLOSE": 3}


@pytest.fixture
def slow_quotes(site_factory: SiteFactory) -> SiteServer:
    """The quotes capture, each response 200 ms late: kills land mid-flight."""
    warc = default_warc_path()
    if not warc.is_file():
        pytest.skip(f"WARC capture not found at {warc}")
    return site_factory(load_warc(warc), latency=0.2)


def mongo(uri: str, database: str) -> Any:
    return pymongo.MongoClient(uri)[database]


class Workers:
    """Worker processes of one test, with their logs."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        self.env, self.tmp_path = env, tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, spider: str, **settings: object) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"{spider}-{len(self.logs)}.log"
        proc = start_worker(spider, self.env, log, {**FAST, **settings})
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def wait(self) -> list[Any]:
        alive = [(p, log) for p, log in zip(self.procs, self.logs, strict=True)
                 if p.returncode is None or p.returncode == 0]
        return wait_workers([p for p, _ in alive], [log for _, log in alive], timeout=180)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()


@pytest.fixture
def workers(redis_url: str, mongo_uri: str, mongo_db: str, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(worker_env(redis_url, mongo_uri, mongo_db), tmp_path)
    yield pool
    pool.kill_all()


@pytest.mark.parametrize(("spider", "counts"), [
    ("quotes", {"quotes": 100, "authors": 50}),
    ("pages", {"pages": 213}),
])
def test_killed_workers_lose_no_request(
    spider: str, counts: dict[str, int], workers: Workers, slow_quotes: SiteServer,
    redis_url: str, mongo_uri: str, mongo_db: str,
) -> None:
    rds = redis.Redis.from_url(redis_url)
    rds.lpush(f"{spider}:start_urls", slow_quotes.url_for("/"))
    victims = [workers.start(spider) for _ in range(3)]
    for threshold in (40, 120):
        wait_for(lambda t=threshold: len(slow_quotes.hits()) >= t)
        victim = victims.pop(0)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        victims.append(workers.start(spider))

    finished = workers.wait()

    assert [w.returncode for w in finished] == [0] * len(finished)
    db = mongo(mongo_uri, mongo_db)
    for collection, n in counts.items():
        assert db[collection].count_documents({}) == n, collection
    assert rds.llen(f"{{{spider}}}:dead") == 0
    assert rds.zcard(f"{{{spider}}}:leases") == 0
    returned = sum(w.stats.get("frontier/leases/returned", 0) for w in finished)
    assert returned > 0  # the killed workers' leases were taken back


def test_a_redis_restart_mid_crawl_loses_nothing(
    site_factory: SiteFactory, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    warc = default_warc_path()
    site = site_factory(load_warc(warc), latency=0.1)
    with RedisServer(appendonly=True) as server:
        env = worker_env(server.url, mongo_uri, mongo_db)
        redis.Redis.from_url(server.url).lpush("quotes:start_urls", site.url_for("/"))
        pool = Workers(env, tmp_path)
        try:
            pool.start("quotes")
            pool.start("quotes")
            wait_for(lambda: len(site.hits()) >= 60)
            # A graceful stop: the append-only file has every write. Redis
            # stays down until a worker's scheduler has noticed.
            server.stop()
            wait_for(lambda: any(
                "[crawler.frontier.scheduler] WARNING: Redis unreachable" in log.read_text()
                for log in pool.logs if log.exists()
            ))
            server.start()
            finished = pool.wait()
        finally:
            pool.kill_all()
        db = mongo(mongo_uri, mongo_db)
        assert db.quotes.count_documents({}) == 100
        assert db.authors.count_documents({}) == 50
        assert [w.returncode for w in finished] == [0, 0]
        assert sum(w.stats.get("frontier/redis/outages", 0) for w in finished) > 0


@pytest.mark.skipif(bool(os.environ.get("MONGO_URI")), reason="stops its own MongoDB server")
def test_mongodb_down_for_ten_seconds_loses_nothing(
    site_factory: SiteFactory, redis_url: str, tmp_path: Path
) -> None:
    site = site_factory(load_warc(default_warc_path()), latency=0.05)
    with MongoServer() as server:
        env = worker_env(redis_url, server.uri, "outage")
        redis.Redis.from_url(redis_url).lpush("quotes:start_urls", site.url_for("/"))
        pool = Workers(env, tmp_path)
        try:
            pool.start("quotes", MAX_IDLE_TIME_BEFORE_CLOSE=5)
            wait_for(lambda: len(site.hits()) >= 40)
            server.stop()
            time.sleep(10)  # the outage under test lasts ten seconds
            server.start()
            [worker] = pool.wait()
        finally:
            pool.kill_all()
        db = mongo(server.uri, "outage")
        assert db.quotes.count_documents({}) == 100
        assert db.authors.count_documents({}) == 50
        assert worker.returncode == 0
        assert worker.stats.get("mongo/retries", 0) > 0


def flaky_then_ok(path: str, nth: int) -> Page | None:
    html = [("Content-Type", "text/html")]
    if path == "/flaky" and nth <= 2:
        return Page(503, html, b"busy")
    if path == "/broken":
        return Page(500, html, b"broken")
    if path in ("/flaky", "/"):
        return Page(200, html, b"<title>ok</title>")
    return None


def test_retries_wait_with_backoff_and_give_up_into_the_dead_letter_queue(
    site_factory: SiteFactory, workers: Workers, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    site = site_factory(handler=flaky_then_ok)
    rds = redis.Redis.from_url(redis_url)
    rds.lpush("pages:start_urls", site.url_for("/flaky"), site.url_for("/broken"))
    # Adaptive slowing (a 503 also slows the site) is off: backoff alone.
    settings = {"FRONTIER_RETRY_BACKOFF_BASE": 1.0, "FRONTIER_RETRY_JITTER": 0.1,
                "RETRY_TIMES": 2, "FRONTIER_ADAPTIVE_ENABLED": False}
    workers.start("pages", **settings)
    [worker] = workers.wait()

    flaky = [h.started for h in site.hits() if h.path == "/flaky"]
    assert len(flaky) == 3
    gaps = [b - a for a, b in itertools.pairwise(flaky)]
    with capsys.disabled():
        print(f"\n/flaky fetched at gaps of {[round(g, 3) for g in gaps]} s (backoff 1 s, 2 s)")
    # 1 s then 2 s, each stretched by at most 10% jitter (plus scheduling).
    assert 1.0 <= gaps[0] <= 1.1 + 0.25, gaps
    assert 2.0 <= gaps[1] <= 2.2 + 0.25, gaps
    assert worker.stats["frontier/retries/scheduled"] == 4

    [dead] = [json.loads(d) for d in rds.lrange("{pages}:dead", 0, -1)]
    assert dead["url"] == site.url_for("/broken")
    assert dead["attempts"] == 3
    assert "500 Internal Server Error" in dead["reason"]
    assert [h.path for h in site.hits()].count("/broken") == 3

    requeue = subprocess.run(
        [sys.executable, "-m", "scrapy", "deadletters", "requeue", "pages"],
        cwd=PROJECT_DIR, env=workers.env, capture_output=True, text=True, check=True,
    )
    assert "requeued 1" in requeue.stdout
    assert rds.llen("{pages}:dead") == 0
    workers.start("pages", **{**settings, "RETRY_TIMES": 0})
    workers.wait()
    # Sent back to the frontier, it was fetched again (and failed again).
    assert [h.path for h in site.hits()].count("/broken") == 4
    assert rds.llen("{pages}:dead") == 1


def test_sigterm_returns_or_finishes_every_lease(
    slow_quotes: SiteServer, workers: Workers, redis_url: str, mongo_uri: str, mongo_db: str
) -> None:
    rds = redis.Redis.from_url(redis_url)
    rds.lpush("quotes:start_urls", slow_quotes.url_for("/"))
    proc = workers.start("quotes", FRONTIER_LEASE_TIMEOUT=60)
    wait_for(lambda: rds.zcard("{quotes}:leases") >= 4)
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert time.monotonic() - stopped < 30
    assert proc.returncode == 0
    # Every lease was acknowledged or given back (deadline 0): none waits
    # for the 60 s timeout.
    assert [score for _, score in rds.zrange("{quotes}:leases", 0, -1, withscores=True)
            if score > 0] == []
    # Another worker finishes the crawl with nothing missing.
    workers.start("quotes")
    workers.wait()
    db = mongo(mongo_uri, mongo_db)
    assert db.quotes.count_documents({}) == 100
    assert db.authors.count_documents({}) == 50
    assert Counter(h.path for h in slow_quotes.hits())["/"] == 1


def test_a_request_that_cannot_be_downloaded_becomes_a_dead_letter(
    replay_server: Any, workers: Workers, redis_url: str
) -> None:
    rds = redis.Redis.from_url(redis_url)
    rds.lpush(
        "pages:start_urls",
        json.dumps({"url": replay_server.url_for("/page/8/"),
                    "meta": {"download_timeout": "x"}}),
        json.dumps({"url": replay_server.url_for("/page/6/"), "method": "GET /x HTTP/1.1\r\n"}),
    )
    workers.start("pages", DEPTH_LIMIT=1, RETRY_TIMES=0)
    [worker] = workers.wait()
    assert worker.returncode == 0
    reasons = sorted(json.loads(d)["reason"] for d in rds.lrange("{pages}:dead", 0, -1))
    assert len(reasons) == 2
    assert reasons[0].startswith("download failed: TypeError")
    assert reasons[1].startswith("download failed: ValueError: Invalid method")
