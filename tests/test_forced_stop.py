"""A forced stop (SIGTERM twice) gives the worker's leases back.

Real ``scrapy crawl pages`` workers on a slow site: each is stopped with a
second SIGTERM while its downloads are in flight, so that Scrapy stops the
reactor before the scheduler is closed.
"""

from __future__ import annotations

import json
import re
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from crawler.frontier.store import Frontier
from devtools.replay import Page
from tests.waiting import wait_for
from tests.workers import start_worker, wait_workers

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

    import redis

    from tests.conftest import SiteFactory

pytestmark = [pytest.mark.workers, pytest.mark.faults]

SPIDER = "pages"
PAGES = 30
#: Leases far longer than the test: a lease not given back stays held.
LONG_LEASES: dict[str, object] = {
    "FRONTIER_LEASE_TIMEOUT": 60, "MAX_IDLE_TIME_BEFORE_CLOSE": 2, "CONCURRENT_REQUESTS": 4,
    "FRONTIER_MAX_DELIVERIES": 2,
}


def slow_site(site_factory: SiteFactory) -> Any:
    html = [("Content-Type", "text/html")]
    links = "".join(f'<a href="/p/{i}">{i}</a> ' for i in range(PAGES))
    pages = {"/": Page(200, html, f"<title>home</title>{links}".encode())}
    pages |= {f"/p/{i}": Page(200, html, f"<title>page {i}</title>".encode())
              for i in range(PAGES)}
    return site_factory(pages, latency=1.5)


def force_stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, then SIGTERM again once Scrapy's graceful stop began."""
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: log.exists() and "shutting down gracefully" in log.read_text(),
             10, "the graceful stop to begin")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)


def holders(rds: redis.Redis, leases: str) -> set[str]:
    return {lid.decode().rsplit(":", 1)[0] for lid in rds.zrange(leases, 0, -1)}


def test_a_forced_stop_gives_its_leases_back_to_the_next_worker(
    env: dict[str, str], tmp_path: Path, site_factory: SiteFactory,
    rds: redis.Redis, db: Any,
) -> None:
    site = slow_site(site_factory)
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    frontier = Frontier(rds, SPIDER)
    leases, ldata = frontier.key("leases"), frontier.key("ldata")
    # Four forced stops of a worker restarted each time.
    for round_ in range(4):
        log = tmp_path / f"stopped-{round_}.log"
        proc = start_worker(SPIDER, env, log, LONG_LEASES)
        try:
            wait_for(lambda: rds.zcard(leases) > 0, 30, "the worker to hold leases")
            held = set(rds.zrange(leases, 0, -1))
            force_stop(proc, log)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert not held & set(rds.zrange(leases, 0, -1)), "leases left after a forced stop"
        assert "Forced stop: gave back" in log.read_text()
    # A fifth, while the next worker runs: it fetches the given-back work.
    log = tmp_path / "stopped-4.log"
    proc = start_worker(SPIDER, env, log, LONG_LEASES)
    wait_for(lambda: rds.zcard(leases) > 0, 30, "the worker to hold leases")
    [stopped] = holders(rds, leases)
    next_log = tmp_path / "next.log"
    next_proc = start_worker(SPIDER, env, next_log, {**LONG_LEASES, "CONCURRENT_REQUESTS": 8})
    try:
        wait_for(lambda: len(holders(rds, leases)) == 2, 30, "both workers to hold leases")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "shutting down gracefully" in log.read_text(), 10, "a graceful stop")
        ids = [lid for lid in rds.zrange(leases, 0, -1) if lid.decode().startswith(stopped + ":")]
        paths = {m.group() for data in rds.hmget(ldata, ids)
                 if data and (m := re.search(r"/p/\d+", data.decode()))}
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        assert paths
        wait_for(lambda: paths <= {h.path for h in site.hits() if h.started >= stopped_at},
                 30, f"the given-back pages {paths} to be fetched again")
        refetched = max(h.started for h in site.hits()
                        if h.path in paths and h.started >= stopped_at)
        [worker] = wait_workers([next_proc], [next_log], 90)
    finally:
        for p in (proc, next_proc):
            if p.poll() is None:
                p.kill()
    print(f"given-back pages fetched again {refetched - stopped_at:.2f} s after the second SIGTERM")
    assert refetched - stopped_at < 2.0, (refetched - stopped_at, paths)
    assert worker.returncode == 0, worker.log[-3000:]
    dead = [json.loads(d) for d in rds.lrange(f"{{{SPIDER}}}:dead", 0, -1)]
    assert dead == []
    assert db.pages.count_documents({}) == PAGES + 1
    assert frontier.audit() == {}
