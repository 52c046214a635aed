"""The scheduler, queue and dupefilter against a real Redis, in process."""

from __future__ import annotations

import json
import pickle
import warnings
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from crawler.frontier.scheduler import FrontierScheduler

if TYPE_CHECKING:
    from collections.abc import Iterator


class _Spider(Spider):
    name = "t"

    def parse_page(self, response: Any) -> None:
        pass


SETTINGS = {
    "SCHEDULER_QUEUE_CLASS": "crawler.frontier.queue.JsonPriorityQueue",
    "SCHEDULER_QUEUE_KEY": "{%(spider)s}:requests",
    "SCHEDULER_DUPEFILTER_KEY": "{%(spider)s}:dupefilter",
    "DUPEFILTER_CLASS": "crawler.frontier.dupefilter.FrontierDupeFilter",
    "SCHEDULER_PERSIST": True,
}


@pytest.fixture
def rds(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def open_scheduler(redis_url: str, **settings: Any) -> tuple[FrontierScheduler, Any]:
    crawler = get_crawler(_Spider, {**SETTINGS, "REDIS_URL": redis_url, **settings})
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    scheduler = build_from_crawler(FrontierScheduler, crawler)
    scheduler.open(crawler.spider)
    return scheduler, crawler


def test_building_the_scheduler_does_no_io() -> None:
    # Nothing listens on port 1: building must not connect (scrapy-redis pings).
    crawler = get_crawler(_Spider, {**SETTINGS, "REDIS_URL": "redis://127.0.0.1:1/0"})
    build_from_crawler(FrontierScheduler, crawler)


def test_scheduling_uses_scrapys_fingerprinter_and_no_deprecated_calls(
    redis_url: str, rds: redis.Redis
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduler, crawler = open_scheduler(redis_url)
        request = Request("https://a.example/x?b=2&a=1", callback=crawler.spider.parse_page)
        assert scheduler.enqueue_request(request)
        assert not scheduler.enqueue_request(Request("https://a.example/x?a=1&b=2"))
        popped = scheduler.next_request()
        assert popped is not None
        assert popped.callback == crawler.spider.parse_page
        assert scheduler.next_request() is None
    fingerprint = crawler.request_fingerprinter.fingerprint(request)
    assert rds.smembers("{t}:dupefilter") == {fingerprint}
    assert crawler.stats.get_value("scheduler/enqueued/redis") == 1
    assert crawler.stats.get_value("scheduler/dequeued/redis") == 1
    assert crawler.stats.get_value("dupefilter/filtered") == 1


def test_a_dont_filter_request_is_queued_and_still_counts_as_seen(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = open_scheduler(redis_url)
    assert scheduler.enqueue_request(Request("https://a.example/", dont_filter=True))
    assert scheduler.enqueue_request(Request("https://a.example/", dont_filter=True))
    # A page linking back to the seed does not fetch it again.
    assert not scheduler.enqueue_request(Request("https://a.example/"))
    # scrapy-redis's sorted set holds identical entries once.
    assert rds.zcard("{t}:requests") == 1


def test_higher_priority_pops_first(redis_url: str) -> None:
    scheduler, _ = open_scheduler(redis_url)
    for i, priority in enumerate([0, 5, -1, 9]):
        scheduler.enqueue_request(Request(f"https://a.example/{i}", priority=priority))
    order = [scheduler.next_request().url for _ in range(4)]  # type: ignore[union-attr]
    assert order == [f"https://a.example/{i}" for i in (3, 1, 0, 2)]


def test_an_unencodable_request_is_refused_and_not_marked_seen(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, crawler = open_scheduler(redis_url)
    assert not scheduler.enqueue_request(Request("https://a.example/", meta={"x": object()}))
    assert "https://a.example/" in caplog.text
    assert "meta['x']" in caplog.text
    assert crawler.stats.get_value("scheduler/unencodable") == 1
    assert rds.scard("{t}:dupefilter") == 0
    assert scheduler.enqueue_request(Request("https://a.example/"))


def test_a_pickled_entry_is_dead_lettered_not_unpickled(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = open_scheduler(redis_url)
    rds.zadd("{t}:requests", {pickle.dumps({"url": "https://evil.example/"}): -1})
    scheduler.enqueue_request(Request("https://a.example/good"))
    request = scheduler.next_request()
    assert request is not None
    assert request.url == "https://a.example/good"
    [dead] = rds.lrange("{t}:requests:dead", 0, -1)
    assert "pickled payload" in json.loads(dead)["reason"]


def test_closing_keeps_the_shared_frontier(redis_url: str, rds: redis.Redis) -> None:
    scheduler, _ = open_scheduler(redis_url)
    scheduler.enqueue_request(Request("https://a.example/1"))
    scheduler.close("finished")
    assert rds.zcard("{t}:requests") == 1
    assert rds.scard("{t}:dupefilter") == 1
