"""A graceful stop during a Redis outage ends within its bound, and loses nothing.

A real ``scrapy crawl pages`` worker crawls the quotes capture through a
:class:`~tests.faultproxy.FaultProxy`; mid-crawl the proxy cuts Redis off
(``refused``: every connection closed, new ones refused; ``silent``: a
partition that leaves connections open, every reply held past the socket
timeout) and the worker gets one SIGINT.
It cannot give its leases back nor send the writes waiting in its outbox:
it must still exit within the bound docs/stopping.md states, and once Redis
answers again a new worker must complete the crawl, every page stored once.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

import pytest

from crawler.frontier.store import Frontier
from devtools.replay import default_warc_path, load_warc
from tests.test_faults import QUOTES_PAGES, SPIDER, proxy  # noqa: F401 (a fixture)
from tests.waiting import wait_for
from tests.workers import start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from tests.conftest import SiteFactory
    from tests.faultproxy import FaultProxy

pytestmark = [pytest.mark.workers, pytest.mark.faults]

#: The bound docs/stopping.md and the README state for a graceful stop
#: during a Redis outage (s).
STOP_BOUND = 15.0
#: Leases longer than the close's wait for Redis (``CLOSE_REDIS_WAIT``, 10 s),
#: so that the bound, not the lease, ends the wait; short enough that the
#: next worker takes the stopped worker's leases back within the test.
SETTINGS: dict[str, object] = {
    "FRONTIER_LEASE_TIMEOUT": 20, "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 4,
}


@pytest.mark.parametrize("outage", ["refused", "silent"])
def test_a_stop_during_a_redis_outage_ends_within_its_bound_and_loses_nothing(
    outage: str, proxy: FaultProxy, mongo_uri: str, mongo_db: str,  # noqa: F811
    rds: redis.Redis, db: Any, site_factory: SiteFactory, tmp_path: Path,
) -> None:
    site = site_factory(load_warc(default_warc_path()), latency=0.2)
    env = worker_env(proxy.url, mongo_uri, mongo_db)
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    log = tmp_path / "stopped.log"
    proc = start_worker(SPIDER, env, log, SETTINGS)
    try:
        wait_for(lambda: db.pages.count_documents({}) >= 20, 60, "the crawl to be under way")
        if outage == "refused":
            proxy.begin_outage()
        else:  # (Redis runs what it is sent; no reply comes back)
            proxy.lose_replies(times=10**9, mode="hold", hold=600)
        wait_for(lambda: "Redis unreachable" in log.read_text(), 60,
                 "the worker to meet the outage")
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=2 * STOP_BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker still ran {2 * STOP_BOUND:.0f} s after SIGINT")
        took = time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    print(f"the worker exited {took:.1f} s after SIGINT, {db.pages.count_documents({})} "
          f"pages stored by then")
    assert took < STOP_BOUND, (took, text[-3000:])
    assert proc.returncode == 0, text[-3000:]
    assert "frontier writes not sent" in text, text[-3000:]
    # The close's wait for Redis is said once when it starts and once when
    # it ends, not at every try.
    closing = text.split("Closing spider", 1)[1]
    assert closing.count("Redis unreachable at close: trying for up to") == 1, closing[-3000:]
    assert closing.count("frontier writes not sent") == 1
    assert closing.count("WARNING: Redis unreachable (") <= 1, closing[-3000:]

    proxy.end_outage()
    proxy.stop_losing()
    next_log = tmp_path / "next.log"
    [worker] = wait_workers([start_worker(SPIDER, env, next_log, SETTINGS)], [next_log], 120)
    assert worker.returncode == 0, worker.log[-3000:]
    assert db.pages.count_documents({}) == QUOTES_PAGES
    assert len(db.pages.distinct("url")) == QUOTES_PAGES
    assert Frontier(rds, SPIDER).audit() == {}
    assert rds.llen(f"{{{SPIDER}}}:dead") == 0
