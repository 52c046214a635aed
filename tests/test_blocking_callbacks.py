"""A callback that blocks the reactor longer than a lease (issue 29, item 3):
the worker's heartbeat goes on from a thread of its own, so it keeps the
leases it holds; no page is handed out again, none dead-lettered."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider

from crawler import settings as project
from crawler.frontier.store import Frontier, NotDue
from devtools.replay import Page
from tests import scheduler_harness as harness
from tests.waiting import wait_for
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


class _Spider(Spider):
    name = "t"


@pytest.mark.usefixtures("stop_heartbeats")
def test_the_heartbeat_thread_keeps_leases_while_the_reactor_does_not_turn(
    redis_url: str, rds: redis.Redis,
) -> None:
    # (the harness's reactor does not turn: only the thread can beat)
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, heartbeat_thread=True, FRONTIER_LEASE_TIMEOUT=0.6
    )
    for url in ("https://a.example/slow", "https://b.example/other"):
        scheduler.enqueue_request(Request(url))
    assert scheduler.flush_outbox()
    held = harness.lease_all(scheduler)
    assert len(held) == 2
    beater = scheduler.heartbeats.thread
    assert beater is not None
    assert sorted(id_ for ids in beater.held().values() for id_ in ids) == sorted(
        scheduler.book.leases.values()
    )
    start = beater.beats
    wait_for(lambda: beater.beats >= start + 5, 10, "five beats (over 1.5 leases)", 0.05)

    # Another worker finds nothing to lease: no lease expired.
    other = Frontier(rds, "t", lease_timeout=0.6)
    other.load_scripts()
    result = other.lease_many(["other#1:0"])
    assert isinstance(result, NotDue), result
    assert result.expired == 0
    assert rds.zcard(other.key("leases")) == 2
    assert rds.zscore(other.key("alive"), scheduler.holder) is not None

    # An acknowledged lease is not revived by a beat (extend.lua: XX);
    # close stops the thread.
    harness.finish(scheduler, held[0])
    start = beater.beats
    wait_for(lambda: beater.beats >= start + 2, 10, "two more beats", 0.05)
    assert rds.zcard(other.key("leases")) == 1
    scheduler.close("finished")
    assert scheduler.heartbeats.thread is None
    assert beater._thread is not None
    assert not beater._thread.is_alive()
    assert rds.zcard(other.key("leases")) == 0  # given back, and no beat revived it


def _until_past(rds: redis.Redis, frontier: Frontier, lease_id: str) -> None:
    def past() -> bool:
        seconds, micros = rds.time()
        deadline = rds.zscore(frontier.key("leases"), lease_id)
        return deadline is None or deadline < seconds * 1000 + micros // 1000

    wait_for(past, 5, f"lease {lease_id} to expire", 0.005)




def _pushed(rds: redis.Redis, url: str) -> Frontier:
    frontier = Frontier(rds, "t", lease_timeout=0.25, max_deliveries=2)
    frontier.load_scripts()
    assert frontier.push(url.encode(), site="a.example", priority=0,
                         fingerprint=url.encode(), dont_filter=False)
    return frontier


def test_a_lease_that_expired_while_its_holder_heartbeats_is_not_counted_as_a_delivery(
    rds: redis.Redis,
) -> None:
    frontier = _pushed(rds, "https://a.example/slow")
    # The live worker's lease expires (its extensions missed the deadline)
    # five times; it beats (alive.lua, as the heartbeat thread does) after
    # each deadline: none counts, whether it or another worker requeues it.
    for n in range(5):
        [lease] = frontier.lease_many([f"live#1:{n}"])  # type: ignore[misc]
        assert lease.deliveries == 1, n
        _until_past(rds, frontier, lease.lease_id)
        frontier.alive("live#1")
    [lease] = frontier.lease_many(["other#1:0"])  # type: ignore[misc]
    assert lease.deliveries == 1
    assert rds.lrange(frontier.key("dead"), 0, -1) == []


def test_a_lease_of_a_worker_without_heartbeat_is_still_counted_as_a_delivery(
    rds: redis.Redis,
) -> None:
    frontier = _pushed(rds, "https://a.example/poison")
    # Two workers die holding it (neither seen after its deadline): each
    # expiry counts, the second dead-letters it (FRONTIER_MAX_DELIVERIES=2).
    [lease] = frontier.lease_many(["dies#1:0"])  # type: ignore[misc]
    assert lease.deliveries == 1
    _until_past(rds, frontier, lease.lease_id)
    [lease] = frontier.lease_many(["dies#2:0"])  # type: ignore[misc]
    assert lease.deliveries == 2
    _until_past(rds, frontier, lease.lease_id)
    result = frontier.lease_many(["dies#3:0"])
    assert isinstance(result, NotDue), result
    [dead] = rds.lrange(frontier.key("dead"), 0, -1)
    assert json.loads(dead)["deliveries"] == 2
    assert "its worker died each time" in json.loads(dead)["reason"]
