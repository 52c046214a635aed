"""A callback that blocks the reactor longer than a lease (issue 29, item 3):
the worker's heartbeat goes on from a thread of its own, so it keeps the
leases it holds; no page is handed out again, none dead-lettered."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from crawler import settings as project
from devtools.replay import Page
from tests.workers import crawl

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from tests.conftest import SiteFactory

LEASE = 2.0


@pytest.mark.workers
def test_a_callback_blocking_the_reactor_longer_than_a_lease_keeps_the_leases(
    env: dict[str, str], db: Any, rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    pages = {
        f"/{i}": Page(200, [("Content-Type", "text/html")], f"<title>{i}</title>".encode())
        for i in range(24)
    }
    site = site_factory(pages, latency=0.2)
    slow = site.url_for("/3")
    rds.lpush("pages:start_urls", *[site.url_for(p) for p in pages])
    middlewares = {**project.SPIDER_MIDDLEWARES, "tests.blocking.BlockOnUrlMiddleware": 45}
    env = {**env, "BLOCK_URLS": slow, "BLOCK_SECONDS": str(1.5 * LEASE)}

    workers = crawl("pages", env, tmp_path, workers=2, settings={
        "FRONTIER_LEASE_TIMEOUT": LEASE, "FRONTIER_MAX_DELIVERIES": 3,
        "CONCURRENT_REQUESTS": 4, "SPIDER_MIDDLEWARES": json.dumps(middlewares),
    })

    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    counts = Counter(h.path for h in site.hits())
    # The slow page fetched once, and no other lease handed out again.
    assert counts["/3"] == 1, counts
    assert {p: n for p, n in counts.items() if n > 1} == {}, counts
    assert rds.lrange("pages:dead", 0, -1) == []
    assert db.pages.count_documents({}) == len(pages)
    assert sum(w.stats.get("frontier/leases/returned", 0) for w in workers) == 0
