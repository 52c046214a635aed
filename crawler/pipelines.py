"""Item pipelines: batched upserts into MongoDB."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from pymongo import ASCENDING, InsertOne, MongoClient, UpdateOne
from pymongo.errors import BulkWriteError, ConnectionFailure, PyMongoError
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from typing import Self

    from pymongo.collection import Collection
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = ["MongoPipeline"]

#: MongoDB's error code for a unique index violation.
DUPLICATE_KEY = 11000
#: Attempts, with doubling pauses from 0.5 s, to write what is left at close.
CLOSE_ATTEMPTS = 6


@dataclass
class _Pending:
    """One document waiting for the next bulk write."""

    doc: dict[str, Any]
    key: tuple[str, ...]
    first: datetime
    last: datetime


class MongoPipeline:
    """Store items in MongoDB with batched upserts.

    An item class names its collection and natural key with the class
    attributes ``collection`` (str) and ``key`` (tuple of field names), as
    :mod:`crawler.items` does. Each collection gets a unique index on its key,
    and each item becomes one ``UpdateOne(..., upsert=True)`` that sets the
    item's fields and ``last_seen`` and, on insert only, ``first_seen`` (UTC
    datetimes). Crawling a site twice therefore never duplicates a document.
    Items with no key (plain dicts) are inserted into the collection named
    after the spider.

    Writes go out as unordered ``bulk_write`` calls, one per collection, when
    ``MONGO_BATCH_SIZE`` items are waiting or every ``MONGO_FLUSH_INTERVAL``
    seconds, in a thread so the crawl is not blocked; items with the same key
    in one batch are merged into one write. Pending writes are flushed when
    the spider closes.

    Settings: ``MONGO_URI`` (NotConfigured when empty), ``MONGO_DATABASE``,
    ``MONGO_BATCH_SIZE`` (default 500), ``MONGO_FLUSH_INTERVAL`` (seconds,
    default 1.0).

    Stats: ``mongo/bulk_writes``, ``mongo/upserted``, ``mongo/modified``,
    ``mongo/inserted``, ``mongo/write_errors``, ``mongo/retries``.
    """

    def __init__(
        self,
        crawler: Crawler,
        uri: str,
        database: str,
        batch_size: int = 500,
        flush_interval: float = 1.0,
    ) -> None:
        self.crawler = crawler
        self.uri = uri
        self.database = database
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.client: MongoClient[dict[str, Any]] | None = None
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._inserts: dict[str, list[dict[str, Any]]] = {}
        self._indexed: set[str] = set()
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None

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
            flush_interval=settings.getfloat("MONGO_FLUSH_INTERVAL", 1.0),
        )

    async def open_spider(self) -> None:
        """Create the client (it connects in the background) and the timer."""
        assert self.crawler.spider is not None
        self._spider_name: str = self.crawler.spider.name
        self.client = MongoClient(self.uri, tz_aware=True, connect=False)
        self._timer = asyncio.ensure_future(self._flush_periodically())

    async def close_spider(self) -> None:
        """Flush what is pending, retrying through a short outage, then close."""
        if self._timer is not None:
            self._timer.cancel()
        delay = 0.5
        for attempt in range(CLOSE_ATTEMPTS):
            if await self.flush():
                break
            if attempt + 1 < CLOSE_ATTEMPTS:
                await asyncio.sleep(delay)
                delay *= 2
        else:
            logger.error(
                "MongoDB unreachable at close: %d items not stored",
                len(self._pending) + sum(map(len, self._inserts.values())),
            )
        if self.client is not None:
            self.client.close()

    async def process_item(self, item: Any) -> Any:
        """Queue ``item`` for the next bulk write; flush when the batch is full."""
        adapter = ItemAdapter(item)
        now = datetime.now(UTC)
        doc = adapter.asdict()
        key: tuple[str, ...] = tuple(getattr(item, "key", ()))
        collection = getattr(item, "collection", None) or self._spider_name
        if key:
            ident = json.dumps([doc.get(k) for k in key], default=str)
            known = self._pending.get((collection, ident))
            first = known.first if known else now
            self._pending[(collection, ident)] = _Pending(doc, key, first, now)
        else:
            self._inserts.setdefault(collection, []).append(
                {**doc, "first_seen": now, "last_seen": now}
            )
        if self._count() >= self.batch_size:
            await self.flush()
        return item

    def _count(self) -> int:
        return len(self._pending) + sum(map(len, self._inserts.values()))

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush()

    async def flush(self) -> bool:
        """Write everything pending; return False if MongoDB was unreachable.

        On a connection failure the batch is kept and tried again at the next
        flush (``mongo/retries``). Write errors other than a duplicate key
        (which is retried once: two workers upserted the same key at once) are
        logged with the reason and counted in ``mongo/write_errors``.
        """
        async with self._lock:
            if not self._count():
                return True
            pending, self._pending = self._pending, {}
            inserts, self._inserts = self._inserts, {}
            ops: dict[str, list[Any]] = {}
            for (collection, _), p in pending.items():
                ops.setdefault(collection, []).append(
                    UpdateOne(
                        {k: p.doc.get(k) for k in p.key},
                        {
                            "$set": {**p.doc, "last_seen": p.last},
                            "$setOnInsert": {"first_seen": p.first},
                        },
                        upsert=True,
                    )
                )
            for collection, docs in inserts.items():
                ops.setdefault(collection, []).extend(InsertOne(d) for d in docs)
            keys = {c: p.key for (c, _), p in pending.items()}
            try:
                await asyncio.to_thread(self._write, ops, keys)
            except ConnectionFailure as exc:
                logger.warning("MongoDB unreachable, will retry the batch: %s", exc)
                self.crawler.stats.inc_value("mongo/retries")
                for k, p in pending.items():
                    self._pending.setdefault(k, p)
                for c, docs in inserts.items():
                    self._inserts.setdefault(c, []).extend(docs)
                return False
            return True

    def _write(self, ops: dict[str, list[Any]], keys: dict[str, tuple[str, ...]]) -> None:
        """Run the bulk writes (in a worker thread)."""
        assert self.client is not None
        db = self.client[self.database]
        stats = self.crawler.stats
        for name, batch in ops.items():
            coll = db[name]
            if name in keys and name not in self._indexed:
                coll.create_index([(k, ASCENDING) for k in keys[name]], unique=True)
                self._indexed.add(name)
            todo = batch
            for attempt in (1, 2):
                try:
                    result = coll.bulk_write(todo, ordered=False)
                except BulkWriteError as exc:
                    todo = self._failed_ops(coll, todo, exc, retry=attempt == 1)
                    if todo:
                        continue
                    break
                except PyMongoError as exc:
                    if isinstance(exc, ConnectionFailure):
                        raise
                    logger.error("MongoDB rejected a batch for %s: %s", name, exc)
                    stats.inc_value("mongo/write_errors", len(todo))
                    break
                stats.inc_value("mongo/bulk_writes")
                stats.inc_value("mongo/upserted", result.upserted_count)
                stats.inc_value("mongo/modified", result.modified_count)
                stats.inc_value("mongo/inserted", result.inserted_count)
                break

    def _failed_ops(
        self, coll: Collection[dict[str, Any]], batch: list[Any], exc: BulkWriteError,
        *, retry: bool,
    ) -> list[Any]:
        """Count what a partly failed bulk write did; return ops to retry."""
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
            stats.inc_value("mongo/write_errors")
            logger.error(
                "MongoDB rejected a write to %s: %s", coll.name, error.get("errmsg")
            )
        return again
