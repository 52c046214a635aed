"""The scheduler's revisits on their own (:mod:`crawler.frontier.revisits`),
over leases taken from a real Redis: a leased request reported fetched is
queued again as it was queued, with its validators and without the
headers of this download; nothing else is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from crawler.frontier.connection import get_redis
from crawler.frontier.dupefilter import FrontierDupeFilter
from crawler.frontier.leasebook import REVISIT_META, LeaseBook
from crawler.frontier.outbox import Outbox
from crawler.frontier.queue import LeasedPriorityQueue
from crawler.frontier.revisits import Revisits
from crawler.frontier.signals import request_fetched
from crawler.frontier.store import Push, Revisit
from tests.scheduler_harness import reactor_loop

if TYPE_CHECKING:
    from collections.abc import Iterator

HOLDER = "revisit-worker#0001"
USER_AGENT = "part-test/1.0"


class _Spider(Spider):
    name = "again"


class _Part:
    """Revisits over a real queue and lease book."""

    def __init__(self, redis_url: str, **settings: Any) -> None:
        reactor_loop()
        crawler = get_crawler(_Spider, {
            "REDIS_URL": redis_url, "USER_AGENT": USER_AGENT, **settings,
        })
        crawler.spider = crawler._create_spider()
        crawler.stats.open_spider()
        self.crawler = crawler
        self.queue = LeasedPriorityQueue(get_redis(crawler.settings), crawler.spider, "{again}")
        self.outbox = Outbox(60.0, flush=lambda: True, resume_at=lambda: 0.0)
        self.book = LeaseBook(HOLDER, self.outbox, crawler.stats, lambda *a: None, lambda: None)
        self.book.queue = self.queue
        self.dupefilter = FrontierDupeFilter.from_crawler(crawler)
        self.revisits = Revisits(self.book, self.outbox, self.dupefilter, crawler.stats,
                                 crawler.settings)
        self.revisits.queue = self.queue
        self.revisits.connect(crawler.signals)

    def lease(self, request: Request) -> Request:
        """``request`` queued, leased and handed out (as the engine gets it)."""
        self.queue.frontier.push_many([Push(
            self.queue.encode(request), self.queue.policy.slot_of(request), request.priority,
            self.dupefilter.request_fingerprint(request), False,
        )])
        leased = self.queue.frontier.lease_many(self.book.new_ids(1), held_all=0)
        assert isinstance(leased, list)
        self.book.take(leased)
        return self.book.hand_out()

    def fetched(self, request: Request, **validators: str) -> None:
        self.crawler.signals.send_catch_log(
            request_fetched, request=request, validators=validators
        )


@pytest.fixture
def part(redis_url: str) -> Iterator[_Part]:
    p = _Part(redis_url, FRONTIER_REVISIT_AFTER=60)
    yield p
    p.outbox.cancel()


def test_a_leased_request_fetched_is_queued_again_as_it_was_queued(part: _Part) -> None:
    queued = Request("https://a.example/p", priority=2, meta={"depth": 1},
                     headers={"X-Kept": "1", "Cookie": "c=1"})
    request = part.lease(queued)
    # what this download added: Scrapy's meta and headers of the moment
    request.meta.update(download_latency=0.2, retry_times=1)
    request.headers["User-Agent"] = USER_AGENT
    part.fetched(request, etag='"v1"')
    [op] = part.outbox.ops
    assert op.kind == "revisits" and isinstance(op.item, Revisit)
    assert (op.item.site, op.item.priority) == ("a.example", 2)
    assert op.item.fingerprint == part.dupefilter.request_fingerprint(request)
    again = part.queue.decode(op.item.data, op.item.site)
    assert again.url == queued.url
    assert again.meta[REVISIT_META] == {"etag": '"v1"'} and again.meta["depth"] == 1
    assert not {"download_latency", "retry_times"} & set(again.meta)  # this download's
    assert again.headers.get("X-Kept") == b"1"
    assert "Cookie" not in again.headers and "User-Agent" not in again.headers
    assert part.crawler.stats.get_value("frontier/revisits/scheduled") == 1
    _, batches = part.outbox.batches()
    part.queue.frontier.commit(batches[0])
    assert part.queue.frontier.revisits() == 1


def test_a_revisits_headers_drop_the_last_conditionals_and_the_settings_defaults(
    part: _Part,
) -> None:
    queued = Request("https://a.example/p", headers={
        "If-None-Match": '"v0"', "If-Modified-Since": "Mon, 01 Jan 2024 00:00:00 GMT",
        "Accept-Encoding": "gzip", "User-Agent": "another/2.0",
        "Accept-Language": "en",  # Scrapy's DEFAULT_REQUEST_HEADERS has it
        "Accept": "text/html",  # not Scrapy's default value: kept
    })
    headers = part.revisits.headers(queued)
    assert dict(headers.to_unicode_dict()) == {
        "User-Agent": "another/2.0", "Accept": "text/html",
    }


def test_requests_not_leased_or_without_revisits_are_not_queued_again(
    part: _Part, redis_url: str,
) -> None:
    part.fetched(Request("https://a.example/robots.txt"))  # fetched outside the frontier
    assert len(part.outbox) == 0
    off = _Part(redis_url)  # FRONTIER_REVISIT_AFTER 0: off
    try:
        off.fetched(off.lease(Request("https://b.example/p")))
        assert len(off.outbox) == 0
    finally:
        off.outbox.cancel()
