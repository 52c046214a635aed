"""scrapy-redis 0.9.1 users land safely: its switch, its settings, a crawl's name.

In process, against a real Redis: the scheduler is built and opened as
Scrapy's engine does (tests/scheduler_harness.py), with only the settings a
scrapy-redis project has (``SCHEDULER`` and ``DUPEFILTER_CLASS`` pointed at
ours), not the project's crawler/settings.py.
"""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import CloseSpider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from crawler.control import CrawlControl
from crawler.extensions import ClusterStats
from crawler.frontier.bloom import BloomDupeFilter
from crawler.frontier.housekeeping import FrontierHousekeeping
from crawler.frontier.scheduler import FrontierScheduler
from tests import scheduler_harness as harness
from tests.scheduler_harness import StubSlot, lease_all

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")

#: scrapy-redis's switch, pointed at the frontier: nothing else of ours.
SWITCH = {
    "SCHEDULER": "crawler.frontier.scheduler.FrontierScheduler",
    "DUPEFILTER_CLASS": "crawler.frontier.dupefilter.FrontierDupeFilter",
}


class ExampleSpider(Spider):
    name = "example"


class NamedInInit(Spider):
    """Names itself in ``__init__``, as Scrapy allows (and its
    StartUrlsSpider does): the class has no name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.name = "named-in-init"
        super().__init__(*args, **kwargs)


def build(
    redis_url: str, spidercls: type[Spider], settings: dict[str, Any], **spider_kwargs: Any
) -> tuple[FrontierScheduler, Any]:
    """A crawler with its spider, and the scheduler built from it (not opened)."""
    crawler = get_crawler(spidercls, {"REDIS_URL": redis_url, **settings})
    crawler.spider = crawler._create_spider(**spider_kwargs)
    crawler.stats.open_spider()
    crawler.engine = SimpleNamespace(
        _slot=StubSlot(),
        downloader=SimpleNamespace(total_concurrency=16, active=set()),
    )
    scheduler = build_from_crawler(FrontierScheduler, crawler)
    harness.reactor_loop()
    return scheduler, crawler


def open_(scheduler: FrontierScheduler, crawler: Any) -> None:
    scheduler.open(crawler.spider)
    harness._opened.append(scheduler)


# -- kind 2 (issue 28): scrapy-redis's switch -----------------------------------


@pytest.mark.parametrize(
    "left_as_they_were",
    [
        {},  # scrapy-redis's defaults, unset
        {"SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue", "SCHEDULER_PERSIST": True},
        {"SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.SpiderPriorityQueue",
         "SCHEDULER_QUEUE_KEY": "%(spider)s:requests",
         "SCHEDULER_IDLE_BEFORE_CLOSE": 10, "SCHEDULER_FLUSH_ON_START": False},
        {"DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter"},
    ],
    ids=["defaults", "priority-queue", "spider-priority-queue", "its-dupefilter"],
)
def test_scrapy_redis_switch_with_its_other_settings_crawls_on_the_frontier(
    redis_url: str, rds: redis.Redis, left_as_they_were: dict[str, Any]
) -> None:
    scheduler, crawler = build(redis_url, ExampleSpider, {**SWITCH, **left_as_they_were})
    open_(scheduler, crawler)
    assert scheduler.enqueue_request(Request("http://a.example/1"))
    assert not scheduler.enqueue_request(Request("http://a.example/1"))  # the shared set
    assert scheduler.flush_outbox()
    assert [r.url for r in lease_all(scheduler)] == ["http://a.example/1"]
    assert rds.scard("{example}:dupefilter") == 1


def test_scrapy_redis_default_dupefilter_key_is_the_set_the_frontier_records_in(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, crawler = build(
        redis_url, ExampleSpider, {**SWITCH, "SCHEDULER_DUPEFILTER_KEY": "%(spider)s:dupefilter"}
    )
    open_(scheduler, crawler)
    scheduler.enqueue_request(Request("http://a.example/1"))
    assert scheduler.flush_outbox()
    assert scheduler.df.key == "{example}:dupefilter"
    assert scheduler.df.request_seen(Request("http://a.example/1"))  # agrees with the crawl
    assert rds.scard("{example}:dupefilter") == 1


@pytest.mark.parametrize(
    ("setting", "value", "line"),
    [
        ("SCHEDULER_QUEUE_CLASS", "scrapy_redis.queue.FifoQueue",
         "SCHEDULER_QUEUE_CLASS=scrapy_redis.queue.FifoQueue: not supported"),
        ("SCHEDULER_QUEUE_CLASS", "scrapy_redis.queue.LifoQueue",
         "SCHEDULER_QUEUE_CLASS=scrapy_redis.queue.LifoQueue: not supported"),
        ("SCHEDULER_QUEUE_KEY", "myproject:%(spider)s:requests",
         "SCHEDULER_QUEUE_KEY=myproject:%(spider)s:requests: not supported"),
        ("SCHEDULER_DUPEFILTER_KEY", "%(spider)s:seen",
         "SCHEDULER_DUPEFILTER_KEY=%(spider)s:seen: not supported"),
        ("REDIS_START_URLS_AS_ZSET", True, "REDIS_START_URLS_AS_ZSET=True: not supported"),
        ("DUPEFILTER_CLASS", "scrapy.dupefilters.RFPDupeFilter",
         "DUPEFILTER_CLASS=scrapy.dupefilters.RFPDupeFilter: must be "
         "crawler.frontier.dupefilter.FrontierDupeFilter or a subclass"),
    ],
)
def test_a_scrapy_redis_setting_the_frontier_cannot_honour_is_refused_at_open_in_one_line(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture,
    setting: str, value: Any, line: str,
) -> None:
    scheduler, crawler = build(redis_url, ExampleSpider, {**SWITCH, setting: value})
    with caplog.at_level(logging.ERROR):
        open_(scheduler, crawler)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"Configuration error: {line}"), errors
    assert "\n" not in errors[0]
    with pytest.raises(CloseSpider):
        scheduler._close_at_open()
    assert rds.keys("*") == []  # refused before any Redis call


def test_the_frontier_honours_scrapys_politeness_without_the_add_on(
    redis_url: str,
) -> None:
    """No FRONTIER_DELAY / FRONTIER_CONCURRENCY (no add-on): Scrapy's
    DOWNLOAD_DELAY and CONCURRENT_REQUESTS_PER_DOMAIN hold per site."""
    scheduler, crawler = build(
        redis_url, ExampleSpider,
        {**SWITCH, "DOWNLOAD_DELAY": 30, "CONCURRENT_REQUESTS_PER_DOMAIN": 1},
    )
    open_(scheduler, crawler)
    for i in range(3):
        scheduler.enqueue_request(Request(f"http://a.example/{i}"))
    assert scheduler.flush_outbox()
    assert len(lease_all(scheduler)) == 1


# -- kind 6 (issue 28): the crawl's name is the spider instance's ---------------


@pytest.mark.parametrize(
    ("spidercls", "kwargs", "name"),
    [(NamedInInit, {}, "named-in-init"), (ExampleSpider, {"name": "renamed"}, "renamed")],
    ids=["set-in-init", "dash-a-name"],
)
@pytest.mark.parametrize(
    "dupefilter",
    ["crawler.frontier.dupefilter.FrontierDupeFilter", "crawler.frontier.bloom.BloomDupeFilter"],
)
def test_a_spider_named_in_init_or_by_argument_keeps_one_set_of_keys(
    redis_url: str, rds: redis.Redis, spidercls: type[Spider], kwargs: dict[str, Any],
    name: str, dupefilter: str,
) -> None:
    scheduler, crawler = build(
        redis_url, spidercls,
        {**harness.SETTINGS, "DUPEFILTER_CLASS": dupefilter, "FRONTIER_BLOOM_CAPACITY": 1000},
        **kwargs,
    )
    stats = ClusterStats.from_crawler(crawler)
    control = CrawlControl.from_crawler(crawler)
    housekeeping = FrontierHousekeeping.from_crawler(crawler)
    open_(scheduler, crawler)
    stats.keys = None  # type: ignore[assignment]
    stats.spider_opened()
    stats._task.stop()  # type: ignore[union-attr]
    housekeeping.spider_opened()
    housekeeping.spider_closed()
    control.spider = control.key = ""
    opening = control.spider_opened()  # chooses its key, then reads the state
    with contextlib.suppress(Exception):
        opening.send(None)
    opening.close()
    scheduler.enqueue_request(Request("http://a.example/1"))
    assert scheduler.flush_outbox()
    assert stats.keys.stats == f"{{{name}}}:stats"
    assert housekeeping.housekeeper.spider == name
    assert control.key == f"{{{name}}}:control"
    seen = f"{{{name}}}:bloom" if "Bloom" in dupefilter else f"{{{name}}}:dupefilter"
    assert scheduler.df.key == seen
    assert isinstance(scheduler.df, BloomDupeFilter) == ("Bloom" in dupefilter)
    tags = {key.split(b"}")[0] + b"}" for key in rds.keys("*")}
    assert tags == {f"{{{name}}}".encode()}, tags
