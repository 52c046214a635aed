"""The shared scheduler: scrapy-redis's Scheduler with leases and an outbox.

:class:`FrontierScheduler` is the class Scrapy loads (``SCHEDULER``): a thin
adapter between Scrapy's engine and signals and the parts it delegates to,
as Scrapy's own scheduler delegates to its queues:

* :class:`~crawler.frontier.outbox.Outbox`: writes queued, then sent in
  batches (one commit per shard);
* :class:`~crawler.frontier.session.Session`: round trips, never a call
  sent twice, lost replies found out, Redis's health and the backoff
  (:mod:`crawler.frontier.backoff`);
* :class:`~crawler.frontier.router.ShardRouter`: which shard the next lease
  call goes to, and where its batch stops;
* :class:`~crawler.frontier.leasebook.LeaseBook`: the leases held, their
  buffer, acks, freed slots, give-backs and the last-chance rule;
* :class:`~crawler.frontier.opening.Opening`: the checks and set-up at
  open (configuration errors, scrapy-redis spiders, ``start_urls``);
* :class:`~crawler.frontier.heartbeat.Heartbeats`: the heartbeats on the
  reactor and in a thread, which keep the leases held;
* :class:`~crawler.frontier.eviction.EvictionWatch`: a Redis that evicts
  keys stops the crawl;
* :class:`~crawler.frontier.revisits.Revisits` and
  :class:`~crawler.frontier.deadletters.DeadLetters`: what a fetched
  request and a request given up become.

The adapter keeps what is Scrapy's: ``open`` and ``close`` (and a forced
stop), ``enqueue_request`` (encoding, the local dupefilter memory),
``next_request`` (waking the engine), ``has_pending_requests``, and the
engine's hooks (a download ended, a request finished).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy_redis.scheduler import Scheduler

from crawler.config import FrontierConfig
from crawler.frontier import serializer as json_serializer
from crawler.frontier.backoff import CONFIG_ERROR_PAUSE, OUTAGE_BACKOFF_CAP, UNREACHABLE
from crawler.frontier.closing import Closing
from crawler.frontier.compat import scheduler_options
from crawler.frontier.connection import get_redis, redis_location
from crawler.frontier.deadletters import (
    DEFAULT_PRIORITY_ADJUST,
    DeadLetters,
    first_priority,
    whole_number,
)
from crawler.frontier.enqueuer import Enqueuer
from crawler.frontier.eviction import EvictionWatch
from crawler.frontier.feedstop import warn_remote_feeds
from crawler.frontier.forcedstop import before_reactor_stops
from crawler.frontier.health import may_call_redis
from crawler.frontier.heartbeat import Heartbeats
from crawler.frontier.leasebook import REVISIT_META, LeaseBook
from crawler.frontier.opening import Opening
from crawler.frontier.outbox import Op, Outbox
from crawler.frontier.redis_seeds import DurableSeeds
from crawler.frontier.reports import Reports
from crawler.frontier.revisits import Revisits
from crawler.frontier.router import EMPTY_SHARD_RECHECK, ShardRouter
from crawler.frontier.session import Session
from crawler.frontier.shards import ShardCountError
from crawler.frontier.signals import RETRY_DELAY_META
from crawler.frontier.store import Committed, Lease, NotDue
from crawler.frontier.wakeup import WakeUp

if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from typing import Self

    from scrapy.crawler import Crawler

    from crawler.frontier.queue import LeasedPriorityQueue
    from crawler.frontier.stuck import Stuck

logger = logging.getLogger(__name__)

#: Names other modules import from here (their homes are the parts).
__all__ = [
    "CONFIG_ERROR_PAUSE", "DEFAULT_PRIORITY_ADJUST", "EMPTY_SHARD_RECHECK",
    "OUTAGE_BACKOFF_CAP", "RETRY_DELAY_META", "REVISIT_META", "UNREACHABLE",
    "FrontierScheduler", "first_priority", "whole_number",
]


class FrontierScheduler(Scheduler):  # type: ignore[misc]
    """One leased Redis frontier shared by every worker of a crawl.

    Requests go to :class:`~crawler.frontier.queue.LeasedPriorityQueue`
    (``SCHEDULER_QUEUE_CLASS``); the dupefilter (``DUPEFILTER_CLASS``) gives
    the fingerprints and the set's key. scrapy-redis's settings keep their
    names: ``SCHEDULER_PERSIST``, ``SCHEDULER_FLUSH_ON_START``,
    ``SCHEDULER_SERIALIZER`` (default here: JSON; never pickle unless named;
    :func:`crawler.frontier.compat.scheduler_options`).

    **Leases.** :meth:`next_request` leases a request. Its site's download
    slot (politeness) is freed when the download ends; the lease ends (one
    ``ack``) when Scrapy's engine has finished with the request: its response
    went through the callback, every item it yielded went through the item
    pipelines (:class:`~crawler.pipelines.MongoPipeline` returns only once an
    item is stored) and every request it yielded was queued, or its failure
    was handled. Leases held are extended every ``FRONTIER_LEASE_TIMEOUT / 3``
    seconds, also while a callback blocks the reactor
    (:class:`~crawler.frontier.heartbeat.Heartbeats`); a killed worker's
    leases expire and any worker returns them to the queue. At close, leases
    not finished are given back (:class:`~crawler.frontier.closing.Closing`).
    Lease ids are ``<worker id>#<nonce>:<n>``, so a worker restarted under
    the same id never takes over a dead process's leases.

    **Batches.** A lease call takes up to ``FRONTIER_LEASE_BATCH`` requests,
    no more than the downloader has free slots for, into a local buffer
    that the engine's next calls drain; buffered requests are leased like
    the others (extended, given back at close). With several shards a
    batch stops before a lower priority than another shard's best, and
    before a site that joined its shard's ready index more than
    ``FRONTIER_FIFO_SLACK`` seconds (default 0) after another shard's first
    site of that priority (first in, first out across shards). Each worker
    remembers the last ``FRONTIER_LOCAL_SEEN`` fingerprints it recorded in
    the shared dupefilter and drops a repeat of one (``enqueue_request``
    returns False) without asking Redis: the shared dupefilter only grows
    while a crawl runs, so what this worker recorded there stays seen. Redis
    coming back from an outage, a restart or a failover may hold an older
    dupefilter, so the memory is cleared whenever Redis could not be reached
    or had forgotten the scripts.

    **Writes.** Every write (new requests, retries, dead letters, freed
    slots, acks, leases given back, revisits) is queued in the
    :class:`~crawler.frontier.outbox.Outbox` and sent as one atomic commit
    per shard, pipelined with the next lease call or on its own
    ``FRONTIER_OUTBOX_DELAY`` seconds later: a batch of seeds is queued
    atomically, and a lease is acknowledged only with or after the requests
    its callback yielded (a worker killed with writes unsent loses the ack
    with the requests, and its lease is crawled again). The
    :class:`~crawler.frontier.session.Session` never sends a call twice,
    finds out what a call whose reply was lost did before it sends anything
    else, waits out an outage with backoff (nothing is dropped, the worker
    keeps running) and logs a call a script refused (a key of the wrong type:
    nothing was written), sending it again after a backoff until the key is
    fixed. Bad values the scripts met and worked around are logged once each
    (:class:`~crawler.frontier.reports.Reports`).

    **Retries, dead letters, revisits.** A request whose meta has
    ``frontier_retry_delay`` goes to the retry set for that many seconds. A
    request given up (signal :data:`~crawler.frontier.signals.request_dead`),
    one whose callback raised, and a leased entry that cannot be decoded
    become dead letters in ``{s}:dead``
    (:class:`~crawler.frontier.deadletters.DeadLetters`). With
    ``FRONTIER_REVISIT_AFTER`` > 0 a leased request reported fetched is
    committed with its ack as a conditional revisit
    (:class:`~crawler.frontier.revisits.Revisits`); a lease call queues due
    revisits past the dupefilter, and revisits not due are not pending work.

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
    ``frontier/revisits/leased`` (revisits this worker leased),
    ``frontier/evicted``, ``frontier/start_urls/dropped``,
    ``frontier/last_chance/leased``, ``frontier/last_chance/drains``.
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
    #: The worker closes for idleness with requests that only wait
    #: (:meth:`stuck`, :meth:`let_go`): nothing more is leased.
    letting_go: bool = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the scheduler and its dupefilter; connect to Redis lazily."""
        settings = crawler.settings
        kwargs, dupefilter_path, refused = scheduler_options(settings)
        kwargs.setdefault("serializer", json_serializer)
        kwargs["dupefilter"] = build_from_crawler(load_object(dupefilter_path), crawler)
        scheduler = cls(server=get_redis(settings), **kwargs)
        scheduler.refused = "; ".join(refused)
        scheduler.stats = crawler.stats
        scheduler.crawler = crawler
        config = FrontierConfig.of(crawler)
        scheduler.lease_timeout = config.lease_timeout
        scheduler.worker_id = config.worker
        # One holder per process: a worker restarted under the same id gets
        # lease ids of its own.
        scheduler.holder = f"{scheduler.worker_id}#{os.urandom(4).hex()}"
        scheduler.lease_batch = max(1, config.lease_batch)
        scheduler.fifo_slack_us = round(max(0.0, config.fifo_slack) * 1_000_000)
        scheduler.seen_max = max(0, config.local_seen)
        scheduler.outbox_delay = max(0.0, config.outbox_delay)
        scheduler.eviction = EvictionWatch(
            scheduler.server, redis_location(settings), allowed=config.allow_eviction,
            crawler=crawler,
        )
        scheduler._setup_state()
        return scheduler

    def _setup_state(self) -> None:
        #: The parts (see the module's docstring).
        self.outbox = Outbox(self.outbox_delay, self.flush_outbox, lambda: self.session.down_until)
        self.session = Session(self.server, self.crawler, self.holder, self.outbox, self)
        self.reports = Reports(self.crawler, self.df)
        self.router = ShardRouter(self.holder, self.session, self.outbox, self.reports.lease_result)
        self.enqueuer = Enqueuer(self.df, self.outbox, self.router, self.stats, self.seen_max)
        self.wakeup = WakeUp(self.crawler)
        self.dead_letters = DeadLetters(self.outbox, self.stats, self.crawler.settings, self.holder)
        self.heartbeats = Heartbeats(
            self.crawler, self.session, self.holder, self.lease_timeout,
            flush=self.flush_outbox, after_beat=self.eviction.watch,
        )
        self.book = LeaseBook(
            self.holder, self.outbox, self.stats, self.dead_letters.entry,
            self.heartbeats.publish_held,
        )
        self.dead_letters.lease_shards = self.book.lease_shards
        self.heartbeats.book = self.book
        self.revisits = Revisits(self.book, self.outbox, self.df, self.stats, self.crawler.settings)
        self.opening = Opening(self.crawler, self.server, self.session, self.eviction, self.holder)
        self.closing = Closing(
            self.crawler, self.session, self.book, self.heartbeats, self.outbox,
            holder=self.holder, lease_timeout=self.lease_timeout, flush=self.flush_outbox,
        )
        #: Gates synchronous Redis calls on the running reactor's thread
        #: during an outage and once the spider is closing (health.py).
        self.redis_health = self.session.redis_health
        self._unhook_forced_stop: Callable[[], None] = lambda: None
        #: Whether this worker queues the start requests of the spider's
        #: ``start_urls`` (:meth:`Opening.claim_start_urls
        #: <crawler.frontier.opening.Opening.claim_start_urls>`); True until
        #: it knows.
        self._start_urls_mine = True

    @property
    def evicted(self) -> str | None:
        """Why leasing stopped: Redis evicted keys or may evict them (the
        crawl is closing); None while it has not
        (:attr:`EvictionWatch.evicted <crawler.frontier.eviction.EvictionWatch.evicted>`)."""
        return self.eviction.evicted

    # -- life cycle --------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        """Create the queue, hook lease acknowledgement and start heartbeats.

        The first Redis calls (the eviction policy, the shard count, site
        overrides, ``SCRIPT LOAD``, the worker's ``alive`` script) check the
        configuration (:meth:`Opening.check
        <crawler.frontier.opening.Opening.check>`): a wrong password, a
        database the server lacks or an ACL that forbids what the crawler
        needs is logged in one line and stops the crawl before it starts;
        Redis being down is an outage, waited out later.

        The spider is then closed with the reason ``config_error`` as soon
        as it is open (``CloseSpider`` from the ``spider_opened`` signal).

        :raises RuntimeError: Scrapy's engine no longer exposes the hook that
            tells when a request is finished.
        :raises ValueError: a per-site setting is not valid.
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
        self.opening.warn_robots(spider, self.queue)
        if hasattr(spider, "server"):
            self.opening.adopt_redis_spider(spider)
            # scrapy-redis's own spiders take seeds durably too (redis_seeds.py)
            DurableSeeds.install(self, spider)
        self.opening.warn_slots(spider, self.queue)
        shards = self.queue.shards
        for part in (self.session, self.book, self.dead_letters, self.revisits, self.eviction,
                     self.reports, self.closing, self.enqueuer):
            part.spider = spider
        self.session.shards = self.reports.shards = self.closing.shards = shards
        self.book.queue = self.dead_letters.queue = self.revisits.queue = self.queue
        self.enqueuer.queue = self.queue
        self.router.open(shards)
        overrides = self.opening.site_settings(self.queue)
        self._hook_engine()
        mine = self.opening.check(spider, self.queue, self.refused, overrides)
        if mine is None:  # a configuration error: the spider closes once open
            return
        self._start_urls_mine = mine
        self.dead_letters.connect(self.crawler.signals)
        self.revisits.connect(self.crawler.signals)
        self.crawler.signals.connect(self._download_ended, signal=signals.request_left_downloader)
        self.heartbeats.start(shards, spider)
        if self.flush_on_start:
            self.flush()
            try:
                shards.check_count()  # the crawl's marker and shard count again
            except (*UNREACHABLE, ShardCountError):
                pass  # (an outage, met again by the next call; a race with another worker)
        self.opening.log_resuming(spider, self.queue)

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
        self._unhook_forced_stop = before_reactor_stops(self.closing.give_back_at_forced_stop)
        warn_remote_feeds(self.crawler)

    def close(self, reason: str) -> None:
        """Give back unfinished leases, send the outbox, stop heartbeats
        (:meth:`Closing.close <crawler.frontier.closing.Closing.close>`:
        Redis is waited for at most ``CLOSE_REDIS_WAIT``, 10 s, or
        ``FRONTIER_LEASE_TIMEOUT`` when shorter; past it, what was not sent
        is left out, and nothing is lost: the leases not acknowledged expire
        and are crawled again). Without ``SCHEDULER_PERSIST``, the queue and
        the dupefilter are then cleared (when Redis answered)."""
        self._unhook_forced_stop()
        self.wakeup.cancel()
        if self.closing.close() and not self.persist:
            self.flush()

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
        the crawl (:meth:`Opening.claim_start_urls
        <crawler.frontier.opening.Opening.claim_start_urls>`); the mark is not
        stored.

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
        return self.enqueuer.enqueue(request)

    # -- lease -------------------------------------------------------------------

    def next_request(self) -> Request | None:
        """The next leased request, or None (nothing due, or Redis down).

        Served from the local buffer while it holds any; otherwise the
        outbox and one ``lease.lua`` call, in one round trip, refill it (see
        *Batches* and *Writes*). With None, the engine is woken when the
        first site or retry becomes due (:meth:`next_due`), whatever the
        spider: Scrapy's engine otherwise asks again only when a download
        ends, or every 5 seconds. None once Redis evicted keys or may evict
        them (:attr:`evicted`): the crawl is closing, and what this worker
        holds is given back then.
        """
        if self.eviction.evicted is not None or self.letting_go:
            return None
        request = self._next_request()
        if request is None:
            self.wakeup.when_due()
        return request

    def _next_request(self) -> Request | None:
        if self.book.ready or not self._before_lease() or self.book.holding_back():
            return self.book.hand_out() if self.book.ready else None
        asked: set[int] = set()
        while True:
            shard, self.book.drain_shard = self.book.drain_shard, None
            if shard is None or shard in asked or shard >= len(self.router):
                shard = self.router.next_shard(asked)
            if shard is None:  # every shard said: nothing due now
                self.wakeup.due_at = self.router.earliest_due()
                return None
            ids = self.book.new_ids(self._want())
            result = self.session.exchange(ids, shard)
            if isinstance(result, (list, NotDue)):
                self.book.last_passed(result[0] if isinstance(result, list) else result, shard)
            if isinstance(result, list):
                self.stats.inc_value("frontier/lease_calls")
                self.reports.lease_result(result[0], shard)
                self.router.leased(shard, result[0])
                self.book.take(result)
            elif isinstance(result, NotDue):
                self.stats.inc_value("frontier/lease_calls/not_due")
                self.reports.lease_result(result, shard)
                now = self.router.not_due(shard, result)
                asked.add(shard)
                if len(self.router) == 1:
                    self.wakeup.due_at = None if result.wait is None else now + result.wait
            # (leases found out after a lost reply are in the buffer too)
            if self.book.ready:
                return self.book.hand_out()
            if result is None or self.book.holding_back():  # Redis down, or refused; a drain
                return None
            if len(self.router) == 1 and not isinstance(result, list):
                return None

    def _before_lease(self) -> bool:
        """Before a shard is chosen for a lease call: find out what a
        round trip whose reply was lost did (:meth:`Session.resolve`: the
        leases a lost lease call took go first, and what this worker knew of
        its shard, its head among them maybe, is learnt again), then peek at
        the shards not heard from lately (:meth:`ShardRouter.peek_stale`).

        :returns: whether to go on to a lease call: False when the lost
            call's leases are in the buffer now, or while Redis cannot tell
            what it did.
        """
        if not may_call_redis(self.crawler):
            return False
        if self.session.in_doubt is not None and time.monotonic() >= self.session.down_until:
            if not self.session.resolve() or self.book.ready:
                return False
        self.router.peek_stale()
        return True

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

    @property
    def next_due(self) -> float | None:
        """Seconds until a site or retry becomes due, as the last lease that
        found nothing due reported (None: nothing was queued then). The spider
        sleeps that long before it wakes the engine."""
        return self.wakeup.next_due

    def _download_ended(self, request: Request, **kwargs: Any) -> None:
        """``request_left_downloader``: a leased request's slot is freed."""
        shard = self.book.download_ended(request)
        if shard is not None:
            # Its slot frees, and with it this worker's share of the site:
            # worth a lease of its shard now, not when the last NotDue said.
            now = time.monotonic()
            self.router.slot_freed(shard, now)
            self.wakeup.sooner(now)

    def _finished(self, request: Request) -> None:
        """The engine is done with ``request``: its lease is acknowledged."""
        if self.book.finished(request):
            self.wakeup.due_at = time.monotonic()  # the drain is over: lease now

    def has_pending_requests(self) -> bool:
        """Whether any request is queued, waiting for a retry or leased, anywhere.

        True while Redis is unreachable or writes are waiting to be sent, so
        a worker never closes for idleness during an outage; False once the
        worker lets go of requests that only wait (:meth:`let_go`). While requests
        are pending, it logs, once per change, the leases of silent (dead)
        workers it waits for and when they expire
        (:class:`~crawler.frontier.waiting.LeaseWaitLog`).
        """
        from crawler.frontier.waiting import LeaseWaitLog  # noqa: PLC0415

        if self.book.ready or not may_call_redis(self.crawler) or not self.flush_outbox():
            return True
        if self.letting_go:
            return False  # what waits in Redis is left to later workers
        try:
            pending = self.queue.shards.pending() > 0
        except UNREACHABLE as exc:
            self.session.failed(exc)
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

    def stuck(
        self, far: float | None = None, unanswered: Collection[str] = (),
    ) -> Stuck | None:
        """What the crawl's pending requests wait for, when nothing can be
        done with them now (:func:`crawler.frontier.stuck.survey`): nothing
        leased anywhere, and every one on a site of ``unanswered`` (its
        robots.txt did not answer this worker) or due in more than ``far``
        seconds (default :data:`~crawler.frontier.stuck.FAR_WAIT`). None when some can be
        served now or soon, when this worker holds any or has writes
        unsent, and while Redis cannot be reached (an outage is waited out).
        """
        from crawler.frontier.stuck import FAR_WAIT, survey  # noqa: PLC0415

        if self.book.ready or not may_call_redis(self.crawler) or not self.flush_outbox():
            return None
        try:
            return survey(self.queue.shards, FAR_WAIT if far is None else far, unanswered)
        except UNREACHABLE as exc:
            self.session.failed(exc)
            return None

    def let_go(self) -> None:
        """The worker closes for idleness although requests are pending
        (they only wait: :meth:`stuck`): lease nothing more, and report
        nothing pending once what this worker holds is sent, so that the
        engine closes the spider. The requests stay in Redis."""
        self.letting_go = True

    def __len__(self) -> int:
        return len(self.queue)

    def dead_letter(self, request: Request, reason: str, error: str | None = None) -> None:
        """Record ``request`` in ``{s}:dead`` as JSON: url, reason, attempts,
        last error, time (Unix seconds), the encoded request and the priority
        it was first scheduled with (for requeue):
        :meth:`DeadLetters.record <crawler.frontier.deadletters.DeadLetters.record>`."""
        self.dead_letters.record(request, reason, error)

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once every write queued so far is in Redis.

        The callback runs on the reactor thread right after the transaction
        that carried those writes was committed (the reply was read); never
        when they could not be sent (Redis down at close, a killed worker).
        The spider uses it to let go of seeds only once they are in the
        frontier.
        """
        self.outbox.write("after_commit", done=callback)

    def flush_outbox(self) -> bool:
        """Send queued writes: one commit per shard they go to, in one round
        trip (one pipeline per Redis Cluster master).

        Acks held back (:meth:`Outbox.batches`) go in a second round trip,
        once the first is answered.

        :returns: False when Redis could not be reached (the writes stay
            queued and are tried again after a backoff).
        """
        if not self.outbox:
            return True
        sent = self.session.exchange(None)
        if (
            sent is None and self.outbox.acks_held and self.session.in_doubt is None
            and self.outbox.only_acks()
        ):
            # The writes before them are in; no write carrying a request is
            # left, so none is held this time.
            sent = self.session.exchange(None)
        return sent is not None

    # -- what the session tells (crawler.frontier.session.SessionHost) ----------

    def lease_options(self, shard: int) -> dict[str, Any]:
        """The keywords of a lease call on ``shard``: the slots this worker
        holds there (``lease.lua`` passes over at most that many sites where
        it has its share) and in all, the best elsewhere to stop its batch
        at (``FRONTIER_FIFO_SLACK`` added to its join time), and the site of
        a last chance drained for there."""
        held = self.book.held_on(shard)
        least, joined = self.router.best_elsewhere(shard)
        if joined is not None:  # (FRONTIER_FIFO_SLACK)
            joined += self.fifo_slack_us
        drained_for = self.book.drain_hint(shard)
        return {
            "held": held, "least": least, "least_joined": joined,
            "held_all": len(self.book.lease_shards), "drained_for": drained_for,
        }

    def committed(self, shard: int, ops: list[Op], reply: Committed | None) -> None:
        """The writes ``ops`` (``shard``'s commit) are in Redis: counted and
        logged (:meth:`Reports.committed
        <crawler.frontier.reports.Reports.committed>`); ``reply`` is None
        when its reply was lost and Redis only told that it ran."""
        self.reports.committed(ops, reply, shard)
        if reply is not None:
            self.router.committed(shard, reply)

    def leases_found(self, leases: list[Lease]) -> None:
        """The leases a lease call whose reply was lost took: buffered."""
        self.book.take(leases)

    def passed_over(self, result: Lease | NotDue, shard: int) -> None:
        """A lease result sent again: what it met is counted."""
        self.reports.lease_result(result, shard)

    def forget_shard(self, shard: int) -> None:
        """What was learnt of ``shard`` may be out of date."""
        self.router.forget(shard)

    def forget_seen(self) -> None:
        """Forget the fingerprints this worker recorded (``FRONTIER_LOCAL_SEEN``)."""
        self.enqueuer.forget_seen()

    def wake(self) -> None:
        """Wake the engine now."""
        self.wakeup.now()
