"""Figure e: MongoDB items per second, our pipeline vs ``insert_one`` per item."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from itemadapter import ItemAdapter
from pymongo import MongoClient
from scrapy import Spider
from scrapy.utils.test import get_crawler

from crawler.items import PageItem
from crawler.pipelines import MongoPipeline

__all__ = ["mongo_items"]

#: Items handed to the pipeline at once: Scrapy keeps scraping while items
#: wait to be stored, up to SCRAPER_SLOT_MAX_ACTIVE_SIZE (5 MB) of responses.
IN_FLIGHT = 1000


def _items(n: int, tag: str) -> list[PageItem]:
    """``n`` page items as the ``pages`` spider yields them (~1 KB each)."""
    text = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 12
    return [
        PageItem(
            url=f"https://www.example.com/{tag}/page-{i:07d}.html",
            requested_url=f"https://www.example.com/{tag}/page-{i:07d}.html",
            final_url=f"https://www.example.com/{tag}/page-{i:07d}.html",
            status=200,
            title=f"Page {i}",
            description=f"Description of page {i}",
            text=text,
            links=[f"https://www.example.com/{tag}/page-{j:07d}.html" for j in range(i, i + 8)],
            fetched_at=datetime.now(UTC),
        )
        for i in range(n)
    ]


class _Spider(Spider):
    name = "bench_items"


async def _ours(uri: str, database: str, items: list[PageItem]) -> float:
    crawler = get_crawler(_Spider, {"MONGO_URI": uri, "MONGO_DATABASE": database})
    crawler.spider = _Spider()
    pipeline = MongoPipeline.from_crawler(crawler)
    await pipeline.open_spider()
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(item: Any) -> None:
        async with gate:
            await pipeline.process_item(item)

    start = time.monotonic()
    await asyncio.gather(*(one(item) for item in items))
    elapsed = time.monotonic() - start
    await pipeline.close_spider()
    return len(items) / elapsed


def _insert_one(uri: str, database: str, items: list[PageItem]) -> float:
    """The pattern of Scrapy's documentation (``MongoPipeline`` example)."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    collection = client[database]["pages"]
    collection.insert_one({"warm": True})
    start = time.monotonic()
    for item in items:
        collection.insert_one(ItemAdapter(item).asdict())
    elapsed = time.monotonic() - start
    client.close()
    return len(items) / elapsed


def _bare_bulk(uri: str, database: str, items: list[PageItem]) -> float:
    """The server's bound for ours: the same documents (no ``first_seen``,
    ``last_seen``) in unordered ``insert_many`` calls of
    ``MONGO_BATCH_SIZE``'s default, under the same unique index on ``url``;
    connection and index made untimed. No upserts, no pipeline."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    collection = client[database]["pages"]
    collection.create_index("url", unique=True)
    docs = [ItemAdapter(item).asdict() for item in items]
    start = time.monotonic()
    for i in range(0, len(docs), 500):
        collection.insert_many(docs[i : i + 500], ordered=False)
    elapsed = time.monotonic() - start
    client.close()
    return len(items) / elapsed


def mongo_items(uri: str, n: int, run: int) -> dict[str, float]:
    """Items/s of :class:`~crawler.pipelines.MongoPipeline` (unordered bulk
    inserts under the unique index on ``url``, upserts for keys stored
    already; ``MONGO_BATCH_SIZE`` 500) and of one ``insert_one`` per item, on
    the same ``n`` items, each into a fresh database; and, as ``"bound"``,
    what the server allows ours at best (:func:`_bare_bulk`). Ours includes
    the client's first connection and the ``create_index``; the baseline's
    connection and collection are made by an untimed first insert."""
    return {
        "ours": asyncio.run(_ours(uri, f"bench_ours_{run}", _items(n, f"o{run}"))),
        "baseline": _insert_one(uri, f"bench_base_{run}", _items(n, f"b{run}")),
        "bound": _bare_bulk(uri, f"bench_bound_{run}", _items(n, f"u{run}")),
    }
