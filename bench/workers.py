"""Start and stop real ``scrapy crawl`` worker processes for the benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis import Redis

__all__ = ["PROJECT_DIR", "start_worker", "stop_workers", "wait_blocked"]

PROJECT_DIR = Path(__file__).resolve().parent.parent

#: Settings every benchmark worker gets (besides the figure's own).
COMMON_SETTINGS: dict[str, object] = {
    "TELNETCONSOLE_ENABLED": "False",
    "LOG_LEVEL": "INFO",
    "MAX_IDLE_TIME_BEFORE_CLOSE": 0,
}


def start_worker(
    spider: str,
    redis_url: str,
    log_file: Path,
    settings: dict[str, object],
    *,
    stock: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``scrapy crawl <spider>`` in the project directory.

    :param settings: ``-s`` overrides, on top of :data:`COMMON_SETTINGS`.
    :param stock: run with :mod:`bench.stock_settings` (stock scrapy-redis)
        instead of the project's ``crawler.settings``.
    """
    env = dict(os.environ, REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    if stock:
        env["SCRAPY_SETTINGS_MODULE"] = "bench.stock_settings"
    args = [sys.executable, "-m", "scrapy", "crawl", spider, "-s", f"LOG_FILE={log_file}"]
    for name, value in {**COMMON_SETTINGS, **settings}.items():
        args += ["-s", f"{name}={value}"]
    return subprocess.Popen(
        args, cwd=PROJECT_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )


def stop_workers(procs: list[subprocess.Popen[bytes]], timeout: float = 15.0) -> None:
    """SIGTERM the workers (Scrapy shuts down gracefully); SIGKILL stragglers."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_blocked(
    redis: Redis, count: int, procs: list[subprocess.Popen[bytes]], timeout: float = 90.0
) -> None:
    """Wait until ``count`` clients are blocked on a seed list (idle workers: our
    ``BLMOVE``, stock scrapy-redis's ``BRPOP``).

    :raises RuntimeError: a worker exited, or the timeout passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited early with code {proc.returncode}")
        blocked = sum(1 for c in redis.client_list() if c.get("cmd") in ("brpop", "blmove"))
        if blocked >= count:
            return
        time.sleep(0.05)
    raise RuntimeError(f"fewer than {count} workers became idle within {timeout}s")
