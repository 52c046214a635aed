"""A forced stop (SIGTERM twice) of a worker whose only store is a feed
export loses no item whose page's lease was acknowledged.

Real ``scrapy crawl quotes -O feed.jsonl`` workers with no item pipeline
(no MongoDB) on the quotes capture served slowly: the first is stopped with a
second SIGTERM while downloads are in flight, a second finishes the crawl
with its own feed. Both feeds together hold every item of an unstopped run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from devtools.replay import ReplayServer, default_warc_path
from tests.waiting import wait_for
from tests.workers import PROJECT_DIR, wait_workers

if TYPE_CHECKING:
    from pathlib import Path

    import redis

pytestmark = [pytest.mark.workers, pytest.mark.faults]

SPIDER = "quotes"
ORIGIN = re.compile(r"http://127\.0\.0\.1:\d+")
#: No item pipeline: the feed is the only store, so pages are acknowledged
#: once their items are scraped.
FEED_ONLY: dict[str, object] = {
    "ITEM_PIPELINES": "{}", "TELNETCONSOLE_ENABLED": False, "MAX_IDLE_TIME_BEFORE_CLOSE": 2,
    "FRONTIER_LEASE_TIMEOUT": 60,
}


def feed_env(redis_url: str) -> dict[str, str]:
    """The workers' environment: the test's Redis, no MongoDB."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"MONGO_URI", "MONGO_DATABASE", "SCRAPY_SETTINGS_MODULE"}}
    return {**env, "REDIS_URL": redis_url}


def start_feed_worker(
    env: dict[str, str], feed: Path, log: Path, settings: dict[str, object],
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "scrapy", "crawl", SPIDER, "-O", str(feed),
            "-s", f"LOG_FILE={log}"]
    for name, value in {**FEED_ONLY, **settings}.items():
        args += ["-s", f"{name}={value}"]
    return subprocess.Popen(args, cwd=PROJECT_DIR, env=env)


def feed_items(path: Path) -> list[str]:
    """The items of a JSON-lines feed as canonical JSON, the replay
    server's origin left out of URLs; fails on a line that is not one JSON
    value."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [ORIGIN.sub("", json.dumps(json.loads(line), sort_keys=True)) for line in lines]


def test_a_forced_stop_of_a_feed_only_worker_loses_no_acknowledged_item(
    redis_url: str, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path,
) -> None:
    env = feed_env(redis_url)
    # The items of an unstopped run.
    rds.lpush(f"{SPIDER}:start_urls", replay_server.url_for("/"))
    whole = tmp_path / "whole.jsonl"
    [run] = wait_workers([start_feed_worker(env, whole, tmp_path / "whole.log", {})],
                         [tmp_path / "whole.log"])
    assert run.returncode == 0, run.log[-3000:]
    expected = set(feed_items(whole))
    assert len(expected) > 100
    rds.flushdb()

    with ReplayServer(default_warc_path(), latency=1.0) as site:
        rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
        first, first_log = tmp_path / "first.jsonl", tmp_path / "first.log"
        proc = start_feed_worker(env, first, first_log, {"CONCURRENT_REQUESTS": 4})
        try:
            # Pages done (acknowledged), their items still in the feed's buffer.
            wait_for(lambda: len(site.hits()) >= 16, 60, "pages to be crawled")
            proc.send_signal(signal.SIGTERM)
            wait_for(lambda: "shutting down gracefully" in first_log.read_text(), 10,
                     "the graceful stop to begin")
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
        log = first_log.read_text()
        assert "forcing unclean shutdown" in log
        assert "Forced stop: finished the jsonl feed" in log, log[-3000:]
        stopped = feed_items(first)  # (every line is JSON)
        assert stopped
        second, second_log = tmp_path / "second.jsonl", tmp_path / "second.log"
        [worker] = wait_workers(
            [start_feed_worker(env, second, second_log, {"CONCURRENT_REQUESTS": 16})],
            [second_log])
    assert worker.returncode == 0, worker.log[-3000:]
    print(f"first feed: {len(stopped)} items, second: {len(feed_items(second))}")
    missing = expected - set(stopped) - set(feed_items(second))
    assert not missing, f"{len(missing)} items lost, e.g. {sorted(missing)[:2]}"
