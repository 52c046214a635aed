"""The scheduler's opening on its own (:mod:`crawler.frontier.opening`),
against a real Redis: the first worker queues the spider's ``start_urls``,
per-site settings are stored as the commands store them, a configuration
error closes the spider once it is open, and Redis being down is an
outage, not an error."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import CloseSpider
from scrapy.utils.test import get_crawler

from crawler.config import CONFIG_ERROR_REASON, config_error_of
from crawler.frontier.connection import get_redis, redis_location
from crawler.frontier.eviction import EvictionWatch
from crawler.frontier.opening import Opening
from crawler.frontier.outbox import Outbox
from crawler.frontier.queue import LeasedPriorityQueue
from crawler.frontier.session import Session
from crawler.frontier.shards import ShardCountError
from tests.scheduler_harness import reactor_loop

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator


class _Seeded(Spider):
    """Scrapy's own ``start()`` over ``start_urls``."""

    name = "opening"
    start_urls = ("https://a.example/", "https://b.example/")


class _OwnStart(_Seeded):
    async def start(self) -> AsyncIterator[Any]:
        yield Request("https://c.example/")


class _Worker:
    """One worker's opening, with its session and queue."""

    def __init__(self, redis_url: str, spidercls: type[Spider] = _Seeded,
                 **settings: Any) -> None:
        reactor_loop()
        crawler = get_crawler(spidercls, {"REDIS_URL": redis_url, **settings})
        crawler.spider = crawler._create_spider()
        crawler.stats.open_spider()
        self.crawler, self.spider = crawler, crawler.spider
        self.server = get_redis(crawler.settings)
        self.queue = LeasedPriorityQueue(self.server, crawler.spider, "{opening}")
        self.outbox = Outbox(60.0, flush=lambda: True, resume_at=lambda: 0.0)
        host = SimpleNamespace(forget_seen=lambda: None, wake=lambda: None)
        self.session = Session(self.server, crawler, "opening#0001", self.outbox, host)
        self.session.shards = self.queue.shards
        eviction = EvictionWatch(self.server, redis_location(crawler.settings),
                                 allowed=False, crawler=crawler)
        self.opening = Opening(crawler, self.server, self.session, eviction, "opening#0001")

    def check(self, refused: str = "") -> bool | None:
        return self.opening.check(
            self.spider, self.queue, refused, self.opening.site_settings(self.queue)
        )


@pytest.fixture
def workers(redis_url: str) -> Iterator[list[_Worker]]:
    made: list[_Worker] = []
    yield made
    for worker in made:
        worker.outbox.cancel()


def test_the_first_worker_queues_the_start_urls_and_the_others_drop_theirs(
    redis_url: str, workers: list[_Worker],
) -> None:
    workers += [_Worker(redis_url), _Worker(redis_url), _Worker(redis_url, _OwnStart)]
    assert [worker.check() for worker in workers] == [True, False, True]
    assert workers[0].session.config_stopped is False


def test_per_site_settings_are_stored_as_the_commands_store_them(
    redis_url: str, workers: list[_Worker],
) -> None:
    worker = _Worker(redis_url, FRONTIER_SITE_DELAYS={"a.example": 2},
                     FRONTIER_SITE_CONCURRENCY='{"b.example": 3}')
    workers.append(worker)
    assert worker.opening.site_settings(worker.queue) == {
        "delay": {"a.example": 2000}, "conc": {"b.example": 3},
    }
    worker.check()
    shard = worker.queue.shards[0]
    assert worker.server.hgetall(shard.key("delay")) == {b"a.example": b"2000"}
    assert worker.server.hgetall(shard.key("conc")) == {b"b.example": b"3"}


def test_a_configuration_error_at_open_closes_the_spider_once_it_is_open(
    redis_url: str, workers: list[_Worker],
) -> None:
    worker = _Worker(redis_url)
    workers.append(worker)
    refused = "SCHEDULER_SERIALIZER=pickle: refused"
    assert worker.check(refused) is None
    assert worker.session.config_stopped  # no Redis call meanwhile
    assert config_error_of(worker.crawler) == refused
    with pytest.raises(CloseSpider) as raised:
        worker.opening.close_at_open()
    assert raised.value.reason == CONFIG_ERROR_REASON
    # the start_urls were not claimed: no call was made
    workers.append(_Worker(redis_url))
    assert workers[-1].check() is True


def test_a_shard_count_error_says_where_the_default_count_came_from(
    redis_url: str, workers: list[_Worker],
) -> None:
    default, given = _Worker(redis_url), _Worker(redis_url, FRONTIER_SHARDS=4)
    workers += [default, given]
    exc = ShardCountError("the crawl has 2 shards, this worker 1")
    assert default.opening.shard_count_message(exc, 1) == (
        "the crawl has 2 shards, this worker 1 (FRONTIER_SHARDS is not set: 1 is its "
        "default on one Redis server)"
    )
    assert given.opening.shard_count_message(exc, 4) == str(exc)


def test_redis_down_at_open_is_an_outage_and_the_worker_queues_its_start_urls(
    workers: list[_Worker],
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = _Worker(f"redis://127.0.0.1:{port}/0")
    workers.append(worker)
    assert worker.check() is True  # crawled twice rather than not at all
    assert worker.session.unreachable and not worker.session.config_stopped
    assert worker.crawler.stats.get_value("frontier/redis/outages") == 1
