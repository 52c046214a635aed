"""The scheduler's dead letters on their own (:mod:`crawler.frontier.deadletters`),
committed to a real Redis: a request given up, one whose callback raised,
and a leased entry that is no request (its lease acknowledged with it)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider, signals
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

from crawler.frontier.connection import get_redis
from crawler.frontier.deadletters import DeadLetters, first_priority
from crawler.frontier.leasebook import LeaseBook
from crawler.frontier.outbox import Outbox
from crawler.frontier.queue import LeasedPriorityQueue
from crawler.frontier.signals import request_dead
from crawler.frontier.store import Push
from tests.scheduler_harness import reactor_loop

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.crawler import Crawler

HOLDER = "dead-worker#0001"


class _Spider(Spider):
    name = "dead"


class _Part:
    """Dead letters over a real queue, and the lease book whose shards they use."""

    def __init__(self, redis_url: str, **settings: Any) -> None:
        reactor_loop()
        crawler = get_crawler(_Spider, {"REDIS_URL": redis_url, **settings})
        crawler.spider = crawler._create_spider()
        crawler.stats.open_spider()
        self.crawler: Crawler = crawler
        self.queue = LeasedPriorityQueue(get_redis(crawler.settings), crawler.spider, "{dead}")
        self.outbox = Outbox(60.0, flush=lambda: True, resume_at=lambda: 0.0)
        self.dead = DeadLetters(self.outbox, crawler.stats, crawler.settings)
        self.book = LeaseBook(HOLDER, self.outbox, crawler.stats, self.dead.entry, lambda: None)
        self.book.queue = self.dead.queue = self.queue
        self.dead.lease_shards = self.book.lease_shards

    def commit(self) -> Any:
        groups, batches = self.outbox.batches()
        committed = self.queue.frontier.commit(batches[0]) if batches else None
        for ops in groups.values():
            self.outbox.remove(ops)
        return committed

    def records(self) -> list[dict[str, Any]]:
        frontier = self.queue.frontier
        return [json.loads(raw) for raw in frontier.redis.lrange(frontier.key("dead"), 0, -1)]


@pytest.fixture
def part(redis_url: str) -> Iterator[_Part]:
    p = _Part(redis_url, RETRY_PRIORITY_ADJUST=-2)
    yield p
    p.outbox.cancel()


def test_a_request_given_up_is_recorded_with_its_first_priority(part: _Part) -> None:
    request = Request("https://a.example/x", priority=3, meta={"retry_times": 2})
    part.crawler.signals.send_catch_log(request_dead, request=request, reason="ignored")
    assert len(part.outbox) == 0  # (not connected yet)
    part.dead.connect(part.crawler.signals)
    part.crawler.signals.send_catch_log(
        request_dead, request=request, reason="gave up after 3 attempts: 500", error="500"
    )
    assert [op.kind for op in part.outbox.ops] == ["dead"]
    assert part.crawler.stats.get_value("frontier/dead") == 1
    part.commit()
    [record] = part.records()
    assert {k: record[k] for k in ("url", "reason", "attempts", "last_error")} == {
        "url": "https://a.example/x", "reason": "gave up after 3 attempts: 500",
        "attempts": 3, "last_error": "500",
    }
    assert record["first_priority"] == 7 == first_priority(3, request.meta, -2)
    assert part.queue.decode(record["entry"].encode(), "a.example").url == request.url


def test_a_callback_that_raised_is_a_dead_letter(part: _Part) -> None:
    part.dead.connect(part.crawler.signals)
    request = Request("https://b.example/page")
    response = HtmlResponse(request.url, body=b"<html></html>", request=request)
    part.crawler.signals.send_catch_log(
        signals.spider_error,
        failure=Failure(ValueError("boom")), response=response, spider=part.crawler.spider,
    )
    part.commit()
    [record] = part.records()
    assert record["reason"] == "callback raised"
    assert record["last_error"] == "ValueError('boom')"


def test_an_undecodable_entry_is_recorded_whole_and_its_lease_acknowledged(part: _Part) -> None:
    part.queue.frontier.push_many([Push(b"\x80 not a request", "c.example", 0, b"f", False)])
    leased = part.queue.frontier.lease_many(part.book.new_ids(1), held_all=0)
    assert isinstance(leased, list)
    part.book.take(leased)  # the book hands it to DeadLetters.entry
    assert part.book.lease_shards == {}
    assert sorted(op.kind for op in part.outbox.ops) == ["acks", "dead"]
    committed = part.commit()
    assert committed.acked == 1
    assert part.queue.frontier.pending() == 0
    [record] = part.records()
    assert record["url"] is None and record["site"] == "c.example"
    assert record["entry"] == "\x80 not a request"
    assert record["reason"].startswith("undecodable frontier entry: ")
