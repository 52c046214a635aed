"""The scheduler's enqueuer on its own (:mod:`crawler.frontier.enqueuer`),
committed to a real Redis: a request becomes a push (or a retry) for its
site's shard, a repeat this worker recorded is dropped without Redis, and
what cannot be stored is refused and never remembered."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from crawler.frontier.connection import get_redis
from crawler.frontier.dupefilter import FrontierDupeFilter
from crawler.frontier.enqueuer import Enqueuer
from crawler.frontier.outbox import Outbox
from crawler.frontier.queue import LeasedPriorityQueue
from crawler.frontier.router import ShardRouter
from crawler.frontier.session import Session
from crawler.frontier.signals import RETRY_DELAY_META
from crawler.frontier.store import PRIORITY_LIMIT, Push, Retry
from tests.scheduler_harness import reactor_loop

if TYPE_CHECKING:
    from collections.abc import Iterator

HOLDER = "enqueue-worker#0001"


class _Spider(Spider):
    name = "enqueue"


class _Part:
    """An enqueuer over a real queue, with the router it tells."""

    def __init__(self, redis_url: str, seen_max: int = 3) -> None:
        reactor_loop()
        crawler = get_crawler(_Spider, {"REDIS_URL": redis_url})
        crawler.spider = crawler._create_spider()
        crawler.stats.open_spider()
        self.stats = crawler.stats
        server = get_redis(crawler.settings)
        self.queue = LeasedPriorityQueue(server, crawler.spider, "{enqueue}")
        self.outbox = Outbox(60.0, flush=lambda: True, resume_at=lambda: 0.0)
        host = SimpleNamespace(forget_seen=lambda: None, wake=lambda: None)
        session = Session(server, crawler, HOLDER, self.outbox, host)
        router = ShardRouter(HOLDER, session, self.outbox, lambda result, shard: None)
        router.open(self.queue.shards)
        self.dupefilter = FrontierDupeFilter.from_crawler(crawler)
        self.enqueuer = Enqueuer(self.dupefilter, self.outbox, router, crawler.stats, seen_max)
        self.enqueuer.queue = self.queue
        self.enqueuer.spider = crawler.spider

    def commit(self) -> Any:
        _, batches = self.outbox.batches()
        return self.queue.frontier.commit(batches[0])


@pytest.fixture
def part(redis_url: str) -> Iterator[_Part]:
    p = _Part(redis_url)
    yield p
    p.outbox.cancel()


def test_a_request_becomes_a_push_for_its_site_and_a_repeat_is_dropped_locally(
    part: _Part,
) -> None:
    request = Request("https://a.example/p", priority=4)
    assert part.enqueuer.enqueue(request)
    assert request.meta["download_slot"] == "a.example"
    [op] = part.outbox.ops
    assert op.kind == "pushes" and isinstance(op.item, Push) and op.request is request
    assert (op.item.site, op.item.priority) == ("a.example", 4)
    assert list(part.enqueuer.seen) == [part.dupefilter.request_fingerprint(request)]
    assert not part.enqueuer.enqueue(Request("https://a.example/p", priority=4))
    assert part.stats.get_value("dupefilter/filtered") == 1 and len(part.outbox) == 1
    assert part.commit().pushed == [True]
    assert part.queue.frontier.pending() == 1


def test_the_memory_keeps_the_last_fingerprints_and_is_forgotten_on_demand(
    part: _Part,
) -> None:
    for i in range(5):
        assert part.enqueuer.enqueue(Request(f"https://a.example/{i}"))
    assert len(part.enqueuer.seen) == 3  # the oldest went first
    assert part.enqueuer.enqueue(Request("https://a.example/0"))  # (left to Redis)
    part.enqueuer.forget_seen()
    assert part.enqueuer.seen == {}


def test_a_retry_goes_to_the_retry_set_and_is_not_remembered(part: _Part) -> None:
    retry = Request("https://b.example/r", dont_filter=True, meta={RETRY_DELAY_META: 0.5})
    assert part.enqueuer.enqueue(retry)
    [op] = part.outbox.ops
    assert op.kind == "retries" and isinstance(op.item, Retry) and op.item.delay == 0.5
    assert RETRY_DELAY_META not in retry.meta and part.enqueuer.seen == {}
    assert part.stats.get_value("frontier/retries/scheduled") == 1


@pytest.mark.parametrize(
    ("request_", "stat"),
    [(Request("https://c.example/", priority=PRIORITY_LIMIT + 1),
      "scheduler/priority_out_of_range"),
     (Request("https://c.example/", meta={"x": object()}), "scheduler/unencodable")],
    ids=["priority", "unencodable"],
)
def test_what_cannot_be_stored_is_refused_and_never_remembered(
    part: _Part, request_: Request, stat: str
) -> None:
    assert not part.enqueuer.enqueue(request_)
    assert part.stats.get_value(stat) == 1
    assert len(part.outbox) == 0 and part.enqueuer.seen == {}
