"""Item pipelines: batched writes into MongoDB, stored before acknowledged."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bson import ObjectId, json_util
from bson.errors import InvalidDocument
from itemadapter import ItemAdapter
from pymongo import ASCENDING, InsertOne, MongoClient, UpdateOne
from pymongo.errors import BulkWriteError, ConnectionFailure, PyMongoError
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Self

    from pymongo.collection import Collection
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = ["MongoPipeline", "as_document", "load_spill"]

#: MongoDB's error code for a unique index violation.
DUPLICATE_KEY = 11000
#: Longest pause, in seconds, between two attempts to reach MongoDB.
BACKOFF_CAP = 30.0

#: Value types that :func:`as_document` keeps as they are.
_SCALARS = frozenset({str, int, float, bool, type(None), datetime, bytes, ObjectId})


def as_document(item: Any) -> dict[str, Any]:
    """``ItemAdapter(item).asdict()``, several times faster.

    The same dict: the item's fields in order, nested items (in dicts, lists,
    tuples and sets too) turned into dicts, containers copied. The speed comes
    from returning strings, numbers and datetimes at once, where
    ``ItemAdapter`` asks each of its adapters whether the value is an item.

    :raises TypeError: ``item`` is not an item ItemAdapter knows.
    """
    adapter = item if isinstance(item, ItemAdapter) else ItemAdapter(item)
    return {name: _plain(value) for name, value in adapter.items()}


def _plain(value: Any) -> Any:
    """``value`` as ``ItemAdapter.asdict`` stores it (see :func:`as_document`)."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | set | tuple):
        return value.__class__(_plain(v) for v in value)
    if isinstance(value, ItemAdapter) or ItemAdapter.is_item(value):
        return as_document(value)
    return value


@dataclass
class _Pending:
    """One document waiting for a bulk write.

    For an item with a natural key, the latest fields of that key in the open
    batch (``first`` is when the key was first seen in it); for an item without
    one, the item itself, with an ``_id`` minted here unless it had one
    (``minted``), so that writing it again is harmless.
    """

    collection: str
    ident: str
    doc: dict[str, Any]
    key: tuple[str, ...]
    first: datetime
    last: datetime
    minted: bool = False
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def insert(self) -> InsertOne[dict[str, Any]]:
        """The insert of a new document, ``first_seen`` and ``last_seen`` included."""
        return InsertOne({**self.doc, "first_seen": self.first, "last_seen": self.last})

    def upsert(self) -> UpdateOne:
        """The upsert on the natural key: fields and ``last_seen`` always set,
        ``first_seen`` on insert only."""
        return UpdateOne(
            {k: self.doc.get(k) for k in self.key},
            {
                "$set": {**self.doc, "last_seen": self.last},
                "$setOnInsert": {"first_seen": self.first},
            },
            upsert=True,
        )


class MongoPipeline:
    """Store items in MongoDB with batched bulk writes.

    An item class names its collection and natural key with the class
    attributes ``collection`` (str) and ``key`` (tuple of field names), as
    :mod:`crawler.items` does. Each collection gets a unique index on its key,
    so a key is stored once: a new key is inserted with ``first_seen`` and
    ``last_seen`` (UTC datetimes); a key already stored gets its fields and
    ``last_seen`` set and keeps its ``first_seen``. Crawling a site twice
    therefore never duplicates a document. Items with no key (plain dicts)
    are inserted, with both times, into the collection named after the
    spider.

    Items are converted with :func:`as_document` and wait in an open batch
    (items with the same key in it are merged into one document). The batch
    is written once it holds ``MONGO_BATCH_SIZE`` documents, or every
    ``MONGO_FLUSH_INTERVAL`` seconds when no write is under way, in a
    thread so the crawl is not blocked; the next batch fills up meanwhile,
    and batches are written one after the other, in order.

    A batch is written insert-first, one unordered ``bulk_write`` per
    collection: each document is an ``InsertOne``, and the ones the unique
    index refuses as duplicates (code 11000: the key is stored already, by an
    earlier crawl or by another worker just now) are sent again as
    ``UpdateOne(..., upsert=True)`` in a second bulk write. New documents,
    the common case, thus cost one insert, which MongoDB does for less than
    an upsert (a lookup, then an insert). When most keys of a collection's
    batch turn out to exist (a re-crawl), its next batches go straight to
    upserts, until most of a batch is new again. A duplicate-key error on an
    upsert (two workers inserting the same key at once) is retried once.

    ``process_item`` returns only once the item is stored (or set aside, see
    below), so Scrapy's engine finishes a request, and the frontier
    acknowledges its lease, only after its items are safe: a worker killed
    before a flush loses nothing, its request is crawled again.

    * **Outage** (or any other error, such as a refused login): the batch
      is kept and retried with doubling pauses (up to 30 s; stat
      ``mongo/retries``); writing it again is harmless. Once more than
      ``MONGO_SPILL_AFTER`` documents wait, they are appended to a JSON-lines
      file in ``MONGO_SPILL_DIR`` (stat ``mongo/spilled``), from which
      ``scrapy loadspill FILE`` stores them later.
    * **Rejected item** (MongoDB refuses it: over 16 MB, a value BSON cannot
      carry such as a set or an int over 64 bits, a key that is not a
      string): stored in the ``MONGO_DEAD_COLLECTION`` collection with the
      reason (stat ``mongo/dead``); the rest of its batch is stored and the
      crawl goes on.

    Settings: ``MONGO_URI`` (NotConfigured when empty), ``MONGO_DATABASE``,
    ``MONGO_BATCH_SIZE`` (documents, 500), ``MONGO_FLUSH_INTERVAL`` (seconds,
    0.25), ``MONGO_SPILL_AFTER`` (documents, 10000), ``MONGO_SPILL_DIR``
    ("spill"), ``MONGO_DEAD_COLLECTION`` ("dead_items").

    Stats: ``mongo/bulk_writes`` (calls), ``mongo/upserted`` (keyed documents
    created, by insert or upsert), ``mongo/modified`` (keyed documents
    changed by an upsert), ``mongo/inserted`` (items without a key stored),
    ``mongo/retries``, ``mongo/spilled``, ``mongo/dead``.
    """

    def __init__(
        self,
        crawler: Crawler,
        uri: str,
        database: str,
        *,
        batch_size: int = 500,
        flush_interval: float = 0.25,
        spill_after: int = 10_000,
        spill_dir: str = "spill",
        dead_collection: str = "dead_items",
    ) -> None:
        self.crawler = crawler
        self.uri = uri
        self.database = database
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.spill_after = spill_after
        self.spill_dir = Path(spill_dir)
        self.dead_collection = dead_collection
        self.client: MongoClient[dict[str, Any]] | None = None
        #: The open batch, by (collection, natural key as JSON or a serial).
        self._open: dict[tuple[str, str], _Pending] = {}
        #: Full batches waiting to be written, oldest first.
        self._sealed: deque[list[_Pending]] = deque()
        self._serial = count()
        self._indexed: set[tuple[str, tuple[str, ...]]] = set()
        #: Collections whose last batch was mostly keys stored already.
        self._upsert_first: set[str] = set()
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[bool] | None = None
        self._backoff = 0.0
        self._spider_name = ""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Read the ``MONGO_*`` settings; no connection is made here."""
        settings = crawler.settings
        uri = settings.get("MONGO_URI")
        if not uri:
            raise NotConfigured("MONGO_URI is not set")
        return cls(
            crawler,
            uri,
            settings.get("MONGO_DATABASE", "crawler"),
            batch_size=settings.getint("MONGO_BATCH_SIZE", 500),
            flush_interval=settings.getfloat("MONGO_FLUSH_INTERVAL", 0.25),
            spill_after=settings.getint("MONGO_SPILL_AFTER", 10_000),
            spill_dir=settings.get("MONGO_SPILL_DIR", "spill"),
            dead_collection=settings.get("MONGO_DEAD_COLLECTION", "dead_items"),
        )

    async def open_spider(self) -> None:
        """Create the client (it connects at the first write) and the timer."""
        assert self.crawler.spider is not None
        self._spider_name = self.crawler.spider.name
        self.client = MongoClient(
            self.uri, tz_aware=True, connect=False, serverSelectionTimeoutMS=5000
        )
        self._timer = asyncio.ensure_future(self._flush_periodically())

    async def close_spider(self) -> None:
        """Store what is pending (waiting out a short outage, then spilling)."""
        if self._timer is not None:
            self._timer.cancel()
        for _ in range(5):
            if await self.flush():
                break
            await asyncio.sleep(self._backoff)
        else:
            await self._spill()
        if self.client is not None:
            self.client.close()

    async def process_item(self, item: Any) -> Any:
        """Queue ``item`` for the next bulk write and return once it is stored."""
        now = datetime.now(UTC)
        doc = as_document(item)
        key: tuple[str, ...] = tuple(getattr(item, "key", ()))
        collection = getattr(item, "collection", None) or self._spider_name
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if key:
            ident = json.dumps([doc.get(k) for k in key], default=str)
            pending = self._open.get((collection, ident))
            if pending is None:
                pending = _Pending(collection, ident, doc, key, now, now)
                self._open[(collection, ident)] = pending
            else:
                pending.doc, pending.last = doc, now
        else:
            minted = "_id" not in doc
            if minted:
                doc = {"_id": ObjectId(), **doc}
            ident = f"#{next(self._serial)}"
            pending = _Pending(collection, ident, doc, key, now, now, minted)
            self._open[(collection, ident)] = pending
        pending.waiters.append(done)
        if len(self._open) >= self.batch_size:
            self._seal()
            if not self._backoff and (self._flusher is None or self._flusher.done()):
                self._flusher = asyncio.ensure_future(self.flush(everything=False))
        await done
        return item

    def _seal(self) -> None:
        """Close the open batch: it is written after those sealed before it."""
        if self._open:
            self._sealed.append(list(self._open.values()))
            self._open = {}

    def _count(self) -> int:
        return len(self._open) + sum(map(len, self._sealed))

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._backoff or self.flush_interval)
            if self._flusher is not None and not self._flusher.done():
                continue  # a write is under way; the open batch may still fill up
            # A task of its own, so that cancelling the timer (at close) never
            # interrupts a write under way.
            self._flusher = asyncio.ensure_future(self.flush())
            if not await asyncio.shield(self._flusher) and self._count() > self.spill_after:
                await self._spill()

    async def flush(self, *, everything: bool = True) -> bool:
        """Write the sealed batches in order, and first seal the open one
        unless ``everything`` is False; return False if MongoDB could not be
        written (the batches are kept for the next attempt)."""
        async with self._lock:
            if everything:
                self._seal()
            while self._sealed:
                batch = self._sealed[0]
                try:
                    await asyncio.to_thread(self._write, batch)
                except Exception as exc:
                    # Writing the batch again is harmless (see _write): an
                    # error that is not MongoDB's, a bug, is retried too,
                    # and the batch spilled in the end, rather than the
                    # items waiting for ever.
                    self._backoff = min(BACKOFF_CAP, max(0.5, self._backoff * 2))
                    log = logger.warning if isinstance(exc, ConnectionFailure) else logger.error
                    log(
                        "MongoDB unreachable or failing (%r); %d documents wait, retrying in %.1fs",
                        exc, self._count(), self._backoff,
                        exc_info=not isinstance(exc, PyMongoError),
                    )
                    self.crawler.stats.inc_value("mongo/retries")
                    return False
                self._sealed.popleft()
                for pending in batch:
                    for done in pending.waiters:
                        if not done.done():
                            done.set_result(None)
            if self._backoff:
                logger.info("MongoDB reachable again")
            self._backoff = 0.0
            return True

    def _write(self, batch: list[_Pending]) -> None:
        """Store ``batch`` (in a worker thread), collection by collection.

        Writing a batch again, after an error part-way, is harmless: keys
        stored already are updated to the same values, and items without a
        key bring the ``_id`` of their first attempt.

        :raises PyMongoError: MongoDB is unreachable or failing; the caller
            keeps the batch.
        """
        assert self.client is not None
        db = self.client[self.database]
        by_collection: dict[str, list[_Pending]] = {}
        for pending in batch:
            by_collection.setdefault(pending.collection, []).append(pending)
        for name, entries in by_collection.items():
            coll = db[name]
            for key in {p.key for p in entries if p.key}:
                if (name, key) not in self._indexed:
                    coll.create_index([(k, ASCENDING) for k in key], unique=True)
                    self._indexed.add((name, key))
            self._store(coll, entries)

    def _store(self, coll: Collection[dict[str, Any]], entries: list[_Pending]) -> None:
        """Store ``entries``; find by halving the ones BSON cannot carry."""
        try:
            self._store_batch(coll, entries)
        except (InvalidDocument, OverflowError, UnicodeEncodeError) as exc:
            if len(entries) == 1:
                self._dead(coll, entries[0], f"{type(exc).__name__}: {exc}")
                return
            half = len(entries) // 2
            self._store(coll, entries[:half])
            self._store(coll, entries[half:])

    def _store_batch(self, coll: Collection[dict[str, Any]], entries: list[_Pending]) -> None:
        """Insert-first, then upsert the keys found stored already.

        :raises InvalidDocument: a document BSON cannot carry (a set, a
            Decimal, a key that is not a string; ``OverflowError`` for an int
            over 64 bits, ``UnicodeEncodeError`` for a lone surrogate); nothing
            tells which, and some others may be stored by then.
        """
        name = coll.name
        upsert_first = name in self._upsert_first
        updates = [p for p in entries if p.key and upsert_first]
        inserts = [p for p in entries if not (p.key and upsert_first)]
        if inserts:
            existing = 0
            failed, _ = self._bulk(coll, [p.insert() for p in inserts], inserts)
            for pending, error in failed:
                duplicate = error.get("code") == DUPLICATE_KEY
                if duplicate and pending.key:
                    updates.append(pending)
                    existing += 1
                elif duplicate and pending.minted and error.get("keyPattern") == {"_id": 1}:
                    pass  # stored by an earlier attempt at this batch
                else:
                    self._dead(coll, pending, f"{error.get('code')}: {error.get('errmsg')}")
            keyed = sum(1 for p in inserts if p.key)
            if keyed and existing * 2 > keyed:
                self._upsert_first.add(name)
        for attempt in (1, 2):
            if not updates:
                break
            failed, upserted = self._bulk(coll, [p.upsert() for p in updates], updates)
            if attempt == 1 and upsert_first and upserted * 2 > len(updates):
                self._upsert_first.discard(name)
            updates = []
            for pending, error in failed:
                if attempt == 1 and error.get("code") == DUPLICATE_KEY:
                    updates.append(pending)  # another worker inserted the key just now
                else:
                    self._dead(coll, pending, f"{error.get('code')}: {error.get('errmsg')}")

    def _bulk(
        self, coll: Collection[dict[str, Any]], ops: list[Any], entries: list[_Pending]
    ) -> tuple[list[tuple[_Pending, dict[str, Any]]], int]:
        """One unordered ``bulk_write`` of ``ops`` (all inserts or all upserts,
        one per entry); count it. Return the entries refused, each with its
        write error, and the number of documents upserted."""
        stats = self.crawler.stats
        details: Mapping[str, Any]
        try:
            details = coll.bulk_write(ops, ordered=False).bulk_api_result
        except BulkWriteError as exc:
            details = exc.details
        errors: list[dict[str, Any]] = details.get("writeErrors", [])
        stats.inc_value("mongo/bulk_writes")
        if isinstance(ops[0], InsertOne):
            refused = {error["index"] for error in errors}
            stored = [p for i, p in enumerate(entries) if i not in refused]
            stats.inc_value("mongo/upserted", sum(1 for p in stored if p.key))
            stats.inc_value("mongo/inserted", sum(1 for p in stored if not p.key))
        else:
            stats.inc_value("mongo/upserted", details.get("nUpserted", 0))
            stats.inc_value("mongo/modified", details.get("nModified", 0))
        return [(entries[error["index"]], error) for error in errors], details.get("nUpserted", 0)

    def _dead(self, coll: Collection[dict[str, Any]], pending: _Pending, reason: str) -> None:
        """Store a refused item in the dead collection, with the reason."""
        logger.error("MongoDB rejected an item for %s: %s", coll.name, reason)
        self.crawler.stats.inc_value("mongo/dead")
        try:
            item = json_util.dumps(pending.doc)
        except (TypeError, ValueError):
            item = repr(pending.doc)
        record = {
            "collection": coll.name,
            "reason": reason,
            "time": datetime.now(UTC),
            "item": item[:1_000_000],
        }
        try:
            coll.database[self.dead_collection].insert_one(record)
        except PyMongoError as exc:
            logger.error("Could not store the dead item either: %s", exc)

    async def _spill(self) -> None:
        """Spill everything waiting, once no write is under way."""
        async with self._lock:
            self._seal()
            self._spill_all()

    def _spill_all(self) -> None:
        """Append everything sealed to this worker's spill file, then release it.

        Documents of one key in several batches become one row (latest fields,
        earliest ``first_seen``), so that loading the file stores the latest.
        """
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        waiters: list[asyncio.Future[None]] = []
        while self._sealed:
            for p in self._sealed.popleft():
                waiters += p.waiters
                known = rows.get((p.collection, p.ident))
                if known is not None:
                    known.update(doc=p.doc, last_seen=p.last)
                elif p.key:
                    rows[(p.collection, p.ident)] = {
                        "collection": p.collection, "key": list(p.key), "doc": p.doc,
                        "first_seen": p.first, "last_seen": p.last,
                    }
                else:
                    doc = {**p.doc, "first_seen": p.first, "last_seen": p.last}
                    rows[(p.collection, p.ident)] = {
                        "collection": p.collection, "key": [], "doc": doc,
                    }
        if not rows:
            return
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        path = self.spill_dir / f"{self._spider_name}-{socket.gethostname()}-{os.getpid()}.jsonl"
        spilled = 0
        with path.open("a", encoding="utf-8") as f:
            for row in rows.values():
                try:
                    line = json_util.dumps(row)
                except (TypeError, ValueError) as exc:
                    logger.error("Cannot spill an item of %s (%s): dropped", row["collection"], exc)
                    continue
                f.write(line + "\n")
                spilled += 1
            f.flush()
            os.fsync(f.fileno())
        self.crawler.stats.inc_value("mongo/spilled", spilled)
        logger.warning("MongoDB unreachable: spilled %d documents to %s", spilled, path)
        for done in waiters:
            if not done.done():
                done.set_result(None)


def load_spill(path: str | Path, uri: str, database: str) -> int:
    """Store the items of a spill file written by :class:`MongoPipeline`.

    Upserts keyed items as the pipeline would (keeping the earliest
    ``first_seen``) and inserts the others with the ``_id`` the pipeline gave
    them; one whose ``_id`` is stored already (the pipeline had stored it
    before it spilled, or the file is loaded again) counts as stored. Loading
    a file twice therefore stores nothing twice. Returns the number of items
    stored; the file is left in place.

    :raises pymongo.errors.PyMongoError: MongoDB refused or is unreachable.
    """
    client: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    db = client[database]
    ops: dict[str, list[Any]] = {}
    indexed: set[tuple[str, tuple[str, ...]]] = set()
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json_util.loads(line)
            doc, key, name = row["doc"], tuple(row["key"]), row["collection"]
            if key:
                op: Any = UpdateOne(
                    {k: doc.get(k) for k in key},
                    {"$set": {**doc, "last_seen": row["last_seen"]},
                     "$min": {"first_seen": row["first_seen"]}},
                    upsert=True,
                )
                if (name, key) not in indexed:
                    db[name].create_index([(k, ASCENDING) for k in key], unique=True)
                    indexed.add((name, key))
            else:
                op = InsertOne(doc)
            ops.setdefault(name, []).append(op)
    stored = 0
    try:
        for name, batch in ops.items():
            for i in range(0, len(batch), 1000):
                chunk = batch[i : i + 1000]
                try:
                    db[name].bulk_write(chunk, ordered=False)
                except BulkWriteError as exc:
                    refused = [
                        error for error in exc.details.get("writeErrors", [])
                        if not (
                            error.get("code") == DUPLICATE_KEY
                            and isinstance(chunk[error["index"]], InsertOne)
                            and error.get("keyPattern") == {"_id": 1}
                        )
                    ]
                    if refused:
                        raise
                stored += len(chunk)
    finally:
        client.close()
    return stored
