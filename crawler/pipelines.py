"""Item pipelines: batched writes into MongoDB, stored before acknowledged.

Delivery is at least once: a response can be processed twice (its worker
was killed after storing the items and before acknowledging the lease), and
storage stays exactly once. An item with a natural key is stored by that
key; an item without one is stored by an ``_id`` derived from the response
that yielded it (:class:`crawler.middlewares.ItemIdMiddleware` derives it
with :func:`derive_item_id` and hands it over through :class:`ItemIds`).
Either way a second delivery updates the same document. Times never go
backwards: ``last_seen`` only grows, ``first_seen`` only falls, and a
version of a document older than the stored one never overwrites its fields
(the pipeline's writes and ``scrapy loadspill`` alike).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from weakref import WeakKeyDictionary

from bson import ObjectId, json_util
from bson.errors import InvalidDocument
from itemadapter import ItemAdapter
from pymongo import ASCENDING, InsertOne, MongoClient, UpdateOne
from pymongo.errors import (
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
)
from scrapy.exceptions import NotConfigured

from crawler.config import (
    FrontierConfig,
    close_at_open,
    masked_url,
    scrub,
    secrets_of,
    stop_on_config_error,
)
from crawler.frontier.clock import CLOCK
from crawler.storage import (
    ADDED_STAT_PREFIX,
    SOURCE_FIELD,
    ItemIds,
    ItemSources,
    collection_of,
    derive_item_id,
    register_store,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Self

    from pymongo.collection import Collection
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = [
    "ADDED_STAT_PREFIX",
    "SOURCE_FIELD",
    "ItemIds",
    "ItemSources",
    "MongoPipeline",
    "SpillLoad",
    "as_document",
    "collection_of",
    "derive_item_id",
    "load_spill",
    "mongo_config_error",
]

#: The settings' defaults (:data:`crawler.config.SETTINGS`), for the
#: constructor's keyword arguments.
_DEFAULTS = FrontierConfig()
#: MongoDB's error code for a unique index violation.
DUPLICATE_KEY = 11000
#: The key an item without a natural key is stored by.
ID_KEY: tuple[str, ...] = ("_id",)
#: Longest pause, in seconds, between two attempts to reach MongoDB.
BACKOFF_CAP = 30.0
#: Pause between write attempts once the engine is stopping (seconds).
STOP_RETRY = 1.0
#: MongoDB error codes that say the configuration is wrong, not the server
#: down: AuthenticationFailed, Unauthorized, MechanismUnavailable.
AUTHENTICATION_FAILED, UNAUTHORIZED, MECHANISM_UNAVAILABLE = 18, 13, 334
#: A server's refusal quoted in a ``ServerSelectionTimeoutError``'s text.
_REFUSAL_IN_TEXT = re.compile(r"'code': (18|13|334), 'codeName': '\w+'")
#: Seconds the pipeline waits, when it opens, for MongoDB to answer its
#: check of the credentials; past that (MongoDB down or slow) the crawl
#: starts, and the first write finds out.
OPEN_CHECK_WAIT = 3.0

#: Seconds :meth:`MongoPipeline.touch` keeps its list of the collections
#: that have an index on :data:`SOURCE_FIELD`.
SOURCE_COLLECTIONS_TTL = 60.0
#: Fields of a stored document a 304 raises to its time as it raises
#: ``last_seen``, when the document has them (an item's fetch time).
FETCH_TIME_FIELDS = ("fetched_at",)

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


def mongo_config_error(exc: BaseException, database: str = "") -> str | None:
    """What a pymongo error says is wrong with the configuration, or None.

    Configuration errors, which no retry fixes: pymongo's
    ``ConfigurationError`` (an option, auth mechanism or ``authSource`` it
    refuses, a password missing), and ``OperationFailure`` codes 18
    (AuthenticationFailed: wrong user or password, or the wrong
    ``authSource``), 13 (Unauthorized: the user may not read or write
    ``database``) and 334 (MechanismUnavailable). Anything else (the server
    down, a timeout, a rejected document) is not.

    :returns: one line naming the cause and what to check, or None.
    """
    if isinstance(exc, ConfigurationError):
        return f"pymongo refuses the configuration ({exc}): check MONGO_URI"
    code: int | None = None
    if isinstance(exc, OperationFailure):
        details = exc.details if isinstance(exc.details, dict) else {}
        code, text = exc.code, str(details.get("errmsg") or exc)
    elif isinstance(exc, ConnectionFailure) and (found := _REFUSAL_IN_TEXT.search(str(exc))):
        # Once a login failed, pymongo marks the server unknown and the
        # next calls time out selecting it, quoting the refusal.
        code, text = int(found.group(1)), found.group(0)
    if code in (AUTHENTICATION_FAILED, MECHANISM_UNAVAILABLE):
        return (f"authentication failed ({text}): check the user name, password, "
                "authSource and authMechanism in MONGO_URI")
    if code == UNAUTHORIZED:
        where = f" {database!r}" if database else ""
        return (f"not authorized ({text}): the user of MONGO_URI needs the readWrite "
                f"role on the database{where} (MONGO_DATABASE)")
    return None


def _not_newer(last: datetime) -> dict[str, Any]:
    """Filter: the stored document is not newer than ``last`` (or has no ``last_seen``)."""
    return {"$or": [{"last_seen": {"$lte": last}}, {"last_seen": {"$exists": False}}]}


def upsert_op(
    key: tuple[str, ...], doc: Mapping[str, Any], first: datetime, last: datetime,
    *, upsert: bool = True,
) -> UpdateOne:
    """The write of ``doc`` by ``key`` that never takes time backwards.

    It matches the stored document by ``key`` only if that one is not newer
    (its ``last_seen <= last``); then it sets ``doc``'s fields, raises
    ``last_seen`` to ``last`` (``$max``) and lowers ``first_seen`` to ``first``
    (``$min``). With no document of that key, it inserts one (``upsert``).
    When the stored document is newer, the upsert's insert collides with it
    on the unique index (error 11000): :func:`settle_ops` is then the write.

    :param key: the natural key's fields, or ``("_id",)``.
    :param doc: the fields (``first_seen``/``last_seen`` in it are ignored).
    """
    fields = {k: v for k, v in doc.items() if k not in ("_id", "first_seen", "last_seen")}
    update: dict[str, Any] = {"$max": {"last_seen": last}, "$min": {"first_seen": first}}
    if fields:
        update["$set"] = fields
    if "_id" in doc and key != ID_KEY:
        update["$setOnInsert"] = {"_id": doc["_id"]}
    match = {k: doc.get(k) for k in key}
    return UpdateOne({**match, **_not_newer(last)}, update, upsert=upsert)


def settle_ops(
    key: tuple[str, ...], doc: Mapping[str, Any], first: datetime, last: datetime
) -> tuple[UpdateOne, UpdateOne]:
    """The writes of ``doc`` once its key is known to be stored.

    The first is :func:`upsert_op` without the insert: it applies when the
    stored document is not newer (another worker inserted the key a moment
    ago). The second lowers the stored ``first_seen`` to ``first``, and is all
    that applies when the stored document is newer: its fields and
    ``last_seen`` stay.
    """
    match = {k: doc.get(k) for k in key}
    return (
        upsert_op(key, doc, first, last, upsert=False),
        UpdateOne(match, {"$min": {"first_seen": first}}),
    )


@dataclass
class _Pending:
    """One document waiting for a bulk write.

    The latest fields of one key in the open batch (``first`` is when the
    key was first seen in it, ``last`` the latest). ``key`` is the item's
    natural key, or ``("_id",)`` for an item without one (``keyless``), whose
    ``doc`` then starts with its ``_id``: its own, the one derived from its
    response, or one minted here. Writing it again is therefore harmless.
    """

    collection: str
    ident: str
    doc: dict[str, Any]
    key: tuple[str, ...]
    first: datetime
    last: datetime
    keyless: bool = False
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def insert(self) -> InsertOne[dict[str, Any]]:
        """The insert of a new document, ``first_seen`` and ``last_seen`` included."""
        return InsertOne({**self.doc, "first_seen": self.first, "last_seen": self.last})

    def upsert(self) -> UpdateOne:
        """The upsert by key that never takes time backwards (:func:`upsert_op`)."""
        return upsert_op(self.key, self.doc, self.first, self.last)

    def settle(self) -> tuple[UpdateOne, UpdateOne]:
        """The writes once the key is known to be stored (:func:`settle_ops`)."""
        return settle_ops(self.key, self.doc, self.first, self.last)


class MongoPipeline:
    """Store items in MongoDB with batched bulk writes: an item store
    (:class:`crawler.storage.ItemStore`, registered for its crawler).

    An item class names its collection and natural key with the class
    attributes ``collection`` (str) and ``key`` (tuple of field names), as
    :mod:`crawler.items` does. Each collection gets a unique index on its key,
    so a key is stored once: a new key is inserted with ``first_seen`` and
    ``last_seen`` (UTC datetimes); a key already stored gets its fields set,
    ``last_seen`` raised and ``first_seen`` lowered (``$max``, ``$min``), unless
    the stored document is newer (a ``last_seen`` later than this item's,
    written by another worker or an earlier load of a spill file): its fields
    and ``last_seen`` then stay, and only an earlier ``first_seen`` is kept
    (stat ``mongo/stale``). Crawling a site twice therefore never duplicates
    a document, and time never goes backwards.

    Items with no key (plain dicts, or classes without ``key``) go to their
    class's ``collection``, else the collection named after the spider, and
    are stored by ``_id``: their own ``_id`` field when they have one, else
    the id that :class:`~crawler.middlewares.ItemIdMiddleware` derived from
    the response that yielded them (:func:`derive_item_id`; stat
    ``mongo/ids/derived``), else a fresh ObjectId (stat ``mongo/ids/minted``;
    a warning is logged once). A response processed twice (at-least-once
    delivery) thus stores its items without a key once: the second delivery
    updates them as it would a stored key.

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
    upsert (another worker inserted the key a moment ago, or the stored
    document is newer) is settled with :func:`settle_ops`.

    ``process_item`` returns only once the item is stored (or set aside, see
    below), so Scrapy's engine finishes a request, and the frontier
    acknowledges its lease, only after its items are safe: a worker killed
    before a flush loses nothing, its request is crawled again.

    * **Configuration error** (:func:`mongo_config_error`: credentials
      refused, a user not allowed to write the database, an option pymongo
      refuses): not an outage. When the pipeline opens, it asks MongoDB
      (``ping``, which logs in) and, on such an error, logs it in one line
      (password masked) and stops the crawl before it starts
      (``CloseSpider("config_error")``); met later (a password rotated, a
      role revoked), it is logged once, everything waiting is spilled to the
      spill file (below) instead of waiting for ever, every later item goes
      there too, and the crawl is stopped
      (:func:`crawler.config.stop_on_config_error`).
    * **Outage** (or any other error): the batch
      is kept and retried with doubling pauses (up to 30 s; stat
      ``mongo/retries``); writing it again is harmless. Once more than
      ``MONGO_SPILL_AFTER`` documents wait, they are appended to a JSON-lines
      file in ``MONGO_SPILL_DIR`` (stat ``mongo/spilled``), from which
      ``scrapy loadspill FILE`` stores them later. Once the engine is
      stopping (a graceful stop), writes are tried every ``STOP_RETRY``
      (1 s) and a failed one spills everything waiting at once, so that a
      stop during an outage ends (within about 15 s: a write attempt runs
      into pymongo's 5 s server selection timeout).
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
    created, by insert or upsert), ``mongo/inserted`` (documents of items
    without a key created), ``mongo/modified`` (stored documents changed),
    ``mongo/stale`` (items older than their stored document: fields not
    written), ``mongo/ids/derived``, ``mongo/ids/minted`` (see above),
    ``mongo/retries``, ``mongo/spilled``, ``mongo/dead``.
    """

    def __init__(
        self,
        crawler: Crawler,
        uri: str,
        database: str,
        *,
        batch_size: int = _DEFAULTS.mongo_batch_size,
        flush_interval: float = _DEFAULTS.mongo_flush_interval,
        spill_after: int = _DEFAULTS.mongo_spill_after,
        spill_dir: str = _DEFAULTS.mongo_spill_dir,
        dead_collection: str = _DEFAULTS.mongo_dead_collection,
    ) -> None:
        self.crawler = crawler
        self.uri = uri
        self.database = database
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.spill_after = spill_after
        self.spill_dir = Path(spill_dir)
        self.dead_collection = dead_collection
        self._source_cache: tuple[float, list[str]] | None = None
        self.client: MongoClient[dict[str, Any]] | None = None
        #: The open batch, by (collection, natural key or _id as JSON).
        self._open: dict[tuple[str, str], _Pending] = {}
        #: Full batches waiting to be written, oldest first.
        self._sealed: deque[list[_Pending]] = deque()
        #: Ids derived by ItemIdMiddleware, taken by process_item.
        self._ids = ItemIds.of(crawler)
        #: Sources of items (revisits on), taken by process_item.
        self._sources = ItemSources.of(crawler)
        self._revisits = FrontierConfig.of(crawler).revisit_after > 0
        MongoPipeline._by_crawler[crawler] = self
        register_store(crawler, self)
        self._warned_minted = False
        self._indexed: set[tuple[str, tuple[str, ...]]] = set()
        #: Collections whose last batch was mostly keys stored already.
        self._upsert_first: set[str] = set()
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[bool] | None = None
        self._backoff = 0.0
        self._spider_name = ""
        #: The configuration error that stopped this pipeline's writes.
        self._config_error: str | None = None

    _by_crawler: ClassVar[WeakKeyDictionary[Crawler, MongoPipeline]] = WeakKeyDictionary()
    #: What the store is, in messages (:class:`crawler.storage.ItemStore`).
    name: ClassVar[str] = "MongoDB"
    #: What :meth:`touch` raises when MongoDB failed.
    errors: ClassVar[tuple[type[BaseException], ...]] = (PyMongoError, RuntimeError)

    @classmethod
    def of(cls, crawler: Crawler) -> MongoPipeline | None:
        """The crawler's pipeline, once built (None when it is not enabled)."""
        return cls._by_crawler.get(crawler)

    def touch(self, source: str, when: datetime) -> int:
        """Record that the response of request ``source`` is unchanged at
        ``when``: the documents it yielded (:data:`SOURCE_FIELD` equal to
        ``<spider>:source``, in the collections of ``MONGO_DATABASE`` that
        have an index on it) get ``last_seen`` and their :data:`FETCH_TIME_FIELDS` raised to
        ``when`` (``$max``: never backwards). Blocking: call it in a thread.

        :param source: the request's fingerprint, hex.
        :param when: UTC datetime.
        :returns: documents changed.
        :raises pymongo.errors.PyMongoError: MongoDB failed (nothing or part
            was written; writing again is harmless).
        :raises RuntimeError: the pipeline is not open.
        """
        if self.client is None:
            raise RuntimeError("MongoPipeline.touch before the pipeline opened")
        db = self.client[self.database]
        source = f"{self._spider_name}:{source}"
        changed = 0
        for name in self._source_collections(db):
            coll = db[name]
            changed += coll.update_many(
                {SOURCE_FIELD: source}, {"$max": {"last_seen": when}}
            ).modified_count
            for fetched in FETCH_TIME_FIELDS:
                coll.update_many(
                    {SOURCE_FIELD: source, fetched: {"$exists": True}},
                    {"$max": {fetched: when}},
                )
        return changed

    def _source_collections(self, db: Any) -> list[str]:
        """The collections with an index on :data:`SOURCE_FIELD` (those items
        were stored in with revisits on), listed again at most every
        :data:`SOURCE_COLLECTIONS_TTL` seconds: a 304 never scans a
        collection without that index."""
        now = time.monotonic()
        cached = self._source_cache
        if cached is not None and now - cached[0] < SOURCE_COLLECTIONS_TTL:
            return cached[1]
        names = [
            name for name in db.list_collection_names()
            if name != self.dead_collection and not name.startswith("system.")
            and any(
                list(index.get("key", {})) == [SOURCE_FIELD]
                for index in db[name].list_indexes()
            )
        ]
        self._source_cache = (now, names)
        return names

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Read the ``MONGO_*`` settings; no connection is made here."""
        config = FrontierConfig.of(crawler)
        uri = config.mongo_uri
        if not uri:
            raise NotConfigured(
                "MONGO_URI is not set: items are not stored in MongoDB; set MONGO_URI (or "
                "list crawler.addon.MongoAddon, which defaults it), or remove the pipeline"
            )
        return cls(
            crawler,
            uri,
            config.mongo_database,
            batch_size=config.mongo_batch_size,
            flush_interval=config.mongo_flush_interval,
            spill_after=config.mongo_spill_after,
            spill_dir=config.mongo_spill_dir,
            dead_collection=config.mongo_dead_collection,
        )

    async def open_spider(self) -> None:
        """Create the client, check the configuration, start the timer.

        The check is a ``ping`` of ``MONGO_DATABASE``, which logs in with
        the credentials of ``MONGO_URI``; it is waited for up to
        :data:`OPEN_CHECK_WAIT` seconds (a MongoDB that is down does not
        hold the crawl up: the first write finds out).

        :raises CloseSpider: ``config_error``, when pymongo refuses the URI
            or MongoDB the credentials (:func:`mongo_config_error`); the
            error is logged in one line first.
        """
        assert self.crawler.spider is not None
        self._spider_name = self.crawler.spider.name
        try:
            self.client = MongoClient(
                self.uri, tz_aware=True, connect=False, serverSelectionTimeoutMS=5000
            )
        except (ConfigurationError, ValueError, TypeError) as exc:
            refused = mongo_config_error(exc) or f"pymongo refuses MONGO_URI ({exc})"
            raise close_at_open(self.crawler, self._config_message(refused)) from None
        check = asyncio.ensure_future(asyncio.to_thread(self._check_access))
        done, _ = await asyncio.wait({check}, timeout=OPEN_CHECK_WAIT)
        error = check.exception() if done else None
        if not done:  # MongoDB down or slow: its answer is not waited for
            check.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        cause = mongo_config_error(error, self.database) if error is not None else None
        if cause is not None:
            self.client.close()
            raise close_at_open(self.crawler, self._config_message(cause))
        self._timer = asyncio.ensure_future(self._flush_periodically())

    def _check_access(self) -> None:
        """Log in and ping ``MONGO_DATABASE``, then measure this process's
        clock offset to MongoDB's (:meth:`Clock.measure_mongo`; in a worker
        thread)."""
        assert self.client is not None
        self.client[self.database].command("ping")
        try:
            CLOCK.measure_mongo(self.client)
        except KeyError:  # a server without hello.localTime: Redis's clock serves
            pass

    def _config_message(self, cause: str) -> str:
        """The one log line of a MongoDB configuration error (password masked)."""
        message = f"MongoDB at {masked_url(self.uri)}: {cause}; this is no outage: stopping"
        return scrub(message, secrets_of(self.uri))

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
        """Queue ``item`` for the next bulk write and return once it is stored.

        It is stamped (``first_seen``/``last_seen``) by the corrected clock
        (:data:`~crawler.frontier.clock.CLOCK`), so that workers with skewed
        clocks order their writes by the servers' clock; a
        :data:`FETCH_TIME_FIELDS` datetime later than that is lowered to it.
        """
        now = CLOCK.utcnow()
        derived = self._ids.pop(item)
        source = self._sources.pop(item) if self._revisits else None
        doc = as_document(item)
        for fetched in FETCH_TIME_FIELDS:  # a time in the future is never stored
            when = doc.get(fetched)
            if isinstance(when, datetime) and when.tzinfo is not None and when > now:
                doc[fetched] = now
        if source is not None:
            doc[SOURCE_FIELD] = f"{self._spider_name}:{source}"  # one spider's pages only
        key: tuple[str, ...] = tuple(getattr(item, "key", ()))
        collection = collection_of(item, self._spider_name)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if key:
            ident = json.dumps([doc.get(k) for k in key], default=str)
        else:
            key, doc = ID_KEY, {"_id": self._id_for(doc, derived), **doc}
            ident = json_util.dumps(doc["_id"])  # an ObjectId is not its hex string
        pending = self._open.get((collection, ident))
        if pending is None:
            pending = _Pending(collection, ident, doc, key, now, now, keyless=key == ID_KEY)
            self._open[(collection, ident)] = pending
        else:
            pending.doc, pending.last = doc, now
        pending.waiters.append(done)
        if len(self._open) >= self.batch_size:
            self._seal()
            if not self._backoff and (self._flusher is None or self._flusher.done()):
                self._flusher = asyncio.ensure_future(self.flush(everything=False))
        await done
        return item

    def _id_for(self, doc: dict[str, Any], derived: str | None) -> Any:
        """The ``_id`` of an item without a key: its own (taken out of
        ``doc``), the derived one, or a new ObjectId."""
        own = doc.pop("_id", None)
        if own is not None:
            return own
        if derived is not None:
            self.crawler.stats.inc_value("mongo/ids/derived")
            return derived
        self.crawler.stats.inc_value("mongo/ids/minted")
        if not self._warned_minted:
            self._warned_minted = True
            logger.warning(
                "An item without a key reached %s with no id derived from its response "
                "(ItemIdMiddleware off, the item yielded by start() or replaced by an "
                "earlier pipeline): it gets a new ObjectId, and a redelivery of its "
                "response would store it again (stat mongo/ids/minted)",
                type(self).__name__,
            )
        return ObjectId()

    def _seal(self) -> None:
        """Close the open batch: it is written after those sealed before it."""
        if self._open:
            self._sealed.append(list(self._open.values()))
            self._open = {}

    def _count(self) -> int:
        return len(self._open) + sum(map(len, self._sealed))

    def _stopping(self) -> bool:
        """The engine is stopping (a graceful stop, or the crawl ending)."""
        engine = getattr(self.crawler, "engine", None)
        return engine is not None and not getattr(engine, "running", True)

    async def _flush_periodically(self) -> None:
        while True:
            pause = self._backoff or self.flush_interval
            if self._backoff and self._stopping():
                pause = min(pause, STOP_RETRY)
            await asyncio.sleep(pause)
            if self._flusher is not None and not self._flusher.done():
                continue  # a write is under way; the open batch may still fill up
            # A task of its own, so that cancelling the timer (at close) never
            # interrupts a write under way.
            self._flusher = asyncio.ensure_future(self.flush())
            if not await asyncio.shield(self._flusher) and (
                self._count() > self.spill_after or self._stopping()
            ):
                # A stop waits for the items in flight: during an outage it
                # would wait for ever. They go to the spill file instead.
                await self._spill()

    async def flush(self, *, everything: bool = True) -> bool:
        """Write the sealed batches in order, and first seal the open one
        unless ``everything`` is False; return False if MongoDB could not be
        written (the batches are kept for the next attempt). After a
        configuration error everything waiting is spilled instead (and True
        returned: nothing waits any more)."""
        async with self._lock:
            if everything:
                self._seal()
            if self._config_error is not None:
                self._seal()
                self._spill_all()  # this worker writes no more to MongoDB
                return True
            while self._sealed:
                batch = self._sealed[0]
                try:
                    await asyncio.to_thread(self._write, batch)
                except Exception as exc:
                    cause = mongo_config_error(exc, self.database)
                    if cause is not None:
                        # Not an outage: no retry fixes it. Spill what waits
                        # (nothing is lost: scrapy loadspill stores it once
                        # the configuration is fixed) and stop the crawl.
                        self._config_error = cause
                        stop_on_config_error(self.crawler, self._config_message(cause))
                        self._seal()
                        self._spill_all()
                        return True
                    # Writing the batch again is harmless (see _write): an
                    # error that is not MongoDB's, a bug, is retried too,
                    # and the batch spilled in the end, rather than the
                    # items waiting for ever.
                    self._backoff = min(BACKOFF_CAP, max(0.5, self._backoff * 2))
                    log = logger.warning if isinstance(exc, ConnectionFailure) else logger.error
                    log(
                        "MongoDB unreachable or failing (%r); %d documents wait, retrying in %.1fs "
                        "(check MONGO_URI and that MongoDB runs if this goes on)",
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
        (and ``_id`` s of items without a key) stored already are updated to
        the same values.

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
            for key in {p.key for p in entries if p.key != ID_KEY}:
                if (name, key) not in self._indexed:
                    coll.create_index([(k, ASCENDING) for k in key], unique=True)
                    self._indexed.add((name, key))
            if self._revisits and (name, (SOURCE_FIELD,)) not in self._indexed:
                coll.create_index([(SOURCE_FIELD, ASCENDING)])  # touch() finds by it
                self._indexed.add((name, (SOURCE_FIELD,)))
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
        """Insert-first, then upsert the keys found stored already, then
        settle the upserts that collided with a stored document.

        :raises InvalidDocument: a document BSON cannot carry (a set, a
            Decimal, a key that is not a string; ``OverflowError`` for an int
            over 64 bits, ``UnicodeEncodeError`` for a lone surrogate); nothing
            tells which, and some others may be stored by then.
        """
        name = coll.name
        upsert_first = name in self._upsert_first
        updates = list(entries) if upsert_first else []
        if not upsert_first:
            existing = 0
            failed, _ = self._bulk(coll, [p.insert() for p in entries], entries)
            for pending, error in failed:
                if error.get("code") == DUPLICATE_KEY:
                    updates.append(pending)  # stored already: an update
                    existing += 1
                else:
                    self._dead(coll, pending, f"{error.get('code')}: {error.get('errmsg')}")
            if existing * 2 > len(entries):
                self._upsert_first.add(name)
        if not updates:
            return
        failed, details = self._bulk(coll, [p.upsert() for p in updates], updates)
        if upsert_first and len(details.get("upserted", ())) * 2 > len(updates):
            self._upsert_first.discard(name)
        collided = []
        for pending, error in failed:
            if error.get("code") == DUPLICATE_KEY:
                collided.append(pending)  # inserted a moment ago, or newer
            else:
                self._dead(coll, pending, f"{error.get('code')}: {error.get('errmsg')}")
        if collided:
            self._settle(coll, collided)

    def _settle(self, coll: Collection[dict[str, Any]], entries: list[_Pending]) -> None:
        """Write ``entries``, whose keys are stored, with :func:`settle_ops`:
        an update where the stored document is not newer, else only an
        earlier ``first_seen`` (stat ``mongo/stale``)."""
        pairs = [p.settle() for p in entries]
        failed, details = self._bulk(coll, [update for update, _ in pairs], entries)
        failed += self._bulk(coll, [lower for _, lower in pairs], entries)[0]
        self.crawler.stats.inc_value("mongo/stale", len(entries) - details.get("nMatched", 0))
        for pending, error in {id(p): (p, e) for p, e in failed}.values():
            self._dead(coll, pending, f"{error.get('code')}: {error.get('errmsg')}")

    def _bulk(
        self, coll: Collection[dict[str, Any]], ops: list[Any], entries: list[_Pending]
    ) -> tuple[list[tuple[_Pending, dict[str, Any]]], Mapping[str, Any]]:
        """One unordered ``bulk_write`` of ``ops`` (all inserts or all updates,
        one per entry); count it. Return the entries refused, each with its
        write error, and MongoDB's result (``nMatched``, ``upserted``, ...)."""
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
            created = [p for i, p in enumerate(entries) if i not in refused]
        else:
            created = [entries[u["index"]] for u in details.get("upserted", ())]
            stats.inc_value("mongo/modified", details.get("nModified", 0))
        stats.inc_value("mongo/upserted", sum(1 for p in created if not p.keyless))
        stats.inc_value("mongo/inserted", sum(1 for p in created if p.keyless))
        if created:  # (the status's documents per spider and collection)
            stats.inc_value(f"{ADDED_STAT_PREFIX}{coll.name}", len(created))
        return [(entries[error["index"]], error) for error in errors], details

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
            "time": CLOCK.utcnow(),
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

        One row per document, in MongoDB extended JSON: ``{"collection",
        "key" (field names; ``["_id"]`` for an item without a key), "doc",
        "first_seen", "last_seen"}``. Documents of one key in several batches
        become one row (latest fields, earliest ``first_seen``), so that
        loading the file stores the latest.
        """
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        waiters: list[asyncio.Future[None]] = []
        while self._sealed:
            for p in self._sealed.popleft():
                waiters += p.waiters
                known = rows.get((p.collection, p.ident))
                if known is None:
                    rows[(p.collection, p.ident)] = {
                        "collection": p.collection, "key": list(p.key), "doc": p.doc,
                        "first_seen": p.first, "last_seen": p.last,
                    }
                else:
                    known.update(
                        doc=p.doc,
                        first_seen=min(known["first_seen"], p.first),
                        last_seen=max(known["last_seen"], p.last),
                    )
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
        logger.warning(
            "MongoDB unreachable: spilled %d documents to %s (once MongoDB is back: "
            "scrapy loadspill %s)", spilled, path, path,
        )
        for done in waiters:
            if not done.done():
                done.set_result(None)


@dataclass(frozen=True)
class SpillLoad:
    """What :func:`load_spill` did with a file's rows.

    :ivar stored: rows now stored: inserted, or written over a document not
        newer than them.
    :ivar stale: rows older than their stored document (a later crawl
        stored it meanwhile): its fields and ``last_seen`` stay, and only an
        earlier ``first_seen`` was kept.
    """

    stored: int
    stale: int

    @property
    def rows(self) -> int:
        """Every row of the file (``stored + stale``)."""
        return self.stored + self.stale


def _spill_row(line: str) -> tuple[str, tuple[str, ...], dict[str, Any], datetime, datetime]:
    """``(collection, key, doc, first_seen, last_seen)`` of one spill file line.

    Rows of an item without a key written before ``_id`` became their key
    (``"key": []``, both times inside ``doc``) are read as ``["_id"]`` rows.
    """
    row = json_util.loads(line, json_options=json_util.JSONOptions(tz_aware=True))
    doc: dict[str, Any] = row["doc"]
    key = tuple(row["key"]) or ID_KEY
    if "first_seen" in row:
        first, last = row["first_seen"], row.get("last_seen")
    else:
        first, last = doc.pop("first_seen", None), doc.pop("last_seen", None)
    if first is None or last is None:
        raise ValueError(f"spill row without first_seen/last_seen: {line[:200]!r}")
    return row["collection"], key, doc, first, last


def load_spill(path: str | Path, uri: str, database: str) -> SpillLoad:
    """Store the items of a spill file written by :class:`MongoPipeline`.

    Each row is written as the pipeline writes a document stored already
    (:func:`upsert_op`, then :func:`settle_ops` where it collides), so time
    never goes backwards: a row older than its stored document (its
    ``last_seen`` earlier: a later crawl stored it meanwhile) never
    overwrites that document's fields or ``last_seen``, and only lowers its
    ``first_seen``; a row not older updates it, and a row whose key is not
    stored is inserted. Items without a key are stored by the ``_id`` the
    pipeline gave them. Loading a file twice therefore stores nothing twice.
    The file is left in place.

    :raises pymongo.errors.PyMongoError: MongoDB refused a row (other than
        by its key being stored) or is unreachable; loading the file again
        is harmless.
    :raises ValueError, KeyError: a line that is not a spill row.
    """
    client: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    db = client[database]
    rows: dict[str, list[tuple[tuple[str, ...], dict[str, Any], datetime, datetime]]] = {}
    indexed: set[tuple[str, tuple[str, ...]]] = set()
    stored = stale = 0
    try:
        with Path(path).open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    name, key, doc, first, last = _spill_row(line)
                    rows.setdefault(name, []).append((key, doc, first, last))
                    if key != ID_KEY and (name, key) not in indexed:
                        db[name].create_index([(k, ASCENDING) for k in key], unique=True)
                        indexed.add((name, key))
        for name, batch in rows.items():
            for i in range(0, len(batch), 1000):
                chunk = batch[i : i + 1000]
                collided = _load_chunk(db[name], chunk)
                stored += len(chunk) - len(collided)
                if collided:
                    settled = _settle_chunk(db[name], collided)
                    stored += settled
                    stale += len(collided) - settled
    finally:
        client.close()
    return SpillLoad(stored, stale)


_SpillRow = tuple[tuple[str, ...], dict[str, Any], datetime, datetime]


def _load_chunk(coll: Collection[dict[str, Any]], chunk: list[_SpillRow]) -> list[_SpillRow]:
    """Upsert ``chunk``; return the rows that collided with a stored document.

    :raises BulkWriteError: MongoDB refused a row for another reason.
    """
    try:
        coll.bulk_write([upsert_op(*row) for row in chunk], ordered=False)
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if any(error.get("code") != DUPLICATE_KEY for error in errors):
            raise
        return [chunk[error["index"]] for error in errors]
    return []


def _settle_chunk(coll: Collection[dict[str, Any]], chunk: list[_SpillRow]) -> int:
    """Write rows whose key is stored (:func:`settle_ops`); return how many
    updated their document (the others were older: ``first_seen`` only)."""
    pairs = [settle_ops(*row) for row in chunk]
    matched: int = coll.bulk_write([update for update, _ in pairs], ordered=False).matched_count
    coll.bulk_write([lower for _, lower in pairs], ordered=False)
    return matched
