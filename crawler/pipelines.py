"""Item pipelines: batched upserts into MongoDB, stored before acknowledged."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bson import json_util
from itemadapter import ItemAdapter
from pymongo import ASCENDING, InsertOne, MongoClient, UpdateOne
from pymongo.errors import BulkWriteError, ConnectionFailure, PyMongoError
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = ["MongoPipeline", "load_spill"]

#: MongoDB's error code for a unique index violation.
DUPLICATE_KEY = 11000
#: Longest pause, in seconds, between two attempts to reach MongoDB.
BACKOFF_CAP = 30.0


@dataclass
class _Pending:
    """Documents with one natural key waiting for the next bulk write."""

    doc: dict[str, Any]
    key: tuple[str, ...]
    first: datetime
    last: datetime
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class MongoPipeline:
    """Store items in MongoDB with batched upserts.

    An item class names its collection and natural key with the class
    attributes ``collection`` (str) and ``key`` (tuple of field names), as
    :mod:`crawler.items` does. Each collection gets a unique index on its key,
    and each item becomes one ``UpdateOne(..., upsert=True)`` that sets the
    item's fields and ``last_seen`` and, on insert only, ``first_seen`` (UTC
    datetimes); crawling a site twice therefore never duplicates a document.
    Items with no key (plain dicts) are inserted into the collection named
    after the spider.

    Writes go out as unordered ``bulk_write`` calls, one per collection, when
    ``MONGO_BATCH_SIZE`` items are waiting or every ``MONGO_FLUSH_INTERVAL``
    seconds, in a thread so the crawl is not blocked; items with the same key
    in one batch are merged into one write.

    ``process_item`` returns only once the item is stored (or set aside, see
    below), so Scrapy's engine finishes a request, and the frontier
    acknowledges its lease, only after its items are safe: a worker killed
    before a flush loses nothing, its request is crawled again.

    * **Outage**: while MongoDB is unreachable the batch is kept and retried
      with doubling pauses (up to 30 s; stat ``mongo/retries``). Once more
      than ``MONGO_SPILL_AFTER`` items wait, they are appended to a JSON-lines
      file in ``MONGO_SPILL_DIR`` (stat ``mongo/spilled``), from which
      ``scrapy loadspill FILE`` stores them later.
    * **Rejected item** (MongoDB refuses it: over 16 MB, a bad field name):
      stored in the ``MONGO_DEAD_COLLECTION`` collection with the reason
      (stat ``mongo/dead``); the crawl goes on.

    Settings: ``MONGO_URI`` (NotConfigured when empty), ``MONGO_DATABASE``,
    ``MONGO_BATCH_SIZE`` (500), ``MONGO_FLUSH_INTERVAL`` (seconds, 0.25),
    ``MONGO_SPILL_AFTER`` (items, 10000), ``MONGO_SPILL_DIR`` ("spill"),
    ``MONGO_DEAD_COLLECTION`` ("dead_items").

    Stats: ``mongo/bulk_writes``, ``mongo/upserted``, ``mongo/modified``,
    ``mongo/inserted``, ``mongo/retries``, ``mongo/spilled``, ``mongo/dead``.
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
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._inserts: dict[str, list[tuple[dict[str, Any], asyncio.Future[None]]]] = {}
        self._indexed: set[str] = set()
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._backoff = 0.0
        self._spider_name = ""
        self._tasks: set[asyncio.Future[bool]] = set()

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
        """Create the client (it connects in the background) and the timer."""
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
            self._spill_all()
        if self.client is not None:
            self.client.close()

    async def process_item(self, item: Any) -> Any:
        """Queue ``item`` for the next bulk write and return once it is stored."""
        adapter = ItemAdapter(item)
        now = datetime.now(UTC)
        doc = adapter.asdict()
        key: tuple[str, ...] = tuple(getattr(item, "key", ()))
        collection = getattr(item, "collection", None) or self._spider_name
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if key:
            ident = json.dumps([doc.get(k) for k in key], default=str)
            known = self._pending.get((collection, ident))
            pending = _Pending(doc, key, known.first if known else now, now)
            if known:
                pending.waiters = known.waiters
            pending.waiters.append(done)
            self._pending[(collection, ident)] = pending
        else:
            doc = {**doc, "first_seen": now, "last_seen": now}
            self._inserts.setdefault(collection, []).append((doc, done))
        if self._count() >= self.batch_size and not self._backoff:
            task = asyncio.ensure_future(self.flush())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await done
        return item

    def _count(self) -> int:
        return len(self._pending) + sum(map(len, self._inserts.values()))

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._backoff or self.flush_interval)
            if not await self.flush() and self._count() > self.spill_after:
                self._spill_all()

    async def flush(self) -> bool:
        """Write everything pending; return False if MongoDB was unreachable."""
        async with self._lock:
            if not self._count():
                return True
            pending, self._pending = self._pending, {}
            inserts, self._inserts = self._inserts, {}
            ops: dict[str, list[tuple[Any, list[asyncio.Future[None]]]]] = {}
            for (collection, _), p in pending.items():
                op = UpdateOne(
                    {k: p.doc.get(k) for k in p.key},
                    {
                        "$set": {**p.doc, "last_seen": p.last},
                        "$setOnInsert": {"first_seen": p.first},
                    },
                    upsert=True,
                )
                ops.setdefault(collection, []).append((op, p.waiters))
            for collection, docs in inserts.items():
                ops.setdefault(collection, []).extend(
                    (InsertOne(doc), [done]) for doc, done in docs
                )
            keys = {c: p.key for (c, _), p in pending.items()}
            try:
                written = await asyncio.to_thread(self._write, ops, keys)
            except ConnectionFailure as exc:
                self._backoff = min(BACKOFF_CAP, max(0.5, self._backoff * 2))
                logger.warning(
                    "MongoDB unreachable (%s); %d items wait, retrying in %.1fs",
                    exc, self._count() + len(pending) + sum(map(len, inserts.values())),
                    self._backoff,
                )
                self.crawler.stats.inc_value("mongo/retries")
                for k, p in pending.items():
                    self._merge_back(k, p)
                for c, docs in inserts.items():
                    self._inserts.setdefault(c, [])[:0] = docs
                return False
            if self._backoff:
                logger.info("MongoDB reachable again")
            self._backoff = 0.0
            for collection in written:
                for _, waiters in ops[collection]:
                    for done in waiters:
                        if not done.done():
                            done.set_result(None)
            return True

    def _merge_back(self, k: tuple[str, str], p: _Pending) -> None:
        newer = self._pending.get(k)
        if newer is None:
            self._pending[k] = p
        else:
            newer.first = p.first
            newer.waiters[:0] = p.waiters

    def _write(
        self,
        ops: dict[str, list[tuple[Any, list[asyncio.Future[None]]]]],
        keys: dict[str, tuple[str, ...]],
    ) -> list[str]:
        """Run the bulk writes (in a worker thread); return collections done.

        :raises ConnectionFailure: MongoDB is unreachable; nothing is lost,
            the caller keeps the batch.
        """
        assert self.client is not None
        db = self.client[self.database]
        stats = self.crawler.stats
        done = []
        for name, batch in ops.items():
            coll = db[name]
            if name in keys and name not in self._indexed:
                coll.create_index([(k, ASCENDING) for k in keys[name]], unique=True)
                self._indexed.add(name)
            todo = [op for op, _ in batch]
            for attempt in (1, 2):
                try:
                    result = coll.bulk_write(todo, ordered=False)
                except BulkWriteError as exc:
                    todo = self._failed_ops(db, name, todo, exc, retry=attempt == 1)
                    if todo:
                        continue
                    break
                stats.inc_value("mongo/bulk_writes")
                stats.inc_value("mongo/upserted", result.upserted_count)
                stats.inc_value("mongo/modified", result.modified_count)
                stats.inc_value("mongo/inserted", result.inserted_count)
                break
            done.append(name)
        return done

    def _failed_ops(
        self, db: Any, name: str, batch: list[Any], exc: BulkWriteError, *, retry: bool
    ) -> list[Any]:
        """Count what a partly failed bulk write did; return ops to retry.

        A duplicate-key error on an upsert (two workers inserted the same key
        at once) is retried once; any other rejected write goes to the dead
        collection with MongoDB's reason.
        """
        stats = self.crawler.stats
        details = exc.details
        stats.inc_value("mongo/bulk_writes")
        stats.inc_value("mongo/upserted", details.get("nUpserted", 0))
        stats.inc_value("mongo/modified", details.get("nModified", 0))
        stats.inc_value("mongo/inserted", details.get("nInserted", 0))
        again = []
        for error in details.get("writeErrors", []):
            op = batch[error["index"]]
            if retry and error.get("code") == DUPLICATE_KEY and isinstance(op, UpdateOne):
                again.append(op)
                continue
            self._dead(db, name, op, f"{error.get('code')}: {error.get('errmsg')}")
        return again

    def _dead(self, db: Any, name: str, op: Any, reason: str) -> None:
        document = op._doc if isinstance(op, InsertOne) else op._update.get("$set", {})
        logger.error("MongoDB rejected an item for %s: %s", name, reason)
        self.crawler.stats.inc_value("mongo/dead")
        record = {
            "collection": name,
            "reason": reason,
            "time": datetime.now(UTC),
            "item": json_util.dumps(document)[:1_000_000],
        }
        try:
            db[self.dead_collection].insert_one(record)
        except PyMongoError as exc:
            logger.error("Could not store the dead item either: %s", exc)

    def _spill_all(self) -> None:
        """Append everything pending to this worker's spill file, then release it."""
        pending, self._pending = self._pending, {}
        inserts, self._inserts = self._inserts, {}
        rows = []
        waiters: list[asyncio.Future[None]] = []
        for (collection, _), p in pending.items():
            rows.append({"collection": collection, "key": list(p.key), "doc": p.doc,
                         "first_seen": p.first, "last_seen": p.last})
            waiters += p.waiters
        for collection, docs in inserts.items():
            for doc, done in docs:
                rows.append({"collection": collection, "key": [], "doc": doc})
                waiters.append(done)
        if not rows:
            return
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        path = self.spill_dir / f"{self._spider_name}-{socket.gethostname()}-{os.getpid()}.jsonl"
        with path.open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json_util.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.crawler.stats.inc_value("mongo/spilled", len(rows))
        logger.warning("MongoDB unreachable: spilled %d items to %s", len(rows), path)
        for done in waiters:
            if not done.done():
                done.set_result(None)


def load_spill(path: str | Path, uri: str, database: str) -> int:
    """Store the items of a spill file written by :class:`MongoPipeline`.

    Upserts keyed items as the pipeline would (keeping the earliest
    ``first_seen``) and inserts the others. Returns the number of items
    stored; the file is left in place.

    :raises pymongo.errors.PyMongoError: MongoDB refused or is unreachable.
    """
    client: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    db = client[database]
    ops: dict[str, list[Any]] = {}
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json_util.loads(line)
            doc, key = row["doc"], row["key"]
            if key:
                op: Any = UpdateOne(
                    {k: doc.get(k) for k in key},
                    {"$set": {**doc, "last_seen": row["last_seen"]},
                     "$min": {"first_seen": row["first_seen"]}},
                    upsert=True,
                )
                db[row["collection"]].create_index([(k, ASCENDING) for k in key], unique=True)
            else:
                op = InsertOne(doc)
            ops.setdefault(row["collection"], []).append(op)
    stored = 0
    try:
        for name, batch in ops.items():
            for i in range(0, len(batch), 1000):
                db[name].bulk_write(batch[i : i + 1000], ordered=False)
                stored += len(batch[i : i + 1000])
    finally:
        client.close()
    return stored
