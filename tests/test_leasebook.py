"""The scheduler's lease book on its own (:mod:`crawler.frontier.leasebook`),
with leases taken from a real Redis: requests buffered and handed out, a
download's slot freed, the ack that ends a lease, give-backs, what the
heartbeats extend, undecodable entries, and the last-chance rule (leased
alone; a drain, then the site looked at first)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from crawler.frontier.connection import get_redis
from crawler.frontier.leasebook import REVISIT_META, LeaseBook
from crawler.frontier.lifecycle import SUSPECT
from crawler.frontier.outbox import Outbox
from crawler.frontier.queue import LeasedPriorityQueue
from crawler.frontier.store import Lease, NotDue, Push
from tests.scheduler_harness import reactor_loop

if TYPE_CHECKING:
    from collections.abc import Iterator

HOLDER = "book-worker#0001"


class _Spider(Spider):
    name = "book"


class _Book:
    """A lease book over a real queue, and what it told."""

    def __init__(self, redis_url: str, **settings: Any) -> None:
        reactor_loop()
        crawler = get_crawler(_Spider, {"REDIS_URL": redis_url, **settings})
        crawler.spider = crawler._create_spider()
        crawler.stats.open_spider()
        self.stats = crawler.stats
        self.queue = LeasedPriorityQueue(get_redis(crawler.settings), crawler.spider, "{book}")
        self.outbox = Outbox(60.0, flush=lambda: True, resume_at=lambda: 0.0)
        self.dead: list[tuple[bytes, str, str | None]] = []
        self.changes = 0
        self.book = LeaseBook(HOLDER, self.outbox, crawler.stats, self._dead_entry, self._changed)
        self.book.queue = self.queue

    def _dead_entry(self, data: bytes, lease_id: str, exc: Exception, site: str | None) -> None:
        self.dead.append((data, lease_id, site))

    def _changed(self) -> None:
        self.changes += 1

    def push(self, *requests: Request) -> None:
        self.queue.frontier.push_many([
            Push(self.queue.encode(r), self.queue.policy.slot_of(r), r.priority,
                 r.url.encode(), False)
            for r in requests
        ])

    def lease(self, n: int) -> list[Lease]:
        leased = self.queue.frontier.lease_many(self.book.new_ids(n), held_all=0)
        assert isinstance(leased, list)
        return leased

    def commit(self) -> Any:
        """Send the outbox as the session would (one shard)."""
        groups, batches = self.outbox.batches()
        committed = self.queue.frontier.commit(batches[0]) if batches else None
        for ops in groups.values():
            self.outbox.remove(ops)
        return committed


@pytest.fixture
def book(redis_url: str) -> Iterator[_Book]:
    b = _Book(redis_url)
    yield b
    b.outbox.cancel()


def test_leases_taken_are_handed_out_in_order_and_counted(book: _Book) -> None:
    book.push(Request("https://a.example/1"), Request("https://b.example/2"))
    leases = book.lease(2)
    assert [lease.lease_id for lease in leases] == [f"{HOLDER}:0", f"{HOLDER}:1"]
    book.book.take(leases)
    assert book.changes == 2
    assert [book.book.hand_out().url for _ in range(2)] == [
        "https://a.example/1", "https://b.example/2"
    ]
    assert book.stats.get_value("scheduler/dequeued/redis") == 2
    assert book.book.held() == {0: [f"{HOLDER}:0", f"{HOLDER}:1"]}
    assert book.book.held_on(0) == 2 and book.book.held_on(1) == 0


def test_a_download_frees_its_slot_and_the_ack_ends_the_lease_extended_until_in(
    book: _Book,
) -> None:
    book.push(Request("https://a.example/1"))
    book.book.take(book.lease(1))
    request = book.book.hand_out()
    assert book.book.download_ended(Request("https://elsewhere.example/")) is None
    assert book.book.download_ended(request) == 0
    assert [(op.kind, op.item) for op in book.outbox.ops] == [("slots", f"{HOLDER}:0")]
    assert book.book.finished(request) is False  # (no drain: nothing to wake)
    assert book.book.leases == {} and book.book.lease_shards == {}
    assert book.book.held() == {0: [f"{HOLDER}:0"]}  # its ack is not in Redis yet
    committed = book.commit()
    assert committed.acked == 1 and book.book.held() == {}
    assert book.queue.frontier.pending() == 0


def test_give_back_all_returns_every_lease_to_the_front_of_its_queue(book: _Book) -> None:
    book.push(Request("https://a.example/1"), Request("https://a.example/2"))
    book.book.take(book.lease(2))
    book.book.hand_out()
    assert book.book.give_back_all() == 2
    assert not book.book.ready and not book.book.leases and not book.book.entries
    assert book.commit().given == 2
    again = book.lease(2)
    assert [lease.deliveries for lease in again] == [1, 1]  # no failed delivery


def test_an_undecodable_entry_goes_to_the_dead_entry_callback(book: _Book) -> None:
    book.queue.frontier.push_many([Push(b"\x80 not a request", "a.example", 0, b"f", False)])
    [lease] = book.lease(1)
    book.book.take([lease])
    assert book.dead == [(b"\x80 not a request", lease.lease_id, "a.example")]
    assert not book.book.ready and not book.book.leases
    assert book.book.lease_shards == {lease.lease_id: 0}  # (the callback acks it)


def test_a_revisit_leased_is_counted(redis_url: str) -> None:
    b = _Book(redis_url, FRONTIER_REVISIT_AFTER=60)
    b.push(Request("https://a.example/1", meta={REVISIT_META: {"etag": "x"}}))
    b.book.take(b.lease(1))
    request = b.book.ready[0]
    assert b.stats.get_value("frontier/revisits/leased") == 1
    assert b.book.entries[request][1] == "a.example"


def test_a_last_chance_is_held_alone_until_it_is_done(redis_url: str) -> None:
    b = _Book(redis_url, FRONTIER_MAX_DELIVERIES=2)
    data = b.queue.encode(Request("https://a.example/poison"))
    b.book.take([Lease(data, "a.example", f"{HOLDER}:9", deliveries=2, state=SUSPECT)])
    assert b.book.alone == f"{HOLDER}:9"
    assert b.stats.get_value("frontier/last_chance/leased") == 1
    assert b.book.holding_back()
    assert b.book.finished(b.book.hand_out()) is True  # lease now
    assert not b.book.holding_back() and b.book.alone is None


def test_a_drain_waits_for_the_leases_held_then_names_the_site_once(book: _Book) -> None:
    book.push(Request("https://a.example/1"))
    book.book.take(book.lease(1))
    book.book.last_passed(NotDue(None, 0, 0, last_passed="p.example"), 0)
    assert book.stats.get_value("frontier/last_chance/drains") == 1
    assert book.book.holding_back() and book.book.drain_shard == 0
    assert book.book.drain_hint(0) is None  # (still holding a lease)
    assert book.book.finished(book.book.hand_out()) is True
    assert not book.book.holding_back()
    assert book.book.drain_hint(1) is None  # another shard
    assert book.book.drain_hint(0) == "p.example"
    assert book.book.drain_hint(0) is None  # once
