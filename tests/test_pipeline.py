"""MongoPipeline against a real MongoDB wire-protocol server, in process."""

from __future__ import annotations

import asyncio
from typing import Any

from scrapy import Spider
from scrapy.utils.test import get_crawler

from crawler.items import AuthorItem, QuoteItem
from crawler.pipelines import MongoPipeline


class _Spider(Spider):
    name = "pipeline_test"


def run(
    mongo_uri: str, mongo_db: str, items: list[Any], close_early: bool = False, **settings: Any
) -> dict[str, Any]:
    """Open the pipeline, feed it ``items``, close it; return the stats."""
    crawler = get_crawler(
        _Spider, {"MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db, **settings}
    )
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    pipeline = MongoPipeline.from_crawler(crawler)

    async def go() -> None:
        await pipeline.open_spider()
        # As Scrapy does, items are processed concurrently; each returns once
        # it is stored. Closing stores whatever is still waiting.
        tasks = [asyncio.ensure_future(pipeline.process_item(item)) for item in items]
        await asyncio.sleep(0)
        if close_early:
            await pipeline.close_spider()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        if not close_early:
            await pipeline.close_spider()

    asyncio.run(go())
    return crawler.stats.get_stats()


def quotes(n: int) -> list[QuoteItem]:
    return [QuoteItem(text=f"q{i}", author=f"a{i % 7}", tags=["t"], url="u") for i in range(n)]


def test_items_are_upserted_in_batches_once_per_key(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    stats = run(mongo_uri, mongo_db, quotes(600) + quotes(600), MONGO_BATCH_SIZE=500)

    assert db.quotes.count_documents({}) == 600
    # 1200 items in a few bulk writes, not one round trip per item.
    assert stats["mongo/bulk_writes"] <= 3
    assert stats["mongo/upserted"] == 600
    unique = [i for i in db.quotes.index_information().values() if i.get("unique")]
    assert [dict(i["key"]) for i in unique] == [{"text": 1, "author": 1}]


def test_a_second_crawl_keeps_first_seen_and_updates_last_seen(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    run(mongo_uri, mongo_db, quotes(10))
    before = {d["text"]: d for d in db.quotes.find()}
    changed = [QuoteItem(text=q.text, author=q.author, tags=["new"], url="u2") for q in quotes(10)]
    run(mongo_uri, mongo_db, changed)

    assert db.quotes.count_documents({}) == 10
    for doc in db.quotes.find():
        old = before[doc["text"]]
        assert doc["first_seen"] == old["first_seen"]
        assert doc["last_seen"] > old["last_seen"]
        assert doc["tags"] == ["new"]
        assert doc["last_seen"].tzinfo is not None


def test_pending_writes_are_flushed_at_close(mongo_uri: str, mongo_db: str, db: Any) -> None:
    author = AuthorItem(
        name="A", birth_date="1900-01-01", birth_place="X", description="d", url="u"
    )
    stats = run(
        mongo_uri, mongo_db, [author, {"free": "form"}], close_early=True,
        MONGO_BATCH_SIZE=10_000, MONGO_FLUSH_INTERVAL=3600,
    )
    assert db.authors.count_documents({"name": "A"}) == 1
    # Items with no natural key go to the spider's collection.
    assert db.pipeline_test.count_documents({"free": "form"}) == 1
    assert stats["mongo/bulk_writes"] == 2
