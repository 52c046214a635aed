"""The shared scheduler: scrapy-redis's Scheduler with leases and an outbox."""

from __future__ import annotations

import importlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from crawler.frontier.store import NotDue

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
    """A Redis write waiting in the outbox; ``send`` queues it on a pipeline."""

    kind: str
    send: Callable[[Any], object]


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

    **Outbox.** Writes (new requests, retries, acks, dead letters) are queued
    in order and sent as one ``MULTI``/``EXEC`` pipeline before the next
    lease or within the reactor's next turn. A batch of seeds is therefore
    queued atomically, a lease is acknowledged only after the requests its
    callback yielded, and a Redis outage is waited out with backoff: nothing
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
    ``frontier/redis/outages``.
    """

    queue: LeasedPriorityQueue

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
        if not self.persist:
            self.flush()

    # -- enqueue -----------------------------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        """Queue ``request`` (through the outbox) unless it was seen.

        A request with ``frontier_retry_delay`` in its meta goes to the retry
        set instead. A request that cannot be encoded is logged as an error
        naming the URL and the key that JSON cannot carry, counted in
        ``scheduler/unencodable`` and dropped, without being marked as seen.

        :returns: False only for a request that could not be encoded; a
            duplicate is filtered when the outbox is sent (``dupefilter/filtered``).
        """
        delay = request.meta.pop(RETRY_DELAY_META, None)
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
        dont_filter = request.dont_filter
        self._write(
            "push",
            lambda pipe: frontier.push(
                data, site=site, priority=priority, fingerprint=fingerprint,
                dont_filter=dont_filter, client=pipe,
            ),
        )
        return True

    # -- lease -------------------------------------------------------------------

    def next_request(self) -> Request | None:
        """Lease the best due request, or return None (nothing due, or Redis down)."""
        if not self.flush_outbox():
            return None
        while True:
            lease_id = f"{self.worker_id}:{next(self._lease_ids)}"
            try:
                result = self.queue.lease(lease_id)
            except RedisError as exc:
                self._outage(exc)
                return None
            self._recovered()
            if result.expired:
                self.stats.inc_value("frontier/leases/returned", result.expired)
            if isinstance(result, NotDue):
                self._due_at = None if result.wait is None else time.monotonic() + result.wait
                return None
            try:
                request = self.queue.decode(result.data, result.site)
            except Exception as exc:  # whatever Redis held, never crash the worker
                self._dead_entry(result.data, lease_id, exc)
                continue
            self._leases[request] = lease_id
            self.stats.inc_value("scheduler/dequeued/redis")
            return request

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
            frontier = self.queue.frontier
            self._write("release", lambda pipe: frontier.release_slots([lease_id], client=pipe))

    def _finished(self, request: Request) -> None:
        lease_id = self._leases.pop(request, None)
        if lease_id is not None:
            frontier = self.queue.frontier
            self._write("ack", lambda pipe: frontier.ack([lease_id], client=pipe))

    def _beat(self) -> None:
        self.flush_outbox()
        if self._leases and time.monotonic() >= self._down_until:
            try:
                self.queue.frontier.extend(list(self._leases.values()))
            except RedisError as exc:
                self._outage(exc)

    def has_pending_requests(self) -> bool:
        """Whether any request is queued, waiting for a retry or leased, anywhere.

        True while Redis is unreachable or writes are waiting to be sent, so
        a worker never closes for idleness during an outage.
        """
        if not self.flush_outbox():
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
        frontier = self.queue.frontier
        self._write("ack", lambda pipe: frontier.ack([lease_id], client=pipe))

    def _dead(self, record: dict[str, Any]) -> None:
        frontier = self.queue.frontier
        self._write("dead", lambda pipe: frontier.dead_letter(record, client=pipe))
        self.stats.inc_value("frontier/dead")

    # -- outbox and outages --------------------------------------------------------

    def _write(self, kind: str, send: Callable[[Any], object]) -> None:
        self._outbox.append(_Op(kind, send))
        if self._flush_call is None:
            self._flush_call = call_later(0, self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_call = None
        if not self.flush_outbox() and self._outbox:
            wait = max(0.05, self._down_until - time.monotonic())
            self._flush_call = call_later(wait, self._flush_soon)

    def flush_outbox(self) -> bool:
        """Send queued writes in order, in one transaction.

        :returns: False when Redis could not be reached (the writes stay
            queued and are tried again after a backoff).
        """
        if not self._outbox:
            return True
        if time.monotonic() < self._down_until:
            return False
        ops = list(self._outbox)
        try:
            results = self._send(ops)
        except NoScriptError:
            # Redis restarted and forgot the scripts; the transaction's other
            # writes went through, and are idempotent but for dead letters,
            # which may be written twice.
            try:
                self.queue.frontier.load_scripts()
                results = self._send(ops)
            except RedisError as exc:
                self._outage(exc)
                return False
        except RedisError as exc:
            self._outage(exc)
            return False
        del self._outbox[: len(ops)]
        self._recovered()
        for op, result in zip(ops, results, strict=False):
            if op.kind == "push":
                key = "scheduler/enqueued/redis" if result else "dupefilter/filtered"
                self.stats.inc_value(key)
            elif op.kind == "ack":
                self.stats.inc_value("frontier/leases/acked", int(result or 0))
        return True

    def _send(self, ops: list[_Op]) -> list[Any]:
        with self.server.pipeline(transaction=True) as pipe:
            for op in ops:
                op.send(pipe)
            results: list[Any] = pipe.execute()
        return results

    def _outage(self, exc: Exception) -> None:
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
