"""The scheduler's heartbeats on their own (:class:`crawler.frontier.heartbeat.Heartbeats`),
against a real Redis: a beat sends the outbox, marks the worker live and
extends the leases held, then asks for the eviction check; after a
configuration error it sends nothing; the thread beats with the leases
published to it, and both stop."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from crawler.frontier.connection import get_redis
from crawler.frontier.heartbeat import Heartbeats
from crawler.frontier.leasebook import LeaseBook
from crawler.frontier.outbox import Outbox
from crawler.frontier.queue import LeasedPriorityQueue
from crawler.frontier.session import Session
from crawler.frontier.store import Push
from tests.scheduler_harness import reactor_loop

if TYPE_CHECKING:
    from collections.abc import Iterator

HOLDER = "beat-worker#0001"
LEASE_TIMEOUT = 60.0


class _Spider(Spider):
    name = "beats"


class _Part:
    """Heartbeats over a real queue, session and lease book."""

    def __init__(self, redis_url: str) -> None:
        reactor_loop()
        crawler = get_crawler(_Spider, {"REDIS_URL": redis_url,
                                        "FRONTIER_LEASE_TIMEOUT": LEASE_TIMEOUT})
        crawler.spider = crawler._create_spider()
        crawler.stats.open_spider()
        self.server = get_redis(crawler.settings)
        self.queue = LeasedPriorityQueue(self.server, crawler.spider, "{beats}")
        self.outbox = Outbox(60.0, flush=lambda: True, resume_at=lambda: 0.0)
        host = SimpleNamespace(forget_seen=lambda: None, wake=lambda: None)
        self.session = Session(self.server, crawler, HOLDER, self.outbox, host)
        self.session.shards = self.queue.shards
        self.flushes = self.checks = 0
        self.beats = Heartbeats(crawler, self.session, HOLDER, LEASE_TIMEOUT,
                                flush=self._flush, after_beat=self._after_beat)
        self.book = LeaseBook(HOLDER, self.outbox, crawler.stats, lambda *a: None,
                              self.beats.publish_held)
        self.book.queue = self.queue
        self.beats.book = self.book
        self.beats.shards = self.queue.shards

    def _flush(self) -> bool:
        self.flushes += 1
        return True

    def _after_beat(self) -> None:
        self.checks += 1

    def lease(self, n: int) -> list[str]:
        frontier = self.queue.frontier
        frontier.push_many([
            Push(self.queue.encode(Request(f"https://a.example/{i}")), "a.example", 0,
                 f"f{i}".encode(), False)
            for i in range(n)
        ])
        leased = frontier.lease_many(self.book.new_ids(n), held_all=0)
        assert isinstance(leased, list)
        self.book.take(leased)
        return [lease.lease_id for lease in leased]

    def deadlines(self) -> dict[str, float]:
        """Lease id -> its deadline, ms after now on Redis's clock."""
        seconds, micros = self.server.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        key = self.queue.frontier.key("leases")
        return {k.decode(): score - now for k, score in self.server.zrange(key, 0, -1,
                                                                           withscores=True)}

    def nearly_expire(self, lease_id: str) -> None:
        """Bring ``lease_id``'s deadline to one second from now."""
        seconds, micros = self.server.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        self.server.zadd(self.queue.frontier.key("leases"), {lease_id: now + 1000}, xx=True)
        assert self.deadlines()[lease_id] <= 1000

    def live(self) -> set[bytes]:
        return set(self.server.zrange(self.queue.frontier.key("alive"), 0, -1))


@pytest.fixture
def part(redis_url: str) -> Iterator[_Part]:
    p = _Part(redis_url)
    yield p
    p.beats.stop(timeout=5)
    p.outbox.cancel()


def test_a_beat_sends_the_outbox_marks_the_worker_live_and_extends_its_leases(
    part: _Part,
) -> None:
    [lease_id] = part.lease(1)
    part.nearly_expire(lease_id)
    part.server.delete(part.queue.frontier.key("alive"))
    part.beats.beat()
    assert part.flushes == 1 and part.checks == 1
    assert part.live() == {HOLDER.encode()}
    assert part.deadlines()[lease_id] > (LEASE_TIMEOUT - 5) * 1000


def test_after_a_configuration_error_a_beat_sends_nothing(part: _Part) -> None:
    part.lease(1)
    part.server.delete(part.queue.frontier.key("alive"))
    part.session.stop()  # (what Opening.stop_at_open does)
    part.beats.beat()
    assert part.live() == set() and part.checks == 0


def test_the_thread_extends_the_leases_published_to_it_and_both_heartbeats_stop(
    part: _Part,
) -> None:
    part.beats.start(part.queue.shards, None)
    assert part.beats.loop.running
    thread: Any = part.beats.thread
    assert thread is not None and thread.held() == {}
    [lease_id] = part.lease(1)  # the book publishes what it holds
    assert thread.held() == {0: [lease_id]}
    part.nearly_expire(lease_id)
    assert thread.beat()
    assert part.deadlines()[lease_id] > (LEASE_TIMEOUT - 5) * 1000
    part.beats.stop(timeout=5)
    assert not part.beats.loop.running and part.beats.thread is None
