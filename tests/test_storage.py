"""Storage is an interface (:class:`crawler.storage.ItemStore`): store items
durably, touch them on a 304, item ids. ``MongoPipeline`` is one item
store; :class:`JsonLinesStore` here, a file of JSON lines, is a second one,
and a 304 to a revisit touches the items of the page in it as in MongoDB.

The middlewares and the store run in this process, as Scrapy chains them:
``ItemIdMiddleware`` derives the ids and sources of a page's items, the
store stores them, and ``RevisitMiddleware`` meets the 304.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from itemadapter import ItemAdapter
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from crawler.frontier.clock import CLOCK
from crawler.frontier.scheduler import REVISIT_META
from crawler.frontier.signals import request_dead, request_fetched
from crawler.middlewares import ItemIdMiddleware, RevisitMiddleware
from crawler.pipelines import MongoPipeline
from crawler.storage import SOURCE_FIELD, ItemIds, ItemSources, ItemStore, register_store, store_of

if TYPE_CHECKING:
    from datetime import datetime
    from pathlib import Path

    from scrapy.crawler import Crawler


class JsonLinesStore:
    """An item store in one file of JSON lines, one line per stored item.

    Items are stored by their natural key (``key``), else by the id
    :class:`ItemIds` holds for them (a redelivered page stores its items
    once), else by a new id; with revisits on, each line records its
    source (:data:`SOURCE_FIELD`). Each write replaces the file (written
    aside, flushed to disk, renamed), so an item is stored durably once
    :meth:`process_item` returns. ``first_seen``/``last_seen`` are ISO
    times, ``last_seen`` never lowered.
    """

    name: ClassVar[str] = "a JSON-lines file"
    errors: ClassVar[tuple[type[BaseException], ...]] = (OSError,)

    def __init__(self, crawler: Crawler, path: Path) -> None:
        self.path = path
        self.spider = crawler.spider.name if crawler.spider else "spider"
        self.ids = ItemIds.of(crawler)
        self.sources = ItemSources.of(crawler)
        register_store(crawler, self)

    def lines(self) -> dict[str, dict[str, Any]]:
        """The stored items, by id."""
        if not self.path.exists():
            return {}
        docs = (json.loads(line) for line in self.path.read_text().splitlines())
        return {doc["_id"]: doc for doc in docs}

    def _write(self, docs: dict[str, dict[str, Any]]) -> None:
        aside = self.path.with_suffix(".tmp")
        with aside.open("w") as out:
            out.writelines(json.dumps(doc) + "\n" for doc in docs.values())
            out.flush()
            os.fsync(out.fileno())
        aside.replace(self.path)

    async def process_item(self, item: Any) -> Any:
        doc = ItemAdapter(item).asdict()
        key = getattr(item, "key", ())
        derived = self.ids.pop(item)
        ident = json.dumps([doc[k] for k in key]) if key else derived or uuid.uuid4().hex
        source = self.sources.pop(item)
        now = CLOCK.utcnow().isoformat()
        docs = self.lines()
        old = docs.get(ident, {})
        docs[ident] = {**doc, "_id": ident, "first_seen": old.get("first_seen", now),
                       "last_seen": max(now, old.get("last_seen", now))}
        if source is not None:
            docs[ident][SOURCE_FIELD] = f"{self.spider}:{source}"
        self._write(docs)
        return item

    def touch(self, source: str, when: datetime) -> int:
        docs = self.lines()
        changed = 0
        for doc in docs.values():
            if doc.get(SOURCE_FIELD) == f"{self.spider}:{source}" and (
                doc["last_seen"] < when.isoformat()
            ):
                doc["last_seen"] = when.isoformat()
                changed += 1
        self._write(docs)
        return changed


def _crawl(settings: dict[str, Any] | None = None) -> tuple[Crawler, list[tuple[Any, ...]]]:
    crawler = get_crawler(Spider, {"FRONTIER_REVISIT_AFTER": 5, **(settings or {})})
    crawler.spider = Spider(name="t")
    sent: list[tuple[Any, ...]] = []
    crawler.signals.connect(
        lambda request, validators, **_: sent.append(("fetched", request.url, validators)),
        signal=request_fetched, weak=False,
    )
    crawler.signals.connect(
        lambda request, reason, **_: sent.append(("dead", request.url, reason)),
        signal=request_dead, weak=False,
    )
    return crawler, sent


def _yield_and_store(crawler: Crawler, store: ItemStore, request: Request) -> None:
    """The page of ``request`` yields two items without a key; the store stores them."""
    response = HtmlResponse(request.url, headers={"ETag": '"e1"'}, body=b"<p>", request=request)
    ids = ItemIdMiddleware.from_crawler(crawler)
    for item in ids.process_spider_output(response, [{"title": "A"}, {"title": "B"}]):
        asyncio.run(store.process_item(item))


def test_mongo_pipeline_and_the_json_lines_store_are_item_stores(tmp_path: Path) -> None:
    crawler, _ = _crawl()
    mongo = MongoPipeline(crawler, "mongodb://127.0.0.1:1", "crawler")  # no connection made
    assert isinstance(mongo, ItemStore)
    assert store_of(crawler) is mongo
    jsonl = JsonLinesStore(crawler, tmp_path / "items.jsonl")
    assert isinstance(jsonl, ItemStore)
    assert store_of(crawler) is jsonl


def test_a_redelivered_page_stores_its_items_once_in_the_json_lines_store(
    tmp_path: Path,
) -> None:
    crawler, _ = _crawl()
    store = JsonLinesStore(crawler, tmp_path / "items.jsonl")
    request = Request("https://a.example/p")
    _yield_and_store(crawler, store, request)
    first = store.lines()
    _yield_and_store(crawler, store, Request(request.url))  # the same page, delivered again
    again = store.lines()
    assert sorted(d["title"] for d in again.values()) == ["A", "B"]
    assert again.keys() == first.keys()
    assert all(again[i]["first_seen"] == first[i]["first_seen"] for i in first)


def test_a_304_to_a_revisit_touches_the_pages_items_in_the_json_lines_store(
    tmp_path: Path,
) -> None:
    crawler, sent = _crawl()
    store = JsonLinesStore(crawler, tmp_path / "items.jsonl")
    page = Request("https://a.example/p")
    _yield_and_store(crawler, store, page)
    _yield_and_store(crawler, store, Request("https://a.example/other"))
    before = store.lines()
    assert len(before) == 4
    assert all(doc[SOURCE_FIELD].startswith("t:") for doc in before.values())

    revisits = RevisitMiddleware.from_crawler(crawler)
    revisit = Request(page.url, meta={REVISIT_META: {"etag": '"e1"'}})
    revisits.process_request(revisit)
    assert revisit.headers[b"If-None-Match"] == b'"e1"'
    with pytest.raises(IgnoreRequest):
        asyncio.run(revisits.process_response(revisit, HtmlResponse(page.url, status=304)))

    after = store.lines()
    touched = {i for i in after if after[i]["last_seen"] > before[i]["last_seen"]}
    page_source = before[next(iter(touched))][SOURCE_FIELD]
    assert touched == {i for i, doc in before.items() if doc[SOURCE_FIELD] == page_source}
    assert len(touched) == 2  # the page's two items, not the other page's
    assert {after[i]["title"] for i in touched} == {"A", "B"}
    assert crawler.stats.get_value("revisit/touched") == 2
    assert sent == [("fetched", page.url, {"etag": '"e1"'})]  # the next revisit, scheduled


class _BrokenFileStore(JsonLinesStore):
    def touch(self, source: str, when: datetime) -> int:
        raise PermissionError("read-only file system (test)")


def test_a_304_the_store_could_not_record_becomes_a_dead_letter_naming_the_store(
    tmp_path: Path,
) -> None:
    crawler, sent = _crawl()
    _BrokenFileStore(crawler, tmp_path / "items.jsonl")
    revisits = RevisitMiddleware.from_crawler(crawler)
    revisit = Request("https://a.example/p", meta={REVISIT_META: {"etag": '"e1"'}})
    revisits.process_request(revisit)
    with pytest.raises(IgnoreRequest):
        asyncio.run(revisits.process_response(revisit, HtmlResponse(revisit.url, status=304)))
    [(what, url, reason)] = sent
    assert (what, url) == ("dead", revisit.url)
    assert reason.startswith("304 not recorded in a JSON-lines file: PermissionError")
    assert crawler.stats.get_value("revisit/touch_failed") == 1
