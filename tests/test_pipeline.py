"""MongoPipeline (in process) and loadspill against a real MongoDB wire-protocol server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import scrapy
from bson import json_util
from itemadapter import ItemAdapter
from scrapy import Spider
from scrapy.utils.test import get_crawler

from crawler.items import AuthorItem, QuoteItem
from crawler.pipelines import MongoPipeline, SpillLoad, as_document, load_spill

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable
#: Seconds the in-process pipeline runs may take before a test fails as hung
#: (1,200 items take a few seconds alone; 30 was not enough beside the rest
#: of the suite on a loaded 2-core machine).
HANG_GUARD = 120


class _Spider(Spider):
    name = "pipeline_test"


def pipeline_for(mongo_uri: str, mongo_db: str, **settings: Any) -> MongoPipeline:
    crawler = get_crawler(
        _Spider, {"MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db, **settings}
    )
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    return MongoPipeline.from_crawler(crawler)


def run_many(
    mongo_uri: str, mongo_db: str, feeds: list[list[Any]], close_early: bool = False,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Open one pipeline per feed (as workers would), feed them their items
    at the same time, close them; return their stats."""
    pipelines = [pipeline_for(mongo_uri, mongo_db, **settings) for _ in feeds]

    async def go() -> None:
        for pipeline in pipelines:
            await pipeline.open_spider()
        # As Scrapy does, items are processed concurrently; each returns once
        # it is stored. Closing stores whatever is still waiting.
        tasks = [
            asyncio.ensure_future(pipeline.process_item(item))
            for pipeline, items in zip(pipelines, feeds, strict=True)
            for item in items
        ]
        await asyncio.sleep(0)
        if close_early:
            for pipeline in pipelines:
                await pipeline.close_spider()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=HANG_GUARD)
        if not close_early:
            for pipeline in pipelines:
                await pipeline.close_spider()

    asyncio.run(go())
    return [pipeline.crawler.stats.get_stats() for pipeline in pipelines]


def run(
    mongo_uri: str, mongo_db: str, items: list[Any], close_early: bool = False, **settings: Any
) -> dict[str, Any]:
    """Open the pipeline, feed it ``items``, close it; return the stats."""
    [stats] = run_many(mongo_uri, mongo_db, [items], close_early, **settings)
    return stats


def quotes(n: int) -> list[QuoteItem]:
    return [QuoteItem(text=f"q{i}", author=f"a{i % 7}", tags=["t"], url="u") for i in range(n)]


def test_items_are_upserted_in_batches_once_per_key(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    stats = run(mongo_uri, mongo_db, quotes(600) + quotes(600), MONGO_BATCH_SIZE=500)

    assert db.quotes.count_documents({}) == 600
    # 1200 items in a few bulk writes, not one round trip per item: three
    # batches of at most 500 documents, one with inserts and upserts.
    assert stats["mongo/bulk_writes"] <= 4
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


def test_new_items_are_inserted_in_one_bulk_write(mongo_uri: str, mongo_db: str, db: Any) -> None:
    stats = run(mongo_uri, mongo_db, quotes(50))

    assert db.quotes.count_documents({}) == 50
    assert stats["mongo/bulk_writes"] == 1
    assert stats["mongo/upserted"] == 50
    assert stats.get("mongo/modified", 0) == 0
    doc = db.quotes.find_one({"text": "q3"}, {"_id": 0})
    first_seen, last_seen = doc.pop("first_seen"), doc.pop("last_seen")
    assert doc == {"text": "q3", "author": "a3", "tags": ["t"], "url": "u"}
    assert first_seen == last_seen
    assert first_seen.tzinfo is not None


def test_a_recrawl_updates_stored_keys_and_inserts_new_ones(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    run(mongo_uri, mongo_db, quotes(20))
    before = {d["text"]: d["first_seen"] for d in db.quotes.find()}
    stats = run(mongo_uri, mongo_db, quotes(40), MONGO_BATCH_SIZE=5)

    assert db.quotes.count_documents({}) == 40
    assert stats["mongo/upserted"] == 20
    assert stats["mongo/modified"] == 20
    for doc in db.quotes.find({"text": {"$in": list(before)}}):
        assert doc["first_seen"] == before[doc["text"]]
        assert doc["last_seen"] > doc["first_seen"]
    # Eight batches of five. The first one's inserts are all refused as
    # duplicates and sent again as upserts (two writes); the next three go
    # straight to upserts (one each). The fifth, new keys, is upserted too
    # and turns the collection back to inserts for the last three.
    assert stats["mongo/bulk_writes"] == 2 + 3 + 1 + 3


def test_two_workers_storing_the_same_keys_at_once_store_each_once(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    feeds = [
        [QuoteItem(text=f"q{i}", author="a", url=worker) for i in range(300)]
        for worker in ("w1", "w2")
    ]
    first, second = run_many(mongo_uri, mongo_db, feeds, MONGO_BATCH_SIZE=100)

    assert db.quotes.count_documents({}) == 300
    # Each key was inserted by one worker; the other's insert was refused as
    # a duplicate and became an update of that document.
    assert first.get("mongo/upserted", 0) + second.get("mongo/upserted", 0) == 300
    assert first.get("mongo/modified", 0) + second.get("mongo/modified", 0) == 300
    assert "mongo/dead" not in first
    assert "mongo/dead" not in second
    assert db.dead_items.count_documents({}) == 0
    # The last write of a key wins: its fields and last_seen are that worker's.
    assert {doc["url"] for doc in db.quotes.find()} <= {"w1", "w2"}


def test_rejected_items_go_to_the_dead_collection_and_the_rest_is_stored(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    too_big = QuoteItem(text="big", author="a", url="x" * (17 * 1024 * 1024))
    unencodable = QuoteItem(text="set", author="a", tags={"a", "b"})  # type: ignore[arg-type]
    huge_int = QuoteItem(text="int", author="a", tags=[2**70])  # type: ignore[list-item]
    items: list[Any] = [
        *quotes(5), too_big, unencodable, {"free": "form"}, {1: "not a string key"}, huge_int,
        *quotes(8)[5:],
    ]
    stats = run(mongo_uri, mongo_db, items)

    assert sorted(d["text"] for d in db.quotes.find()) == [f"q{i}" for i in range(8)]
    assert db.pipeline_test.count_documents({}) == 1
    assert stats["mongo/dead"] == 4
    dead = {d["item"][:40]: d for d in db.dead_items.find()}
    assert len(dead) == 4
    assert all(d["reason"] and d["time"] for d in dead.values())
    assert {d["collection"] for d in dead.values()} == {"quotes", "pipeline_test"}
    [big] = [d for d in dead.values() if '"text": "big"' in d["item"]]
    assert big["collection"] == "quotes"
    [unset] = [d for d in dead.values() if '"text": "set"' in d["item"]]
    assert "cannot encode" in unset["reason"]


def test_writing_a_batch_again_stores_nothing_twice(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    # After an error part-way (a lost connection), the whole batch is sent
    # again: stored keys are updated, items without a key keep their _id.
    pipeline = pipeline_for(mongo_uri, mongo_db, MONGO_FLUSH_INTERVAL=3600)

    async def go() -> None:
        await pipeline.open_spider()
        tasks = [
            asyncio.ensure_future(pipeline.process_item(item))
            for item in [*quotes(10), {"free": "form"}]
        ]
        await asyncio.sleep(0)
        pipeline._seal()
        [batch] = pipeline._sealed
        await asyncio.to_thread(pipeline._write, batch)
        await asyncio.to_thread(pipeline._write, batch)
        await pipeline.close_spider()  # writes it a third time
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=HANG_GUARD)

    asyncio.run(go())
    assert db.quotes.count_documents({}) == 10
    assert db.pipeline_test.count_documents({}) == 1
    assert db.dead_items.count_documents({}) == 0


@dataclass
class _Inner:
    name: str
    tags: list[str] = field(default_factory=list)


class _ScrapyItem(scrapy.Item):
    title = scrapy.Field()
    inner = scrapy.Field()
    unset = scrapy.Field()


@dataclass
class _Outer:
    inner: _Inner
    many: list[_Inner]
    by_name: dict[str, Any]
    pair: tuple[int, _Inner]
    scrapy_item: _ScrapyItem
    plain: dict[str, list[int]]


def test_as_document_is_itemadapters_asdict() -> None:
    inner = _Inner("x", ["a", "b"])
    outer = _Outer(
        inner=inner,
        many=[inner, _Inner("y")],
        by_name={"x": inner, "n": 1, "none": None},
        pair=(1, inner),
        scrapy_item=_ScrapyItem(title="t", inner=inner),
        plain={"a": [1, 2]},
    )
    expected = ItemAdapter(outer).asdict()
    got = as_document(outer)
    assert got == expected
    assert got["inner"] == {"name": "x", "tags": ["a", "b"]}
    assert got["scrapy_item"] == {"title": "t", "inner": {"name": "x", "tags": ["a", "b"]}}
    # A copy: changing the item afterwards does not change the document.
    inner.tags.append("c")
    assert got["inner"]["tags"] == ["a", "b"]


def test_spilled_items_are_loaded_once_however_often_the_file_is_loaded(
    mongo_uri: str, mongo_db: str, db: Any, tmp_path: Any
) -> None:
    pipeline = pipeline_for(
        mongo_uri, mongo_db, MONGO_FLUSH_INTERVAL=3600, MONGO_BATCH_SIZE=10,
        MONGO_SPILL_DIR=str(tmp_path),
    )
    # Two batches hold q0..q9 (the second with changed tags), a third one an
    # item without a key; all are spilled as MongoDB would be down.
    changed = [QuoteItem(text=q.text, author=q.author, tags=["new"]) for q in quotes(10)]

    async def go() -> None:
        await pipeline.open_spider()
        pipeline._backoff = 1.0  # as in an outage: no write is started
        tasks = [
            asyncio.ensure_future(pipeline.process_item(item))
            for item in [*quotes(10), *changed, {"free": "form"}]
        ]
        await asyncio.sleep(0)
        await pipeline._spill()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=HANG_GUARD)
        if pipeline._timer is not None:
            pipeline._timer.cancel()
        assert pipeline.client is not None
        pipeline.client.close()

    asyncio.run(go())
    [spill] = tmp_path.iterdir()
    assert len(spill.read_text().splitlines()) == 11  # one row per key
    assert pipeline.crawler.stats.get_value("mongo/spilled") == 11

    assert load_spill(spill, mongo_uri, mongo_db) == SpillLoad(stored=11, stale=0)
    assert load_spill(spill, mongo_uri, mongo_db) == SpillLoad(stored=11, stale=0)
    assert db.quotes.count_documents({}) == 10
    assert db.quotes.count_documents({"tags": ["new"]}) == 10
    assert db.pipeline_test.count_documents({"free": "form"}) == 1
    doc = db.quotes.find_one({"text": "q1"})
    assert doc["first_seen"] <= doc["last_seen"]


# --- time never goes backwards (issue 11) ------------------------------------------


def test_two_upserts_out_of_order_keep_the_latest_last_seen_and_fields(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    # Worker A sees the quote (and an item without a key) first, worker B
    # later; B's write reaches MongoDB first, A's after it.
    early, late = (
        pipeline_for(mongo_uri, mongo_db, MONGO_FLUSH_INTERVAL=3600) for _ in range(2)
    )

    async def go() -> None:
        for pipeline in (early, late):
            await pipeline.open_spider()
        old = [QuoteItem(text="q", author="a", tags=["old"]), {"_id": "k", "v": "old"}]
        new = [QuoteItem(text="q", author="a", tags=["new"]), {"_id": "k", "v": "new"}]
        first = [asyncio.ensure_future(early.process_item(item)) for item in old]
        await asyncio.sleep(0.05)  # BSON dates are milliseconds
        second = [asyncio.ensure_future(late.process_item(item)) for item in new]
        await asyncio.sleep(0)
        assert await late.flush()
        assert await early.flush()
        await asyncio.wait_for(asyncio.gather(*first, *second), timeout=HANG_GUARD)
        for pipeline in (early, late):
            await pipeline.close_spider()

    asyncio.run(go())
    quote = db.quotes.find_one({"text": "q"})
    keyless = db.pipeline_test.find_one({"_id": "k"})
    for doc, field_name, value in ((quote, "tags", ["new"]), (keyless, "v", "new")):
        assert doc[field_name] == value  # the older write did not overwrite the newer one
        # first_seen: the earlier worker's time, last_seen: the later one's
        # (50 ms apart; each item is stamped when it is processed).
        assert doc["last_seen"] - doc["first_seen"] >= timedelta(milliseconds=40)
    assert db.quotes.count_documents({}) == 1
    assert db.pipeline_test.count_documents({}) == 1
    assert early.crawler.stats.get_value("mongo/stale") == 2
    assert late.crawler.stats.get_value("mongo/stale") is None


def test_a_recrawl_never_moves_last_seen_back_even_with_a_slow_clock(
    mongo_uri: str, mongo_db: str, db: Any
) -> None:
    # A stored document from a worker whose clock runs ahead: a later write
    # with an earlier time keeps its last_seen, and lowers nothing else.
    ahead = datetime.now(UTC) + timedelta(hours=1)
    db.quotes.create_index([("text", 1), ("author", 1)], unique=True)
    db.quotes.insert_one(
        {"text": "q0", "author": "a0", "tags": ["ahead"], "first_seen": ahead, "last_seen": ahead}
    )
    run(mongo_uri, mongo_db, quotes(3))

    doc = db.quotes.find_one({"text": "q0"})
    assert doc["last_seen"] == ahead.replace(microsecond=ahead.microsecond // 1000 * 1000)
    assert doc["tags"] == ["ahead"]
    assert doc["first_seen"] < ahead  # the earlier sighting is kept
    assert db.quotes.count_documents({}) == 3


def _spill_file(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json_util.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.workers
def test_loadspill_never_overwrites_a_newer_document_and_only_lowers_first_seen(
    mongo_uri: str, mongo_db: str, db: Any, env: dict[str, str], tmp_path: Path
) -> None:
    t0, t1, t2, t3 = (datetime(2024, 1, 1, h, tzinfo=UTC) for h in (0, 1, 2, 3))
    # Stored by a crawl that went on after the worker spilled: seen t1..t2.
    db.quotes.create_index([("text", 1), ("author", 1)], unique=True)
    db.quotes.insert_many([
        {"text": "older", "author": "a", "tags": ["stored"], "first_seen": t1, "last_seen": t2},
        {"text": "newer", "author": "a", "tags": ["stored"], "first_seen": t1, "last_seen": t2},
    ])
    db.pipeline_test.insert_one({"_id": "k", "v": "stored", "first_seen": t1, "last_seen": t2})
    spill = _spill_file(tmp_path / "pipeline_test-host-1.jsonl", [
        # Spilled before the crawl stored its newer version: seen t0..t1.
        {"collection": "quotes", "key": ["text", "author"], "first_seen": t0, "last_seen": t1,
         "doc": {"text": "older", "author": "a", "tags": ["spilled"]}},
        # Spilled after: seen t3.
        {"collection": "quotes", "key": ["text", "author"], "first_seen": t3, "last_seen": t3,
         "doc": {"text": "newer", "author": "a", "tags": ["spilled"]}},
        {"collection": "quotes", "key": ["text", "author"], "first_seen": t0, "last_seen": t0,
         "doc": {"text": "new key", "author": "a", "tags": ["spilled"]}},
        # An item without a key, in the format written before _id was its key.
        {"collection": "pipeline_test", "key": [],
         "doc": {"_id": "k", "v": "spilled", "first_seen": t0, "last_seen": t0}},
    ])

    result = subprocess.run(
        [PYTHON, "-m", "scrapy", "loadspill", str(spill)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )

    assert result.returncode == 0, result.stderr
    assert f"{spill}: stored 2 items; 2 older than what MongoDB holds" in result.stdout
    assert not spill.exists()
    assert spill.with_name(spill.name + ".loaded").exists()
    older = db.quotes.find_one({"text": "older"}, {"_id": 0})
    assert older == {"text": "older", "author": "a", "tags": ["stored"],
                     "first_seen": t0, "last_seen": t2}
    newer = db.quotes.find_one({"text": "newer"}, {"_id": 0})
    assert newer == {"text": "newer", "author": "a", "tags": ["spilled"],
                     "first_seen": t1, "last_seen": t3}
    assert db.quotes.find_one({"text": "new key"}, {"_id": 0}) == {
        "text": "new key", "author": "a", "tags": ["spilled"], "first_seen": t0, "last_seen": t0,
    }
    assert db.pipeline_test.find_one({"_id": "k"}) == {
        "_id": "k", "v": "stored", "first_seen": t0, "last_seen": t2,
    }

    # Loading the same rows again changes nothing.
    again = _spill_file(tmp_path / "again.jsonl", [
        json_util.loads(line) for line in spill.with_name(spill.name + ".loaded").open()
    ])
    before = list(db.quotes.find()) + list(db.pipeline_test.find())
    assert load_spill(again, mongo_uri, mongo_db) == SpillLoad(stored=2, stale=2)
    assert list(db.quotes.find()) + list(db.pipeline_test.find()) == before
