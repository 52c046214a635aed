"""Run real ``scrapy crawl`` worker processes from tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devtools.replay import ReplayServer

PROJECT_DIR = Path(__file__).resolve().parent.parent
#: A worker that has not exited after this many seconds fails the test.
WORKER_TIMEOUT = 120.0

_STAT = re.compile(r"'([a-z0-9_/.\-]+)': (\d+),?$", re.MULTILINE)


@dataclass
class Worker:
    """One finished worker: exit code, log text and integer stats."""

    returncode: int
    log: str
    ended: float  # time.monotonic() when the process was seen to exit
    stats: dict[str, int] = field(default_factory=dict)


def worker_env(redis_url: str, mongo_uri: str, database: str) -> dict[str, str]:
    """The environment a worker needs to reach the test's servers."""
    env = dict(os.environ, REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=database)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return env


def start_worker(
    spider: str, env: dict[str, str], log_file: Path, settings: dict[str, object]
) -> subprocess.Popen[bytes]:
    """Start ``scrapy crawl spider`` with ``-s`` overrides, logging to ``log_file``.

    The telnet console is off unless ``settings`` turn it on: workers
    started at once race for its ports (6023-6073), and the loser logs an
    ERROR ("Address already in use") that tests checking for none would
    take for the crawl's (as the benchmark's workers, ``bench/workers.py``).
    """
    args = [sys.executable, "-m", "scrapy", "crawl", spider, "-s", f"LOG_FILE={log_file}"]
    settings = {"TELNETCONSOLE_ENABLED": False, **settings}
    for name, value in settings.items():
        args += ["-s", f"{name}={value}"]
    return subprocess.Popen(args, cwd=PROJECT_DIR, env=env)


def wait_workers(
    procs: list[subprocess.Popen[bytes]], logs: list[Path], timeout: float = WORKER_TIMEOUT
) -> list[Worker]:
    """Wait for every process to exit; kill all and fail past ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    ended: dict[int, float] = {}
    while len(ended) < len(procs):
        for i, proc in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.monotonic()
        if time.monotonic() > deadline:
            for proc in procs:
                proc.kill()
            raise AssertionError(f"workers still running after {timeout}s")
        if len(ended) < len(procs):
            try:
                procs[min(set(range(len(procs))) - set(ended))].wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
    out = []
    for i, proc in enumerate(procs):
        text = logs[i].read_text() if logs[i].exists() else ""
        stats_block = text.split("Dumping Scrapy stats:", 1)[-1]
        stats = {k: int(v) for k, v in _STAT.findall(stats_block)}
        out.append(Worker(proc.returncode, text, ended[i], stats))
    return out


def crawl(
    spider: str,
    env: dict[str, str],
    tmp_path: Path,
    *,
    workers: int = 1,
    settings: dict[str, object] | None = None,
    timeout: float = WORKER_TIMEOUT,
) -> list[Worker]:
    """Run ``workers`` processes of ``spider`` together until they all exit."""
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, **(settings or {})}
    logs = [tmp_path / f"{spider}-{i}-{time.monotonic_ns()}.log" for i in range(workers)]
    procs = [start_worker(spider, env, log, settings) for log in logs]
    return wait_workers(procs, logs, timeout)


def assert_quotes_crawled(workers: list[Worker], db: Any, site: ReplayServer) -> None:
    """The quotes crawl came out whole: every worker exited cleanly and
    fetched pages, MongoDB holds the 100 quotes and 50 authors, no path was
    downloaded twice across the workers (the seed "/" included, although every
    page links back to it), and every download reached ``site``."""
    assert [w.returncode for w in workers] == [0] * len(workers), [w.log[-3000:] for w in workers]
    assert db.quotes.count_documents({}) == 100
    assert db.authors.count_documents({}) == 50
    assert all(w.stats.get("downloader/response_count", 0) > 0 for w in workers)
    counts = Counter(h.path for h in site.hits())
    assert counts["/"] == 1
    assert [p for p, n in counts.items() if n > 1] == []
    downloads = sum(w.stats.get("downloader/request_count", 0) for w in workers)
    assert downloads == len(site.hits())
