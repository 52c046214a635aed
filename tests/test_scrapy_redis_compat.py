"""scrapy-redis 0.9.1 users land safely: its switch, its settings, a crawl's name.

In process, against a real Redis: the scheduler is built and opened as
Scrapy's engine does (tests/scheduler_harness.py), with only the settings a
scrapy-redis project has (``SCHEDULER`` and ``DUPEFILTER_CLASS`` pointed at
ours), not the project's crawler/settings.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
import redis as redis_lib
from scrapy import FormRequest, Request, Spider
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.http import HtmlResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.settings import Settings
from scrapy.spiders import CrawlSpider, Rule
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from scrapy_redis.spiders import RedisSpider

from crawler.checks import validate_settings
from crawler.commands.frontier import clear_frontier
from crawler.control import CrawlControl
from crawler.extensions import ClusterStats
from crawler.frontier.bloom import BloomDupeFilter
from crawler.frontier.housekeeping import FrontierHousekeeping
from crawler.frontier.intake import IntakeKeys, SeedIntake
from crawler.frontier.scheduler import FrontierScheduler
from crawler.frontier.spider import FrontierCrawlSpider, FrontierSpider
from devtools.replay import Page, generated_site
from tests import scheduler_harness as harness
from tests.scheduler_harness import StubSlot, lease_all
from tests.waiting import wait_for
from tests.workers import crawl, start_worker

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from tests.conftest import SiteFactory

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
        ("SCHEDULER_SERIALIZER", "scrapy_redis.picklecompat",
         "SCHEDULER_SERIALIZER=scrapy_redis.picklecompat: not supported (it unpickles"),
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
        scheduler.opening.close_at_open()
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


# -- kinds 2-6 (issue 28): seeds as scrapy-redis spiders read them ---------------


class Seeded(FrontierSpider):
    name = "seeded"


def seeded_spider(
    redis_url: str, spidercls: type[Spider] = Seeded, **settings: Any
) -> tuple[Any, list[Request]]:
    """A frontier spider opened on its scheduler; the engine's ``crawl``
    collects the requests it is handed."""
    scheduler, crawler = build(redis_url, spidercls, {**harness.SETTINGS, **settings})
    crawled: list[Request] = []
    crawler.engine.crawl = crawled.append
    crawler.engine._slot = SimpleNamespace(scheduler=None, remove_request=lambda r: None)
    scheduler.open(crawler.spider)
    harness._opened.append(scheduler)
    return crawler.spider, crawled


def test_seeds_in_a_set_are_held_in_an_intake_batch_until_done_or_returned(
    rds: redis.Redis,
) -> None:
    intake = SeedIntake(rds, "s:start_urls", "w#1", as_set=True)
    rds.sadd("s:start_urls", "http://a.example/1", "http://a.example/2", "http://a.example/3")
    assert intake.wait_for_seeds(0.1)
    taken = intake.take(intake.new_batch(), 2)
    assert len(taken.seeds) == 2
    assert rds.scard("s:start_urls") == 1
    assert sorted(rds.lrange(taken.batch, 0, -1)) == sorted(taken.seeds)  # durable in Redis
    assert intake.take(taken.batch, 2).reused  # a lost reply: the same seeds again
    assert intake.return_batch(taken.batch) == 2
    assert rds.scard("s:start_urls") == 3
    assert not rds.exists(taken.batch)
    intake.take(intake.new_batch(), 10)  # its worker dies
    assert [r.seeds for r in intake.reclaim_stale(0)] == [3]
    assert rds.scard("s:start_urls") == 3


def test_a_frontier_spider_reads_seeds_from_a_set_with_redis_start_urls_as_set(
    redis_url: str, rds: redis.Redis
) -> None:
    spider, crawled = seeded_spider(redis_url, REDIS_START_URLS_AS_SET=True)
    rds.sadd("seeded:start_urls", "http://a.example/1", "http://a.example/2")
    assert spider._take_batch(spider._seed_intake())
    assert sorted(r.url for r in crawled) == ["http://a.example/1", "http://a.example/2"]
    assert rds.scard("seeded:start_urls") == 0


class ScrapyRedisSetSpider(RedisSpider):
    name = "srset"


def test_scrapy_redis_own_spider_reads_a_seed_set_on_the_frontier(
    redis_url: str, rds: redis.Redis
) -> None:
    settings = get_crawler(
        ScrapyRedisSetSpider, {**SWITCH, "REDIS_START_URLS_AS_SET": True}
    ).settings
    validate_settings(settings)  # the add-on's check: no refusal, no traceback
    scheduler, crawler = build(
        redis_url, ScrapyRedisSetSpider, {**SWITCH, "REDIS_START_URLS_AS_SET": True}
    )
    open_(scheduler, crawler)
    rds.sadd("srset:start_urls", "http://a.example/1")
    assert [r.url for r in crawler.spider.next_requests()] == ["http://a.example/1"]


@pytest.mark.parametrize("as_set", [True, False], ids=["set", "list"])
def test_scrapy_redis_own_spider_loses_no_seed_when_its_worker_dies_after_taking_them(
    redis_url: str, rds: redis.Redis, as_set: bool
) -> None:
    """scrapy-redis's own ``RedisSpider`` ``SPOP``s (or ``LTRIM``s) its
    seeds: here a worker that took three (``next_requests`` read them) and
    died before queuing them leaves them in a registered intake batch, and
    a second worker returns them to the set and reads all three."""
    settings = {**SWITCH, "REDIS_START_URLS_AS_SET": as_set, "FRONTIER_LEASE_TIMEOUT": 1}
    urls = [f"http://a.example/{i}" for i in range(3)]
    (rds.sadd if as_set else rds.lpush)("srset:start_urls", *urls)
    dead, crawler = build(redis_url, ScrapyRedisSetSpider, settings)
    open_(dead, crawler)
    requests = crawler.spider.next_requests()
    assert next(requests).url in urls  # it took its batch, then died
    assert not rds.exists("srset:start_urls")  # taken: in no seed list or set

    second, crawler2 = build(redis_url, ScrapyRedisSetSpider, settings)
    open_(second, crawler2)
    upkeep = getattr(crawler2.spider.fetch_data.__self__, "upkeep", lambda: None)
    found: list[str] = []

    def crawled_all() -> bool:
        upkeep()  # its periodic upkeep returns the abandoned batch
        found.extend(r.url for r in crawler2.spider.next_requests())
        return sorted(found) == urls

    wait_for(crawled_all, 5, "the dead worker's seeds read by the second")


class ManyPerSeed(FrontierSpider):
    name = "many"

    def make_request_from_data(self, data: bytes) -> Any:
        url = data.decode()
        if url.endswith("/list"):
            return [Request(url + "/a"), Request(url + "/b")]
        if url.endswith("/gen"):
            return (Request(f"{url}/{i}") for i in range(2))
        if url.endswith("/item"):
            return [{"an": "item"}, Request(url + "/ok")]
        if url.endswith("/none"):
            return None
        raise ValueError("boom")


def test_make_request_from_data_may_return_a_request_or_any_iterable_of_them(
    redis_url: str, rds: redis.Redis
) -> None:
    spider, crawled = seeded_spider(redis_url, ManyPerSeed)
    for path in ("list", "gen", "item", "none", "raises"):
        rds.lpush("many:start_urls", f"http://a.example/{path}")
    assert spider._take_batch(spider._seed_intake())
    assert [r.url for r in crawled] == [
        "http://a.example/list/a", "http://a.example/list/b",
        "http://a.example/gen/0", "http://a.example/gen/1", "http://a.example/item/ok",
    ]
    assert spider.crawler.stats.get_value("frontier/seeds/bad") == 2  # the item, the error


def test_a_scrapy_redis_json_seed_with_post_and_form_data_is_sent_as_a_form(
    redis_url: str, rds: redis.Redis
) -> None:
    spider, crawled = seeded_spider(redis_url)
    rds.lpush("seeded:start_urls", json.dumps({
        "url": "http://a.example/search", "method": "post", "meta": {"job-id": "123xsd"},
        "q": "books", "page": 2,
    }), json.dumps({"url": "http://a.example/get", "url_cookie_key": "fertxsas"}))
    assert spider._take_batch(spider._seed_intake())
    post, get = crawled
    assert isinstance(post, FormRequest)
    assert post.method == "POST"
    assert post.body == b"q=books&page=2"
    assert post.headers[b"Content-Type"] == b"application/x-www-form-urlencoded"
    assert post.meta["job-id"] == "123xsd"
    assert get.method == "GET"
    assert get.url == "http://a.example/get?url_cookie_key=fertxsas"  # as scrapy-redis


class WithStartUrls(FrontierSpider):
    name = "starts"
    start_urls = [  # noqa: RUF012 - as Scrapy spiders write it
        "http://a.example/1", "http://a.example/2", "not a url"]


def test_start_urls_are_seeded_once_per_crawl_through_the_seed_checks(
    redis_url: str, rds: redis.Redis
) -> None:
    first, crawled = seeded_spider(redis_url, WithStartUrls)
    second, _ = seeded_spider(redis_url, WithStartUrls)
    for spider in (first, second):  # two workers of one crawl
        spider._push_start_urls(spider._seed_intake())
    assert rds.llen("starts:start_urls") == 3
    assert first._take_batch(first._seed_intake())
    assert [r.url for r in crawled] == ["http://a.example/1", "http://a.example/2"]
    assert first.crawler.stats.get_value("frontier/seeds/bad") == 1  # "not a url"


class Rules(FrontierCrawlSpider):
    name = "rules"
    rules = (Rule(LinkExtractor(allow=r"/page/"), callback="parse_page", follow=True),)

    def parse_page(self, response: Any) -> Any:
        yield {"url": response.url}


def test_a_frontier_crawl_spider_follows_its_rules_from_seeds(
    redis_url: str, rds: redis.Redis
) -> None:
    spider, crawled = seeded_spider(redis_url, Rules)
    assert isinstance(spider, CrawlSpider)
    rds.lpush("rules:start_urls", "http://a.example/")
    assert spider._take_batch(spider._seed_intake())
    [seed] = crawled
    response = HtmlResponse(
        seed.url, body=b'<a href="/page/1">1</a><a href="/other">x</a>', request=seed
    )
    async def parse() -> list[Any]:
        return [r async for r in spider._parse(response)]

    followed = harness.reactor_loop().run_until_complete(parse())
    assert [r.url for r in followed] == ["http://a.example/page/1"]


# -- real workers: scrapy-redis's own spiders on scrapy-redis's switch ----------


@pytest.mark.workers
@pytest.mark.parametrize(
    ("spider", "seed_key", "as_set"),
    [("switched", "switched:seeds", False), ("switchedcrawl", "switchedcrawl:start_urls", True)],
)
def test_scrapy_redis_spiders_crawl_unchanged_on_scrapy_redis_switch(
    env: dict[str, str], site_factory: Any, tmp_path: Path,
    spider: str, seed_key: str, as_set: bool,
) -> None:
    site = site_factory(generated_site(12))
    rds = redis_lib.Redis.from_url(env["REDIS_URL"])
    if as_set:
        rds.sadd(seed_key, site.url_for("/"))
    else:
        rds.lpush(seed_key, site.url_for("/"))
    switched_env = {**env, "SCRAPY_SETTINGS_MODULE": "tests.srswitch.settings"}
    settings: dict[str, object] = {"REDIS_START_URLS_AS_SET": as_set}
    [worker] = crawl(spider, switched_env, tmp_path, settings=settings)
    assert worker.returncode == 0, worker.log[-3000:]
    assert "Traceback" not in worker.log, worker.log[-3000:]
    fetched = {h.path for h in site.hits() if h.path != "/robots.txt"}
    assert len(fetched) == 13, sorted(fetched)  # every page, each once
    assert len([h for h in site.hits() if h.path != "/robots.txt"]) == 13
    assert rds.scard(f"{{{spider}}}:dupefilter") >= 13  # the shared set, under the spider's tag


@pytest.mark.workers
@pytest.mark.faults
def test_a_scrapy_redis_spiders_seeds_from_a_set_survive_a_worker_killed_after_taking_them(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis
) -> None:
    """scrapy-redis's own ``RedisSpider`` with ``REDIS_START_URLS_AS_SET``:
    the first worker takes the seeds (the set is empty), is SIGKILLed
    before it queues them; a second worker crawls every one."""
    pages = {f"/p{i}": Page(200, [("Content-Type", "text/html")], b"<title>p</title>")
             for i in range(5)}
    site = site_factory(pages)
    seed_key = "stalling:start_urls"
    rds.sadd(seed_key, *[site.url_for(p) for p in pages])
    switched_env = {**env, "SCRAPY_SETTINGS_MODULE": "tests.srswitch.settings"}
    settings: dict[str, object] = {"REDIS_START_URLS_AS_SET": True, "FRONTIER_LEASE_TIMEOUT": 3}
    log = tmp_path / "killed.log"
    first = start_worker("stalling", switched_env, log, {**settings, "SEED_STALL_SECONDS": 60})
    try:
        wait_for(lambda: rds.scard(seed_key) == 0, 60, "the first worker to take the seeds")
    finally:
        first.kill()
        first.wait()
    assert site.hits() == []
    [second] = crawl("stalling", switched_env, tmp_path,
                     settings={**settings, "MAX_IDLE_TIME_BEFORE_CLOSE": 10})
    assert second.returncode == 0, second.log[-3000:]
    assert sorted(h.path for h in site.hits()) == sorted(pages)


class PlainStartUrls(CrawlSpider):
    """A spider of Scrapy's own, its ``start()`` Scrapy's: ``start_urls``."""

    name = "plainstarts"
    start_urls = ("http://a.example/", "http://a.example/2")


def test_a_plain_spiders_start_urls_are_queued_once_per_crawl_not_once_per_worker(
    redis_url: str, rds: redis.Redis
) -> None:
    workers = [harness.open_scheduler(redis_url, PlainStartUrls) for _ in range(2)]
    for scheduler, crawler in workers:
        for url in crawler.spider.start_urls:  # as Scrapy's start() and its middleware give them
            request = Request(url, dont_filter=True, meta={"is_start_request": True})
            scheduler.enqueue_request(request)
        assert scheduler.flush_outbox()
    first, second = workers
    leased = lease_all(first[0]) + lease_all(second[0])
    assert sorted(r.url for r in leased) == list(PlainStartUrls.start_urls)
    assert not any("is_start_request" in r.meta for r in leased)  # nor in their redirects
    assert second[1].stats.get_value("frontier/start_urls/dropped") == 2
    assert rds.exists("{plainstarts:start_urls}:start_urls_seeded")


class IdleClosingRedisSpider(RedisSpider):
    name = "idleclosing"


def test_a_scrapy_redis_spider_reads_redis_and_its_idle_time_as_the_add_on_set_them(
    redis_url: str, rds: redis.Redis
) -> None:
    """Scrapy builds the spider before the add-ons run: scrapy-redis's
    ``setup_redis`` bound its seed calls to a client of the settings as they
    were (no ``REDIS_URL`` from the environment yet) and read
    ``MAX_IDLE_TIME_BEFORE_CLOSE`` as 0 (never close). Opened, the spider
    counts and pops seeds on the crawl's Redis and closes when idle."""
    scheduler, crawler = harness.open_scheduler(
        redis_url, IdleClosingRedisSpider, MAX_IDLE_TIME_BEFORE_CLOSE=7
    )
    spider = crawler.spider
    early = redis_lib.Redis(host="127.0.0.1", port=1)  # what setup_redis made too early
    spider.server, spider.count_size, spider.max_idle_time = early, early.llen, 0
    scheduler.opening.adopt_redis_spider(spider)
    rds.lpush("idleclosing:start_urls", "http://a.example/")
    assert spider.count_size("idleclosing:start_urls") == 1
    assert spider.server is not early
    assert spider.max_idle_time == 7


def test_frontier_clear_lets_the_next_crawl_queue_start_urls_again(
    rds: redis.Redis,
) -> None:
    """The mark that a spider's ``start_urls`` were queued goes with the
    frontier (``scrapy frontier clear``): a crawl run again after a clear
    queues them again instead of finishing at once with nothing to do."""
    marker = IntakeKeys.for_seed_list("plain:start_urls").seeded
    rds.set(marker, 1)
    clear_frontier(rds, "plain", Settings())
    assert not rds.exists(marker)


# -- bad seeds of scrapy-redis's own spiders (issue 28) -------------------------

#: One of each bad seed a tester pushed, with the reason our log names: a
#: JSON seed with an int form value (scrapy-redis's ``FormRequest`` cannot
#: encode it; ours sends ``1``) is not among them.
BAD_SEEDS = {
    '{"url": "http://a.example/bad-json", ': "not valid JSON",
    "not a url": "not an http(s) URL",
    '{"url": "http://a.example/form", "k": {"nested": 1}}': "form field 'k'",
}
GOOD_SEEDS = ["http://a.example/1", "http://a.example/2",
              '{"url": "http://a.example/post", "method": "POST", "meta": {}, "k": 1}']


class BadSeedOverride(RedisSpider):
    """A subclass whose own ``make_request_from_data`` raises on one seed."""

    name = "srbad"

    def make_request_from_data(self, data: bytes) -> Any:
        if b"boom" in data:
            raise KeyError("boom")
        return super().make_request_from_data(data)


@pytest.mark.parametrize("as_set", [True, False], ids=["set", "list"])
def test_scrapy_redis_own_spider_skips_each_bad_seed_in_one_line_and_crawls_the_rest(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture, as_set: bool
) -> None:
    """scrapy-redis's ``make_request_from_data`` raises on an int form
    value, a bad JSON text or a URL without scheme, and its idle handler
    dies with it: here each bad seed is logged in one line and skipped, the
    good seeds read with it are crawled, the batch is deleted and the
    spider stays open by its idle rule."""
    settings = {**SWITCH, "REDIS_START_URLS_AS_SET": as_set, "MAX_IDLE_TIME_BEFORE_CLOSE": 60}
    scheduler, crawler = build(redis_url, ScrapyRedisSetSpider, settings)
    open_(scheduler, crawler)
    (rds.sadd if as_set else rds.lpush)("srset:start_urls", *GOOD_SEEDS, *BAD_SEEDS)
    crawled: list[Request] = []
    crawler.engine.crawl = crawled.append
    with caplog.at_level(logging.INFO):
        with pytest.raises(DontCloseSpider):  # scrapy-redis's idle rule, not a crash
            crawler.spider.spider_idle()
    assert sorted(r.url for r in crawled) == [
        "http://a.example/1", "http://a.example/2", "http://a.example/post"]
    [post] = [r for r in crawled if r.method == "POST"]
    assert post.body == b"k=1"
    skipped = [r for r in caplog.records if "bad seed" in r.getMessage()]
    assert len(skipped) == len(BAD_SEEDS)
    for seed, reason in BAD_SEEDS.items():
        [line] = [r.getMessage() for r in skipped if reason in r.getMessage()]
        assert repr(seed.encode()) in line and "\n" not in line
    assert not any(r.exc_info for r in caplog.records)
    assert "String request is deprecated" not in caplog.text
    assert crawler.stats.get_value("frontier/seeds/bad") == len(BAD_SEEDS)
    assert scheduler.flush_outbox()  # the commit after which the batch goes
    keys = IntakeKeys.for_seed_list("srset:start_urls")
    assert rds.zcard(keys.registry) == 0
    assert list(rds.scan_iter(match=keys.batch_prefix + "*")) == []
    assert not rds.exists("srset:start_urls")


def test_a_subclass_make_request_from_data_that_raises_skips_only_that_seed(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, crawler = build(redis_url, BadSeedOverride, SWITCH)
    open_(scheduler, crawler)
    rds.rpush("srbad:start_urls", "http://a.example/1", "http://a.example/boom",
              '{"url": "http://a.example/form", "k": 1}', "http://a.example/2")
    requests = list(crawler.spider.next_requests())
    assert sorted(r.url for r in requests) == ["http://a.example/1", "http://a.example/2"]
    boom, form = sorted(r.getMessage() for r in caplog.records if "bad seed" in r.getMessage())
    assert "KeyError: 'boom'" in boom
    assert "TypeError: to_bytes must receive a str or bytes object, got int" in form
    assert scheduler.flush_outbox()
    assert rds.zcard(IntakeKeys.for_seed_list("srbad:start_urls").registry) == 0


@pytest.mark.workers
@pytest.mark.parametrize(
    ("spider", "seed_key", "addon"),
    [("rqseeds", "rq:seeds", True), ("stalling", "stalling:start_urls", False)],
    ids=["redis-spider-with-the-add-on", "make-request-from-data-overridden-on-the-switch"],
)
def test_a_scrapy_redis_spiders_bad_seeds_are_skipped_and_the_good_ones_crawled(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis,
    spider: str, seed_key: str, addon: bool,
) -> None:
    """A real ``scrapy crawl`` of scrapy-redis's ``RedisSpider`` on a seed
    set holding an invalid JSON seed, a URL without scheme and a JSON seed
    with an int form value: each bad seed is one ``Skipped bad seed`` line,
    every good seed is crawled, the worker closes by its idle rule and no
    seed is left in an intake batch. The int form value is good for the
    spider as scrapy-redis ships it (sent as ``k=1``) and bad for one that
    calls scrapy-redis's own ``make_request_from_data`` (``TypeError``)."""
    pages = {f"/p{i}": Page(200, [("Content-Type", "text/html")], b"<title>p</title>")
             for i in range(3)}
    site = site_factory(pages)
    bad = ['{"url": "' + site.url_for("/p9") + '", ', "not a url"]
    form_seed = json.dumps({"url": site.url_for("/p2"), "meta": {}, "k": 1})
    rds.sadd(seed_key, site.url_for("/p0"), site.url_for("/p1"), form_seed, *bad)
    settings: dict[str, object] = {"REDIS_START_URLS_AS_SET": True, "MAX_IDLE_TIME_BEFORE_CLOSE": 3}
    if addon:  # the project's settings (the add-on), scrapy-redis's spider
        settings["SPIDER_MODULES"] = "tests.srswitch.spiders"
        worker_env = env
    else:
        worker_env = {**env, "SCRAPY_SETTINGS_MODULE": "tests.srswitch.settings"}
    [worker] = crawl(spider, worker_env, tmp_path, settings=settings)
    assert worker.returncode == 0, worker.log[-3000:]
    assert "Traceback" not in worker.log, worker.log[-3000:]
    assert "Error caught on signal handler" not in worker.log, worker.log[-3000:]
    expected = ["/p0", "/p1", "/p2?k=1"] if addon else ["/p0", "/p1"]
    assert sorted(h.path for h in site.hits() if h.path != "/robots.txt") == expected
    skipped = [line for line in worker.log.splitlines() if "Skipped bad seed" in line]
    assert len(skipped) == len(bad) + (0 if addon else 1), skipped
    for seed in bad:
        assert len([line for line in skipped if repr(seed.encode()) in line]) == 1, skipped
    if addon:  # our own reading of the seed, as FrontierSpider's
        assert any("not valid JSON" in line for line in skipped)
    else:  # scrapy-redis's: it made a request of the bad JSON text as a URL
        assert any("not an http(s) URL" in line for line in skipped)
        assert any("to_bytes must receive a str or bytes object, got int" in line
                   for line in skipped)
    stamps = [line[:19] for line in worker.log.splitlines()
              if "Spider opened" in line or "Closing spider (finished)" in line]
    opened, closed = (datetime.fromisoformat(s) for s in (stamps[0], stamps[-1]))
    assert (closed - opened).total_seconds() >= 2  # its idle rule, not at once
    keys = IntakeKeys.for_seed_list(seed_key)
    assert rds.zcard(keys.registry) == 0
    assert list(rds.scan_iter(match=keys.batch_prefix + "*")) == []
    assert not rds.exists(seed_key)
