"""The shared scheduler: scrapy-redis's Scheduler with leases and an outbox."""

from __future__ import annotations

import collections
import importlib
import itertools
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from scrapy import Request, Spider, signals
from scrapy.utils.asyncio import call_later, create_looping_call
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.python import to_bytes
from scrapy_redis.scheduler import Scheduler
from twisted.internet.threads import deferToThread

from crawler.config import close_at_open, is_unset, stop_on_config_error, worker_id
from crawler.frontier import serializer as json_serializer
from crawler.frontier.compat import (
    DEFAULT_DUPEFILTER_CLASS,
    DEFAULT_QUEUE_CLASS,
    dupefilter_class,
    queue_class,
    refusals,
)
from crawler.frontier.connection import (
    CLUSTER_BUSY,
    NOT_RUN,
    cluster_enabled,
    config_error_message,
    drop_connections,
    get_redis,
    is_no_master,
    redis_location,
)
from crawler.frontier.eviction import ALLOW_EVICTION_SETTING, EvictionWatch
from crawler.frontier.feedstop import finish_local_feeds, warn_remote_feeds
from crawler.frontier.forcedstop import (
    CLOSE_REDIS_WAIT,
    GIVE_BACK_TIMEOUT,
    before_reactor_stops,
    run_bounded,
)
from crawler.frontier.health import RedisHealth, may_call_redis
from crawler.frontier.heartbeat import HeartbeatThread
from crawler.frontier.intake import IntakeKeys
from crawler.frontier.overrides import parse_site_settings
from crawler.frontier.redis_seeds import DurableSeeds
from crawler.frontier.replicas import NotReplicated, ReplicaWait
from crawler.frontier.shards import ShardCountError
from crawler.frontier.signals import request_dead, request_fetched
from crawler.frontier.sites import SLOT_META, slot_of
from crawler.frontier.store import (
    PRIORITY_LIMIT,
    Commit,
    Committed,
    Frontier,
    Lease,
    NotDue,
    Push,
    Retry,
    Revisit,
)
from crawler.keys import slot_warning

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.http.headers import Headers
    from twisted.python.failure import Failure

    from crawler.frontier.queue import LeasedPriorityQueue

logger = logging.getLogger(__name__)

__all__ = ["RETRY_DELAY_META", "REVISIT_META", "FrontierScheduler"]

#: Request meta key: seconds to hold the request in the retry set before it
#: is queued again (set by :class:`crawler.middlewares.BackoffRetryMiddleware`).
RETRY_DELAY_META = "frontier_retry_delay"
#: Request meta key of a revisit (``FRONTIER_REVISIT_AFTER``): the
#: validators of the last response, ``{"etag": str, "modified": str}`` (each
#: optional), sent as ``If-None-Match`` / ``If-Modified-Since``
#: (:class:`crawler.middlewares.RevisitMiddleware`).
REVISIT_META = "frontier_revisit"
#: Meta keys of one download that a revisit does not carry over.
_NOT_REVISITED = frozenset({
    "download_latency", "download_slot", "retry_times", RETRY_DELAY_META,
    "redirect_times", "redirect_ttl",
})
#: Conditional headers of the last revisit: the next one sends its own.
_CONDITIONAL = (b"If-None-Match", b"If-Modified-Since")
#: Longest pause, in seconds, between attempts to reach Redis during an outage.
OUTAGE_BACKOFF_CAP = 30.0
#: Seconds after which a shard found without queued work is asked again (the
#: requests other workers queue there since are found within this time).
EMPTY_SHARD_RECHECK = 1.0

#: Seconds a worker stopped by a configuration error waits before any other
#: frontier call (it closes meanwhile).
CONFIG_ERROR_PAUSE = 3600.0
#: Errors a Redis client raises when Redis cannot be reached or answered
#: too late (redis-py's cluster client raises RedisClusterException, which
#: is no RedisError).
UNREACHABLE = (RedisError, RedisClusterException)


#: Scrapy's default ``RETRY_PRIORITY_ADJUST``.
DEFAULT_PRIORITY_ADJUST = -1


def whole_number(value: Any) -> int | None:
    """``value`` when it is a whole number (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def first_priority(
    priority: int, meta: dict[str, Any], priority_adjust: int = DEFAULT_PRIORITY_ADJUST
) -> int:
    """The priority a request had when it was first scheduled, before
    Scrapy's retries changed it.

    Each retry (:func:`scrapy.downloadermiddlewares.retry.get_retry_request`)
    adds the request's ``meta["priority_adjust"]``, else
    ``RETRY_PRIORITY_ADJUST`` (default -1), to its priority and counts itself
    in ``meta["retry_times"]``; this takes those retries off again, assuming
    the adjustment did not change between them.

    :param priority: the priority the request has now.
    :param meta: its meta (``retry_times``, ``priority_adjust``; other types
        than whole numbers count as absent).
    :param priority_adjust: ``RETRY_PRIORITY_ADJUST``.
    """
    retries = whole_number(meta.get("retry_times")) or 0
    adjust = whole_number(meta.get("priority_adjust"))
    return priority - retries * (priority_adjust if adjust is None else adjust)


@dataclass
class _Op:
    """A Redis write waiting in the outbox.

    ``kind`` names the :class:`~crawler.frontier.store.Commit` list that
    ``item`` goes to: ``pushes`` (a :class:`Push`), ``retries`` (a
    :class:`Retry`), ``dead`` (JSON bytes), ``slots``, ``acks`` or
    ``givebacks`` (a lease id), ``revisits`` (a :class:`Revisit`);
    ``after_commit`` ops carry only ``done``.
    """

    kind: str
    item: Any = None
    #: Called once the commit that carried every write queued before this
    #: op is known to be in Redis (``after_commit``).
    done: Callable[[], object] | None = None
    #: The request a ``pushes`` op queues, kept until its commit is
    #: answered: the reply says, per push, whether the shared dupefilter
    #: filtered it, and a filtered request is logged as Scrapy logs one.
    request: Request | None = None
    #: The frontier shard the write goes to (its request's site's).
    shard: int = 0


@dataclass
class _InDoubt:
    """A round trip whose reply was lost: each of its calls may or may not
    have run.

    :ivar seq: the sequence number its commits carried (None: no commit).
    :ivar commits: the outbox ops of each shard's commit, by shard.
    :ivar lease_ids: the lease ids it asked for.
    :ivar lease_shard: the shard the lease call went to.
    """

    seq: int | None
    commits: dict[int, list[_Op]]
    lease_ids: list[str]
    lease_shard: int = 0


class FrontierScheduler(Scheduler):  # type: ignore[misc]
    """One leased Redis frontier shared by every worker of a crawl.

    Requests go to :class:`~crawler.frontier.queue.LeasedPriorityQueue`
    (``SCHEDULER_QUEUE_CLASS``); the dupefilter (``DUPEFILTER_CLASS``) gives
    the fingerprints and the set's key. scrapy-redis's settings keep their
    names: ``SCHEDULER_PERSIST``, ``SCHEDULER_FLUSH_ON_START``,
    ``SCHEDULER_SERIALIZER`` (default here: JSON; never pickle unless named).

    **Leases.** :meth:`next_request` leases a request. Its site's download
    slot (politeness) is freed when the download ends; the lease ends (one
    ``ack``) when Scrapy's engine has finished with the request: its response
    went through the callback, every item it yielded went through the item
    pipelines (:class:`~crawler.pipelines.MongoPipeline` returns only once an
    item is stored) and every request it yielded was queued, or its failure
    was handled. Leases held are extended every ``FRONTIER_LEASE_TIMEOUT / 3``
    seconds, from a thread with a Redis client of its own
    (:class:`~crawler.frontier.heartbeat.HeartbeatThread`: a callback that
    blocks the reactor does not stop it); a killed worker's leases expire
    and any worker returns them to the queue. At close, leases not finished are given back.

    **Batches.** A lease call takes up to ``FRONTIER_LEASE_BATCH`` requests,
    no more than the downloader has free slots for, into a local buffer
    that the engine's next calls drain; buffered requests are leased like
    the others (extended, given back at close). With several shards a
    batch stops before a lower priority than another shard's best, and
    before a site that joined its shard's ready index more than
    ``FRONTIER_FIFO_SLACK`` seconds (default 0) after another shard's first
    site of that priority (first in, first out across shards). Each worker
    remembers the
    last ``FRONTIER_LOCAL_SEEN`` fingerprints it recorded in the shared
    dupefilter and drops a repeat of one (``enqueue_request`` returns False)
    without asking Redis: the shared dupefilter only grows while a crawl
    runs, so what this worker recorded there stays seen. Redis coming back
    from an outage, a restart or a failover may hold an older dupefilter,
    so the memory is cleared whenever Redis could not be reached or had
    forgotten the scripts.

    **Outbox.** Writes (new requests, retries, dead letters, freed slots,
    acks, leases given back) are queued and sent as one atomic
    ``commit.lua`` call, pipelined with the next lease call (one round trip
    for both), or on their own ``FRONTIER_OUTBOX_DELAY`` seconds after the
    first of them when no lease call comes sooner (one call per shard with
    ``FRONTIER_SHARDS`` > 1, and an ack waits for the calls of other shards
    that carry requests queued before it: :meth:`_batches`). A batch of
    seeds is therefore queued atomically, a lease is acknowledged only with
    or after the requests its callback yielded (a worker killed with writes
    unsent loses the ack with the requests, and its lease is crawled
    again), and a Redis
    outage is waited out with backoff: nothing is dropped, the worker keeps
    running, and the outbox is sent once Redis answers again.

    **Lost replies.** No call is ever sent twice on the client's own
    initiative (redis-py's retries are off, see
    :func:`~crawler.frontier.connection.get_redis`). When a reply is lost
    (the connection drops or times out after the call was sent), the worker
    does not guess: before it sends anything else it reads the commit
    marker ``{s}:sent:<holder>`` (did the commit run?) and the lease data
    of the ids it asked for (which leases did it take?), and goes on from
    there. Lease ids are ``<worker id>#<nonce>:<n>``, so a worker restarted
    under the same id never takes over a dead process's leases.

    **Refusals.** A script that refuses a call (a key of the wrong type, a
    counter that is not a number) has written nothing: it is no outage. The
    error, which names the key and the value, is logged; the writes stay
    queued and are sent again after a backoff, until the key is fixed. Bad
    values the scripts met and worked around (an override that is not a
    number falls back to the default) are logged once each.

    **Retries and dead letters.** A request whose meta has
    ``frontier_retry_delay`` goes to the retry set for that many seconds. The
    signal :data:`~crawler.frontier.signals.request_dead` and a callback that
    raises (``spider_error``) add a dead letter to ``{s}:dead``; so does an
    entry that cannot be decoded (a pickled payload, say).

    Changes from :class:`scrapy_redis.scheduler.Scheduler` beyond those: built
    with ``from_crawler`` and no I/O (scrapy-redis pings Redis in
    ``from_settings``, which Scrapy no longer calls); stats calls carry no
    ``spider`` argument; a ``dont_filter`` request still records its
    fingerprint, so a link back to a seed is not fetched again.

    Stats: ``scheduler/enqueued/redis``, ``scheduler/dequeued/redis``,
    ``dupefilter/filtered`` (counted by the dupefilter's ``log``),
    ``scheduler/unencodable``, ``scheduler/priority_out_of_range``,
    ``frontier/leases/acked``, ``frontier/leases/returned`` (expired leases
    this worker put back), ``frontier/leases/released``,
    ``frontier/retries/scheduled``, ``frontier/dead``,
    ``frontier/redis/outages``, ``frontier/redis/refused`` (calls a script
    refused), ``frontier/redis/in_doubt`` (calls whose reply was lost, or
    that too few replicas acknowledged), ``frontier/redis/not_replicated``
    (round trips and recoveries that fewer than ``FRONTIER_MIN_REPLICAS``
    replicas acknowledged: :mod:`crawler.frontier.replicas`),
    ``frontier/lease_calls`` (Redis calls that leased at least one request),
    ``frontier/lease_calls/not_due`` (lease calls that found nothing to
    lease: each tells how long to wait, never 0 without progress),
    ``frontier/problems`` (bad values met in Redis),
    ``frontier/revisits/scheduled`` (fetched requests committed as revisits),
    ``frontier/revisits/leased`` (revisits this worker leased).

    **Revisits.** With ``FRONTIER_REVISIT_AFTER`` > 0, a leased request
    reported fetched (signal :data:`~crawler.frontier.signals.request_fetched`,
    sent by :class:`crawler.middlewares.RevisitMiddleware`) is committed with
    its ack as a revisit, due that many seconds later (or its site's
    ``{s}:revisit`` override): one per fingerprint, its response's validators
    in its meta (:data:`REVISIT_META`). A lease call queues due revisits past
    the dupefilter. Revisits not due are not pending work.
    """

    queue: LeasedPriorityQueue
    #: The scrapy-redis settings refused (:func:`crawler.frontier.compat.
    #: refusals`), one line; empty: none.
    refused: str = ""
    lease_batch: int
    fifo_slack_us: int
    seen_max: int
    outbox_delay: float
    eviction: EvictionWatch

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the scheduler and its dupefilter; connect to Redis lazily."""
        settings = crawler.settings
        kwargs: dict[str, Any] = {
            "persist": settings.getbool("SCHEDULER_PERSIST"),
            "flush_on_start": settings.getbool("SCHEDULER_FLUSH_ON_START"),
        }
        if value := settings.get("SCHEDULER_QUEUE_KEY"):
            kwargs["queue_key"] = value
        refused = refusals(settings)
        if refused:
            # Reported in one line when the scheduler opens (no Redis I/O
            # then); the frontier's own classes keep this object whole.
            kwargs["queue_cls"] = DEFAULT_QUEUE_CLASS
            dupefilter_path = DEFAULT_DUPEFILTER_CLASS
        else:
            kwargs["queue_cls"] = queue_class(settings)
            dupefilter_path = dupefilter_class(settings)
            for setting, path in (
                ("SCHEDULER_QUEUE_CLASS", kwargs["queue_cls"]),
                ("DUPEFILTER_CLASS", dupefilter_path),
            ):
                given = settings.get(setting)
                if given and given != path:
                    logger.info("%s=%s: taken as %s", setting, given, path)
        serializer = settings.get("SCHEDULER_SERIALIZER")
        if isinstance(serializer, str):
            serializer = importlib.import_module(serializer)
        kwargs["serializer"] = serializer or json_serializer
        kwargs["dupefilter"] = build_from_crawler(load_object(dupefilter_path), crawler)
        scheduler = cls(server=get_redis(settings), **kwargs)
        scheduler.refused = "; ".join(refused)
        scheduler.stats = crawler.stats
        scheduler.crawler = crawler
        scheduler.lease_timeout = settings.getfloat("FRONTIER_LEASE_TIMEOUT", 60.0)
        scheduler.worker_id = worker_id(settings)
        # One holder per process: a worker restarted under the same id gets
        # lease ids of its own.
        scheduler.holder = f"{scheduler.worker_id}#{os.urandom(4).hex()}"
        scheduler.lease_batch = max(1, settings.getint("FRONTIER_LEASE_BATCH", 16))
        scheduler.fifo_slack_us = round(
            max(0.0, settings.getfloat("FRONTIER_FIFO_SLACK", 0.0)) * 1_000_000
        )
        scheduler.seen_max = max(0, settings.getint("FRONTIER_LOCAL_SEEN", 100_000))
        scheduler.outbox_delay = max(0.0, settings.getfloat("FRONTIER_OUTBOX_DELAY", 0.05))
        scheduler.eviction = EvictionWatch(
            scheduler.server, redis_location(settings),
            allowed=settings.getbool(ALLOW_EVICTION_SETTING, False),
        )
        scheduler._setup_state()
        return scheduler

    def _setup_state(self) -> None:
        self._leases: dict[Request, str] = {}
        #: With revisits on: each leased request's entry as queued and its
        #: site; a revisit is built from it, not from the request as the
        #: downloader middlewares left it (their headers and meta are
        #: this download's, e.g. USER_AGENT, cookies).
        self._entries: dict[Request, tuple[bytes, str]] = {}
        self._lease_ids = itertools.count()
        self._outbox: list[_Op] = []
        self._flush_call: Any = None
        #: The engine's wake-up for the next due request (_wake_when_due).
        self._wake_call: Any = None
        self._wake_at: float | None = None
        self._down_until = 0.0
        self._backoff = 0.0
        #: Gates synchronous Redis calls on the running reactor's thread
        #: during an outage and once the spider is closing (health.py).
        self.redis_health = RedisHealth(self._ping, self._redis_answered)
        self._heartbeat: Any = None
        #: Marks the worker live and extends its leases from a thread, with
        #: a Redis client of its own, while a callback blocks the reactor.
        self._beater: HeartbeatThread | None = None
        self._unhook_forced_stop: Callable[[], None] = lambda: None
        self._due_at: float | None = None
        self._ready: collections.deque[Request] = collections.deque()
        self._seen: dict[bytes, None] = {}
        self._seq = 0
        self._unreachable = False
        self._in_doubt: _InDoubt | None = None
        #: A CLUSTERDOWN or TRYAGAIN of the last round trip (the call did
        #: not run; once more after the slot map is refreshed, then an outage).
        self._busy: ResponseError | None = None
        #: Acks the last :meth:`_batches` held back (see there).
        self._acks_held = 0
        #: A configuration error stops the crawl: no Redis call until it closes.
        self._config_stopped = False
        #: Why leasing stopped: Redis evicted keys or may evict them (the
        #: crawl is closing); None while it has not.
        self.evicted: str | None = None
        #: The eviction check running in a thread (:meth:`_watch_evictions`).
        self._eviction_call: Any = None
        self._problems: set[str] = set()
        #: Lease id -> the shard it was taken from.
        self._lease_shards: dict[str, int] = {}
        #: The lease of a request on its last chance (one death short of
        #: FRONTIER_MAX_DELIVERIES), leased alone: nothing more is leased
        #: while it is held, so that if it kills the worker it dies alone.
        self._alone: str | None = None
        #: A shard whose lease call put back a request's last chance because
        #: this worker held leases: nothing more is leased until it holds
        #: none, then that shard is asked first (:meth:`_holding_back`).
        self._drain_shard: int | None = None
        #: That shard and the last chance's site, until a lease call there
        #: holding nothing is sent: it looks at that site first (lease.lua's
        #: ARGV[17]), so better work queued elsewhere does not make the
        #: worker meet the last chance beside it, and drain, again and again.
        self._drained_for: tuple[int, str] | None = None
        #: Whether this worker queues the start requests of the spider's
        #: ``start_urls`` (:meth:`_claim_start_urls`); True until it knows.
        self._start_urls_mine = True
        #: The shard the next lease call goes to first among equals (round
        #: robin: shards of equal best priority and head join time).
        self._turn = 0
        #: Per shard, ``time.monotonic()`` before which it said nothing is
        #: due (0: ask it; None: nothing queued when last asked).
        self._shard_due: list[float | None] = []
        #: Per shard, ``time.monotonic()`` when it last said nothing is queued.
        self._shard_empty_at: list[float] = []
        #: Per shard, the best priority due there as last learnt (inf: not
        #: known; -inf: nothing due), and ``time.monotonic()`` when learnt.
        self._shard_best: list[float] = []
        self._shard_best_at: list[float] = []
        #: Per shard, when its first site at that priority (its head)
        #: joined its ready index, µs of the Redis clock (0: long ago; inf:
        #: not known, or a push of this worker not committed yet: then the
        #: commit's reply tells, :meth:`_learn_pushed`).
        self._shard_head: list[float] = []

    # -- life cycle --------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        """Create the queue, hook lease acknowledgement and start heartbeats.

        The first Redis calls (site overrides, ``SCRIPT LOAD``, the worker's
        ``alive`` script) check the configuration: a wrong password, a
        database the server lacks or an ACL that forbids what the crawler
        needs is logged in one line and stops the crawl before it starts;
        Redis being down is an outage, waited out later.

        The spider is then closed with the reason ``config_error`` as soon
        as it is open (``CloseSpider`` from the ``spider_opened`` signal).

        :raises RuntimeError: Scrapy's engine no longer exposes the hook that
            tells when a request is finished.
        """
        self.spider = spider
        self.df.open()  # its keys come from the spider's name
        self.queue = load_object(self.queue_cls)(
            server=self.server,
            spider=spider,
            key=self.queue_key % {"spider": spider.name},
            serializer=self.serializer,
            dupefilter_key=self.df.key,
            bloom=getattr(self.df, "bloom", None),
        )
        if self.crawler.settings.getbool("ROBOTSTXT_OBEY") and not self.queue.policy.robots_gate:
            logger.info(
                "ROBOTSTXT_OBEY without crawler.politeness.SharedRobotsTxtMiddleware: each "
                "worker fetches robots.txt itself and sites get their full concurrency at "
                "once (that middleware fetches it once for the cluster and keeps its "
                "Crawl-delay)", extra={"spider": spider},
            )
        if hasattr(spider, "server"):
            self._adopt_redis_spider(spider)
            # scrapy-redis's own spiders take seeds durably too (redis_seeds.py)
            DurableSeeds.install(self, spider)
        shards = self.queue.shards
        if cluster_enabled(self.crawler.settings) and (
            warning := slot_warning(spider.name, len(shards))
        ):
            logger.warning("%s", warning, extra={"spider": spider})
        self._shard_due = [0.0] * len(shards)
        self._shard_empty_at = [0.0] * len(shards)
        self._shard_best = [math.inf] * len(shards)
        self._shard_best_at = [-math.inf] * len(shards)
        self._shard_head = [math.inf] * len(shards)
        overrides = self._site_settings()
        self._hook_engine()
        if self.refused:
            self._stop_at_open(self.refused)
            return
        try:
            refusal = self.eviction.start()
            if refusal is not None:
                self._stop_at_open(refusal)
                return
            shards.check_count()
            for key, mapping in overrides.items():
                by_shard: dict[int, dict[str, int]] = {}
                for site, value in mapping.items():
                    by_shard.setdefault(shards.index_of(site), {})[site] = value
                for i, part in by_shard.items():
                    self.server.hset(shards[i].key(key), mapping=part)
            shards.load_scripts()
            shards.alive(self.holder)
            self._start_urls_mine = self._claim_start_urls(spider)
        except (RedisError, ShardCountError) as exc:
            message = (
                self._shard_count_message(exc, len(shards.frontiers))
                if isinstance(exc, ShardCountError)
                else config_error_message(exc, self.crawler.settings)
            )
            if message is not None:
                self._stop_at_open(message)
                return
            self._outage(exc)
        signals_ = self.crawler.signals
        signals_.connect(self._on_request_dead, signal=request_dead)
        signals_.connect(self._on_request_fetched, signal=request_fetched)
        signals_.connect(self._on_spider_error, signal=signals.spider_error)
        signals_.connect(self._download_ended, signal=signals.request_left_downloader)
        self._start_heartbeats()
        if self.flush_on_start:
            self.flush()
            try:
                shards.check_count()  # the crawl's marker and shard count again
            except (*UNREACHABLE, ShardCountError):
                pass  # (an outage, met again by the next call; a race with another worker)
        self._log_resuming()

    def _adopt_redis_spider(self, spider: Spider) -> None:
        """Give a scrapy-redis spider the settings it read too early.

        Scrapy builds the spider before it runs the add-ons, so
        scrapy-redis's ``setup_redis`` read ``REDIS_URL`` and
        ``MAX_IDLE_TIME_BEFORE_CLOSE`` before
        :class:`crawler.addon.FrontierAddon` took them from the
        environment, and made a client of its own (no I/O yet) with
        scrapy-redis's options only. The spider now reads its seeds through
        one of ours (the settings as the crawl has them, ``REDIS_PARAMS``
        merged over our timeouts, no retries; on a cluster, one that follows
        its slots): ``server`` and the client's methods it bound
        (``fetch_data``, ``count_size``: ``SPOP``/``SCARD``/``LLEN``) are
        replaced, so that no call goes to the first client's server. A
        ``max_idle_time`` the spider's class leaves unset is read again
        from the settings.
        """
        old, new = getattr(spider, "server", None), get_redis(self.crawler.settings)
        setattr(spider, "server", new)  # noqa: B010 (not every spider has it)
        for name in ("fetch_data", "count_size"):
            bound: Any = getattr(spider, name, None)
            if old is not None and getattr(bound, "__self__", None) is old:
                setattr(spider, name, getattr(new, bound.__name__))
        if hasattr(spider, "max_idle_time") and getattr(type(spider), "max_idle_time", 0) is None:
            spider.max_idle_time = self.crawler.settings.getint("MAX_IDLE_TIME_BEFORE_CLOSE")

    def _claim_start_urls(self, spider: Spider) -> bool:
        """Whether this worker queues the requests of the spider's
        ``start_urls``: the first worker of the crawl does, the others drop
        theirs (:meth:`enqueue_request`), so that a spider whose ``start()``
        is Scrapy's own (a plain ``Spider`` or ``CrawlSpider`` with
        ``start_urls``) has them crawled once per crawl, not once per
        worker. The first is the one that sets the marker of its seed list,
        ``{<name>:start_urls}:start_urls_seeded`` (``SET NX``), the marker
        :class:`~crawler.frontier.spider.FrontierSpider` sets when it pushes
        its ``start_urls``; delete it to have them queued again.

        A spider with a ``start()`` of its own (``FrontierSpider``, or one
        that yields requests other than ``start_urls``) or without
        ``start_urls`` is left alone: True.

        :raises redis.exceptions.RedisError: Redis failed (the worker then
            queues them: crawled twice rather than not at all).
        """
        urls = getattr(spider, "start_urls", None)
        if type(spider).start is not Spider.start or not urls:
            return True
        seed_list = getattr(spider, "redis_key", None) or (
            self.crawler.settings.get("REDIS_START_URLS_KEY") or "%(name)s:start_urls"
        ) % {"name": spider.name}
        marker = IntakeKeys.for_seed_list(seed_list).seeded
        mine = bool(self.server.set(marker, str(int(time.time() * 1000)), nx=True))
        if mine:
            logger.info(
                "Queueing the spider's %d start_urls for the whole crawl (marker %s; "
                "the other workers drop theirs)", len(urls), marker, extra={"spider": spider},
            )
        else:
            logger.info(
                "start_urls were queued for this crawl already (%s; delete it to queue them "
                "again): this worker drops its own", marker, extra={"spider": spider},
            )
        return mine

    def _log_resuming(self) -> None:
        """Log scrapy-redis's ``Resuming crawl (N requests scheduled)`` (at
        INFO) when the frontier already holds requests: queued, waiting for
        a retry or leased, in every shard. Nothing when Redis cannot be read
        now (the outage is met, and waited out, by the next call), nor when
        a counter holds a malformed value (the frontier's calls report it)."""
        try:
            scheduled = len(self.queue)
        except UNREACHABLE:
            return
        except (ValueError, ResponseError) as exc:
            logger.debug("Not counting the requests scheduled: %s", exc,
                         extra={"spider": self.spider})
            return
        if scheduled:
            logger.info("Resuming crawl (%d requests scheduled)", scheduled,
                        extra={"spider": self.spider})

    def _shard_count_message(self, exc: ShardCountError, count: int) -> str:
        """The error's message, saying where this worker's count came from
        when ``FRONTIER_SHARDS`` is not set (its default)."""
        if not is_unset(self.crawler.settings, "FRONTIER_SHARDS"):
            return str(exc)
        where = "on a Redis Cluster" if self.crawler.settings.getbool(
            "FRONTIER_REDIS_CLUSTER") else "on one Redis server"
        return f"{exc} (FRONTIER_SHARDS is not set: {count} is its default {where})"

    def _site_settings(self) -> dict[str, dict[str, int]]:
        """``DOWNLOAD_SLOTS``' delays and concurrency, then
        ``FRONTIER_SITE_DELAYS`` / ``FRONTIER_SITE_CONCURRENCY`` (which win
        for a site both name) and ``FRONTIER_SITE_REVISITS``, as the overrides ``scrapy frontier
        delay|concurrency|revisit`` would store, by key (``delay``: ms,
        ``conc``, ``revisit``: ms).

        :raises ValueError: a site or a value is not valid (the message says
            which setting, site and value).
        """
        settings = self.crawler.settings
        policy = self.queue.policy
        out = {
            "delay": {**policy.slot_delays, **parse_site_settings(
                "delay", settings.getdict("FRONTIER_SITE_DELAYS"), "FRONTIER_SITE_DELAYS"
            )},
            "conc": {**policy.slot_concurrency, **parse_site_settings(
                "conc", settings.getdict("FRONTIER_SITE_CONCURRENCY"), "FRONTIER_SITE_CONCURRENCY"
            )},
            "revisit": parse_site_settings(
                "revisit", settings.getdict("FRONTIER_SITE_REVISITS"), "FRONTIER_SITE_REVISITS"
            ),
        }
        return {key: mapping for key, mapping in out.items() if mapping}

    def _hook_engine(self) -> None:
        # Scrapy's engine calls _Slot.remove_request(request) once a request
        # is completely handled (response scraped, items through the
        # pipelines, yielded requests scheduled; or its failure handled).
        # No public signal marks that moment, so we wrap that call.
        slot = getattr(self.crawler.engine, "_slot", None)
        remove = getattr(slot, "remove_request", None)
        if remove is None:
            raise RuntimeError(
                "This Scrapy version's engine has no _slot.remove_request: "
                "leases could not be acknowledged"
            )

        def remove_request(request: Request) -> None:
            remove(request)
            self._finished(request)

        slot.remove_request = remove_request  # type: ignore[union-attr]
        # A forced stop stops the reactor without closing the engine.
        self._unhook_forced_stop = before_reactor_stops(self._give_back_at_forced_stop)
        warn_remote_feeds(self.crawler)

    def close(self, reason: str) -> None:
        """Give back unfinished leases, send the outbox, stop heartbeats.

        Redis is waited for at most ``CLOSE_REDIS_WAIT`` (10 s, or
        ``FRONTIER_LEASE_TIMEOUT`` when shorter), in a thread whatever the
        socket timeouts: past it, what was not sent is left out. Nothing
        is lost: a lease is acknowledged only in or after the commits that
        queue the requests its page yielded (:meth:`_batches`), so an
        unsent ack and its requests go together, the lease expires and the
        page is crawled again (its items, already stored, are stored again
        in place).
        """
        self._unhook_forced_stop()
        wait = min(self.lease_timeout, CLOSE_REDIS_WAIT)
        deadline = time.monotonic() + wait
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        if self._beater is not None:
            # (before the give-backs: a beat after them would extend them)
            self._beater.stop(timeout=wait)
            self._beater = None
        if self._wake_call is not None:
            self._wake_call.cancel()
            self._wake_at = self._wake_call = None
        sent = run_bounded(
            lambda: self._send_at_close(deadline),
            max(0.0, deadline - time.monotonic()) + 0.5,
            what="The frontier's writes at close",
        )
        if not sent:
            logger.error(
                "Redis unreachable or refusing at close: %d frontier writes not sent "
                "within %.0f s (unacknowledged leases will expire and be crawled again)",
                len(self._outbox), wait, extra={"spider": self.spider},
            )
            if sent is None or self._unreachable:  # (no answer: no more calls)
                return  # (the registry forgets this worker after its last heartbeat)
        try:
            self.queue.shards.leave(self.holder)
        except UNREACHABLE:
            pass  # it stops counting a lease's length after its last heartbeat
        if not self.persist:
            self.flush()

    def _send_at_close(self, deadline: float) -> bool:
        """Resolve a call in doubt, give back the leases held, send the
        outbox; try until ``deadline`` (``time.monotonic()``). Returns
        whether everything was sent."""
        # A call in doubt first: the leases it took are given back too.
        while self._in_doubt is not None and time.monotonic() < deadline:
            self._down_until = 0.0
            if not self._resolve():
                time.sleep(max(0.0, min(1.0, self._backoff or 0.5, deadline - time.monotonic())))
        self._ready.clear()
        self._entries.clear()
        if self._leases:
            held = list(self._leases.values())
            self._leases.clear()
            for lease_id in held:
                self._write("givebacks", item=lease_id, shard=self._lease_shards.pop(lease_id, 0))
            self.stats.inc_value("frontier/leases/released", len(held))
            logger.info("Gave back %d unfinished leases", len(held))
        while self._outbox and time.monotonic() < deadline:
            self._down_until = 0.0
            if not self.flush_outbox():
                time.sleep(max(0.0, min(1.0, self._backoff or 0.5, deadline - time.monotonic())))
        return self._in_doubt is None and not self._outbox

    def _give_back_at_forced_stop(self) -> None:
        """The reactor stops before :meth:`close` ran (a second SIGTERM or
        SIGINT): give every held lease back, with the outbox, in one commit
        that waits at most ``GIVE_BACK_TIMEOUT`` (2 s) for Redis.

        A give-back is not a failed delivery: the request goes back to the
        front of its queue with its delivery count unchanged. A reply lost or
        late is not sent again: the next call of any worker resolves it, or
        the leases expire (and count as a delivery) as after a crash.
        Local feed exports are finished first, before the outbox's acks
        are sent (:func:`~crawler.frontier.feedstop.finish_local_feeds`).
        """
        finish_local_feeds(self.crawler)
        if not self._leases:
            return
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        if self._beater is not None:
            # (a beat after the give-back would only extend leases gone)
            self._beater.stop(timeout=0.2)
            self._beater = None
        held = list(self._leases.values())
        self._leases.clear()
        self._ready.clear()
        self._entries.clear()
        for lease_id in held:
            self._write("givebacks", item=lease_id, shard=self._lease_shards.pop(lease_id, 0))
        self._down_until = 0.0
        if run_bounded(self.flush_outbox, GIVE_BACK_TIMEOUT):
            self.stats.inc_value("frontier/leases/released", len(held))
            logger.info("Forced stop: gave back %d unfinished leases", len(held))
        else:
            logger.warning(
                "Forced stop: Redis did not confirm the give-back of %d leases "
                "within %s s (they come back when they expire)",
                len(held), GIVE_BACK_TIMEOUT,
            )

    # -- enqueue -----------------------------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        """Queue ``request`` (through the outbox) unless it was seen.

        A request with ``frontier_retry_delay`` in its meta goes to the retry
        set instead. A request that cannot be encoded (a value in meta,
        cb_kwargs or a subclass's attribute with no faithful encoding, see
        :mod:`crawler.frontier.serializer`) is logged as one error naming the
        URL and the key, counted in ``scheduler/unencodable`` and refused
        (False), without being marked as seen; one whose priority is outside
        +-``PRIORITY_LIMIT`` (1,000,000) likewise, counted in
        ``scheduler/priority_out_of_range``. The engine then sends
        ``request_dropped`` for it, as for any request a scheduler refuses.

        A request of the spider's ``start_urls`` (Scrapy's ``start()`` marks
        it ``is_start_request``) is dropped (False, counted in
        ``frontier/start_urls/dropped``) when another worker queues them for
        the crawl (:meth:`_claim_start_urls`); the mark is not stored.

        Every duplicate is handed to the dupefilter's ``log(request,
        spider)``, which logs it as Scrapy does (the first one, or all of
        them with ``DUPEFILTER_DEBUG``) and counts it in
        ``dupefilter/filtered``: here for a repeat of a fingerprint this
        worker recorded, when the commit is answered for one the shared
        dupefilter in Redis holds (then the signal ``request_dropped`` is
        sent too, as the engine sends it when this method returns False).

        :returns: False for a request that could not be encoded or whose
            priority is out of range, a start request another worker
            queues, or a duplicate of one this worker
            recorded (``FRONTIER_LOCAL_SEEN``); other duplicates are
            filtered when the outbox is sent.
        """
        # Scrapy marks what start() yields; only this worker's own requests
        # carry the mark (it is not stored), never a leased one's redirect.
        if request.meta.pop("is_start_request", False) and not self._start_urls_mine:
            self.stats.inc_value("frontier/start_urls/dropped")
            return False
        return self._enqueue(request)

    def _enqueue(self, request: Request) -> bool:
        """:meth:`enqueue_request` past the start requests' check."""
        delay = request.meta.pop(RETRY_DELAY_META, None)
        try:
            # Its site in the frontier, and its slot in Scrapy's downloader.
            request.meta[SLOT_META] = self.queue.policy.slot_of(request)
        except ValueError as exc:
            logger.error("Request %s not scheduled: %s", request.url, exc,
                         extra={"spider": self.spider})
            self.stats.inc_value("scheduler/unencodable")
            return False
        fingerprint = None
        if delay is None and not request.dont_filter and self._seen:
            fingerprint = self.df.request_fingerprint(request)
            if fingerprint in self._seen:
                self.df.log(request, self.spider)
                return False
        if not -PRIORITY_LIMIT <= request.priority <= PRIORITY_LIMIT:
            logger.error(
                "cannot queue request %s: its priority %d is outside the frontier's "
                "range, -%d to %d (see docs/requests.md)",
                request.url, request.priority, PRIORITY_LIMIT, PRIORITY_LIMIT,
                extra={"spider": self.spider},
            )
            self.stats.inc_value("scheduler/priority_out_of_range")
            return False
        try:
            data = self.queue.encode(request)
            if type(request) is not Request or b'{"!i":' in data:
                self._check_rebuilds(request, data)
        except ValueError as exc:  # EncodeError, or a callback not on the spider
            logger.error("%s", exc, extra={"spider": self.spider})
            self.stats.inc_value("scheduler/unencodable")
            return False
        site, priority = request.meta[SLOT_META], request.priority
        shard = self.queue.shards.index_of(site)
        if delay is not None:
            self._write("retries", item=Retry(data, site, priority, float(delay)), shard=shard)
            self.stats.inc_value("frontier/retries/scheduled")
            return True
        if fingerprint is None:
            fingerprint = self.df.request_fingerprint(request)
        push = Push(data, site, priority, fingerprint, request.dont_filter)
        self._write("pushes", item=push, request=request, shard=shard)
        self._note_push(shard, priority)
        self._remember(fingerprint)
        return True

    def _check_rebuilds(self, request: Request, data: bytes) -> None:
        """Decode ``data`` as a worker will: a Request subclass whose
        ``__init__`` does not take back what ``to_dict`` gave (Scrapy's
        :func:`~scrapy.utils.request.request_from_dict` passes every
        attribute as a keyword), or an item in meta or cb_kwargs whose class
        cannot be built from its fields, is refused now, not lost when
        leased. Only subclasses and requests holding items pay for it.

        :raises ValueError: naming the URL, the class and the cause.
        """
        try:
            self.queue.decode(data, slot_of(request))
        except Exception as exc:
            raise ValueError(
                f"cannot store request {request.url} in Redis: {type(request).__name__} "
                f"cannot be rebuilt from its stored form ({type(exc).__name__}: {exc})"
            ) from exc

    def _remember(self, fingerprint: bytes) -> None:
        if self.seen_max:
            seen = self._seen
            seen[fingerprint] = None
            if len(seen) > self.seen_max:
                del seen[next(iter(seen))]  # the oldest

    # -- lease -------------------------------------------------------------------

    def next_request(self) -> Request | None:
        """The next leased request, or None (nothing due, or Redis down).

        Served from the local buffer while it holds any; otherwise the
        outbox and one ``lease.lua`` call, in one round trip, refill it (see
        *Batches* and *Outbox*). With None, the engine is woken when the
        first site or retry becomes due (:meth:`next_due`), whatever the
        spider: Scrapy's engine otherwise asks again only when a download
        ends, or every 5 seconds. None once Redis evicted keys or may evict
        them (:attr:`evicted`): the crawl is closing, and what this worker
        holds is given back then.
        """
        if self.evicted is not None:
            return None
        request = self._next_request()
        if request is None:
            self._wake_when_due()
        return request

    def _wake_when_due(self) -> None:
        """Wake the engine in :meth:`next_due` seconds, unless a wake-up is
        already set for then or sooner."""
        if self._due_at is None:
            return
        at = self._due_at
        due = max(0.0, at - time.monotonic())
        if self._wake_at is not None and self._wake_at <= at:
            return
        if self._wake_call is not None:
            self._wake_call.cancel()
        self._wake_at = at
        self._wake_call = call_later(due, self._wake_engine)

    def _wake_engine(self) -> None:
        self._wake_at = self._wake_call = None
        slot = getattr(getattr(self.crawler, "engine", None), "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    def _next_request(self) -> Request | None:
        if self._ready or not self._before_lease() or self._holding_back():
            return self._hand_out() if self._ready else None
        asked: set[int] = set()
        while True:
            shard, self._drain_shard = self._drain_shard, None
            if shard is None or shard in asked or shard >= len(self._shard_due):
                shard = self._next_shard(asked)
            if shard is None:  # every shard said: nothing due now
                self._due_at = self._earliest_due()
                return None
            ids = [f"{self.holder}:{next(self._lease_ids)}" for _ in range(self._want())]
            result = self._exchange(ids, shard)
            if isinstance(result, (list, NotDue)):
                self._last_passed(result[0] if isinstance(result, list) else result, shard)
            if isinstance(result, list):
                self.stats.inc_value("frontier/lease_calls")
                self._housekeeping(result[0], shard)
                self._learn_best(shard, result[0].best, result[0].head)
                self._take(result)
                self._turn = (shard + 1) % len(self._shard_due)
            elif isinstance(result, NotDue):
                self.stats.inc_value("frontier/lease_calls/not_due")
                self._housekeeping(result, shard)
                self._learn_best(shard, result.best, result.head)
                now = time.monotonic()
                self._shard_due[shard] = None if result.wait is None else now + result.wait
                if result.wait is None:
                    self._shard_empty_at[shard] = now
                asked.add(shard)
                if len(self._shard_due) == 1:
                    self._due_at = None if result.wait is None else now + result.wait
            # (leases found out after a lost reply are in the buffer too)
            if self._ready:
                return self._hand_out()
            if result is None or self._holding_back():  # Redis down, or refused; a drain
                return None
            if len(self._shard_due) == 1 and not isinstance(result, list):
                return None

    def _holding_back(self) -> bool:
        """Whether to lease nothing now, for a request on its last chance
        (``lease.lua``, ARGV[16]): while this worker holds such a lease
        (taken alone), or while it drains for one that a lease call put back
        because it held other leases. A poison request then kills the worker
        alone, and a request leased beside it is not dead-lettered with it."""
        if self._alone is not None:
            if self._alone in self._lease_shards:
                return True
            self._alone = None
        return self._drain_shard is not None and bool(self._lease_shards)

    def _last_passed(self, result: Lease | NotDue, shard: int) -> None:
        """Start a drain when a lease call to ``shard`` put back a request's
        last chance (see :meth:`_holding_back`)."""
        if result.last_passed:
            self._drained_for = (shard, result.last_passed)
            if self._drain_shard is None:
                self.stats.inc_value("frontier/last_chance/drains")
                logger.debug(
                    "A request on its last delivery waits for this worker to hold nothing "
                    "(shard %d): leasing nothing more until then", shard,
                    extra={"spider": self.spider},
                )
            self._drain_shard = shard

    def _before_lease(self) -> bool:
        """Before a shard is chosen for a lease call: find out what a
        round trip whose reply was lost did (:meth:`_resolve`: the leases a
        lost lease call took go first, and what this worker knew of its
        shard, its head among them maybe, is learnt again), then peek at the
        shards not heard from lately (:meth:`_peek_stale`).

        :returns: whether to go on to a lease call: False when the lost
            call's leases are in the buffer now, or while Redis cannot tell
            what it did.
        """
        if not may_call_redis(self.crawler):
            return False
        if self._in_doubt is not None and time.monotonic() >= self._down_until:
            if not self._resolve() or self._ready:
                return False
        self._peek_stale()
        return True

    def _next_shard(self, asked: set[int]) -> int | None:
        """The shard the next lease call goes to: of the shards not asked
        in this :meth:`next_request` that may have work due (never asked,
        past the wait it gave, or found empty more than
        :data:`EMPTY_SHARD_RECHECK` seconds ago: other workers' requests may
        have reached it since; this worker's own pushes make it due at
        once), the one whose best due priority is highest as last learnt
        (:meth:`_peek_stale`, lease replies, this worker's pushes); among
        equals the one whose first site at that priority joined its ready
        index first (Redis clock: first in, first out across shards), then
        the next in turn. So a sharded crawl serves its best priority first
        across shards, and equal priorities in the order their sites joined,
        as one frontier does across its sites (within what was learnt at most
        :data:`EMPTY_SHARD_RECHECK` seconds ago),
        and shards without work cost about one call a second each. The
        first call of a :meth:`next_request` asks the shard that has waited
        longest when none is due, as a single frontier is always asked.
        None: every shard was asked, or none may have work due."""
        n = len(self._shard_due)
        now = time.monotonic()
        best: int | None = None
        for j in range(n):
            i = (self._turn + j) % n
            due = self._shard_due[i]
            if i in asked:
                continue
            if (due is None and now - self._shard_empty_at[i] >= EMPTY_SHARD_RECHECK) or (
                due is not None and due <= now
            ):
                if best is None or (self._shard_best[i], -self._shard_head[i]) > (
                    self._shard_best[best], -self._shard_head[best]
                ):
                    best = i
        if best is not None or asked:
            return best

        def waited(i: int) -> float:
            due = self._shard_due[i]
            return self._shard_empty_at[i] + EMPTY_SHARD_RECHECK if due is None else due

        return min(range(n), key=waited)

    def _best_elsewhere(self, shard: int) -> tuple[int | None, int | None]:
        """The best priority due on the shards other than ``shard`` as last
        learnt (None: none has work due, or it is not known), and the
        earliest time a first site at that priority joined their ready
        index, µs (None: not known), so that a lease call's batch stops
        before lower priorities than that, and before sites of that
        priority that joined later. A shard
        that told this worker to wait (its due sites are ones where it holds
        its share, or none is due) does not count until that wait is over:
        its best is not this worker's to lease, and would cut every batch
        elsewhere to one request."""
        now = time.monotonic()
        known = [
            i for i, b in enumerate(self._shard_best)
            if i != shard and not math.isinf(b)
            and (due := self._shard_due[i]) is not None and due <= now
        ]
        if not known:
            return None, None
        best = max(self._shard_best[i] for i in known)
        head = min(self._shard_head[i] for i in known if self._shard_best[i] == best)
        return int(best), None if math.isinf(head) else int(head)

    def _learn_best(self, shard: int, best: int | None, head: int | None = None) -> None:
        """Note the best priority due on ``shard`` (None: nothing due) and
        when its first site at that priority joined its ready index (µs)."""
        if self._shard_best:
            self._shard_best[shard] = -math.inf if best is None else best
            self._shard_head[shard] = math.inf if head is None else head
            self._shard_best_at[shard] = time.monotonic()

    def _learn_pushed(self, shard: int, committed: Committed) -> None:
        """A commit of ``shard`` ran at ``committed.joined`` (µs, Redis
        clock). When this worker's pushes there raised the shard's best
        priority past what it had learnt (:meth:`enqueue_request`: its head
        is not known), the first site at that priority joined then at the
        latest: the shard's head from now on, so that it is ranked and cut
        against the other shards' heads by time (an unknown head ties with
        every other unknown one, and cuts no batch elsewhere)."""
        if (
            committed.joined is not None and any(committed.pushed)
            and self._shard_head and math.isinf(self._shard_head[shard])
            and not math.isinf(self._shard_best[shard])
        ):
            self._shard_head[shard] = committed.joined

    def _peek_stale(self) -> None:
        """With several shards, learn the best priority due on each shard not
        heard from for :data:`EMPTY_SHARD_RECHECK` seconds: one round trip
        (one pipeline per Redis node) of ``lease.lua`` calls that lease
        nothing (:meth:`Frontier.peek`), at most once a second, never on the
        hot path of every lease. They take nothing, so a lost reply needs no
        recovery: what they learnt is lost, and the shards are peeked at
        again once the backoff is over, before the next lease call (which
        would choose blind: in turn, its batch not cut). A peek that did
        not run (``NOSCRIPT``, ``MOVED``, ...) is sent once more after the
        scripts are loaded again (the slot map refreshed); another error
        (a refusal) is passed over: the lease call meets it and deals with
        it. A connection that fails is an outage (:meth:`_failed`: logged, the
        usual backoff; a configuration error stops the crawl), so no lease
        call follows it into a Redis that is down (it would be left in
        doubt); the peeks after the backoff find Redis again."""
        n = len(self._shard_best)
        if n <= 1 or self._in_doubt is not None or time.monotonic() < self._down_until:
            return
        now = time.monotonic()
        stale = [i for i in range(n) if now - self._shard_best_at[i] >= EMPTY_SHARD_RECHECK]
        if not stale:
            return
        for i in stale:
            self._shard_best_at[i] = now
        for attempt in (1, 2):
            try:
                not_run = self._peek(stale, now)
            except UNREACHABLE as exc:  # (a cluster's slot map may raise RedisClusterException)
                for i in stale:  # (peeked at again after the backoff)
                    self._shard_best_at[i] = -math.inf
                self._failed(exc)
                return
            # Scripts forgotten (a restart, a failover) or a slot moved: the
            # peeks that met it did not run. Once more after reloading them,
            # else those shards stay unknown for a second (asked in turn,
            # cutting no batch: first in, first out would not hold).
            if not not_run or attempt == 2 or not self._scripts_lost():
                return
            stale = not_run

    def _peek(self, stale: list[int], now: float) -> list[int]:
        """One round trip of peeks at the shards ``stale`` (see
        :meth:`_peek_stale`); learn what they tell.

        :returns: the shards whose peek did not run (``NOSCRIPT``, ``MOVED``,
            ...: :data:`~crawler.frontier.connection.NOT_RUN`).
        :raises redis.exceptions.RedisError: a connection failed.
        """
        shards = self.queue.shards
        not_run: list[int] = []
        for pipe, indices in shards.groups(stale):
            with pipe:
                for i in indices:
                    shards[i].peek(self.holder, pipe)
                replies = pipe.execute(raise_on_error=False)
            for i, reply in zip(indices, replies, strict=True):
                if isinstance(reply, Exception):
                    if isinstance(reply, NOT_RUN):
                        not_run.append(i)
                    continue
                result = Frontier.leases_of(reply, [])
                if isinstance(result, NotDue):
                    self._housekeeping(result, i)
                    self._learn_best(i, result.best, result.head)
                    if result.best is not None:  # (its wait: it was asked for nothing)
                        self._shard_due[i] = 0.0
                    elif result.wait is None:
                        self._shard_due[i], self._shard_empty_at[i] = None, now
                    else:
                        self._shard_due[i] = now + result.wait
        self._learn_unsent(stale)
        return not_run

    def _learn_unsent(self, shards: list[int]) -> None:
        """After a peek at ``shards``: the pushes of this worker still in
        its outbox were not in Redis when the peek ran (it goes before the
        round trip that commits them), so what the peek learnt leaves them
        out; note them again as :meth:`enqueue_request` did. Otherwise a
        worker whose first round trip carried its seeds (or whose peek of a
        shard came between a callback's push there and its commit) took a
        shard for empty, or its best for lower, for a second: a priority-9
        seed waited behind a whole other shard of priority-0 ones."""
        wanted = set(shards)
        for op in self._outbox:
            if op.kind == "pushes" and op.shard in wanted:
                self._note_push(op.shard, op.item.priority, ask_now=True)

    def _note_push(self, shard: int, priority: int, *, ask_now: bool = False) -> None:
        """What a push of ``priority`` to ``shard``, not yet committed, tells
        of that shard (several shards only): it has work, so it is asked again
        (when it was taken for empty, or, with ``ask_now``, whatever due time
        a peek just learnt without the push); and its best priority is at
        least ``priority``. A better one joins the shard's ready index after
        the heads learnt so far (at an equal priority, behind the head): its
        head is unknown until the commit's reply tells."""
        if self._shard_due and (ask_now or self._shard_due[shard] is None):
            self._shard_due[shard] = 0.0
        if self._shard_best and priority > self._shard_best[shard]:
            self._shard_best[shard] = priority
            self._shard_head[shard] = math.inf

    def _scripts_lost(self) -> bool:
        """Redis restarted (or failed over) and forgot the scripts, or a
        slot moved: refresh a cluster's slot map and load the scripts. What
        Redis holds may be older than what this worker recorded: the local
        fingerprints are forgotten.

        :returns: False when Redis could not be reached (an outage).
        """
        self._seen.clear()
        try:
            refresh = getattr(getattr(self.server, "nodes_manager", None), "initialize", None)
            if refresh is not None:
                refresh()  # a cluster's slot map
            self.queue.shards.load_scripts()
        except UNREACHABLE as exc:
            self._outage(exc)
            return False
        return True

    def _earliest_due(self) -> float | None:
        """``time.monotonic()`` when the first shard that has work becomes
        due (None: no shard had any queued when asked)."""
        dues = [due for due in self._shard_due if due is not None]
        return min(dues) if dues else None

    def _housekeeping(self, result: Lease | NotDue, shard: int) -> None:
        """Count what a lease call to ``shard`` did besides leasing; log what it met."""
        if result.expired:
            self.stats.inc_value("frontier/leases/returned", result.expired)
        if result.dead:
            self.stats.inc_value("frontier/dead", result.dead)
            logger.warning(
                "%d requests moved to the dead-letter list %s by the frontier "
                "(past FRONTIER_MAX_DELIVERIES, or unreadable)",
                result.dead, self.queue.shards[shard].key("dead"), extra={"spider": self.spider},
            )
        self._log_problems(result.problems)

    def _log_problems(self, problems: tuple[str, ...] | list[str]) -> None:
        for text in problems:
            if text not in self._problems:
                self._problems.add(text)
                self.stats.inc_value("frontier/problems")
                logger.warning("Bad value in Redis: %s", text, extra={"spider": self.spider})

    def _take(self, leases: list[Lease]) -> None:
        """Decode leased requests into the local buffer (undecodable ones
        become dead letters)."""
        for lease in leases:
            # (first: an undecodable entry's ack and dead letter go to its shard)
            self._lease_shards[lease.lease_id] = self.queue.shards.index_of(lease.site)
            try:
                request = self.queue.decode(lease.data, lease.site)
            except Exception as exc:  # whatever Redis held, never crash the worker
                self._dead_entry(lease.data, lease.lease_id, exc, lease.site)
                continue
            self._leases[request] = lease.lease_id
            self._publish_held()
            limit = self.queue.frontier.max_deliveries
            if limit > 1 and lease.deliveries >= max(2, limit):
                # (lease.lua leased it alone: its last chance)
                self._alone = lease.lease_id
                self.stats.inc_value("frontier/last_chance/leased")
            if self.queue.frontier.revisit_after_ms:
                self._entries[request] = (lease.data, lease.site)
            self._ready.append(request)
            if REVISIT_META in request.meta and not request.meta.get("retry_times"):
                self.stats.inc_value("frontier/revisits/leased")

    def _want(self) -> int:
        """Requests to lease at once: the downloader's free slots, at least 1."""
        engine = getattr(self.crawler, "engine", None)
        downloader: Any = getattr(engine, "downloader", None)
        try:
            total = int(downloader.total_concurrency)
            free = total - len(downloader.active) if total > 0 else self.lease_batch
        except (AttributeError, TypeError):
            return 1
        return max(1, min(self.lease_batch, free))

    def _hand_out(self) -> Request:
        self.stats.inc_value("scheduler/dequeued/redis")
        return self._ready.popleft()

    @property
    def next_due(self) -> float | None:
        """Seconds until a site or retry becomes due, as the last lease that
        found nothing due reported (None: nothing was queued then). The spider
        sleeps that long before it wakes the engine."""
        if self._due_at is None:
            return None
        return max(0.0, self._due_at - time.monotonic())

    def _download_ended(self, request: Request, **kwargs: Any) -> None:
        lease_id = self._leases.get(request)
        if lease_id is not None:
            shard = self._lease_shards.get(lease_id, 0)
            self._write("slots", item=lease_id, shard=shard)
            # Its slot frees, and with it this worker's share of the site:
            # worth a lease of its shard now, not when the last NotDue said.
            now = time.monotonic()
            due = self._shard_due[shard] if shard < len(self._shard_due) else None
            if due is not None and due > now:
                self._shard_due[shard] = now
            if self._due_at is not None and self._due_at > now:
                self._due_at = now

    def _finished(self, request: Request) -> None:
        self._entries.pop(request, None)
        lease_id = self._leases.pop(request, None)
        if lease_id is not None:
            self._write("acks", item=lease_id, shard=self._lease_shards.pop(lease_id, 0))
            self._publish_held()
            if not self._lease_shards and (self._drain_shard is not None or self._alone):
                self._due_at = time.monotonic()  # the drain is over: lease now

    def _beat(self) -> None:
        """The heartbeat (every third of ``FRONTIER_LEASE_TIMEOUT``): send the
        outbox, mark this worker live (``{s}:alive``) and extend the leases
        it holds.

        It also goes while an outage's backoff runs (up to
        ``OUTAGE_BACKOFF_CAP``, 30 s, past the outage's end): both writes
        are idempotent. When Redis answers, the backoff ends there, so the
        leases are extended and the worker goes on within a heartbeat of
        Redis's return, instead of its leases expiring (another worker would
        crawl them again) and the other workers' fair shares counting it
        dead; when Redis is still down, nothing changes (the outage is
        logged already). After a configuration error it sends nothing (the
        crawl is closing). A refused call is no outage: the heartbeat goes.
        """
        if not may_call_redis(self.crawler):
            self._publish_held()  # (the heartbeat thread extends them)
            return
        self.flush_outbox()
        probing = self._unreachable and time.monotonic() < self._down_until
        if probing and self._config_stopped:
            return  # a configuration error: no call until the crawl closes
        # Leases stay extended until their ack is in Redis (an ack refused
        # or in doubt waits in the outbox).
        held = self._held()
        if self._beater is not None:
            self._beater.hold(held)
        try:
            # (a node that restarted without the scripts gets them loaded:
            # FrontierShards._each)
            self.queue.shards.alive(self.holder)
            if held:
                self.queue.shards.extend(held)
        except UNREACHABLE as exc:
            if not probing:
                self._failed(exc)
            elif is_no_master(exc):  # (still a replica behind the endpoint)
                drop_connections(self.server)
            return
        if probing:
            logger.info("Redis answers the heartbeat: the outage's backoff ends",
                        extra={"spider": self.spider})
            self._down_until = 0.0
            self.flush_outbox()
        self._watch_evictions()

    def _held(self) -> dict[int, list[str]]:
        """The lease ids this worker holds, by shard: its leases, and those
        whose ack waits in the outbox (they stay extended until the ack is
        in Redis)."""
        held: dict[int, list[str]] = {}
        for lease_id in self._leases.values():
            held.setdefault(self._lease_shards.get(lease_id, 0), []).append(lease_id)
        for op in self._outbox:
            if op.kind == "acks":
                held.setdefault(op.shard, []).append(op.item)
        return held

    def _publish_held(self) -> None:
        """Hand the heartbeat thread the lease ids held now (a snapshot)."""
        if self._beater is not None:
            self._beater.hold(self._held())

    def _start_heartbeats(self) -> None:
        """Start both heartbeats, every third of ``FRONTIER_LEASE_TIMEOUT``:
        :meth:`_beat` on the reactor (it also sends the outbox and ends an
        outage's backoff), and :class:`HeartbeatThread`, with a Redis client
        of its own, which goes on while a callback blocks the reactor. Without
        one (a cluster that does not answer now) the reactor's heartbeat
        beats alone, and a callback that blocks the reactor longer than a
        lease loses the worker's leases."""
        self._heartbeat = create_looping_call(self._beat)
        self._heartbeat.start(max(0.1, self.lease_timeout / 3), now=False)
        try:
            client = get_redis(self.crawler.settings)
        except (RedisError, RedisClusterException, ValueError) as exc:
            logger.warning("No heartbeat thread (its Redis client failed: %s): "
                           "a callback that blocks the reactor for longer than "
                           "FRONTIER_LEASE_TIMEOUT loses this worker's leases", exc,
                           extra={"spider": self.spider})
            return
        self._beater = HeartbeatThread(
            self.queue.shards.frontiers, client, self.holder, max(0.1, self.lease_timeout / 3)
        )
        self._publish_held()
        self._beater.start()

    def _watch_evictions(self) -> None:
        """Check, in a thread, whether Redis evicted keys or may evict them
        (:meth:`crawler.frontier.eviction.EvictionWatch.check`: ``INFO``
        and ``CONFIG GET``, on the heartbeat's schedule, one check at a
        time); :meth:`_evictions_checked` handles the answer."""
        if self._eviction_call is not None or self.evicted is not None:
            return
        self._eviction_call = deferToThread(self.eviction.check)
        self._eviction_call.addCallbacks(self._evictions_checked, self._eviction_check_failed)

    def _evictions_checked(self, message: str | None) -> None:
        """Stop leasing when ``message`` says Redis evicted keys or may
        evict them: one ERROR line (``Configuration error: ...``), the
        spider closed with the reason ``config_error`` (its leases given
        back, ``scrapy crawl`` exits with status 1)."""
        self._eviction_call = None
        if message is None or self.evicted is not None:
            return
        self.evicted = message
        self.stats.set_value("frontier/evicted", 1)
        stop_on_config_error(self.crawler, message)

    def _eviction_check_failed(self, failure: Failure) -> None:
        """A failed eviction check: Redis being down is the heartbeat's to
        report (the next beat checks again); anything else is logged."""
        self._eviction_call = None
        if isinstance(failure.value, UNREACHABLE):
            logger.debug("Eviction check failed: %s", failure.value, extra={"spider": self.spider})
            return
        logger.error(
            "Eviction check failed: %s", failure.getErrorMessage(),
            exc_info=failure.value, extra={"spider": self.spider},
        )

    def has_pending_requests(self) -> bool:
        """Whether any request is queued, waiting for a retry or leased, anywhere.

        True while Redis is unreachable or writes are waiting to be sent, so
        a worker never closes for idleness during an outage. While requests
        are pending, it logs, once per change, the leases of silent (dead)
        workers it waits for and when they expire
        (:class:`~crawler.frontier.waiting.LeaseWaitLog`).
        """
        from crawler.frontier.waiting import LeaseWaitLog  # noqa: PLC0415

        if self._ready or not may_call_redis(self.crawler) or not self.flush_outbox():
            return True
        try:
            pending = self.queue.shards.pending() > 0
        except UNREACHABLE as exc:
            self._failed(exc)
            return True
        if pending:
            waits: LeaseWaitLog | None = getattr(self, "_lease_waits", None)
            if waits is None:
                waits = LeaseWaitLog(
                    self.queue.shards, self.holder, self.lease_timeout, self.spider
                )
                self._lease_waits = waits
            waits.check()  # never raises
        return pending

    def __len__(self) -> int:
        return len(self.queue)

    # -- revisits ------------------------------------------------------------------

    def _on_request_fetched(
        self, request: Request, validators: dict[str, str], **kwargs: Any
    ) -> None:
        """Commit a revisit of ``request`` with its ack, if this worker leased
        it (a request fetched outside the frontier, robots.txt say, is not
        revisited)."""
        entry = self._entries.get(request)
        if entry is None or not self.queue.frontier.revisit_after_ms:
            return
        try:
            # The request as it was queued: the headers and meta the
            # downloader middlewares add are this download's, not the next.
            queued = self.queue.decode(*entry)
            meta = {k: v for k, v in queued.meta.items() if k not in _NOT_REVISITED}
            meta[REVISIT_META] = dict(validators)
            data = self.queue.encode(
                queued.replace(meta=meta, headers=self._revisit_headers(queued))
            )
        except ValueError as exc:  # cannot happen for an entry that was decoded
            logger.error("Revisit not scheduled: %s", exc, extra={"spider": self.spider})
            return
        fingerprint = self.df.request_fingerprint(request)
        site = slot_of(request)
        self._write(
            "revisits", item=Revisit(data, site, request.priority, fingerprint),
            shard=self.queue.shards.index_of(site),
        )
        self.stats.inc_value("frontier/revisits/scheduled")

    def _revisit_headers(self, queued: Request) -> Headers:
        """``queued``'s headers less those the downloader middlewares add to
        each download (a redirect target is queued with them): the last
        conditional headers, ``Accept-Encoding`` and ``Cookie`` always,
        ``User-Agent`` and ``DEFAULT_REQUEST_HEADERS`` when they are the
        settings' values. So a revisit gets the settings of the worker that
        fetches it, and its entry stays small."""
        headers = queued.headers.copy()
        for name in (*_CONDITIONAL, b"Accept-Encoding", b"Cookie"):
            headers.pop(name, None)
        settings = self.crawler.settings
        defaults = {
            "User-Agent": settings.get("USER_AGENT"),
            **settings.getdict("DEFAULT_REQUEST_HEADERS"),
        }
        for name, value in defaults.items():
            if value is not None and headers.get(name) == to_bytes(str(value)):
                headers.pop(name, None)
        return headers

    # -- dead letters --------------------------------------------------------------

    def _on_request_dead(
        self, request: Request, reason: str, error: str | None = None, **kwargs: Any
    ) -> None:
        self.dead_letter(request, reason, error)

    def _on_spider_error(self, failure: Failure, response: Response, **kwargs: Any) -> None:
        request = getattr(response, "request", None)
        if request is not None:
            self.dead_letter(request, "callback raised", repr(failure.value))

    def dead_letter(self, request: Request, reason: str, error: str | None = None) -> None:
        """Record ``request`` in ``{s}:dead`` as JSON: url, reason, attempts,
        last error, time (Unix seconds), the encoded request and the priority
        it was first scheduled with (for requeue)."""
        try:
            encoded: str | None = self.queue.encode(request, compact=False).decode()
        except ValueError:
            encoded = None
        record = {
            "url": request.url,
            "reason": reason,
            "attempts": request.meta.get("retry_times", 0) + 1,
            "last_error": error,
            "time": time.time(),
            "request": encoded,
            # Before Scrapy's retries lowered it, by this crawl's own
            # RETRY_PRIORITY_ADJUST: what `scrapy deadletters requeue` restores.
            "first_priority": first_priority(
                request.priority, request.meta,
                self.crawler.settings.getint("RETRY_PRIORITY_ADJUST", -1),
            ),
        }
        self._dead(record, slot_of(request))
        logger.warning("Dead letter for %s: %s", request.url, reason)

    def _dead_entry(
        self, data: bytes, lease_id: str, exc: Exception, site: str | None = None
    ) -> None:
        """A leased entry that is no request here: a dead letter with the
        entry and its site (so ``scrapy deadletters requeue`` can send it back
        once the cause is fixed, e.g. its Request class made importable)."""
        reason = f"undecodable frontier entry: {type(exc).__name__}: {exc}"
        logger.error("%s", reason, extra={"spider": self.spider})
        record = {"url": None, "reason": reason, "attempts": 0, "last_error": repr(exc),
                  "time": time.time(), "request": None, "entry": data.decode("latin-1")}
        if site is not None:
            record["site"] = site
        shard = self._lease_shards.pop(lease_id, 0)
        self._dead(record, site, shard)
        self._write("acks", item=lease_id, shard=shard)

    def _dead(self, record: dict[str, Any], site: str | None, shard: int | None = None) -> None:
        """Queue a dead letter for the shard of ``site`` (or ``shard``)."""
        if shard is None:
            shard = 0 if site is None else self.queue.shards.index_of(site)
        self._write("dead", item=json.dumps(record, default=str).encode(), shard=shard)
        self.stats.inc_value("frontier/dead")

    # -- outbox and outages --------------------------------------------------------

    def _write(
        self,
        kind: str,
        *,
        item: Any = None,
        done: Callable[[], object] | None = None,
        request: Request | None = None,
        shard: int = 0,
    ) -> None:
        self._outbox.append(_Op(kind, item, done, request, shard))
        if self._flush_call is None:
            self._flush_call = call_later(self.outbox_delay, self._flush_soon)

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once every write queued so far is in Redis.

        The callback runs on the reactor thread right after the transaction
        that carried those writes was committed (the reply was read); never
        when they could not be sent (Redis down at close, a killed worker).
        The spider uses it to let go of seeds only once they are in the
        frontier.
        """
        self._write("after_commit", done=callback)

    def _flush_soon(self) -> None:
        self._flush_call = None
        if not self.flush_outbox() and self._outbox:
            wait = max(0.05, self._down_until - time.monotonic())
            self._flush_call = call_later(wait, self._flush_soon)

    def flush_outbox(self) -> bool:
        """Send queued writes: one commit per shard they go to, in one round
        trip (one pipeline per Redis Cluster master).

        Acks held back (:meth:`_batches`) go in a second round trip, once
        the first is answered.

        :returns: False when Redis could not be reached (the writes stay
            queued and are tried again after a backoff).
        """
        if not self._outbox:
            return True
        sent = self._exchange(None)
        if sent is None and self._acks_held and self._in_doubt is None and all(
            op.kind in ("acks", "after_commit") for op in self._outbox
        ):
            # The writes before them are in; no write carrying a request is
            # left, so none is held this time.
            sent = self._exchange(None)
        return sent is not None

    @overload
    def _exchange(self, lease_ids: None, shard: int = 0) -> bool | None: ...

    @overload
    def _exchange(
        self, lease_ids: list[str], shard: int = 0
    ) -> list[Lease] | NotDue | None: ...

    def _exchange(
        self, lease_ids: list[str] | None, shard: int = 0
    ) -> list[Lease] | NotDue | bool | None:
        """Send the outbox (one ``commit.lua`` call per shard it has writes
        for) and, with ``lease_ids``, lease from ``shard`` after it: one
        round trip.

        A call whose reply was lost is found out first (:meth:`_resolve`);
        scripts Redis forgot (a restart, a failover) are loaded and the calls
        that met ``NOSCRIPT``, which did not run, are sent once more; so is
        a lease that ran but found nothing due before a commit of its shard
        that did not run (what that commit queues is leased at once). A
        call that a Redis Cluster did not serve twice (``CLUSTERDOWN``,
        ``TRYAGAIN``: :data:`~crawler.frontier.connection.CLUSTER_BUSY`) is an outage: backoff, a
        warning, ``frontier/redis/outages``.

        :returns: None when Redis could not be reached, refused the call or
            left it in doubt (the writes stay queued); else the lease's
            result, or True when none was asked.
        """
        if time.monotonic() < self._down_until or not self._may_call_redis():
            return None
        if self._in_doubt is not None and not self._resolve():
            return None
        asked, result, ids = lease_ids is not None, None, lease_ids
        for attempt in (1, 2):
            step = self._round_trip(lease_ids, shard)
            if step is None:  # unreachable, in doubt, or refused
                return None
            not_run, leased = step
            if leased is not None:
                result, lease_ids = leased, None
                if isinstance(leased, NotDue) and shard in not_run and attempt == 1:
                    # It ran before a commit of its shard that did not:
                    # "nothing due" may be out of date once that commit
                    # runs. It leased nothing, so it goes again after it,
                    # under the same ids.
                    self._housekeeping(leased, shard)
                    result, lease_ids = None, ids
            if not not_run:
                break
            if attempt == 2:
                if self._busy is not None:
                    # The cluster still does not serve the slot (a master
                    # rejoining, every slot once one is marked failed): an
                    # outage, waited out with backoff, not tried again at
                    # every flush.
                    self._outage(self._busy)
                    return None
                break
            # Redis restarted (or failed over) and forgot the scripts, or a
            # slot moved: the calls that met it did not run.
            if not self._scripts_lost():
                break
        if asked:
            return result
        return None if any(op.kind != "after_commit" for op in self._outbox) else True

    def _round_trip(
        self, lease_ids: list[str] | None, shard: int = 0
    ) -> tuple[set[int | None], list[Lease] | NotDue | None] | None:
        """One round trip: each shard's commit of the outbox, then the lease
        call on ``shard``.

        :returns: None when Redis could not be reached (the calls are then
            in doubt) or refused one; else the calls that did not run and may
            be sent again (``NOSCRIPT``, ``MOVED``, ...): the shards of such
            commits, and None for such a lease; and the lease's result (None
            when not asked or not run).
        """
        groups, batches = self._batches()
        if self._acks_held and lease_ids is not None and self._flush_call is None:
            self._flush_call = call_later(self.outbox_delay, self._flush_soon)  # (for them)
        if batches:
            self._seq += 1
            for batch in batches.values():
                batch.marker = (self.holder, self._seq)
        lease = None if lease_ids is None else (shard, lease_ids)
        try:
            committed, leased = self._send(batches, lease)
        except UNREACHABLE as exc:  # sent or not, its reply is lost
            if batches or lease_ids is not None:
                self._in_doubt = _InDoubt(
                    self._seq if batches else None,
                    {i: groups[i] for i in batches},
                    list(lease_ids or []),
                    shard,
                )
                self.stats.inc_value("frontier/redis/in_doubt")
            self._outage(exc)
            return None
        for i, reply in committed.items():
            if isinstance(reply, Committed):
                self._done(groups[i], reply)
                self._shard_due[i] = 0.0  # new work or free slots there: ask it
                self._learn_pushed(i, reply)
        self._settle()
        result = Frontier.leases_of(leased, lease_ids or []) if isinstance(leased, list) else None
        errors = [r for r in (*committed.values(), leased) if isinstance(r, ResponseError)]
        no_master = next((r for r in errors if is_no_master(r)), None)
        if no_master is not None:
            # A failover: the pooled connections may reach the demoted
            # master. The calls did not run (NOT_RUN); they go once more
            # through new connections, then it is an outage.
            drop_connections(self.server)
            self.stats.inc_value("frontier/redis/no_master")
            logger.warning(
                "Redis is no master (%s): a failover; connections dropped, %d writes kept, "
                "sent again through %s", no_master, len(self._outbox),
                redis_location(self.crawler.settings), extra={"spider": self.spider},
            )
        self._busy = next(
            (r for r in errors if isinstance(r, CLUSTER_BUSY) or is_no_master(r)), None
        )
        refused = next((r for r in errors if not isinstance(r, NOT_RUN)), None)
        if refused is not None:
            self._refused(refused)
            return None if result is None else (set(), result)
        if not errors or (
            # (commits that ran beside one a cluster did not serve end no
            # outage: its backoff goes on doubling, not back to 0.5 s)
            self._busy is None and any(isinstance(r, Committed) for r in committed.values())
        ):
            self._recovered()
        not_run: set[int | None] = {
            i for i, r in committed.items() if isinstance(r, ResponseError)
        }
        if isinstance(leased, ResponseError):
            not_run.add(None)
        return not_run, result

    def _batches(self) -> tuple[dict[int, list[_Op]], dict[int, Commit]]:
        """The outbox's writes by shard, and the commit of each shard that
        has anything to send.

        An ack is held back (left in the outbox, counted in
        ``_acks_held``) while a write queued before it for another shard
        carries a request (a push, retry, dead letter, revisit or
        give-back; not a freed slot, not another ack): the commits of one
        round trip to several shards are not atomic together (a round trip
        cut midway, a Redis Cluster master down), and a page's ack must
        never be in Redis before the requests its page yielded, on any
        shard (else a stop before they are sent loses them). The page of a
        write is not known, so every earlier write for another shard
        counts. Such writes are never held, so once the round trip that
        carries them is answered the acks held go, in the next round trip:
        :meth:`flush_outbox` sends it at once, and a round trip with a
        lease call leaves them to the flush it schedules. Writes for one shard are
        sent in outbox order apart from held acks: an ack ends its lease,
        a write after it never needs it ended. One shard, or writes for the
        ack's shard alone before it: nothing is held (the ack goes in the
        same atomic commit as the requests before it).
        """
        groups: dict[int, list[_Op]] = {}
        carrying: set[int] = set()  # shards with a request-carrying write so far
        self._acks_held = 0
        for op in self._outbox:
            if op.kind == "after_commit":
                continue
            if op.kind == "acks" and carrying - {op.shard}:
                self._acks_held += 1
                continue
            if op.kind not in ("acks", "slots"):
                carrying.add(op.shard)
            groups.setdefault(op.shard, []).append(op)
        batches: dict[int, Commit] = {}
        for i, ops in groups.items():
            batch = self._commit_of(ops)
            if batch:
                batches[i] = batch
            else:  # only slots of leases acked in the same outbox: nothing to send
                self._done(ops, None)
        return groups, batches

    @staticmethod
    def _commit_of(ops: list[_Op]) -> Commit:
        """The :class:`Commit` that carries ``ops`` (an ack frees its lease's
        slot too, so a slot op of an acked lease is left out)."""
        batch = Commit()
        acks = {op.item for op in ops if op.kind == "acks"}
        for op in ops:
            if op.kind == "after_commit" or (op.kind == "slots" and op.item in acks):
                continue
            getattr(batch, op.kind).append(op.item)
        return batch

    def _send(
        self, batches: dict[int, Commit], lease: tuple[int, list[str]] | None
    ) -> tuple[dict[int, Committed | ResponseError], list[Any] | ResponseError | None]:
        """Send the commits ``batches`` (by shard) and the lease call
        (``(shard, lease ids)``), never twice: one pipeline on one Redis, one
        per master on a cluster (the lease's last).

        :returns: each commit's reply by shard and the lease's reply (None
            when not sent), a :class:`ResponseError` where a script answered
            one.
        :raises redis.exceptions.RedisError: a connection failed, or
            (:exc:`~crawler.frontier.replicas.NotReplicated`) fewer replicas
            than ``FRONTIER_MIN_REPLICAS`` acknowledged the calls: whether
            they survive is unknown.
        """
        if not batches and lease is None:
            return {}, None
        shards = self.queue.shards
        wanted = [i for i in batches if lease is None or i != lease[0]]
        if lease is not None:
            wanted.append(lease[0])  # last: it sees the slots freed before it
        committed: dict[int, Committed | ResponseError] = {}
        leased: list[Any] | ResponseError | None = None
        groups = shards.groups(wanted)
        if lease is not None:  # the lease's pipeline last
            groups.sort(key=lambda group: lease[0] in group[1])
        for pipe, indices in groups:
            calls: list[tuple[str, int]] = []
            with pipe:
                for i in indices:
                    if i in batches:
                        shards[i].commit(batches[i], client=pipe)
                        calls.append(("commit", i))
                    if lease is not None and i == lease[0]:
                        # (the slots it holds there: lease.lua passes over
                        # at most that many sites where it has its share)
                        held = sum(1 for s in self._lease_shards.values() if s == i)
                        least, joined = self._best_elsewhere(i)
                        if joined is not None:  # (FRONTIER_FIFO_SLACK)
                            joined += self.fifo_slack_us
                        drained_for, hint = None, self._drained_for
                        if hint is not None and hint[0] == i and not self._lease_shards:
                            drained_for, self._drained_for = hint[1], None
                        shards[i].lease_many(
                            lease[1], client=pipe, held=held, least=least, least_joined=joined,
                            held_all=len(self._lease_shards), drained_for=drained_for,
                        )
                        calls.append(("lease", i))
                replies = self._execute(pipe, shards[indices[0]].replica_wait)
            for (call, i), reply in zip(calls, replies, strict=True):
                if call == "lease":
                    leased = reply
                else:
                    committed[i] = (
                        reply if isinstance(reply, ResponseError) else Committed.of(reply)
                    )
        return committed, leased

    @staticmethod
    def _execute(pipe: Any, wait: ReplicaWait | None = None) -> list[Any]:
        """``pipe.execute``, each script's error in its place; with ``wait``
        (``FRONTIER_MIN_REPLICAS``), ``WAIT`` after the calls, its reply
        checked unless every call was refused (nothing was written).

        :raises redis.exceptions.RedisError: a connection failed, or too few
            replicas acknowledged (:exc:`~crawler.frontier.replicas.NotReplicated`):
            whether the calls survive is unknown.
        """
        if wait is not None:
            wait.queue(pipe)
        try:
            replies: list[Any] = pipe.execute(raise_on_error=False)
        except RedisClusterException as exc:  # no RedisError, but unreachable
            raise RedisConnectionError(str(exc)) from exc
        waited = replies.pop() if wait is not None else None
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                raise reply  # a connection error in the replies: lost
        if wait is not None and not all(isinstance(r, ResponseError) for r in replies):
            wait.check(waited)
        return replies

    def _done(self, ops: list[_Op], committed: Committed | None) -> None:
        """The writes ``ops`` (one shard's commit) are in Redis.

        ``committed`` is the commit's reply; None when there was no commit,
        or when its reply was lost and Redis only told that it ran (then
        which pushes were duplicates is not known, and the log says so).
        """
        sent = {id(op) for op in ops}
        self._outbox[:] = [op for op in self._outbox if id(op) not in sent]
        pushes = [op for op in ops if op.kind == "pushes"]
        if committed is None:
            if pushes:
                logger.info(
                    "The reply to a frontier commit was lost; it ran, but which of its %d "
                    "new requests were queued and which were filtered as duplicates is not "
                    "known: they are not counted in scheduler/enqueued/redis or "
                    "dupefilter/filtered, nor logged as duplicates",
                    len(pushes), extra={"spider": self.spider},
                )
            return
        # One flag per push, in the order of the ops (_commit_of keeps it).
        for op, queued in zip(pushes, committed.pushed, strict=False):
            if queued:
                continue
            if op.request is None:
                self.stats.inc_value("dupefilter/filtered")
                continue
            self.df.log(op.request, self.spider)
            self.crawler.signals.send_catch_log(
                signals.request_dropped, request=op.request, spider=self.spider
            )
        for key, n in (
            ("scheduler/enqueued/redis", sum(committed.pushed)),
            ("frontier/leases/acked", committed.acked),
        ):
            if n:
                self.stats.inc_value(key, n)
        self._log_problems(committed.problems)

    def _settle(self) -> None:
        """Run the ``after_commit`` callbacks that no unsent write precedes
        any more (every write queued before them is in Redis)."""
        while self._outbox and self._outbox[0].kind == "after_commit":
            op = self._outbox.pop(0)
            if op.done is not None:
                try:
                    op.done()
                except Exception:  # a callback's failure is its own
                    logger.exception("after_commit callback failed")

    def _resolve(self) -> bool:
        """Find out what the round trip whose reply was lost did, shard by
        shard, and go on from there: the writes of each commit that ran
        leave the outbox (the others are sent again), and the leases it
        took are handed out.

        :returns: False while Redis cannot tell (still unreachable).
        """
        doubt = self._in_doubt
        assert doubt is not None
        shards = self.queue.shards
        asked = sorted({*doubt.commits, *([doubt.lease_shard] if doubt.lease_ids else [])})
        found: dict[int, tuple[bool, list[Lease]]] = {}
        try:
            for i in asked:
                found[i] = shards[i].recover(
                    self.holder,
                    doubt.seq if i in doubt.commits else None,
                    doubt.lease_ids if doubt.lease_ids and i == doubt.lease_shard else [],
                )
        except UNREACHABLE as exc:
            self._failed(exc)
            return False
        self._in_doubt = None
        for i in asked:
            if i < len(self._shard_best_at):
                # (its best and head as learnt before the call, which may
                # have leased that head, or queued a site whose join time
                # the lost reply told: peeked at again before it is chosen)
                self._shard_best_at[i] = -math.inf
        ran = [i for i in doubt.commits if found[i][0]]
        for i in ran:
            self._done(doubt.commits[i], None)
        if ran:
            self._recovered()
        self._settle()
        leases = [lease for _, taken in found.values() for lease in taken]
        self._take(leases)
        logger.info(
            "A frontier call's reply was lost; found out: %s, %d leases taken",
            "no commit" if doubt.seq is None else (
                "committed" if len(ran) == len(doubt.commits)
                else f"{len(ran)} of {len(doubt.commits)} shard commits ran"
                if ran else "not committed"
            ),
            len(leases), extra={"spider": self.spider},
        )
        return True

    def _failed(self, exc: Exception) -> None:
        """A Redis call outside the outbox failed: a configuration error (see
        :meth:`_config_error`), a refusal (a key of the wrong type answers an
        error) or an outage. A reply that says the call did not run
        (:data:`~crawler.frontier.connection.NOT_RUN`: a cluster not serving
        the slot, or ``NOSCRIPT`` from a server that restarted between the
        pipeline's script check and its call; the next pipeline loads the
        scripts again) is an outage too, never logged as a refusal."""
        if self._config_error(exc):
            return
        if (
            isinstance(exc, ResponseError)
            and not isinstance(exc, NOT_RUN)
            and not is_no_master(exc)
        ):
            self._refused(exc)
        else:
            self._outage(exc)

    def _refused(self, exc: ResponseError) -> None:
        """A script refused a call before it wrote anything: no outage, but
        nothing to do until the key it names is fixed. (An ACL's ``NOPERM``
        is a configuration error: :meth:`_config_error`; a server that is
        no master is an outage: :meth:`_outage`.)"""
        if is_no_master(exc):
            self._outage(exc)
            return
        if self._config_error(exc):
            return
        self.stats.inc_value("frontier/redis/refused")
        self._unreachable = False
        self._backoff = min(OUTAGE_BACKOFF_CAP, max(0.5, self._backoff * 2))
        self._down_until = time.monotonic() + self._backoff
        logger.error(
            "Redis refused a frontier call (%s); %d writes kept; trying again in %.1fs",
            exc, len(self._outbox), self._backoff, extra={"spider": self.spider},
        )

    def _outage(self, exc: Exception) -> None:
        """Redis could not be reached, or answered too late: wait with
        doubling pauses. (A refused password is a configuration error,
        although redis-py raises it as a ``ConnectionError``:
        :meth:`_config_error`.)

        A server that is no master (``READONLY``, ``LOADING``, ``MASTERDOWN``,
        ``UNBLOCKED``: :func:`~crawler.frontier.connection.is_no_master`, a
        failover) is an outage too: the pooled connections are dropped, so
        that the next call reaches whatever master the configured address
        names by then; the writes stay in the outbox."""
        if self._config_error(exc):
            return
        failover = is_no_master(exc)
        if failover:
            drop_connections(self.server)
        if isinstance(exc, NotReplicated):
            self.stats.inc_value("frontier/redis/not_replicated")
        # Redis may come back from an older snapshot, without fingerprints
        # this worker recorded: ask it again rather than trust the memory.
        self._seen.clear()
        self._unreachable = True
        self.redis_health.failed()
        if not self._backoff:
            self.stats.inc_value("frontier/redis/outages")
        self._backoff = min(OUTAGE_BACKOFF_CAP, max(0.5, self._backoff * 2))
        self._down_until = time.monotonic() + self._backoff
        logger.warning(
            "Redis %s (%s); %d writes waiting; trying again in %.1fs",
            "is no master (a failover): connections dropped" if failover
            else "has too few replicas" if isinstance(exc, NotReplicated) else "unreachable",
            exc, len(self._outbox), self._backoff, extra={"spider": self.spider},
        )

    def _stop_at_open(self, message: str) -> None:
        """Report the configuration error ``message`` (one log line) and
        close the spider once it is open, with no Redis call meanwhile.

        Raised now, CloseSpider would skip the rest of Scrapy's start-up
        (the item pipelines), whose close then fails: it is raised once the
        spider is open instead."""
        self._close_spider = close_at_open(self.crawler, message)
        self.crawler.signals.connect(self._close_at_open, signal=signals.spider_opened)
        self._config_stopped = True
        self._unreachable = True
        self._down_until = time.monotonic() + CONFIG_ERROR_PAUSE

    def _close_at_open(self) -> None:
        """``spider_opened`` handler after a configuration error at open."""
        raise self._close_spider

    def _config_error(self, exc: Exception) -> bool:
        """Stop the crawl if ``exc`` is a configuration error of Redis.

        A wrong password (after a rotation, say), a database that cannot be
        selected or an ACL that forbids a command or key the crawler needs
        is no outage: no backoff fixes it, and this process cannot get new
        credentials. The error is logged in one line (password masked), the
        spider is closed with the finish reason ``config_error`` (the
        ``crawl`` command then exits non-zero), and this worker sends no
        more frontier calls: the writes waiting in its outbox are given up,
        as a killed worker's are (the leases they would have acknowledged
        expire and are crawled again by the other workers; seeds stay in
        their intake batch and are returned), so nothing is lost.

        :returns: whether ``exc`` was one (then the caller does nothing more).
        """
        message = config_error_message(exc, self.crawler.settings)
        if message is None:
            return False
        given_up = sum(op.kind != "after_commit" for op in self._outbox)
        self._outbox.clear()
        self._in_doubt = None
        self._seen.clear()
        self._config_stopped = True
        self._unreachable = True
        self._backoff = OUTAGE_BACKOFF_CAP
        self._down_until = time.monotonic() + CONFIG_ERROR_PAUSE
        stop_on_config_error(self.crawler, message)
        if given_up and not getattr(self, "_gave_up", False):
            self._gave_up = True
            logger.warning(
                "Gave up %d frontier writes: the leases they would have acknowledged "
                "expire and are crawled again by the other workers",
                given_up, extra={"spider": self.spider},
            )
        return True

    def _recovered(self) -> None:
        if self._backoff:
            logger.info("Redis reachable again", extra={"spider": self.spider})
        self._backoff = 0.0
        self._down_until = 0.0
        self._unreachable = False
        self.redis_health.recovered()

    def _may_call_redis(self) -> bool:
        """:func:`~crawler.frontier.health.may_call_redis`; when the gate
        holds the call because another component (the seed reader, the
        robots.txt middleware) met an outage first, say so once, as
        :meth:`_outage` does for the scheduler's own calls."""
        if may_call_redis(self.crawler):
            return True
        if self._unreachable or not self.redis_health.failing:
            return False
        self._unreachable = True
        self._backoff = max(self._backoff, 0.5)
        self.stats.inc_value("frontier/redis/outages")
        logger.warning(
            "Redis unreachable (met by another component of this worker); %d writes "
            "waiting; trying again once Redis answers a probe",
            len(self._outbox), extra={"spider": self.spider},
        )
        return False

    def _ping(self) -> None:
        """``PING`` Redis (the probe of :class:`RedisHealth`, in its thread)."""
        self.server.ping()

    def _redis_answered(self) -> None:
        """A probe sent during an outage was answered (reactor thread): end
        the backoff, so that the outbox and the leases go on now."""
        if self._unreachable and not self._config_stopped:
            logger.info("Redis answers a probe: the outage's backoff ends",
                        extra={"spider": self.spider})
            self._down_until = 0.0
            self._wake_engine()
