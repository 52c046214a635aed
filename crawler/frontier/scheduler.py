"""The shared scheduler: scrapy-redis's Scheduler with leases and an outbox."""

from __future__ import annotations

import collections
import importlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from redis.exceptions import NoScriptError, RedisError
from scrapy import signals
from scrapy.utils.asyncio import call_later, create_looping_call
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy_redis.scheduler import Scheduler

from crawler.extensions import worker_id
from crawler.frontier import serializer as json_serializer
from crawler.frontier.connection import cluster_enabled, get_redis
from crawler.frontier.signals import request_dead
from crawler.frontier.sites import site_of
from crawler.frontier.store import Frontier, Lease, NotDue, Push

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.python.failure import Failure

    from crawler.frontier.queue import LeasedPriorityQueue

logger = logging.getLogger(__name__)

__all__ = ["RETRY_DELAY_META", "FrontierScheduler"]

#: Request meta key: seconds to hold the request in the retry set before it
#: is queued again (set by :class:`crawler.middlewares.BackoffRetryMiddleware`).
RETRY_DELAY_META = "frontier_retry_delay"
#: Longest pause, in seconds, between attempts to reach Redis during an outage.
OUTAGE_BACKOFF_CAP = 30.0


@dataclass
class _Op:
    """A Redis write waiting in the outbox.

    ``push``, ``ack`` and ``slot`` ops carry their :class:`Push` or lease id
    in ``item`` and are sent together, one script call per kind; the others
    queue themselves on the pipeline with ``send``.
    """

    kind: str
    send: Callable[[Any], object] | None = None
    item: Any = None
    #: Called once the transaction that carried every write queued before
    #: this op has been committed in Redis (``after_commit``).
    done: Callable[[], object] | None = None


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
    seconds; a killed worker's leases expire and any worker returns them to
    the queue. At close, leases not finished are given back.

    **Batches.** A lease call takes up to ``FRONTIER_LEASE_BATCH`` requests,
    no more than the downloader has free slots for, into a local buffer
    that the engine's next calls drain; buffered requests are leased like
    the others (extended, given back at close). Each worker remembers the
    last ``FRONTIER_LOCAL_SEEN`` fingerprints it recorded in the shared
    dupefilter and drops a repeat of one (``enqueue_request`` returns False)
    without asking Redis: the shared dupefilter only grows while a crawl
    runs, so what this worker recorded there stays seen. Redis coming back
    from an outage, a restart or a failover may hold an older dupefilter,
    so the memory is cleared whenever Redis could not be reached or had
    forgotten the scripts.

    **Outbox.** Writes (new requests, retries, acks, dead letters) are queued
    and sent as one ``MULTI``/``EXEC`` transaction, pipelined with the next
    lease call (one round trip for both), or on their own
    ``FRONTIER_OUTBOX_DELAY`` seconds after the first of them when no lease
    call comes sooner: all new requests in one ``push.lua`` call,
    all acks in one ``ack.lua`` call, all freed download slots in one
    ``release.lua`` call (the transaction makes their order inside it
    invisible to other workers). A batch of seeds is therefore
    queued atomically, a lease is acknowledged only after the requests its
    callback yielded (a worker killed with writes unsent loses the ack with
    the requests, and its lease is crawled again), and a Redis outage is
    waited out with backoff: nothing
    is dropped, the worker keeps running, and the outbox is sent once Redis
    answers again.

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
    ``dupefilter/filtered``, ``scheduler/unencodable``,
    ``frontier/leases/acked``, ``frontier/leases/returned`` (expired leases
    this worker put back), ``frontier/leases/released``,
    ``frontier/retries/scheduled``, ``frontier/dead``,
    ``frontier/redis/outages``, ``frontier/lease_calls`` (Redis calls that
    leased at least one request).
    """

    queue: LeasedPriorityQueue
    lease_batch: int
    seen_max: int
    outbox_delay: float

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the scheduler and its dupefilter; connect to Redis lazily."""
        settings = crawler.settings
        kwargs: dict[str, Any] = {
            "persist": settings.getbool("SCHEDULER_PERSIST"),
            "flush_on_start": settings.getbool("SCHEDULER_FLUSH_ON_START"),
        }
        for name, setting in (
            ("queue_key", "SCHEDULER_QUEUE_KEY"),
            ("queue_cls", "SCHEDULER_QUEUE_CLASS"),
        ):
            if value := settings.get(setting):
                kwargs[name] = value
        serializer = settings.get("SCHEDULER_SERIALIZER")
        if isinstance(serializer, str):
            serializer = importlib.import_module(serializer)
        kwargs["serializer"] = serializer or json_serializer
        kwargs["dupefilter"] = build_from_crawler(
            load_object(settings["DUPEFILTER_CLASS"]), crawler
        )
        scheduler = cls(server=get_redis(settings), **kwargs)
        scheduler.stats = crawler.stats
        scheduler.crawler = crawler
        scheduler.lease_timeout = settings.getfloat("FRONTIER_LEASE_TIMEOUT", 60.0)
        scheduler.worker_id = worker_id(settings)
        scheduler.lease_batch = max(1, settings.getint("FRONTIER_LEASE_BATCH", 16))
        scheduler.seen_max = max(0, settings.getint("FRONTIER_LOCAL_SEEN", 100_000))
        scheduler.outbox_delay = max(0.0, settings.getfloat("FRONTIER_OUTBOX_DELAY", 0.05))
        scheduler._setup_state()
        return scheduler

    def _setup_state(self) -> None:
        self._leases: dict[Request, str] = {}
        self._lease_ids = itertools.count()
        self._outbox: list[_Op] = []
        self._flush_call: Any = None
        self._down_until = 0.0
        self._backoff = 0.0
        self._heartbeat: Any = None
        self._due_at: float | None = None
        self._ready: collections.deque[Request] = collections.deque()
        self._seen: dict[bytes, None] = {}

    # -- life cycle --------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        """Create the queue, hook lease acknowledgement and start heartbeats.

        :raises RuntimeError: Scrapy's engine no longer exposes the hook that
            tells when a request is finished.
        """
        self.spider = spider
        self.queue = load_object(self.queue_cls)(
            server=self.server,
            spider=spider,
            key=self.queue_key % {"spider": spider.name},
            serializer=self.serializer,
            dupefilter_key=self.df.key,
            bloom=getattr(self.df, "bloom", None),
        )
        if cluster_enabled(self.crawler.settings) and hasattr(spider, "server"):
            # scrapy-redis's setup_redis gave the spider a standalone client
            # (unused yet, no I/O): it reads the seed list through one that
            # follows the cluster's slots instead.
            spider.server = get_redis(self.crawler.settings)
        self._apply_site_settings()
        self._hook_engine()
        try:
            self.queue.frontier.load_scripts()
            self.queue.frontier.alive(self.worker_id)
        except RedisError as exc:
            self._outage(exc)
        signals_ = self.crawler.signals
        signals_.connect(self._on_request_dead, signal=request_dead)
        signals_.connect(self._on_spider_error, signal=signals.spider_error)
        signals_.connect(self._download_ended, signal=signals.request_left_downloader)
        self._heartbeat = create_looping_call(self._beat)
        self._heartbeat.start(max(0.1, self.lease_timeout / 3), now=False)
        if self.flush_on_start:
            self.flush()

    def _apply_site_settings(self) -> None:
        settings = self.crawler.settings
        frontier = self.queue.frontier
        delays = settings.getdict("FRONTIER_SITE_DELAYS")
        conc = settings.getdict("FRONTIER_SITE_CONCURRENCY")
        if delays:
            self.server.hset(
                frontier.key("delay"),
                mapping={site: round(float(d) * 1000) for site, d in delays.items()},
            )
        if conc:
            self.server.hset(
                frontier.key("conc"), mapping={site: int(n) for site, n in conc.items()}
            )

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

    def close(self, reason: str) -> None:
        """Give back unfinished leases, send the outbox, stop heartbeats."""
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        self._ready.clear()
        if self._leases:
            held = list(self._leases.values())
            self._leases.clear()
            frontier = self.queue.frontier
            self._write("release", lambda pipe: frontier.release(held, client=pipe))
            self.stats.inc_value("frontier/leases/released", len(held))
            logger.info("Gave back %d unfinished leases", len(held))
        deadline = time.monotonic() + self.lease_timeout
        while self._outbox and time.monotonic() < deadline:
            self._down_until = 0.0
            if not self.flush_outbox():
                time.sleep(min(1.0, self._backoff or 0.5))
        if self._outbox:
            logger.error(
                "Redis unreachable at close: %d frontier writes not sent "
                "(unacknowledged leases will expire and be crawled again)",
                len(self._outbox),
            )
        try:
            self.queue.frontier.leave(self.worker_id)
        except RedisError:
            pass  # it stops counting a lease's length after its last heartbeat
        if not self.persist:
            self.flush()

    # -- enqueue -----------------------------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        """Queue ``request`` (through the outbox) unless it was seen.

        A request with ``frontier_retry_delay`` in its meta goes to the retry
        set instead. A request that cannot be encoded is logged as an error
        naming the URL and the key that JSON cannot carry, counted in
        ``scheduler/unencodable`` and dropped, without being marked as seen.

        :returns: False for a request that could not be encoded, or a
            duplicate of one this worker recorded (``FRONTIER_LOCAL_SEEN``);
            other duplicates are filtered when the outbox is sent. Both
            count in ``dupefilter/filtered``.
        """
        delay = request.meta.pop(RETRY_DELAY_META, None)
        if delay is None and not request.dont_filter and self._seen:
            if self.df.request_fingerprint(request) in self._seen:
                self.stats.inc_value("dupefilter/filtered")
                return False
        try:
            data = self.queue.encode(request)
        except ValueError as exc:  # EncodeError, or a callback not on the spider
            logger.error("%s", exc, extra={"spider": self.spider})
            self.stats.inc_value("scheduler/unencodable")
            return False
        site, priority = site_of(request), request.priority
        frontier = self.queue.frontier
        if delay is not None:
            self._write(
                "retry",
                lambda pipe: frontier.push_retry(
                    data, site=site, priority=priority, delay=float(delay), client=pipe
                ),
            )
            self.stats.inc_value("frontier/retries/scheduled")
            return True
        fingerprint = self.df.request_fingerprint(request)
        self._write("push", item=Push(data, site, priority, fingerprint, request.dont_filter))
        self._remember(fingerprint)
        return True

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
        *Batches* and *Outbox*).
        """
        if self._ready:
            return self._hand_out()
        while True:
            ids = [f"{self.worker_id}:{next(self._lease_ids)}" for _ in range(self._want())]
            result = self._exchange(ids)
            if result is None:  # Redis unreachable
                return None
            if isinstance(result, NotDue):
                if result.expired:
                    self.stats.inc_value("frontier/leases/returned", result.expired)
                self._due_at = None if result.wait is None else time.monotonic() + result.wait
                return None
            self.stats.inc_value("frontier/lease_calls")
            if result[0].expired:
                self.stats.inc_value("frontier/leases/returned", result[0].expired)
            for lease in result:
                try:
                    request = self.queue.decode(lease.data, lease.site)
                except Exception as exc:  # whatever Redis held, never crash the worker
                    self._dead_entry(lease.data, lease.lease_id, exc)
                    continue
                self._leases[request] = lease.lease_id
                self._ready.append(request)
            if self._ready:
                return self._hand_out()

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
            self._write("slot", item=lease_id)

    def _finished(self, request: Request) -> None:
        lease_id = self._leases.pop(request, None)
        if lease_id is not None:
            self._write("ack", item=lease_id)

    def _beat(self) -> None:
        self.flush_outbox()
        if time.monotonic() >= self._down_until:
            try:
                self.queue.frontier.alive(self.worker_id)
                if self._leases:
                    self.queue.frontier.extend(list(self._leases.values()))
            except RedisError as exc:
                self._outage(exc)

    def has_pending_requests(self) -> bool:
        """Whether any request is queued, waiting for a retry or leased, anywhere.

        True while Redis is unreachable or writes are waiting to be sent, so
        a worker never closes for idleness during an outage.
        """
        if self._ready or not self.flush_outbox():
            return True
        try:
            return self.queue.frontier.pending() > 0
        except RedisError as exc:
            self._outage(exc)
            return True

    def __len__(self) -> int:
        return len(self.queue)

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
        last error, time (Unix seconds) and the encoded request (for requeue)."""
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
        }
        self._dead(record)
        logger.warning("Dead letter for %s: %s", request.url, reason)

    def _dead_entry(self, data: bytes, lease_id: str, exc: Exception) -> None:
        reason = f"undecodable frontier entry: {type(exc).__name__}: {exc}"
        logger.error("%s", reason, extra={"spider": self.spider})
        self._dead({"url": None, "reason": reason, "attempts": 0, "last_error": repr(exc),
                    "time": time.time(), "request": None, "entry": data.decode("latin-1")})
        self._write("ack", item=lease_id)

    def _dead(self, record: dict[str, Any]) -> None:
        frontier = self.queue.frontier
        self._write("dead", lambda pipe: frontier.dead_letter(record, client=pipe))
        self.stats.inc_value("frontier/dead")

    # -- outbox and outages --------------------------------------------------------

    def _write(
        self,
        kind: str,
        send: Callable[[Any], object] | None = None,
        *,
        item: Any = None,
        done: Callable[[], object] | None = None,
    ) -> None:
        self._outbox.append(_Op(kind, send, item, done))
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
        """Send queued writes in one transaction.

        :returns: False when Redis could not be reached (the writes stay
            queued and are tried again after a backoff).
        """
        return not self._outbox or self._exchange(None) is not None

    @overload
    def _exchange(self, lease_ids: None) -> bool | None: ...

    @overload
    def _exchange(self, lease_ids: list[str]) -> list[Lease] | NotDue | None: ...

    def _exchange(self, lease_ids: list[str] | None) -> list[Lease] | NotDue | bool | None:
        """Send the outbox and, with ``lease_ids``, lease after it: one
        transaction, one round trip.

        :returns: None when Redis could not be reached (the writes stay
            queued); else the lease's result, or True when none was asked.
        """
        if time.monotonic() < self._down_until:
            return None
        ops = list(self._outbox)
        try:
            try:
                replies = self._send(ops, lease_ids)
            except NoScriptError:
                # Redis restarted (or failed over) and forgot the scripts;
                # the transaction's other writes went through, and are
                # idempotent but for dead letters, which may be written
                # twice. What it holds may be older than what this worker
                # recorded: forget the local fingerprints.
                self._seen.clear()
                self.queue.frontier.load_scripts()
                replies = self._send(ops, lease_ids)
        except RedisError as exc:
            self._outage(exc)
            return None
        del self._outbox[: len(ops)]
        self._recovered()
        for op in ops:
            if op.done is not None:
                try:
                    op.done()
                except Exception:  # a callback's failure is its own
                    logger.exception("after_commit callback failed")
        queued = sum(map(bool, replies["push"]))
        for key, n in (
            ("scheduler/enqueued/redis", queued),
            ("dupefilter/filtered", len(replies["push"]) - queued),
            ("frontier/leases/acked", replies["ack"]),
        ):
            if n:
                self.stats.inc_value(key, n)
        if lease_ids is None:
            return True
        return Frontier.leases_of(replies["lease"], lease_ids)

    def _send(self, ops: list[_Op], lease_ids: list[str] | None = None) -> dict[str, Any]:
        """Send ``ops`` in one transaction, then lease ``lease_ids``.

        :returns: the push results (list of 1/0, in order), the number of
            leases acknowledged and ``lease.lua``'s raw reply.
        """
        frontier = self.queue.frontier
        pushes = [op.item for op in ops if op.kind == "push"]
        acks = {op.item: None for op in ops if op.kind == "ack"}
        # An ack frees the download slot too, when release.lua has not yet.
        slots = [op.item for op in ops if op.kind == "slot" and op.item not in acks]
        # A lease alone needs no transaction.
        with self.server.pipeline(transaction=bool(ops)) as pipe:
            for op in ops:
                if op.send is not None:
                    op.send(pipe)
            # After the others: a lease given back at close is not acked.
            frontier.push_many(pushes, client=pipe)
            frontier.release_slots(slots, client=pipe)
            frontier.ack(list(acks), client=pipe)
            if lease_ids is not None:
                frontier.lease_many(lease_ids, client=pipe)
            replies: list[Any] = pipe.execute()
        lease = replies.pop() if lease_ids is not None else None
        it = iter(replies[len(replies) - bool(pushes) - bool(slots) - bool(acks):])
        return {
            "push": next(it) if pushes else [],
            "slot": next(it) if slots else 0,
            "ack": int(next(it)) if acks else 0,
            "lease": lease,
        }

    def _outage(self, exc: Exception) -> None:
        # Redis may come back from an older snapshot, without fingerprints
        # this worker recorded: ask it again rather than trust the memory.
        self._seen.clear()
        if not self._backoff:
            self.stats.inc_value("frontier/redis/outages")
        self._backoff = min(OUTAGE_BACKOFF_CAP, max(0.5, self._backoff * 2))
        self._down_until = time.monotonic() + self._backoff
        logger.warning(
            "Redis unreachable (%s); %d writes waiting; trying again in %.1fs",
            exc, len(self._outbox), self._backoff, extra={"spider": self.spider},
        )

    def _recovered(self) -> None:
        if self._backoff:
            logger.info("Redis reachable again", extra={"spider": self.spider})
        self._backoff = 0.0
        self._down_until = 0.0
