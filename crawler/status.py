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

**Shards.** A sharded frontier (``FRONTIER_SHARDS`` > 1, :mod:`crawler.keys`)
keeps its queues, leases, retries, dead letters, revisits, ``prio`` and
dupefilter in each shard's keys; the figures are sums over the shards.
The shard count is the one the crawl recorded in ``{<spider>}:shards`` (1
when absent: a crawl of the time before shards, or never started). The
pipeline reads the shards of ``FRONTIER_SHARDS`` of the settings along
with that key, so a crawl run with the project's settings takes one round
trip; one recorded with another count takes a second pipeline, of its own
shards. On a Redis Cluster the client sends each key to its master.
Queued by priority is unknown (None) as soon as one shard with queued
requests has no ``prio`` hash.

A server that cannot be read is named in :attr:`ClusterStatus.errors` with
its address (credentials masked, :func:`masked_url`) and the cause; the
figures it holds are then left out, never reported as zeros.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from crawler import items as items_module
from crawler.config import FrontierConfig, masked_url
from crawler.control import RUNNING, parse_state
from crawler.frontier.clock import CLOCK
from crawler.frontier.connection import get_redis, redis_location
from crawler.frontier.eviction import vanished_keys
from crawler.keys import CrawlKeys, ShardKeys, created_key
from crawler.storage import ADDED_STAT_PREFIX

if TYPE_CHECKING:
    from redis import Redis
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

__all__ = [
    "CRAWL_STATES",
    "FEED_STAT_PREFIX",
    "ITEMS_STAT_PREFIX",
    "ClusterStatus",
    "SpiderStatus",
    "StatusReader",
    "WorkerStatus",
    "crawl_state",
    "item_collections",
    "mongo_location",
    "prio_key",
]

#: Prefix of the per-collection item counters in ``{<spider>}:stats``.
ITEMS_STAT_PREFIX = "item_scraped_count/"
#: Prefix of the per-feed item counters in ``{<spider>}:stats``
#: (``feed_items/<feed URI>``, see :class:`crawler.extensions.ClusterStats`).
FEED_STAT_PREFIX = "feed_items/"
#: The stat in ``{<spider>}:stats`` that is 1 when the last worker to close
#: closed with the reason ``finished`` (:class:`crawler.extensions.ClusterStats`).
LAST_FINISHED_STAT = "workers/last_finished"
#: :attr:`SpiderStatus.state` (see :func:`crawl_state` for the rule):
#: live workers and work left.
ACTIVE = "running"
#: The pause flag is set (``scrapy frontier pause``).
PAUSED_STATE = "paused"
#: The stop flag is set (``scrapy frontier stop``), or no worker is live
#: while work is left.
STOPPED_STATE = "stopped"
#: Nothing to do: live workers wait for work, or the crawl never started.
IDLE = "idle"
#: The crawl ran, no worker is live and nothing is left.
FINISHED = "finished"
#: Every crawl state, in the order the metrics list them.
CRAWL_STATES = (ACTIVE, PAUSED_STATE, STOPPED_STATE, IDLE, FINISHED)
#: Stat in ``{<spider>}:stats`` where versions before shards counted the dead
#: letters trimmed off ``{<spider>}:dead``; now each shard counts its own in
#: ``<shard prefix>dead:trimmed`` (:mod:`crawler.frontier.housekeeping`), and
#: :attr:`SpiderStatus.dead_trimmed` is the sum of both.
DEAD_TRIMMED_STAT = "dead/trimmed"
#: Per shard: the commands of :meth:`StatusReader._queue_shard`, in order.
_PER_SHARD = 12


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

    The figures are the worker's own, as of its last heartbeat (every
    ``FRONTIER_HEARTBEAT_INTERVAL`` seconds) or its close, whichever came
    last: a worker that closed keeps its final figures in the registry.

    :ivar id: worker id, ``<host>:<pid>`` unless configured.
    :ivar started: Unix time the worker opened its spider.
    :ivar last_heartbeat: Unix time of its last heartbeat (of its close,
        once closed).
    :ivar pages: responses received by this worker.
    :ivar items: items this worker stored: with MongoDB storage, the
        documents it added to MongoDB (an update of a document stored
        already is not counted again, so the sum over a crawl's workers is
        the documents it stored); else the items it scraped.
    :ivar scraped: items scraped by this worker (Scrapy's
        ``item_scraped_count``: an item scraped twice counts twice).
    :ivar pages_per_minute: rate over the last heartbeat interval.
    :ivar closed: Unix time the worker's spider closed, None while it runs.
    :ivar finish_reason: the reason it closed with (``finished``,
        ``shutdown``, ``stopped``, ...), None while it runs.
    :ivar live: not closed, and last heartbeat at most
        ``FRONTIER_WORKER_TIMEOUT`` ago.
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
    scraped: int = 0
    pages_per_minute: float = 0.0
    closed: float | None = None
    finish_reason: str | None = None
    live: bool = False
    age: float = 0.0


@dataclass
class SpiderStatus:
    """What Redis and MongoDB hold for one spider.

    Figures of keys that do not exist are 0.

    :ivar keys: the spider's key names by role (:meth:`CrawlKeys.as_dict`,
        and ``prio``: :func:`prio_key`, ``shards``: ``{<spider>}:shards``);
        the frontier keys (``count``, ``wait``, ``queues``, ``dupefilter``,
        ``bloom``, ``dead``, ``leases``, ``retries``, ``prio``) are shard
        0's, as they were before shards.
    :ivar shard_keys: every shard's frontier keys, in shard order (the
        recorded ``shards`` of them; one entry, the same names as
        ``keys``, for an unsharded crawl): role -> key name
        (:meth:`ShardKeys.as_dict`: ``prefix``, ``count``, ``wait``,
        ``due``, ``active``, ``queues``, ``leases``, ``ldata``,
        ``retries``, ``dead``, ``revisits``, ``rdata``, ``alive``,
        ``dupefilter``, ``bloom``, ``prio``, ``dead_trimmed``), e.g.
        ``[{"prefix": "{quotes:0}:", "count": "{quotes:0}:count", ...},
        {"prefix": "{quotes:1.3}:", ...}]``.
    :ivar shards: the frontier's shard count, as the crawl recorded it in
        ``{<spider>}:shards`` (1 when absent); every figure below is the
        sum over the shards.
    :ivar seeds: seeds waiting in ``<spider>:start_urls``.
    :ivar queued: requests queued in the frontier, all sites: the counters
        ``{<spider>}:count`` (of each shard).
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
    :ivar revisits: revisits scheduled (``ZCARD {<spider>}:revisits``).
    :ivar dead_letters: dead letters in ``{<spider>}:dead`` (requests given up
        on and undecodable frontier entries).
    :ivar dead_trimmed: dead letters trimmed off the lists past
        ``FRONTIER_DEAD_LETTERS_MAX``: ``<shard prefix>dead:trimmed`` of
        each shard, plus the stat ``dead/trimmed`` older versions kept.
    :ivar seen: fingerprints in the dupefilter sets (URLs seen), or None when
        the crawl uses the Bloom dupefilter (a ``bloom`` bitmap exists and
        no set does): a Bloom filter cannot count its URLs (an estimate
        would take ``BITCOUNT`` of the whole bitmap, megabytes, holding
        Redis up at every reading).
    :ivar items: collection -> documents of this spider in it, for each
        collection it wrote (the cluster stats ``mongo/added/<collection>``,
        :data:`crawler.storage.ADDED_STAT_PREFIX`, name them), dict items
        included (in the collection named after the spider). A collection
        no other spider read here wrote: the documents it holds (MongoDB's
        count, so a worker killed before its stats reached Redis takes
        nothing away). A collection two spiders write: under each, the
        documents that one added (summed over its workers and runs; a
        document another spider updates later counts for the spider that
        added it).
    :ivar feeds: feed URI (password masked) -> items written to feeds of
        that URI by the crawl's workers (``-O``, ``FEEDS``), summed over the
        workers and over every run of the crawl (totals: a feed written again
        by a later run adds up), counted as each feed closes (cluster stats
        ``feed_items/<URI>``).
    :ivar stats: cluster-wide stats (``{<spider>}:stats``), name -> integer.
    :ivar workers: every worker in the registry, live ones first.
    :ivar state: the crawl's state, one of :data:`CRAWL_STATES`
        (``running``, ``paused``, ``stopped``, ``idle``, ``finished``),
        derived from the facts by :func:`crawl_state`.
    :ivar control: the flag in ``{<spider>}:control`` (:mod:`crawler.control`)
        that ``scrapy frontier pause|resume|stop`` set: ``"running"`` (no
        flag), ``"paused"`` or ``"stopped"``; a malformed value counts as
        running, as workers take it.
    :ivar state_bad_value: the malformed value (``"WRONGTYPE"`` for a key
        of another type), or None.
    :ivar missing: the crawl's keys that vanished (evicted, flushed, or
        Redis restarted without persistence), judged by its marker
        ``{<spider>}:created`` (:func:`crawler.frontier.eviction.vanished_keys`):
        its figures are then not those of a clean crawl. Empty otherwise.
    """

    spider: str
    keys: dict[str, str]
    shard_keys: list[dict[str, str]] = field(default_factory=list)
    started: bool = True
    shards: int = 1
    seeds: int = 0
    queued: int = 0
    queued_by_priority: dict[int, int] | None = field(default_factory=dict)
    queued_by_priority_truncated: bool = False
    leases: int = 0
    leases_by_worker: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    revisits: int = 0
    dead_letters: int = 0
    dead_trimmed: int = 0
    seen: int | None = 0
    items: dict[str, int] = field(default_factory=dict)
    feeds: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    workers: list[WorkerStatus] = field(default_factory=list)
    state: str = IDLE
    control: str = "running"
    state_bad_value: str | None = None
    missing: list[str] = field(default_factory=list)

    @property
    def live_workers(self) -> list[WorkerStatus]:
        """The workers that have not closed and whose heartbeat is recent."""
        return [w for w in self.workers if w.live]

    @property
    def work_left(self) -> int:
        """Seeds waiting plus requests queued, leased and waiting for a retry
        (revisits scheduled for later are not counted)."""
        return self.seeds + self.queued + self.leases + self.retries


@dataclass
class ClusterStatus:
    """The whole cluster at one moment.

    :ivar time: Unix time of the reading.
    :ivar spiders: spider name -> :class:`SpiderStatus`, for the spiders
        whose Redis figures were read; when Redis cannot be read, the
        spiders not read are left out (not reported as an empty crawl).
    :ivar items: collection -> documents in MongoDB (every spider's), for
        the collections the spiders read wrote to (their cluster stats);
        empty when MongoDB cannot be read.
    :ivar errors: ``"redis"``/``"mongodb"`` -> ``"<address>: <Type>:
        <message>"`` (address as in ``servers``), for the servers that could
        not be read. Without ``MONGO_URI`` MongoDB is not read (a crawl
        storing its items in feeds only): no error, no ``"mongodb"`` server,
        ``items`` empty.
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


def crawl_state(spider: SpiderStatus) -> str:
    """The crawl's state from the facts read, the first rule that holds:

    1. ``stopped``: the stop flag is set (``scrapy frontier stop``: live
       workers are finishing and exiting; workers started now exit at once);
    2. ``paused``: the pause flag is set (``scrapy frontier pause``: live
       workers start no download);
    3. ``running``: a worker is live and work is left (seeds waiting, or
       requests queued, leased or waiting for a retry:
       :attr:`SpiderStatus.work_left`);
    4. ``idle``: a worker is live and no work is left (it waits for seeds),
       or the crawl never started (none of its keys is in Redis);
    5. ``stopped``: no worker is live and work is left (the workers exited
       or died before the end: start workers to go on);
    6. ``finished``: no worker is live and no work is left.

    A worker is live when it has not closed and its last heartbeat is at
    most ``FRONTIER_WORKER_TIMEOUT`` seconds old. Revisits scheduled for
    later are not work left: a crawl whose only work is revisits is
    finished (or idle) until they fall due.
    """
    if spider.control == STOPPED_STATE:
        return STOPPED_STATE
    if spider.control == PAUSED_STATE:
        return PAUSED_STATE
    if spider.live_workers:
        return ACTIVE if spider.work_left else IDLE
    if not spider.started:
        return IDLE
    return STOPPED_STATE if spider.work_left else FINISHED


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


def _whole(raw: bytes | None) -> int:
    """A counter's value; 0 for none or one that is not a whole number."""
    try:
        return max(0, int(raw or 0))
    except ValueError:
        return 0


def _count(raw: Any) -> int:
    """A worker record's count; 0 for none or one that is not a whole number."""
    try:
        return max(0, int(raw or 0))
    except (TypeError, ValueError):
        return 0


def _rate(raw: Any) -> float:
    """A worker record's rate; 0.0 for none or one that is not a number."""
    try:
        return max(0.0, float(raw or 0.0))
    except (TypeError, ValueError):
        return 0.0


def _shard_count(raw: bytes | None) -> int:
    """The shard count recorded in ``{<spider>}:shards``: 1 when absent or
    not a whole number >= 1 (as workers that find it so refuse to run)."""
    try:
        return max(1, int(raw)) if raw is not None else 1
    except ValueError:
        return 1


def _raise_first(replies: list[Any]) -> None:
    """Raise the first error among a pipeline's replies (``raise_on_error=False``)."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _spider_outputs(status: ClusterStatus) -> None:
    """Fill each spider's ``feeds`` and ``items`` (see :class:`SpiderStatus`)
    from its cluster stats and ``status.items``, MongoDB's counts."""
    writers: dict[str, int] = {}
    for spider in status.spiders.values():
        spider.feeds = {
            stat.removeprefix(FEED_STAT_PREFIX): count
            for stat, count in sorted(spider.stats.items())
            if stat.startswith(FEED_STAT_PREFIX)
        }
        spider.items = {
            stat.removeprefix(ADDED_STAT_PREFIX): count
            for stat, count in sorted(spider.stats.items())
            if stat.startswith(ADDED_STAT_PREFIX)
        }
        for collection in spider.items:
            writers[collection] = writers.get(collection, 0) + 1
    for spider in status.spiders.values():
        for collection in spider.items:
            if writers[collection] == 1 and collection in status.items:
                spider.items[collection] = status.items[collection]


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
        config = FrontierConfig.from_settings(settings)
        uri = config.mongo_uri
        mongo: MongoClient[dict[str, Any]] | None = None
        if uri:
            mongo = MongoClient(uri, connect=False, serverSelectionTimeoutMS=3000, tz_aware=True)
        return cls(
            get_redis(settings),
            mongo,
            config.mongo_database,
            spiders,
            settings=settings,
            worker_timeout=config.worker_timeout,
            max_priorities=config.status_max_priorities,
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

        :param now: Unix time used for worker liveness (default: Redis's
            clock, ``TIME``; this process's clock when Redis cannot be read).
        """
        if now is None:
            try:
                CLOCK.measure_redis(self.redis)
            except (RedisError, RedisClusterException, ValueError, TypeError):
                pass  # the read below reports the failure
            now = CLOCK.now()
        status = ClusterStatus(time=now, servers={"redis": self.redis_at})
        if self.mongo is not None:
            status.servers["mongodb"] = self.mongo_at
        for name in spiders if spiders is not None else self.spiders:
            spider = SpiderStatus(spider=name, keys={})
            try:
                self._read_redis(spider, now)
            except (RedisError, RedisClusterException) as exc:
                status.errors["redis"] = f"{self.redis_at}: {_short(exc)}"
                break
            status.spiders[name] = spider
        collections: set[str] = set()
        for spider in status.spiders.values():
            for stat in spider.stats:
                for prefix in (ITEMS_STAT_PREFIX, ADDED_STAT_PREFIX):
                    if stat.startswith(prefix):
                        collections.add(stat.removeprefix(prefix))
        if self.mongo is not None:  # no MONGO_URI: items go to feeds only, no error
            try:
                status.items = self._count_items(sorted(collections))
            except PyMongoError as exc:
                status.errors["mongodb"] = f"{self.mongo_at}: {_short(exc)}"
        _spider_outputs(status)
        return status

    def _read_redis(self, spider: SpiderStatus, now: float) -> None:
        """Read the spider's known keys (no ``SCAN``): one pipeline with the
        shards of ``FRONTIER_SHARDS``, a second one when the crawl recorded
        another shard count; then ``ZSCAN`` of the leases, if any."""
        name = spider.spider
        keys = CrawlKeys.for_spider(name, self.settings)
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(keys.seeds)
        pipe.hgetall(keys.stats)
        pipe.hgetall(keys.workers)
        pipe.get(keys.control)
        pipe.get(keys.shards_key)
        pipe.exists(created_key(name))
        for shard in keys.shards:
            self._queue_shard(pipe, shard)
        replies = pipe.execute(raise_on_error=False)
        seeds, stats, workers, control, recorded, created = replies[:6]
        _raise_first(replies[:3] + replies[4:])
        count = _shard_count(recorded)
        per_shard = replies[6:]
        if count != keys.shard_count:
            keys = CrawlKeys.for_spider(name, self.settings, shards=count)
            pipe = self.redis.pipeline(transaction=False)
            for shard in keys.shards:
                self._queue_shard(pipe, shard)
            per_shard = pipe.execute()
        spider.keys = {
            **keys.as_dict(), "prio": keys.shards[0].prio, "shards": keys.shards_key,
        }
        spider.shard_keys = [shard.as_dict() for shard in keys.shards]
        spider.shards = count
        self._read_state(spider, control)
        spider.seeds = int(seeds)
        spider.stats = {}
        for stat, value in stats.items():
            try:
                spider.stats[_decode(stat)] = int(value)
            except ValueError:
                continue
        spider.workers = self._workers(workers, now)
        spider.dead_trimmed = spider.stats.get(DEAD_TRIMMED_STAT, 0)
        with_keys, leased = self._add_shards(spider, keys, per_shard)
        spider.started = bool(
            with_keys or stats or workers or spider.seeds or recorded is not None or created
            or spider.control != RUNNING or spider.state_bad_value is not None
        )
        if leased:
            spider.leases_by_worker = self._leases_by_worker(leased)
        spider.state = crawl_state(spider)
        spider.missing = vanished_keys(
            name, created=bool(created), recorded=recorded is not None,
            in_use=with_keys or bool(spider.live_workers),
        )

    def _add_shards(
        self, spider: SpiderStatus, keys: CrawlKeys, replies: list[Any]
    ) -> tuple[bool, list[str]]:
        """Sum the shards' figures (``replies``: :data:`_PER_SHARD` per
        shard, in shard order) into ``spider``.

        :returns: whether any of the shards' keys exists, and the lease
            keys of the shards that have leases.
        """
        any_key, prio_known = False, True
        leased: list[str] = []
        by_priority: dict[int, int] = {}
        any_set = any_bloom = False
        seen = 0
        for shard in keys.shards:
            at = shard.index * _PER_SHARD
            (queued, leases, retries, dead, revisits, cardinality, bloom, bloom0, prio,
             waiting, cut, alive) = replies[at : at + _PER_SHARD]
            queued, cardinality = int(queued or 0), int(cardinality)
            spider.queued += queued
            spider.leases += int(leases)
            if int(leases):
                leased.append(shard.leases)
            spider.retries += int(retries)
            spider.dead_letters += int(dead)
            spider.revisits += int(revisits)
            spider.dead_trimmed += _whole(cut)
            seen += cardinality
            any_set = any_set or cardinality > 0
            any_bloom = any_bloom or bool(int(bloom) or int(bloom0))
            if queued and not prio:
                prio_known = False  # a shard written by an older frontier
            for priority, n in _priorities(prio):
                by_priority[priority] = by_priority.get(priority, 0) + n
            any_key = any_key or bool(
                queued or int(leases) or int(retries) or int(dead) or int(revisits)
                or cardinality or prio or int(waiting) or cut is not None or int(alive)
            )
        spider.seen = None if any_bloom and not any_set else seen
        if spider.queued:
            if prio_known and by_priority:
                counts = sorted(by_priority.items(), reverse=True)
                spider.queued_by_priority = dict(counts[: self.max_priorities])
                spider.queued_by_priority_truncated = len(counts) > self.max_priorities
            else:
                spider.queued_by_priority = None  # an older frontier: unknown
        return any_key or any_bloom, leased

    @staticmethod
    def _queue_shard(pipe: Any, shard: ShardKeys) -> None:
        """Queue the reads of one shard's known keys (:data:`_PER_SHARD`
        commands, one key each: a cluster routes them one by one)."""
        pipe.get(shard.count)
        pipe.zcard(shard.leases)
        pipe.zcard(shard.retries)
        pipe.llen(shard.dead)
        pipe.zcard(shard.revisits)
        pipe.scard(shard.dupefilter)
        pipe.exists(shard.bloom)
        pipe.exists(f"{shard.bloom}:0")  # a bitmap split in keys (crawler.frontier.bloom)
        pipe.hgetall(shard.prio)
        pipe.exists(shard.wait)
        pipe.get(shard.dead_trimmed)
        pipe.exists(shard.alive)

    def _read_state(self, spider: SpiderStatus, raw: Any) -> None:
        """The crawl's state from the reply to ``GET {<spider>}:control``
        (as :func:`crawler.control.read_state` reads it)."""
        if isinstance(raw, ResponseError) and str(raw).startswith("WRONGTYPE"):
            state, raw = None, b"WRONGTYPE"
        elif isinstance(raw, Exception):
            raise raw
        else:
            state = parse_state(raw)
        spider.control = state or RUNNING
        spider.state_bad_value = None if state is not None else _decode(raw or b"")

    def _leases_by_worker(self, keys: list[str]) -> dict[str, int]:
        """Count leases per worker in the lease sets ``keys`` (one per shard
        with leases): a lease id is ``<worker id>#<nonce>:<n>`` (the nonce
        tells the processes of one worker id apart). ``ZSCAN`` of every set
        at once, one pipeline per 1,000 leases of the largest."""
        counts: dict[str, int] = {}
        cursors = dict.fromkeys(keys, 0)
        while cursors:
            pipe = self.redis.pipeline(transaction=False)
            for key, cursor in cursors.items():
                pipe.zscan(key, cursor, count=1000)
            replies = pipe.execute()
            for key, (cursor, members) in zip(list(cursors), replies, strict=True):
                for member, _ in members:
                    holder = _decode(member).rpartition(":")[0]
                    worker = holder.rpartition("#")[0] or holder
                    if worker:
                        counts[worker] = counts.get(worker, 0) + 1
                if int(cursor):
                    cursors[key] = int(cursor)
                else:
                    del cursors[key]
        return counts

    def _workers(self, records: dict[bytes, bytes], now: float) -> list[WorkerStatus]:
        workers = []
        for raw_id, raw in records.items():
            try:
                record = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                logger.warning("Skipped a worker record that is not JSON: %r (not written by a "
                               "worker; housekeeping forgets it, or delete its field)", raw[:100])
                continue
            if not isinstance(record, dict):
                continue
            try:
                beat = float(record.get("last_heartbeat") or 0.0)
                closed = record.get("closed")
                closed = None if closed is None else float(closed)
            except (TypeError, ValueError):
                continue
            age = max(0.0, now - beat)
            reason = record.get("finish_reason")
            workers.append(
                WorkerStatus(
                    id=_decode(raw_id),
                    pid=record.get("pid"),
                    host=str(record.get("host", "")),
                    job=record.get("job"),
                    started=record.get("started"),
                    last_heartbeat=beat,
                    pages=_count(record.get("pages")),
                    items=_count(record.get("items")),
                    scraped=_count(record.get("scraped", record.get("items"))),
                    pages_per_minute=_rate(record.get("pages_per_minute")),
                    closed=closed,
                    finish_reason=None if reason is None else str(reason),
                    live=closed is None and age <= self.worker_timeout,
                    age=age,
                )
            )
        workers.sort(key=lambda w: (not w.live, w.id))
        return workers

    def _count_items(self, collections: list[str]) -> dict[str, int]:
        assert self.mongo is not None
        db = self.mongo[self.database]
        return {name: db[name].estimated_document_count() for name in collections}
