"""A response processed twice (at-least-once delivery) stores nothing twice.

In process: the project's spider middlewares (Scrapy's
``SpiderMiddlewareManager``, built from ``crawler/settings.py``'s
``SPIDER_MIDDLEWARES``) and :class:`~crawler.pipelines.MongoPipeline` on a
real MongoDB server. Across processes: two real ``scrapy crawl`` workers of
one spider, one after the other, crawl the same seed.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import scrapy
from scrapy import Request, Spider, signals
from scrapy.core.spidermw import SpiderMiddlewareManager
from scrapy.exceptions import DropItem
from scrapy.http import HtmlResponse
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.spider import iterate_spider_output
from scrapy.utils.test import get_crawler

from crawler import settings as project_settings
from crawler.frontier.spider import FrontierSpider
from crawler.items import QuoteItem
from crawler.middlewares import ItemIdMiddleware
from crawler.pipelines import ItemIds, MongoPipeline, derive_item_id
from devtools.replay import Page
from tests.workers import crawl

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    import redis
    from scrapy.crawler import Crawler

    from tests.conftest import SiteFactory


@dataclass
class NoteItem:
    """An item class with a collection and no natural key."""

    collection: ClassVar[str] = "notes"

    text: str
    delivery: int


class LooseItem(scrapy.Item):
    """A scrapy.Item with no collection and no key: the spider's collection."""

    text = scrapy.Field()
    delivery = scrapy.Field()


class RedeliverySpider(Spider):
    """Yields, per response, items of every kind; ``delivery`` counts its calls."""

    name = "redelivery"
    delivery = 0

    def parse(self, response: Any) -> Iterator[Any]:
        self.delivery += 1
        n = self.delivery
        yield {"text": "first dict", "delivery": n}
        yield NoteItem("first note", n)
        yield {"text": "second dict", "delivery": n}
        yield Request(response.urljoin("/next"))
        yield LooseItem(text="loose", delivery=n)
        yield NoteItem("second note", n)
        yield {"_id": "mine", "text": "own id", "delivery": n}
        yield QuoteItem(text="keyed", author="a", tags=[str(n)], url=response.url)


def open_crawler(mongo_uri: str, mongo_db: str, **settings: Any) -> Crawler:
    """A crawler of RedeliverySpider with the project's spider middlewares."""
    crawler = get_crawler(
        RedeliverySpider,
        {
            "SPIDER_MIDDLEWARES": project_settings.SPIDER_MIDDLEWARES,
            "MONGO_URI": mongo_uri,
            "MONGO_DATABASE": mongo_db,
            "MONGO_FLUSH_INTERVAL": 3600,  # written when the test flushes
            **settings,
        },
    )
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    return crawler


def response_for(url: str) -> HtmlResponse:
    request = Request(url)
    return HtmlResponse(url, body=b"<html></html>", request=request)


async def scrape(crawler: Crawler, middlewares: SpiderMiddlewareManager, url: str) -> list[Any]:
    """Run the spider's callback on a response of ``url`` through the spider
    middlewares, as Scrapy's scraper does; return the items it let out."""
    response = response_for(url)
    assert crawler.spider is not None
    spider = crawler.spider

    async def call(result: Any, request: Request) -> Any:
        return iterate_spider_output(spider.parse(result))

    output = await middlewares.scrape_response_async(call, response, response.request)
    return [o async for o in output if not isinstance(o, Request)]


def test_a_response_processed_twice_stores_its_items_without_a_key_once(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    crawler = open_crawler(mongo_uri, mongo_db)
    middlewares = SpiderMiddlewareManager.from_crawler(crawler)
    pipeline = MongoPipeline.from_crawler(crawler)
    url = "http://shop.example/list"
    snapshots: list[dict[Any, Any]] = []

    async def deliver() -> None:
        items = await scrape(crawler, middlewares, url)
        stored = [asyncio.ensure_future(pipeline.process_item(item)) for item in items]
        await asyncio.sleep(0)  # as Scrapy does, every item is in the pipeline at once
        await pipeline.flush()
        await asyncio.wait_for(asyncio.gather(*stored), timeout=30)
        snapshots.append(
            {(name, d["_id"]): d for name in ("redelivery", "notes", "quotes")
             for d in db[name].find()}
        )

    async def go() -> None:
        await pipeline.open_spider()
        await deliver()
        await asyncio.sleep(0.05)  # BSON dates are milliseconds
        await deliver()  # the same response again: its lease was not acknowledged
        await pipeline.close_spider()

    asyncio.run(go())

    first, second = snapshots
    # Stored once: the second delivery found and updated the same documents.
    assert db.redelivery.count_documents({}) == 4  # two dicts, the loose item, "mine"
    assert db.notes.count_documents({}) == 2
    assert db.quotes.count_documents({}) == 1
    assert set(first) == set(second)
    for ident, doc in second.items():
        # The second delivery's fields, the first one's first_seen.
        assert doc["tags"] == ["2"] if ident[0] == "quotes" else doc["delivery"] == 2
        assert doc["first_seen"] == first[ident]["first_seen"]
        assert doc["last_seen"] > first[ident]["last_seen"]
    # The item's own _id is kept; the others got derived string ids.
    assert ("redelivery", "mine") in second
    derived = [i for c, i in second if c != "quotes" and i != "mine"]
    assert all(isinstance(i, str) and len(i) == 32 for i in derived)
    stats = crawler.stats.get_stats()
    assert stats["mongo/ids/derived"] == 2 * 5
    assert "mongo/ids/minted" not in stats
    assert stats["mongo/inserted"] == 6  # documents of items without a key, created once
    assert stats["mongo/modified"] == 7  # all seven, updated by the second delivery
    assert len(ItemIds.of(crawler)) == 0  # every id was taken by the pipeline


def test_ids_depend_on_the_request_collection_class_and_rank(
    mongo_uri: str, mongo_db: str
) -> None:
    crawler = open_crawler(mongo_uri, mongo_db)
    middlewares = SpiderMiddlewareManager.from_crawler(crawler)
    ids = ItemIds.of(crawler)

    async def ids_of(url: str) -> list[str | None]:
        return [ids.pop(item) for item in await scrape(crawler, middlewares, url)]

    async def go() -> tuple[list[str | None], list[str | None], list[str | None]]:
        return await ids_of("http://a.example/"), await ids_of("http://a.example/"), (
            await ids_of("http://b.example/")
        )

    once, again, other = asyncio.run(go())

    assert once == again  # later deliveries yield more recent "delivery" values: same ids
    assert set(once).isdisjoint(set(other) - {None})
    # Dicts, notes, loose item, own _id, keyed quote.
    assert [i is None for i in once] == [False] * 5 + [True, True]
    assert len(set(once) - {None}) == 5
    fingerprint = crawler.request_fingerprinter.fingerprint(Request("http://a.example/"))
    dict_class, note_class = "builtins.dict", f"{NoteItem.__module__}.NoteItem"
    # Ranks count per collection and class: the notes between the dicts do
    # not shift the dicts' ids.
    assert once[0] == derive_item_id("redelivery", fingerprint, "redelivery", dict_class, 0)
    assert once[2] == derive_item_id("redelivery", fingerprint, "redelivery", dict_class, 1)
    assert once[1] == derive_item_id("redelivery", fingerprint, "notes", note_class, 0)
    assert once[4] == derive_item_id("redelivery", fingerprint, "notes", note_class, 1)


async def _as_async(values: list[Any]) -> AsyncIterator[Any]:
    for value in values:
        yield value


def test_sync_and_async_outputs_get_the_same_ids_and_no_response_gets_none() -> None:
    crawler = get_crawler(RedeliverySpider)
    crawler.spider = crawler._create_spider()
    middleware = build_from_crawler(ItemIdMiddleware, crawler)
    response = response_for("http://a.example/")
    sync_items = [{"n": 1}, {"n": 2}]
    async_items = [{"n": 1}, {"n": 2}]
    start_items = [{"n": 3}]

    list(middleware.process_spider_output(response, sync_items))

    async def go() -> None:
        output = middleware.process_spider_output_async(response, _as_async(async_items))
        _ = [o async for o in output]
        output = middleware.process_spider_output_async(None, _as_async(start_items))
        _ = [o async for o in output]

    asyncio.run(go())
    ids = ItemIds.of(crawler)
    assert [ids.pop(i) for i in sync_items] == [ids.pop(i) for i in async_items]
    assert ids.pop(start_items[0]) is None
    assert len(ids) == 0


def test_item_ids_go_by_identity_are_bounded_and_leave_with_dropped_items() -> None:
    crawler = get_crawler(RedeliverySpider)
    crawler.spider = crawler._create_spider()
    ids = ItemIds.of(crawler)
    assert ItemIds.of(crawler) is ids  # one per crawler
    a, b = {"x": 1}, {"x": 1}

    assert ids.put(a, "id-a") == 0
    assert ids.pop(b) is None  # an equal item is not the same item
    assert ids.pop(a) == "id-a"
    assert ids.pop(a) is None  # taken once

    dropped = {"x": 2}
    ids.put(dropped, "id-dropped")
    crawler.signals.send_catch_log(
        signals.item_dropped, item=dropped, response=None, exception=DropItem("no"),
        spider=crawler.spider,
    )
    assert ids.pop(dropped) is None
    assert len(ids) == 0

    small = ItemIds(capacity=2)
    items = [{"n": n} for n in range(3)]
    assert [small.put(item, f"id-{n}") for n, item in enumerate(items)] == [0, 0, 1]
    assert small.pop(items[0]) is None  # the oldest was forgotten
    assert small.pop(items[2]) == "id-2"


def test_switched_off_the_pipeline_mints_ids_and_says_so(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    crawler = open_crawler(mongo_uri, mongo_db, MONGO_ITEM_IDS_ENABLED=False)
    middlewares = SpiderMiddlewareManager.from_crawler(crawler)
    assert not any(isinstance(m, ItemIdMiddleware) for m in middlewares.middlewares)
    pipeline = MongoPipeline.from_crawler(crawler)

    async def go() -> None:
        await pipeline.open_spider()
        for _ in range(2):
            for item in await scrape(crawler, middlewares, "http://a.example/"):
                await asyncio.gather(pipeline.process_item(item), pipeline.flush())
        await pipeline.close_spider()

    asyncio.run(go())
    # Without derived ids, a redelivery stores items without a key again.
    assert db.notes.count_documents({}) == 4
    assert crawler.stats.get_value("mongo/ids/minted") == 2 * 5


# --- two real workers -----------------------------------------------------------


class RedeliveryFrontierSpider(FrontierSpider):
    """A frontier spider whose page yields items without a key (loaded by
    the workers through ``SPIDER_MODULES``)."""

    name = "redelivery_frontier"

    def parse(self, response: Any) -> Iterator[Any]:
        for n, line in enumerate(response.css("li::text").getall()):
            yield {"line": line, "n": n, "pid": _pid()}
        yield NoteItem(response.css("title::text").get(default=""), _pid())


def _pid() -> int:
    return os.getpid()


@pytest.mark.workers
def test_two_workers_crawling_the_same_page_store_its_items_once(
    env: dict[str, str], db: Any, rds: redis.Redis, tmp_path: Path, site_factory: SiteFactory
) -> None:
    # Two workers handle the same request one after the other, as a lease
    # redelivered after its worker was killed between storing and acking.
    page = b"<html><title>t</title><ul><li>a</li><li>b</li><li>a</li></ul></html>"
    site = site_factory({"/": Page(200, [("Content-Type", "text/html")], page)})
    settings = {"SPIDER_MODULES": "crawler.spiders,tests.test_redelivery"}
    snapshots = []
    for _ in range(2):
        rds.lpush("redelivery_frontier:start_urls", site.url_for("/"))  # a seed is always crawled
        [worker] = crawl("redelivery_frontier", env, tmp_path, settings=settings)
        assert worker.returncode == 0, worker.log[-3000:]
        assert worker.stats.get("mongo/ids/derived") == 4, worker.log[-3000:]
        assert "Deprecat" not in worker.log, worker.log[-3000:]
        assert "ERROR" not in worker.log, worker.log[-3000:]
        snapshots.append({d["_id"]: d for d in db.redelivery_frontier.find()})
    first, second = snapshots

    assert db.redelivery_frontier.count_documents({}) == 3  # "a", "b", "a" again
    assert db.notes.count_documents({}) == 1
    assert set(first) == set(second)
    for ident, doc in second.items():
        assert doc["pid"] != first[ident]["pid"]  # written by the second worker
        assert doc["first_seen"] == first[ident]["first_seen"]
        assert doc["last_seen"] > first[ident]["last_seen"]
    assert sorted((d["n"], d["line"]) for d in second.values()) == [(0, "a"), (1, "b"), (2, "a")]
