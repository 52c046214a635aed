"""Review of issue 13 (sharded frontier, priority across all due sites,
bounded state, status without SCAN): held-back variants of its acceptance,
against real Redis servers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy import Request, Spider

from tests import scheduler_harness as harness
from tests.scheduler_harness import finish

if TYPE_CHECKING:
    import redis

    from crawler.frontier.scheduler import FrontierScheduler

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "t"


def _serve(scheduler: FrontierScheduler, n: int) -> list[Request]:
    """Lease and handle ``n`` requests, one after another."""
    out = []
    for _ in range(n):
        request = scheduler.next_request()
        assert request is not None, out
        out.append(request)
        finish(scheduler, request)
    return out


@pytest.mark.parametrize("shards", [1, 2, 5])
@pytest.mark.parametrize("nth", [33, 41, 500])
def test_priority_9_on_the_nth_due_site_comes_first(
    redis_url: str, rds: redis.Redis, shards: int, nth: int
) -> None:
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    for i in range(1, nth):
        scheduler.enqueue_request(Request(f"https://s{i}.example/0"))
    scheduler.enqueue_request(Request(f"https://s{nth}.example/9", priority=9))
    assert scheduler.flush_outbox()
    got = [r.priority for r in _serve(scheduler, 8)]
    assert got == [9] + [0] * 7, got


@pytest.mark.parametrize("shards", [1, 2, 5])
def test_mixed_priorities_on_distinct_sites_are_served_best_first(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """Priorities 0..9 on 50 sites spread over the shards, pushed in a
    shuffled order: served in order of priority, every one once (a lease
    call's batch does not take one shard's lower priorities before another
    shard's better ones)."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    prios = [(i * 7) % 10 for i in range(50)]
    for i, p in enumerate(prios):
        scheduler.enqueue_request(Request(f"https://m{i}.example/{p}", priority=p))
    assert scheduler.flush_outbox()
    got = [r.priority for r in _serve(scheduler, 50)]
    assert got == sorted(prios, reverse=True), str(got)
