"""The figures of a running crawl, read from Redis and MongoDB.

Shared by ``scrapy frontier status`` (:mod:`crawler.commands.frontier`) and
the Prometheus exporter (:mod:`crawler.metrics`), so both report the same
numbers. Nothing read from Redis is unpickled: heartbeats and leases are
JSON, stats are integers.

Usage::

    reader = StatusReader.from_settings(get_project_settings())
    status = reader.read()          # ClusterStatus
    status.as_dict()                # the JSON of ``scrapy frontier status --json``
    reader.close()

Settings: ``FRONTIER_WORKER_TIMEOUT`` (seconds since its last heartbeat after
which a worker is no longer live, default 30.0),
``FRONTIER_STATUS_MAX_PRIORITIES`` (how many of the highest priorities
``queued_by_priority`` reports per spider, default 100), ``MONGO_URI``,
``MONGO_DATABASE``, ``REDIS_URL``.

It reads counters and known keys only, never ``SCAN`` or ``KEYS``: a Redis
shared with other applications (a million keys of theirs) answers as fast
as one holding the crawl alone. The spiders are the project's (its spider
loader) or those named; each one's keys (:class:`crawler.keys.CrawlKeys`)
are read in one pipeline. A spider none of whose keys exists is reported
with ``started`` False (``not started`` in the table), not left out: a
name typed on the command line that was never crawled shows as such.
Requests queued per priority come from the hash ``{<spider>}:prio``
(priority -> requests queued at it), which the frontier's scripts keep; a
frontier written by a version without it reports them as unknown (None),
never as zeros.

A server that cannot be read is named in :attr:`ClusterStatus.errors` with
its address (credentials masked, :func:`masked_url`) and the cause; the
figures it holds are then left out, never reported as zeros.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError
from redis.exceptions import RedisClusterException, RedisError

from crawler import items as items_module
from crawler.config import masked_url
from crawler.control import RUNNING, read_state
from crawler.frontier.connection import get_redis, redis_location
from crawler.keys import CrawlKeys

if TYPE_CHECKING:
    from redis import Redis
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

__all__ = [
    "ClusterStatus",
    "SpiderStatus",
    "StatusReader",
    "WorkerStatus",
    "item_collections",
    "mongo_location",
    "prio_key",
]

#: Prefix of the per-collection item counters in ``{<spider>}:stats``.
ITEMS_STAT_PREFIX = "item_scraped_count/"
#: Stat in ``{<spider>}:stats``: dead letters trimmed off ``{<spider>}:dead``
#: past ``FRONTIER_DEAD_LETTERS_MAX`` (:mod:`crawler.frontier.housekeeping`).
DEAD_TRIMMED_STAT = "dead/trimmed"


def prio_key(spider: str) -> str:
    """``{<spider>}:prio``: hash priority -> requests queued at that priority
    (all sites), kept by the frontier's scripts."""
    return f"{{{spider}}}:prio"


def mongo_location(settings: BaseSettings) -> str | None:
    """``MONGO_URI`` masked (:func:`masked_url`), or None when not set."""
    uri = settings.get("MONGO_URI")
    return masked_url(str(uri)) if uri else None


def item_collections() -> list[str]:
    """Names of the collections the item classes of :mod:`crawler.items` fill.

    :returns: sorted names, e.g. ``["authors", "pages", "quotes"]``.
    """
    names = set()
    for _, obj in inspect.getmembers(items_module, inspect.isclass):
        collection = getattr(obj, "collection", None)
        if isinstance(collection, str):
            names.add(collection)
    return sorted(names)


@dataclass
class WorkerStatus:
    """One worker's last heartbeat (see :mod:`crawler.extensions`).

    :ivar id: worker id, ``<host>:<pid>`` unless configured.
    :ivar started: Unix time the worker opened its spider.
    :ivar last_heartbeat: Unix time of its last heartbeat.
    :ivar pages: responses received by this worker.
    :ivar items: items scraped by this worker.
    :ivar pages_per_minute: rate over the last heartbeat interval.
    :ivar live: last heartbeat less than ``FRONTIER_WORKER_TIMEOUT`` ago.
    :ivar age: seconds since the last heartbeat.
    """

    id: str
    pid: int | None = None
    host: str = ""
    job: str | None = None
    started: float | None = None
    last_heartbeat: float = 0.0
    pages: int = 0
    items: int = 0
    pages_per_minute: float = 0.0
    live: bool = False
    age: float = 0.0


@dataclass
class SpiderStatus:
    """What Redis and MongoDB hold for one spider.

    Figures of keys that do not exist are 0.

    :ivar keys: the spider's key names by role (:meth:`CrawlKeys.as_dict`,
        and ``prio``: :func:`prio_key`).
    :ivar seeds: seeds waiting in ``<spider>:start_urls``.
    :ivar queued: requests queued in the frontier, all sites: the counter
        ``{<spider>}:count``.
    :ivar started: False when none of the spider's keys exists in Redis
        (never crawled, or its keys were deleted); its figures are then 0.
    :ivar queued_by_priority: request priority -> requests queued, from the
        hash ``{<spider>}:prio`` (:func:`prio_key`), highest priority first;
        only the ``FRONTIER_STATUS_MAX_PRIORITIES`` highest priorities
        (``queued_by_priority_truncated`` tells when there were more). Empty
        when ``queued`` is 0; None (unknown) when requests are queued and the
        hash is absent: a frontier written by a version that did not keep it.
    :ivar leases: requests leased by workers (``ZCARD {<spider>}:leases``).
    :ivar leases_by_worker: worker id -> leases it holds (a lease id is
        ``<worker id>:<n>``).
    :ivar retries: requests waiting to be retried (``ZCARD {<spider>}:retries``).
    :ivar dead_letters: dead letters in ``{<spider>}:dead`` (requests given up
        on and undecodable frontier entries).
    :ivar seen: fingerprints in the dupefilter set (URLs seen), or None when
        the crawl uses the Bloom dupefilter (``{<spider>}:bloom`` exists and
        the set does not): a Bloom filter cannot count its URLs.
    :ivar items: collection -> documents stored, for the collections this
        spider's items went to (known from its cluster stats).
    :ivar stats: cluster-wide stats (``{<spider>}:stats``), name -> integer.
    :ivar workers: every worker in the registry, live ones first.
    :ivar state: the crawl's state from ``{<spider>}:control``
        (:mod:`crawler.control`): ``"running"``, ``"paused"`` or
        ``"stopped"``; a malformed value counts as running, as workers take it.
    :ivar state_bad_value: the malformed value (``"WRONGTYPE"`` for a key
        of another type), or None.
    """

    spider: str
    keys: dict[str, str]
    started: bool = True
    seeds: int = 0
    queued: int = 0
    queued_by_priority: dict[int, int] | None = field(default_factory=dict)
    queued_by_priority_truncated: bool = False
    leases: int = 0
    leases_by_worker: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    dead_letters: int = 0
    dead_trimmed: int = 0
    seen: int | None = 0
    items: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    workers: list[WorkerStatus] = field(default_factory=list)
    state: str = "running"
    state_bad_value: str | None = None

    @property
    def live_workers(self) -> list[WorkerStatus]:
        """The workers whose heartbeat is recent."""
        return [w for w in self.workers if w.live]


@dataclass
class ClusterStatus:
    """The whole cluster at one moment.

    :ivar time: Unix time of the reading.
    :ivar spiders: spider name -> :class:`SpiderStatus`, for the spiders
        whose Redis figures were read; when Redis cannot be read, the
        spiders not read are left out (not reported as an empty crawl).
    :ivar items: collection -> documents stored (every known collection;
        empty when MongoDB cannot be read).
    :ivar errors: ``"redis"``/``"mongodb"`` -> ``"<address>: <Type>:
        <message>"`` (address as in ``servers``), for the servers that could
        not be read; ``"MONGO_URI is not set"`` for MongoDB without a URI.
    :ivar servers: ``"redis"``/``"mongodb"`` -> the address read, with
        credentials masked (:func:`masked_url`).
    """

    time: float
    spiders: dict[str, SpiderStatus] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    servers: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (priorities become string keys;
        ``queued_by_priority`` is null when unknown)."""
        spiders: dict[str, Any] = {}
        for name, spider in self.spiders.items():
            data = asdict(spider)
            by_priority = spider.queued_by_priority
            data["queued_by_priority"] = (
                None if by_priority is None else {str(p): n for p, n in by_priority.items()}
            )
            data["workers_live"] = len(spider.live_workers)
            spiders[name] = data
        return {
            "time": self.time,
            "spiders": spiders,
            "items": dict(self.items),
            "errors": dict(self.errors),
            "servers": dict(self.servers),
        }


def _short(exc: Exception) -> str:
    """``Type: message``, cut to its first 200 characters (pymongo's are long)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:199] + "…"


def _priorities(fields: dict[bytes, bytes]) -> list[tuple[int, int]]:
    """``(priority, requests)`` of the fields of ``{<spider>}:prio`` that
    hold a whole priority and a positive count; others are left out."""
    out = []
    for raw_priority, raw_count in fields.items():
        try:
            priority, count = int(raw_priority), int(raw_count)
        except ValueError:
            continue
        if count > 0:
            out.append((priority, count))
    return out


def _decode(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class StatusReader:
    """Reads :class:`ClusterStatus` from Redis and MongoDB.

    Build it with :meth:`from_settings`; it makes no connection until
    :meth:`read`, and keeps its connections between reads (for
    ``--watch`` and the exporter). Call :meth:`close` when done.

    :param redis: a redis-py client.
    :param mongo: a pymongo client, or None to skip MongoDB.
    :param database: the MongoDB database holding the items.
    :param spiders: spider names to report by default.
    :param settings: settings the key names come from (see
        :meth:`crawler.keys.CrawlKeys.for_spider`).
    :param worker_timeout: seconds after a heartbeat a worker stays live.
    :param max_priorities: how many of the highest priorities
        ``queued_by_priority`` reports per spider.
    :param redis_at: the Redis address for messages (credentials masked).
    :param mongo_at: the MongoDB address for messages (credentials masked).
    """

    def __init__(
        self,
        redis: Redis,
        mongo: MongoClient[dict[str, Any]] | None,
        database: str,
        spiders: list[str],
        *,
        settings: BaseSettings | None = None,
        worker_timeout: float = 30.0,
        max_priorities: int = 100,
        redis_at: str = "Redis",
        mongo_at: str = "MongoDB",
    ) -> None:
        self.redis = redis
        self.mongo = mongo
        self.database = database
        self.spiders = spiders
        self.settings = settings
        self.worker_timeout = worker_timeout
        self.max_priorities = max_priorities
        self.redis_at = redis_at
        self.mongo_at = mongo_at

    @classmethod
    def from_settings(
        cls, settings: BaseSettings, spiders: list[str] | None = None
    ) -> StatusReader:
        """Build a reader from project settings, without connecting.

        :param spiders: names to report; default: every spider of the
            project's spider loader.
        """
        if spiders is None:
            from scrapy.spiderloader import get_spider_loader  # noqa: PLC0415

            spiders = sorted(get_spider_loader(settings).list())
        uri = settings.get("MONGO_URI")
        mongo: MongoClient[dict[str, Any]] | None = None
        if uri:
            mongo = MongoClient(uri, connect=False, serverSelectionTimeoutMS=3000, tz_aware=True)
        return cls(
            get_redis(settings),
            mongo,
            settings.get("MONGO_DATABASE", "crawler"),
            spiders,
            settings=settings,
            worker_timeout=settings.getfloat("FRONTIER_WORKER_TIMEOUT", 30.0),
            max_priorities=settings.getint("FRONTIER_STATUS_MAX_PRIORITIES", 100),
            redis_at=redis_location(settings),
            mongo_at=mongo_location(settings) or "MongoDB",
        )

    def close(self) -> None:
        """Close the connections."""
        self.redis.close()
        if self.mongo is not None:
            self.mongo.close()

    def read(self, spiders: list[str] | None = None, now: float | None = None) -> ClusterStatus:
        """Read the figures of ``spiders`` (default: the reader's spiders).

        A server that cannot be read is named in ``errors`` with its
        address and the reason; the figures it holds are left out (a spider
        whose Redis figures could not all be read is not in ``spiders``). A
        Redis key of another type than the frontier's (``WRONGTYPE``) counts
        as Redis failing. Never raises for a server error.

        :param now: Unix time used for worker liveness (default: now).
        """
        now = time.time() if now is None else now
        status = ClusterStatus(time=now, servers={"redis": self.redis_at})
        if self.mongo is not None:
            status.servers["mongodb"] = self.mongo_at
        for name in spiders if spiders is not None else self.spiders:
            keys = CrawlKeys.for_spider(name, self.settings)
            spider = SpiderStatus(spider=name, keys={**keys.as_dict(), "prio": prio_key(name)})
            try:
                self._read_redis(spider, keys, now)
            except (RedisError, RedisClusterException) as exc:
                status.errors["redis"] = f"{self.redis_at}: {_short(exc)}"
                break
            status.spiders[name] = spider
        collections = set(item_collections())
        for spider in status.spiders.values():
            collections.update(
                s.removeprefix(ITEMS_STAT_PREFIX)
                for s in spider.stats
                if s.startswith(ITEMS_STAT_PREFIX)
            )
        if self.mongo is None:
            status.errors["mongodb"] = "MONGO_URI is not set"
        else:
            try:
                status.items = self._count_items(sorted(collections))
            except PyMongoError as exc:
                status.errors["mongodb"] = f"{self.mongo_at}: {_short(exc)}"
        for spider in status.spiders.values():
            for stat in spider.stats:
                if stat.startswith(ITEMS_STAT_PREFIX):
                    collection = stat.removeprefix(ITEMS_STAT_PREFIX)
                    if collection in status.items:
                        spider.items[collection] = status.items[collection]
        return status

    def _read_redis(self, spider: SpiderStatus, keys: CrawlKeys, now: float) -> None:
        """Read the spider's known keys in one pipeline (no ``SCAN``)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(keys.seeds)
        pipe.get(keys.count)
        pipe.zcard(keys.leases)
        pipe.zcard(keys.retries)
        pipe.llen(keys.dead)
        pipe.scard(keys.dupefilter)
        pipe.exists(keys.bloom)
        pipe.exists(f"{keys.bloom}:0")  # the first shard; one key per call (cluster)
        pipe.hgetall(keys.stats)
        pipe.hgetall(keys.workers)
        pipe.hgetall(prio_key(spider.spider))
        pipe.exists(keys.wait)
        (seeds, count, leases, retries, dead, seen, bloom, bloom0, stats, workers, prio,
         waiting) = pipe.execute()
        self._read_state(spider)
        bloom = int(bloom) + int(bloom0)
        spider.seeds = int(seeds)
        spider.queued = int(count or 0)
        spider.leases, spider.retries, spider.dead_letters = int(leases), int(retries), int(dead)
        spider.seen = None if bloom and not int(seen) else int(seen)
        spider.stats = {}
        for name, value in stats.items():
            try:
                spider.stats[_decode(name)] = int(value)
            except ValueError:
                continue
        spider.dead_trimmed = spider.stats.get(DEAD_TRIMMED_STAT, 0)
        spider.workers = self._workers(workers, now)
        spider.started = bool(
            spider.seeds or count is not None or spider.leases or spider.retries
            or spider.dead_letters or int(seen) or bloom or stats or workers or prio
            or int(waiting) or spider.state != RUNNING or spider.state_bad_value is not None
        )
        if spider.queued:
            if prio:
                counts = sorted(_priorities(prio), reverse=True)
                spider.queued_by_priority = dict(counts[: self.max_priorities])
                spider.queued_by_priority_truncated = len(counts) > self.max_priorities
            else:
                spider.queued_by_priority = None  # an older frontier: unknown
        if spider.leases:
            spider.leases_by_worker = self._leases_by_worker(keys.leases)

    def _read_state(self, spider: SpiderStatus) -> None:
        """The crawl's state (:func:`crawler.control.read_state`)."""
        state, raw = read_state(self.redis, spider.spider)
        spider.state = state or RUNNING
        spider.state_bad_value = None if state is not None else _decode(raw or b"")

    def _leases_by_worker(self, key: str) -> dict[str, int]:
        """Count leases per worker: a lease id is ``<worker id>#<nonce>:<n>``
        (the nonce tells the processes of one worker id apart)."""
        counts: dict[str, int] = {}
        for member, _ in self.redis.zscan_iter(key, count=1000):
            holder = _decode(member).rpartition(":")[0]
            worker = holder.rpartition("#")[0] or holder
            if worker:
                counts[worker] = counts.get(worker, 0) + 1
        return counts

    def _workers(self, records: dict[bytes, bytes], now: float) -> list[WorkerStatus]:
        workers = []
        for raw_id, raw in records.items():
            try:
                record = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                logger.warning("Skipped a worker record that is not JSON: %r", raw[:100])
                continue
            if not isinstance(record, dict):
                continue
            beat = float(record.get("last_heartbeat") or 0.0)
            age = max(0.0, now - beat)
            workers.append(
                WorkerStatus(
                    id=_decode(raw_id),
                    pid=record.get("pid"),
                    host=str(record.get("host", "")),
                    job=record.get("job"),
                    started=record.get("started"),
                    last_heartbeat=beat,
                    pages=int(record.get("pages") or 0),
                    items=int(record.get("items") or 0),
                    pages_per_minute=float(record.get("pages_per_minute") or 0.0),
                    live=age <= self.worker_timeout,
                    age=age,
                )
            )
        workers.sort(key=lambda w: (not w.live, w.id))
        return workers

    def _count_items(self, collections: list[str]) -> dict[str, int]:
        assert self.mongo is not None
        db = self.mongo[self.database]
        return {name: db[name].estimated_document_count() for name in collections}
