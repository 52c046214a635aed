"""Extensions: cluster-wide stats and the worker registry in Redis."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Self

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.conf import build_component_list
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.misc import load_object
from twisted.internet.threads import deferToThread

from crawler.config import FrontierConfig, masked_url, worker_id
from crawler.frontier.clock import CLOCK
from crawler.frontier.clock import configure as configure_clock
from crawler.frontier.connection import get_redis, report_redis_failure
from crawler.frontier.health import redis_is_failing
from crawler.keys import CrawlKeys, spider_name_of
from crawler.pipelines import MongoPipeline, collection_of
from crawler.status import FEED_STAT_PREFIX, ITEMS_STAT_PREFIX, LAST_FINISHED_STAT

if TYPE_CHECKING:
    from redis import Redis
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.utils.asyncio import AsyncioLoopingCall
    from twisted.internet.defer import Deferred
    from twisted.internet.task import LoopingCall

logger = logging.getLogger(__name__)

__all__ = ["ClusterStats", "job_id", "stores_in_mongodb", "worker_id"]


def job_id(crawler: Crawler) -> str | None:
    """The scrapyd job id of this crawl, if any.

    scrapyd passes it as the spider argument ``_job``; older scrapyd
    versions set ``$SCRAPY_JOB``.
    """
    spider = crawler.spider
    job = getattr(spider, "_job", None) if spider is not None else None
    return str(job) if job else os.environ.get("SCRAPY_JOB") or None


def stores_in_mongodb(settings: BaseSettings) -> bool:
    """Whether ``ITEM_PIPELINES`` (with Scrapy's base) enables
    :class:`~crawler.pipelines.MongoPipeline` or a subclass of it."""
    for path in build_component_list(settings.getwithbase("ITEM_PIPELINES")):
        cls = load_object(path)
        if isinstance(cls, type) and issubclass(cls, MongoPipeline):
            return True
    return False


def _mirrored(name: str, value: Any) -> bool:
    """Whether a local stat is summed into the cluster stats.

    Integers only (datetimes and floats are per worker), and not maxima
    (``request_depth_max``, ``memusage/max``), whose sum means nothing.
    """
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not name.endswith("max")
        and not name.startswith("memusage/")
    )


class ClusterStats:
    """Keep cluster-wide stats and a worker registry in Redis.

    * Every integer stat of this worker (``downloader/request_count``,
      ``item_scraped_count``, ``mongo/upserted``, ...) is added to the hash
      ``{<spider>}:stats`` with ``HINCRBY``, by the amount it grew since the
      last heartbeat, so the hash holds the sum over every worker that ever
      ran and survives them. Maxima and non-integer stats are left out.
    * With MongoDB storage on (:class:`~crawler.pipelines.MongoPipeline` or
      a subclass in ``ITEM_PIPELINES``), each item scraped also counts in
      ``item_scraped_count/<collection>``, the collection the pipeline
      stores it in (:func:`~crawler.pipelines.collection_of`: the item
      class's ``collection``, else the spider's name, as for dicts), so the
      status knows which MongoDB collections a spider fills.
    * Each feed a worker writes (``-O``, ``FEEDS``) counts its items in
      ``feed_items/<feed URI>`` (password masked) when the feed is closed
      (Scrapy's ``feed_slot_closed``), so the status lists every feed of the
      crawl; workers writing feeds of the same URI add up.
    * The worker's heartbeat record is ``HSET`` in ``{<spider>}:workers``
      under its id (:func:`worker_id`): JSON ``{"pid", "host", "spider",
      "job", "started", "last_heartbeat", "pages", "items", "scraped",
      "pages_per_minute", "closed", "finish_reason"}`` with Unix times in
      seconds on Redis's clock (each heartbeat measures this worker's offset
      to Redis ``TIME`` first: :mod:`crawler.frontier.clock`). ``pages``:
      responses this worker received (``response_received_count``);
      ``scraped``: items it scraped (``item_scraped_count``); ``items``:
      items it stored: with MongoDB storage on, the documents it added to
      MongoDB (``mongo/upserted`` + ``mongo/inserted``: an item that updates
      a document stored already is not counted again, so the sum over the
      workers is the number of documents the crawl stored), else the items
      scraped (they go to feeds). ``closed`` is null while the worker runs;
      when the spider closes, the record is written a last time with the
      final figures, ``closed`` (Unix time) and ``finish_reason``, and stays
      until housekeeping forgets it (``FRONTIER_WORKER_FORGET_AFTER``). A
      worker that closed, or whose heartbeat is older than
      ``FRONTIER_WORKER_TIMEOUT``, counts as not live in the status.

    Writes happen every ``FRONTIER_HEARTBEAT_INTERVAL`` seconds, when the
    worker runs out of work (Scrapy's ``spider_idle``) with figures that
    changed since the last write (so that the status shows what a worker
    did as soon as it waits, not one interval later), and at close, in a
    thread (the crawl never waits on Redis), as one pipeline. A
    failed write is logged and retried at the next heartbeat; no increment
    is lost or counted twice unless Redis fails after applying a pipeline.
    A configuration error (a refused password, an ACL) stops the crawl
    (:func:`crawler.config.stop_on_config_error`).

    Settings: ``FRONTIER_STATS_ENABLED`` (default True; NotConfigured when
    off), ``FRONTIER_HEARTBEAT_INTERVAL`` (seconds, default 5.0),
    ``FRONTIER_WORKER_ID`` (default ``<hostname>:<pid>``).

    Cluster-only stats: ``workers/started``, ``workers/finished``,
    ``finish_reason/<reason>``, and ``workers/last_finished``
    (:data:`LAST_FINISHED_STAT`, set, not added: 1 when the last worker to
    close closed with the reason ``finished``, else 0; the status's
    ``finished`` state).
    """

    def __init__(
        self,
        crawler: Crawler,
        server: Redis,
        keys: CrawlKeys,
        worker: str,
        interval: float = 5.0,
    ) -> None:
        self.crawler = crawler
        self.server = server
        self.keys = keys
        self.worker = worker
        self.interval = interval
        self.started = CLOCK.now()
        self._sent: dict[str, int] = {}
        self._inflight: Deferred[None] | None = None
        self._task: AsyncioLoopingCall | LoopingCall | None = None
        self._last_beat = (time.monotonic(), 0)
        #: Whether items go to MongoDB (:func:`stores_in_mongodb`).
        self.stores_items = False
        #: The spider closed: later increments (feeds) are sent at once.
        self._closed = False
        #: The reason the spider closed with, once it has.
        self._finish_reason: str | None = None
        #: :meth:`_figures` as of the last record sent.
        self._figures_sent: tuple[int, ...] = ()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the extension for ``crawler``; no Redis I/O here.

        :raises NotConfigured: ``FRONTIER_STATS_ENABLED`` is off, or the
            heartbeat interval is not positive.
        """
        settings = crawler.settings
        config = FrontierConfig.of(crawler)
        if not config.stats_enabled:
            logger.info("ClusterStats off: FRONTIER_STATS_ENABLED is False")
            raise NotConfigured  # (switched off on purpose: no WARNING)
        interval = config.heartbeat_interval
        if interval <= 0:
            raise NotConfigured("FRONTIER_HEARTBEAT_INTERVAL must be positive")
        configure_clock(settings)
        ext = cls(
            crawler,
            get_redis(settings),
            CrawlKeys.for_spider(spider_name_of(crawler), settings),  # again at open
            config.worker,
            interval,
        )
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.item_scraped, signal=signals.item_scraped)
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(ext.feed_slot_closed, signal=signals.feed_slot_closed)
        ext.stores_items = stores_in_mongodb(settings)
        return ext

    def spider_opened(self) -> None:
        """Choose the keys from the spider instance's name (set in its
        ``__init__`` or by ``-a name=...`` too), register the worker and
        start the heartbeat."""
        self.keys = CrawlKeys.for_spider(spider_name_of(self.crawler), self.crawler.settings)
        assert self.crawler.stats is not None
        self.started = CLOCK.now()
        self.crawler.stats.inc_value("workers/started")
        self._task = create_looping_call(self.beat)
        self._task.start(self.interval, now=True)

    def item_scraped(self, item: Any) -> None:
        """Count the item in ``item_scraped_count/<collection>`` (MongoDB
        storage on)."""
        if self.stores_items:
            assert self.crawler.stats is not None
            collection = collection_of(item, self.keys.spider)
            self.crawler.stats.inc_value(f"{ITEMS_STAT_PREFIX}{collection}")

    async def feed_slot_closed(self, slot: Any) -> None:
        """Count the items of a closed feed in ``feed_items/<URI>``; once the
        worker's last increments were sent (the feeds close after the
        spider), send this one too."""
        assert self.crawler.stats is not None
        uri = masked_url(str(slot.uri))
        self.crawler.stats.inc_value(f"{FEED_STAT_PREFIX}{uri}", int(slot.itemcount))
        if self._closed and not redis_is_failing(self.crawler):
            await self._send_now(final=True)

    def spider_idle(self) -> None:
        """The worker has nothing to do: send its figures now if they
        changed since the last write (the engine signals ``spider_idle``
        again every few seconds while it waits)."""
        assert self.crawler.stats is not None
        if self._figures() != self._figures_sent:
            self.beat()

    def _figures(self) -> tuple[int, ...]:
        """The stats the worker record's figures come from, for
        :meth:`spider_idle`."""
        assert self.crawler.stats is not None
        get = self.crawler.stats.get_value
        return tuple(int(get(name, 0)) for name in (
            "response_received_count", "item_scraped_count", "mongo/upserted", "mongo/inserted",
        ))

    def beat(self) -> None:
        """Send the stats grown since the last beat and the heartbeat record.

        Skipped while the previous write is still running, and while the
        frontier's Redis is failing (a write would hold a thread of the
        reactor's pool, which the process waits for at exit, for up to the
        socket timeout).
        """
        if self._inflight is None and not redis_is_failing(self.crawler):
            self._send(final=False)

    async def spider_closed(self, reason: str) -> None:
        """Send the last increments, count the finish, write the closed record."""
        if self._task is not None and self._task.running:
            self._task.stop()
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("workers/finished")
        self.crawler.stats.inc_value(f"finish_reason/{reason}")
        self._finish_reason = reason
        self._closed = True
        if redis_is_failing(self.crawler):
            # (the frontier's close met the outage: no wait for Redis here;
            # the registry forgets this worker after its last heartbeat)
            logger.warning("Redis unreachable at close: the last cluster stats not sent (the "
                           "crawl's totals miss this worker's last seconds; nothing to do)",
                           extra={"spider": self.crawler.spider})
            return
        await self._send_now(final=True)

    async def _send_now(self, *, final: bool) -> None:
        """Send what grew since the last send, once no write is in flight:
        two sends at once would both count what the first one carries."""
        while self._inflight is not None:
            await maybe_deferred_to_future(self._inflight)
        await maybe_deferred_to_future(self._send(final=final))

    def _send(self, *, final: bool) -> Deferred[None]:
        deltas = self._deltas()
        record = self._record()
        self._figures_sent = self._figures()
        d: Deferred[None] = deferToThread(self._write, deltas, record, final)
        d.addCallbacks(self._sent_ok, self._sent_failed, callbackArgs=(deltas,))
        self._inflight = d
        return d

    def _deltas(self) -> dict[str, int]:
        """How much each mirrored stat grew since it was last sent."""
        assert self.crawler.stats is not None
        deltas = {}
        for name, value in self.crawler.stats.get_stats().items():
            if _mirrored(name, value):
                delta = value - self._sent.get(name, 0)
                if delta:
                    deltas[name] = delta
        return deltas

    def _record(self) -> dict[str, Any]:
        assert self.crawler.stats is not None
        stats = self.crawler.stats
        now = time.monotonic()
        pages = int(stats.get_value("response_received_count", 0))
        then, pages_then = self._last_beat
        rate = (pages - pages_then) * 60.0 / (now - then) if now > then else 0.0
        self._last_beat = (now, pages)
        scraped = int(stats.get_value("item_scraped_count", 0))
        stored = scraped
        if self.stores_items:
            stored = int(stats.get_value("mongo/upserted", 0)) + int(
                stats.get_value("mongo/inserted", 0)
            )
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "spider": self.keys.spider,
            "job": job_id(self.crawler),
            "started": self.started,
            "last_heartbeat": CLOCK.now(),  # set again in _write
            "pages": pages,
            "items": stored,
            "scraped": scraped,
            "pages_per_minute": round(rate, 1),
            "closed": None,
            "finish_reason": self._finish_reason,
        }

    def _write(self, deltas: dict[str, int], record: dict[str, Any], final: bool) -> None:
        """Measure the offset to Redis's clock (:data:`CLOCK`), then one
        pipeline: the increments, then the heartbeat record stamped with the
        corrected clock (in a thread); ``final``: the closed record."""
        if not final:
            CLOCK.measure_redis(self.server)
            record["last_heartbeat"] = CLOCK.now()
        pipe = self.server.pipeline(transaction=False)
        for name, delta in deltas.items():
            pipe.hincrby(self.keys.stats, name, delta)
        if final:
            record["closed"] = record["last_heartbeat"]
            if self._finish_reason is not None:
                pipe.hset(self.keys.stats, LAST_FINISHED_STAT,
                          int(self._finish_reason == "finished"))
        pipe.hset(self.keys.workers, self.worker, json.dumps(record))
        pipe.execute()

    def _sent_ok(self, _: None, deltas: dict[str, int]) -> None:
        self._inflight = None
        for name, delta in deltas.items():
            self._sent[name] = self._sent.get(name, 0) + delta

    def _sent_failed(self, failure: Any) -> None:
        self._inflight = None
        report_redis_failure(
            self.crawler, failure, logger,
            retrying="Could not send cluster stats to Redis (will retry): %s",
            failed="Cluster stats failed: %s",
            extra={"spider": self.crawler.spider},
            server=self.server,
        )
