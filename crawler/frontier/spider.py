"""A scrapy-redis spider that reads seeds through Scrapy 2.13+'s ``start()``."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import Request, signals
from scrapy_redis.spiders import RedisSpider

from crawler.frontier.seeds import BadSeed, parse_seed
from crawler.middlewares import tag_seed

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = ["FrontierSpider"]

#: Longest pause, in seconds, between attempts while Redis is unreachable.
REDIS_BACKOFF_CAP = 30.0


class FrontierSpider(RedisSpider):  # type: ignore[misc]
    """Base spider for the shared frontier; subclass it as you would Spider.

    Seeds are read from ``<name>:start_urls`` (``redis_key``), in the order
    they were ``LPUSH``-ed, by a long-running :meth:`start`:

    * A worker moves seeds into the shared frontier only while its
      downloader has free slots, up to ``FRONTIER_SEED_BATCH`` at a time, in
      one transaction; from there every worker leases them as it has room,
      by priority, so seeds spread over the workers and no worker holds more
      than it can start. scrapy-redis 0.9.1 only reads seeds from
      ``start_requests()``, which Scrapy 2.13+ no longer calls, and from the
      idle signal, seconds after the engine runs dry.
    * An idle worker blocks on the seed list (``BRPOP``, up to
      ``FRONTIER_IDLE_WAIT`` seconds, or until the scheduler's next site or
      retry is due) and takes a seed as soon as it is pushed; between waits
      it wakes its engine to lease what other workers queued or what became
      due.
    * A bad seed (see :mod:`crawler.frontier.seeds`) is logged with the
      reason and skipped; the seeds read with it are crawled.
    * With ``MAX_IDLE_TIME_BEFORE_CLOSE`` > 0 the worker closes once it has had
      no request, response or seed for that many seconds *and* has nothing
      queued or in flight. scrapy-redis starts that clock when the module is
      imported, which closes busy crawls early.
    * Seeds taken from Redis but not yet handed to the engine are pushed back
      when the spider closes, at the end they were taken from.

    Seeds become requests with ``dont_filter=True`` (pushing a URL again
    crawls it again); the scheduler still records their fingerprints, so
    links back to a seed are filtered.

    Stats: ``frontier/seeds/read``, ``frontier/seeds/bad``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_activity = time.monotonic()
        # Raw seeds popped from Redis, not yet turned into requests.
        self._pending: deque[bytes] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._room_event: asyncio.Event | None = None
        self._brpop: asyncio.Future[None] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        """Create the spider and connect its activity signals."""
        spider: Self = super().from_crawler(crawler, *args, **kwargs)
        for signal in (
            signals.request_scheduled,
            signals.response_received,
            signals.item_scraped,
        ):
            crawler.signals.connect(spider._touch, signal=signal)
        crawler.signals.connect(spider._room_freed, signal=signals.request_left_downloader)
        crawler.signals.connect(spider._return_pending, signal=signals.spider_closed)
        spider.idle_wait = crawler.settings.getfloat("FRONTIER_IDLE_WAIT", 1.0)
        spider.seed_batch = crawler.settings.getint("FRONTIER_SEED_BATCH", 1000)
        return spider

    # -- activity ------------------------------------------------------------

    def _touch(self, *args: Any, **kwargs: Any) -> None:
        self._last_activity = time.monotonic()

    def _room_freed(self, *args: Any, **kwargs: Any) -> None:
        if self._room_event is not None:
            self._room_event.set()

    def _room(self) -> int:
        """Requests this worker could start now (free downloader slots)."""
        engine = self.crawler.engine
        free: int = self.crawler.settings.getint("CONCURRENT_REQUESTS") - len(
            engine.downloader.active
        )
        return max(0, free)

    def _busy(self) -> bool:
        """Whether this worker has work in flight or queued in the frontier."""
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None)
        return bool(
            engine.downloader.active
            or not engine.scraper.slot.is_idle()
            or (slot is not None and slot.scheduler.has_pending_requests())
        )

    def _idle_timed_out(self) -> bool:
        if self.max_idle_time <= 0 or self._pending or self._busy():
            return False
        return bool(time.monotonic() - self._last_activity >= self.max_idle_time)

    def _scheduler(self) -> Any:
        slot = getattr(self.crawler.engine, "_slot", None)
        return None if slot is None else slot.scheduler

    def _nudge_engine(self) -> None:
        """Let the engine lease requests that other workers queued or that
        became due.

        Scrapy's engine otherwise looks at the scheduler only after its own
        downloads finish, or every 5 seconds.
        """
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    # -- seeds -----------------------------------------------------------------

    async def start(self) -> AsyncIterator[Any]:
        """Move seeds into the shared frontier for as long as the worker runs.

        Seeds are queued through ``engine.crawl`` in batches of up to
        ``FRONTIER_SEED_BATCH``, which the scheduler sends to Redis in one
        transaction, so a batch is ordered by priority before any worker
        leases from it. Yields nothing itself. Returns (ending the start
        phase, so Scrapy may close the spider) only when
        ``MAX_IDLE_TIME_BEFORE_CLOSE`` has passed with nothing to do.
        """
        backoff = 0.0
        while not self._closed:
            try:
                if self._room():
                    if not self._pending:
                        self._pending.extend(self._pop_seeds(self.seed_batch))
                    if self._pending:
                        self._schedule_seeds()
                        await asyncio.sleep(0)  # let the engine lease
                        continue
                    if self._idle_timed_out():
                        break
                    self._nudge_engine()
                    await self._wait_for_seed()
                else:
                    await self._wait_for_room()
                backoff = 0.0
            except RedisError as exc:
                backoff = min(REDIS_BACKOFF_CAP, max(0.5, backoff * 2))
                logger.warning(
                    "Redis unreachable while reading seeds (%s); retrying in %.1fs",
                    exc,
                    backoff,
                    extra={"spider": self},
                )
                await asyncio.sleep(backoff)
        if not self._closed:
            logger.info(
                "Idle for %ss with nothing to do: closing", self.max_idle_time,
                extra={"spider": self},
            )
        return
        yield  # an async generator that yields nothing

    def _schedule_seeds(self) -> None:
        """Hand every pending seed to the engine, in order."""
        engine = self.crawler.engine
        while self._pending:
            request = self.make_request_from_data(self._pending.popleft())
            if request is not None:
                engine.crawl(tag_seed(request))

    def _pop_seeds(self, count: int) -> list[bytes]:
        """Take up to ``count`` seeds from the list, oldest first (``RPOP``)."""
        seeds = self.server.rpop(self.redis_key, count) or []
        if seeds:
            self.crawler.stats.inc_value("frontier/seeds/read", len(seeds))
        return list(seeds)

    async def _wait_for_seed(self) -> None:
        """Wait for a seed (``BRPOP`` in a thread) or for work to come due.

        One ``BRPOP`` of up to ``FRONTIER_IDLE_WAIT`` seconds is kept in
        flight; when the scheduler knows that a site or a retry becomes due
        sooner, the wait ends then, on the event loop's timer (Redis times
        out blocked clients only ten times a second).

        :raises redis.exceptions.RedisError: the ``BRPOP`` failed.
        """
        if self._brpop is None or self._brpop.done():
            self._brpop = asyncio.ensure_future(asyncio.to_thread(self._block_on_seeds))
            # A BRPOP that fails after this wait gave up (or after the spider
            # closed) is not awaited again: mark its error seen, so asyncio
            # does not log it as never retrieved; the next Redis call meets
            # the outage anyway.
            self._brpop.add_done_callback(
                lambda f: None if f.cancelled() else f.exception()
            )
        due = getattr(self._scheduler(), "next_due", None)
        timeout = self.idle_wait if due is None else min(due, self.idle_wait)
        done, _ = await asyncio.wait({self._brpop}, timeout=timeout)
        if done:
            self._brpop.result()  # raises what the thread raised

    def _block_on_seeds(self) -> None:
        popped = self.server.brpop([self.redis_key], timeout=self.idle_wait)
        if not popped:
            return
        with self._lock:
            if self._closed:
                self.server.rpush(self.redis_key, popped[1])
                return
            self.crawler.stats.inc_value("frontier/seeds/read")
            self._pending.append(popped[1])

    async def _wait_for_room(self) -> None:
        """Wait until a request leaves the downloader (or 1 second)."""
        if self._room_event is None:
            self._room_event = asyncio.Event()
        self._room_event.clear()
        try:
            await asyncio.wait_for(self._room_event.wait(), timeout=1.0)
        except TimeoutError:
            pass

    def _return_pending(self, *args: Any, **kwargs: Any) -> None:
        """Push seeds taken but not started back where they came from."""
        with self._lock:
            self._closed = True
            pending, self._pending = list(self._pending), deque()
        if pending:
            self.server.rpush(self.redis_key, *reversed(pending))
            logger.info(
                "Returned %d unstarted seeds to %s", len(pending), self.redis_key,
                extra={"spider": self},
            )

    def make_request_from_data(self, data: bytes) -> Request | None:
        """Turn one seed into a request, or log why it is bad and return None.

        Overrides scrapy-redis's method, which builds a ``FormRequest`` and
        logs with colour codes; see :mod:`crawler.frontier.seeds` for the
        accepted forms.
        """
        try:
            seed = parse_seed(data, self.redis_encoding)
            callback = None
            if seed.callback is not None:
                callback = self._seed_callback(seed.callback)
            request = Request(
                seed.url,
                callback=callback,
                method=seed.method,
                headers=seed.headers or None,
                body=seed.body,
                meta=seed.meta,
                priority=seed.priority,
                cb_kwargs=seed.cb_kwargs,
                dont_filter=True,
            )
        except (BadSeed, ValueError, TypeError, RecursionError) as exc:
            self.crawler.stats.inc_value("frontier/seeds/bad")
            logger.error(
                "Skipped bad seed %r from %s: %s",
                data[:200],
                self.redis_key,
                exc,
                extra={"spider": self},
            )
            return None
        if seed.unknown_keys:
            logger.warning(
                "Seed %s: ignored unknown keys %s", seed.url, ", ".join(seed.unknown_keys),
                extra={"spider": self},
            )
        return request

    def _seed_callback(self, name: str) -> Any:
        """The spider method a JSON seed names as its callback.

        Only ``parse`` and the public methods a spider defines itself are
        callbacks: not private names, nor the machinery of this class and of
        Scrapy's (``start``, ``close``, ...).

        :raises BadSeed: for any other name.
        """
        if name.startswith("_") or (name != "parse" and hasattr(FrontierSpider, name)):
            raise BadSeed(f"{name!r} is not a callback of this spider")
        callback = getattr(self, name, None)
        if not callable(callback):
            raise BadSeed(f"spider has no callback {name!r}")
        return callback

    def spider_idle(self) -> None:
        """Let the spider close once :meth:`start` has given up for idleness.

        Replaces scrapy-redis's handler, which reads seeds here (we read them
        in :meth:`start`) and keeps the spider open with ``DontCloseSpider``.
        The engine sends this signal only after :meth:`start` has returned.
        """
        return None
