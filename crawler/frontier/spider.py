"""A scrapy-redis spider that reads seeds through Scrapy 2.13+'s ``start()``."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError
from scrapy import FormRequest, Request, signals
from scrapy.spiders import CrawlSpider
from scrapy_redis import spiders as scrapy_redis_spiders
from scrapy_redis.spiders import RedisSpider

from crawler.config import FrontierConfig, stop_on_config_error
from crawler.frontier.connection import (
    NOT_RUN,
    config_error_message,
    drop_connections,
    get_redis,
    is_no_master,
)
from crawler.frontier.health import may_call_redis, note_redis_failure, redis_is_failing
from crawler.frontier.intake import IntakeKeys, SeedIntake
from crawler.frontier.seeds import BadSeed, parse_seed
from crawler.frontier.sites import tag_seed
from crawler.frontier.stuck import ROBOTS_WAIT_META, Stuck

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = ["FrontierCrawlSpider", "FrontierSpider"]

#: Longest pause, in seconds, between attempts while Redis is unreachable.
REDIS_BACKOFF_CAP = 30.0


class _OwnClient:
    """Stands for ``scrapy_redis.connection`` in :meth:`setup_redis`."""

    from_settings = staticmethod(get_redis)


class _DropRecords(logging.Filter):
    """Drops the log records whose message (format string) starts with
    ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


class FrontierSpider(RedisSpider):  # type: ignore[misc]
    """Base spider for the shared frontier; subclass it as you would Spider.

    Seeds are read from ``<name>:start_urls`` (``redis_key``), in the order
    they were ``LPUSH``-ed, by a long-running :meth:`start`, through the
    seed intake (:mod:`crawler.frontier.intake`), so that no seed exists
    only in this worker's memory:

    * While its downloader has free slots, a worker moves up to
      ``FRONTIER_SEED_BATCH`` seeds, in one Lua script, from the seed list
      into a registered *intake batch* in Redis; it turns them into requests
      and queues them in the shared frontier (one transaction, through the
      scheduler's outbox); once that transaction is committed
      (``FrontierScheduler.after_commit``) it deletes the batch. From the
      frontier every worker leases as it has room, by priority, so seeds
      spread over the workers. scrapy-redis 0.9.1 only reads seeds from
      ``start_requests()``, which Scrapy 2.13+ no longer calls, and from the
      idle signal, seconds after the engine runs dry.
    * A batch whose owner died (SIGKILL, a crash, Redis lost for too long)
      stays registered; every worker, when it starts and then every
      ``FRONTIER_LEASE_TIMEOUT / 3`` seconds, returns the seeds of batches
      not refreshed for ``FRONTIER_LEASE_TIMEOUT`` seconds to the seed list,
      at the end seeds are taken from and in their order (one atomic script
      per batch), and refreshes its own. Delivery is at least once: a seed
      of a batch returned after its requests were queued is crawled again
      (so is one of a live worker that could not refresh its batch in
      time, or whose ``FRONTIER_LEASE_TIMEOUT`` is longer than the
      reclaiming worker's: give every worker the same).
    * An idle worker blocks on the seed list (``BLMOVE`` of the list onto
      itself, which leaves the seed in place, up to ``FRONTIER_IDLE_WAIT``
      seconds, or until the scheduler's next site or retry is due) and takes
      a seed as soon as it is pushed; between waits it wakes its engine to
      lease what other workers queued or what became due.
    * A bad seed (see :mod:`crawler.frontier.seeds`) is logged with the
      reason and skipped; the seeds read with it are crawled.
    * With ``MAX_IDLE_TIME_BEFORE_CLOSE`` > 0 the worker closes once it has had
      no request, response or seed for that many seconds *and* has nothing
      queued or in flight, and no seed is in an intake batch anywhere.
      Idle means nothing it can do now: requests that only wait for a
      robots.txt are given up at the limit (the robots.txt middleware's
      ``give_up_waits``: they go back to Redis), and requests still pending
      do not keep it open when none is leased anywhere and each is on a site
      whose robots.txt did not answer this worker or due in more than
      :data:`~crawler.frontier.stuck.FAR_WAIT` (60) seconds; it then logs
      one WARNING saying what waits and why, and leaves them in Redis for
      a later worker (:mod:`crawler.frontier.stuck`). A request sent back
      to wait for robots.txt is no activity. Redis out of reach never
      counts as idle (an outage is waited out).
      scrapy-redis starts that clock when the module is imported, which
      closes busy crawls early. A paused crawl (``scrapy frontier pause``,
      :mod:`crawler.control`) is not idle; its clock starts again when it
      resumes. Once the engine closes the spider (``scrapy frontier stop``,
      say), no more seeds are taken.
    * When the spider closes, seeds not yet in the frontier (their requests'
      writes were never committed) go back to the seed list, atomically;
      when Redis cannot be reached then, they stay in their intake batch
      and the next worker returns them (the log says so).

    Seeds become requests with ``dont_filter=True`` (pushing a URL again
    crawls it again); the scheduler still records their fingerprints, so
    links back to a seed are filtered.

    Stats: ``frontier/seeds/read``, ``frontier/seeds/bad``,
    ``frontier/seeds/reclaimed`` (seeds of abandoned batches this worker
    returned to the seed list), ``frontier/seeds/returned`` (its own seeds
    returned at close).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_activity = time.monotonic()
        self._intake: SeedIntake | None = None
        # Batch key -> seeds handed to the engine, their writes not committed.
        self._open: dict[str, int] = {}
        # Batches whose requests are in the frontier, not yet deleted.
        self._committed: set[str] = set()
        # The batch key of a take whose reply was lost (sent again as is).
        self._taking: str | None = None
        self._closed = False
        #: The spider's start_urls were pushed (or found pushed) for this crawl.
        self._start_urls_done = False
        self._room_event: asyncio.Event | None = None
        self._blocking: asyncio.Future[bool] | None = None
        self._next_upkeep = 0.0
        self._told_no_commit = False
        #: What the pending requests wait for, when the worker closes idle
        #: with requests that nothing can serve now.
        self._stuck: Stuck | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        """Create the spider and connect its activity signals.

        :raises ValueError: no intake key can share the seed list's Redis
            Cluster slot (see :meth:`IntakeKeys.for_seed_list`).
        """
        spider: Self = super().from_crawler(crawler, *args, **kwargs)
        for signal in (
            signals.request_scheduled,
            signals.response_received,
            signals.item_scraped,
        ):
            crawler.signals.connect(spider._touch, signal=signal)
        crawler.signals.connect(spider._room_freed, signal=signals.request_left_downloader)
        crawler.signals.connect(spider._close_intake, signal=signals.spider_closed)
        crawler.signals.connect(spider._opened, signal=signals.spider_opened)
        spider._read_settings()
        IntakeKeys.for_seed_list(spider.redis_key)  # a seed list it cannot serve fails now
        return spider

    def _read_settings(self) -> None:
        """Read the spider's settings from ``self.crawler.settings``.

        Called when the spider is built, and again when it opens: Scrapy
        builds the spider before it runs the add-ons (``ADDONS``), and
        :class:`crawler.addon.FrontierAddon` may set
        ``MAX_IDLE_TIME_BEFORE_CLOSE`` and ``FRONTIER_WORKER_ID`` from the
        environment.
        """
        settings = self.crawler.settings
        config = FrontierConfig.of(self.crawler)
        self.idle_wait = config.idle_wait
        self.seed_batch = max(1, config.seed_batch)
        self.lease_timeout = config.lease_timeout
        # scrapy-redis's setting, read by its setup_redis when the spider is built.
        self.max_idle_time = settings.getint("MAX_IDLE_TIME_BEFORE_CLOSE")
        # One holder per process: batch keys are never reused.
        self.holder = f"{config.worker}#{os.urandom(4).hex()}"

    def _opened(self, spider: FrontierSpider) -> None:
        """Read the settings the add-ons set, and say where seeds come from."""
        if spider is not self:
            return
        self._read_settings()
        settings = self.crawler.settings
        logger.info(
            "Reading seeds from Redis %s %s: up to FRONTIER_SEED_BATCH=%d "
            "at a time while downloads have room (CONCURRENT_REQUESTS=%d), each batch kept "
            "in %s until its requests are in the frontier; when idle, waiting up to "
            "FRONTIER_IDLE_WAIT=%gs for new seeds; encoding %s",
            "set" if settings.getbool("REDIS_START_URLS_AS_SET") else "list",
            self.redis_key + ("" if settings.getbool("REDIS_START_URLS_AS_SET")
                              else ", oldest first"),
            self.seed_batch, settings.getint("CONCURRENT_REQUESTS"),
            IntakeKeys.for_seed_list(self.redis_key).registry, self.idle_wait,
            self.redis_encoding, extra={"spider": self},
        )

    def setup_redis(self, crawler: Crawler | None = None) -> None:
        """scrapy-redis's setup (seed key, encoding, Redis client, idle
        signal), without its log line: it announces a start-URL batch size
        (``CONCURRENT_REQUESTS``, 16 by default) that the seed intake does
        not use. :meth:`from_crawler` logs what the intake does instead.
        Its client is the project's (:func:`~crawler.frontier.connection.get_redis`,
        no I/O), not scrapy-redis's, which takes no ``redis+sentinel://`` URL."""
        seeds_logger = logging.getLogger(self.name)  # scrapy-redis logs on self.logger
        quiet = _DropRecords("Reading start URLs from redis key")
        seeds_logger.addFilter(quiet)
        # scrapy-redis's setup_redis calls its module's connection.from_settings.
        builder = scrapy_redis_spiders.connection
        scrapy_redis_spiders.connection = _OwnClient
        try:
            super().setup_redis(crawler)
        finally:
            scrapy_redis_spiders.connection = builder
            seeds_logger.removeFilter(quiet)

    # -- activity ------------------------------------------------------------

    def _touch(self, *args: Any, request: Request | None = None, **kwargs: Any) -> None:
        if request is not None and request.meta.get(ROBOTS_WAIT_META):
            return  # sent back to wait for robots.txt: no progress
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

    def _idle_timed_out(self, intake: SeedIntake) -> bool:
        """Whether the worker has had nothing to do for
        ``MAX_IDLE_TIME_BEFORE_CLOSE`` seconds: nothing of its own in flight,
        no seed of its own or anyone's in an intake batch, nothing queued.

        :raises redis.exceptions.RedisError: from the intake count.
        """
        if getattr(self.crawler.engine, "paused", False):
            # Paused by `scrapy frontier pause` (crawler.control): not idle,
            # and the idle clock starts again when the crawl resumes.
            self._touch()
            return False
        if (
            self.max_idle_time <= 0
            or self._open
            or self._committed
            or self._taking is not None
            or time.monotonic() - self._last_activity < self.max_idle_time
        ):
            return False
        engine = self.crawler.engine
        gates = self._robots_gates()
        if any(gate.waits_only(engine.downloader.active, self.max_idle_time) for gate in gates):
            # All this worker does is wait for robots.txt (a host that does
            # not answer): give up; its requests go back to Redis to wait.
            for gate in gates:
                gate.give_up_waits()
            return False
        self._stuck = None
        if engine.downloader.active or not engine.scraper.slot.is_idle():
            return False
        slot = getattr(engine, "_slot", None)
        if slot is not None and slot.scheduler.has_pending_requests():
            stuck = getattr(slot.scheduler, "stuck", None)
            unanswered = {site for gate in gates for site in gate.unanswered()}
            self._stuck = None if stuck is None else stuck(unanswered=unanswered)
            if self._stuck is None:
                return False
        return intake.pending() == 0

    def _robots_gates(self) -> list[Any]:
        """The downloader middlewares that hold requests while their site's
        robots.txt is fetched (those with ``waits_only``, ``give_up_waits``
        and ``unanswered``: :class:`crawler.politeness.SharedRobotsTxtMiddleware`)."""
        downloader = getattr(self.crawler.engine, "downloader", None)
        middlewares = getattr(getattr(downloader, "middleware", None), "middlewares", ())
        return [m for m in middlewares
                if all(hasattr(m, a) for a in ("give_up_waits", "waits_only", "unanswered"))]

    def _closing(self) -> bool:
        """Whether the engine is closing the spider (``scrapy frontier
        stop``, a configuration error, ``CloseSpider``): take no more seeds."""
        slot = getattr(self.crawler.engine, "_slot", None)
        return slot is not None and getattr(slot, "closing", None) is not None

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

    @property
    def _upkeep_interval(self) -> float:
        """Seconds between two refreshes of this worker's intake batches
        (and reclaims of abandoned ones): a third of the lease timeout."""
        timeout: float = self.lease_timeout
        return max(0.1, timeout / 3)

    def _seed_intake(self) -> SeedIntake:
        """The intake, built at first use: the scheduler gives the spider its
        Redis client when it opens (a cluster client in cluster mode)."""
        if self._intake is None:
            self._intake = SeedIntake(
                self.server, self.redis_key, self.holder,
                as_set=self.crawler.settings.getbool("REDIS_START_URLS_AS_SET"),
            )
        return self._intake

    async def start(self) -> AsyncIterator[Any]:  # noqa: PLR0912 (one loop, its outage cases)
        """Move seeds into the shared frontier for as long as the worker runs.

        Seeds are queued through ``engine.crawl`` in batches of up to
        ``FRONTIER_SEED_BATCH``, which the scheduler sends to Redis in one
        transaction, so a batch is ordered by priority before any worker
        leases from it. Yields nothing itself. Returns (ending the start
        phase, so Scrapy may close the spider) only when
        ``MAX_IDLE_TIME_BEFORE_CLOSE`` has passed with nothing to do, or
        when Redis refuses this worker's configuration (a wrong password, an
        ACL: :func:`crawler.frontier.connection.config_error`), which stops
        the crawl; an outage is waited out.
        """
        backoff = 0.0
        while not self._closed and not self._closing():
            if not may_call_redis(self.crawler):
                # Redis down (health.py): no seed call that would block the
                # reactor; read again once a probe is answered.
                await asyncio.sleep(min(1.0, self._upkeep_interval))
                continue
            try:
                intake = self._seed_intake()
                if not self._start_urls_done:
                    self._push_start_urls(intake)
                if time.monotonic() >= self._next_upkeep:
                    self._upkeep(intake)  # until it succeeds, at every turn
                    self._next_upkeep = time.monotonic() + self._upkeep_interval
                if self._room():
                    if self._take_batch(intake):
                        await asyncio.sleep(0)  # let the engine lease
                        continue
                    if self._idle_timed_out(intake):
                        break
                    self._nudge_engine()
                    await self._wait_for_seed(intake)
                else:
                    await self._wait_for_room()
                backoff = 0.0
            except RedisError as exc:
                message = config_error_message(exc, self.crawler.settings)
                if message is not None:
                    # A wrong password or an ACL that forbids the seed
                    # calls: no wait fixes it. Stop the crawl (the scheduler
                    # does the same when it meets it first).
                    stop_on_config_error(self.crawler, message)
                    return
                backoff = min(REDIS_BACKOFF_CAP, max(0.5, backoff * 2))
                # (a reply that says the call did not run, a cluster not
                # serving the slot yet or NOSCRIPT, is an outage too, as for
                # the scheduler; so is a server that is no master, a
                # failover: its pooled connections may reach the demoted
                # master, so they are dropped)
                failover = is_no_master(exc)
                if failover:
                    drop_connections(self.server)
                refused = (
                    isinstance(exc, ResponseError)
                    and not isinstance(exc, NOT_RUN)
                    and not failover
                )
                what = (
                    "refused a seed call" if refused
                    else "is no master (a failover): connections dropped" if failover
                    else "unreachable"
                )
                logger.warning(
                    "Redis %s while reading seeds (%s); retrying in %.1fs (check that Redis runs "
                    "if this goes on)",
                    what, exc, backoff, extra={"spider": self},
                )
                if not refused:
                    note_redis_failure(self.crawler)
                # Not past the next refresh of the batches this worker holds.
                await asyncio.sleep(min(backoff, self._upkeep_interval))
        if not self._closed and not self._closing():
            if self._stuck is not None:
                scheduler = self._scheduler()
                if scheduler is not None and hasattr(scheduler, "let_go"):
                    scheduler.let_go()
                logger.warning(
                    "Closing after %ss idle (MAX_IDLE_TIME_BEFORE_CLOSE): %s. Nothing is "
                    "lost: a worker started later takes them up when they are due "
                    "(scrapy frontier status %s shows them)",
                    self.max_idle_time, self._stuck.describe(), self.name,
                    extra={"spider": self},
                )
            else:
                logger.info(
                    "Idle for %ss with nothing to do: closing", self.max_idle_time,
                    extra={"spider": self},
                )
        return
        yield  # an async generator that yields nothing

    def _push_start_urls(self, intake: SeedIntake) -> None:
        """Push the spider's ``start_urls`` into the seed list, once per
        crawl (:meth:`SeedIntake.seed_once`): from there they are taken,
        checked and crawled as any seed.

        :raises redis.exceptions.RedisError: the call failed (tried again).
        """
        urls = [str(url) for url in getattr(self, "start_urls", None) or ()]
        if urls:
            pushed = intake.seed_once(urls)
            if pushed >= 0:
                logger.info(
                    "Pushed the spider's %d start_urls into %s (once for this crawl: %s)",
                    pushed, self.redis_key, intake.keys.seeded, extra={"spider": self},
                )
            else:
                logger.info(
                    "start_urls were pushed into %s for this crawl already (%s; delete "
                    "it to push them again)", self.redis_key, intake.keys.seeded,
                    extra={"spider": self},
                )
        self._start_urls_done = True

    def _take_batch(self, intake: SeedIntake) -> bool:
        """Take a batch of seeds into the intake and hand it to the engine.

        The batch is let go of (:meth:`_batch_committed`) once the scheduler
        has committed the requests made from it (``after_commit``), or at
        once with a scheduler that has no such hook. A take whose reply is lost
        is sent again with the same batch key, which returns the seeds it
        took if it ran.

        :returns: whether any seed was taken.
        :raises redis.exceptions.RedisError: the take failed.
        """
        batch = self._taking or intake.new_batch()
        self._taking = batch
        try:
            taken = intake.take(batch, self.seed_batch)
        except ResponseError:
            # Refused: nothing was written by this call. A batch an earlier
            # call with this key may have filled is reclaimed in time.
            self._taking = None
            raise
        self._taking = None
        if not taken.seeds:
            return False
        if taken.reused:
            logger.info(
                "Found the %d seeds of intake batch %s, whose reply was lost",
                len(taken.seeds), batch, extra={"spider": self},
            )
        self.crawler.stats.inc_value("frontier/seeds/read", len(taken.seeds))
        self._open[batch] = len(taken.seeds)
        engine = self.crawler.engine
        for data in taken.seeds:
            for request in self._requests_from(data):
                engine.crawl(tag_seed(request))
        scheduler = self._scheduler()
        after_commit = getattr(scheduler, "after_commit", None)
        if after_commit is not None:
            after_commit(functools.partial(self._batch_committed, batch))
            return True
        # A scheduler that keeps requests in memory (Scrapy's own, as the
        # benchmark's baseline runs): the seeds are in its hands now, and
        # nothing more durable is to be had.
        if not self._told_no_commit:
            self._told_no_commit = True
            logger.warning(
                "%s has no after_commit hook: seeds are let go of once handed to it "
                "(a worker killed before it crawls them loses them)",
                type(scheduler).__name__, extra={"spider": self},
            )
        self._batch_committed(batch)
        return True

    def _batch_committed(self, batch: str) -> None:
        """The requests made from ``batch`` are in the frontier (called on
        the reactor thread by the scheduler, before the leases of the round
        trip that committed them are handed out): delete the batch now.

        Not a reactor turn later: a seed whose request kills its worker as
        soon as the engine takes it (a download that crashes the process)
        would die before its batch was deleted; the batch was then returned
        to the seed list and a fresh copy of the request, with no delivery
        counted, queued after every death, so it never reached
        ``FRONTIER_MAX_DELIVERIES`` and killed workers forever. One Redis
        call per batch of up to ``FRONTIER_SEED_BATCH`` seeds."""
        self._open.pop(batch, None)
        self._committed.add(batch)
        if not self._closed:
            self._delete_committed()

    def _delete_committed(self) -> None:
        """Delete and unregister the committed batches; those that fail stay
        for the next upkeep (or close)."""
        if not self._committed or self._intake is None:
            return
        batches = sorted(self._committed)
        try:
            self._intake.done(batches)
        except RedisError as exc:
            logger.debug("Intake batches not deleted yet (%s)", exc, extra={"spider": self})
            return
        self._committed.difference_update(batches)

    def _upkeep(self, intake: SeedIntake) -> None:
        """Delete committed batches, refresh the ones this worker holds, and
        return abandoned batches to the seed list.

        :raises redis.exceptions.RedisError: a call failed (the next upkeep
            tries again).
        """
        self._delete_committed()
        held = [*self._open, *self._committed]
        if self._taking is not None:
            held.append(self._taking)
        for batch in intake.refresh(held):
            if batch in self._open:
                logger.warning(
                    "Intake batch %s (%d seeds) was returned to %s by another worker "
                    "while this one held it (its refresh came later than "
                    "FRONTIER_LEASE_TIMEOUT): its seeds may be crawled twice",
                    batch, self._open.pop(batch), self.redis_key, extra={"spider": self},
                )
        for reclaimed in intake.reclaim_stale(self.lease_timeout):
            if reclaimed.malformed:
                logger.error(
                    "Intake batch key %s holds something other than a list: "
                    "unregistered and left in place", reclaimed.batch, extra={"spider": self},
                )
            elif reclaimed.seeds:
                self.crawler.stats.inc_value("frontier/seeds/reclaimed", reclaimed.seeds)
                logger.info(
                    "Returned %d seeds of abandoned intake batch %s to %s",
                    reclaimed.seeds, reclaimed.batch, self.redis_key, extra={"spider": self},
                )

    async def _wait_for_seed(self, intake: SeedIntake) -> None:
        """Wait for a seed (``BLMOVE`` in a thread) or for work to come due.

        One ``BLMOVE`` of up to ``FRONTIER_IDLE_WAIT`` seconds is kept in
        flight; it leaves the seed in the list, for :meth:`_take_batch`. When
        the scheduler knows that a site or a retry becomes due sooner, or the
        next upkeep is due, the wait ends then, on the event loop's timer
        (Redis times out blocked clients only ten times a second).

        :raises redis.exceptions.RedisError: the ``BLMOVE`` failed.
        """
        if self._blocking is None or self._blocking.done():
            self._blocking = asyncio.ensure_future(
                asyncio.to_thread(intake.wait_for_seeds, self.idle_wait)
            )
            # A BLMOVE that fails after this wait gave up (or after the
            # spider closed) is not awaited again: mark its error seen, so
            # asyncio does not log it as never retrieved; the next Redis
            # call meets the outage anyway.
            self._blocking.add_done_callback(
                lambda f: None if f.cancelled() else f.exception()
            )
        timeout = min(self.idle_wait, max(0.0, self._next_upkeep - time.monotonic()))
        due = getattr(self._scheduler(), "next_due", None)
        if due is not None:
            timeout = min(due, timeout)
        done, _ = await asyncio.wait({self._blocking}, timeout=timeout)
        if done:
            self._blocking.result()  # raises what the thread raised

    async def _wait_for_room(self) -> None:
        """Wait until a request leaves the downloader (or 1 second)."""
        if self._room_event is None:
            self._room_event = asyncio.Event()
        self._room_event.clear()
        try:
            await asyncio.wait_for(self._room_event.wait(), timeout=1.0)
        except TimeoutError:
            pass

    def _close_intake(self, *args: Any, **kwargs: Any) -> None:
        """At spider close (after the scheduler's last flush): let go of the
        batches whose requests are in the frontier, and return the seeds of
        the others to the seed list; say which stay in intake when Redis
        cannot be reached."""
        self._closed = True
        intake = self._intake
        if intake is None:
            return
        failing = redis_is_failing(self.crawler)
        # (when the scheduler's close met an outage, no call is made: each
        # would wait the socket timeout on the reactor; the next worker
        # returns the batches)
        if self._committed and failing:
            self._warn_committed_stay("no answer at the scheduler's close")
            self._committed.clear()
        if self._committed:
            try:
                intake.done(sorted(self._committed))
                self._committed.clear()
            except RedisError as exc:
                self._warn_committed_stay(exc)
        held = dict(self._open)
        if self._taking is not None:
            held[self._taking] = 0  # unknown: the take's reply was lost
        returned, stuck = 0, {}
        error: RedisError | None = None
        # Later batches first, so that the oldest seeds end at the taking end.
        for batch in sorted(held, reverse=True):
            if failing:
                stuck[batch] = held[batch]
                continue
            try:
                returned += intake.return_batch(batch)
            except RedisError as exc:
                stuck[batch] = held[batch]
                error = exc
        self._open.clear()
        self._taking = None
        if returned:
            self.crawler.stats.inc_value("frontier/seeds/returned", returned)
            logger.info(
                "Returned %d seeds to %s: their requests were not (or not surely) "
                "stored in the frontier", returned, self.redis_key, extra={"spider": self},
            )
        if stuck:
            logger.warning(
                "Redis unreachable at close (%s): seeds taken from %s whose requests "
                "are not known to be stored in the frontier were not crawled by this "
                "worker (%d known, in intake "
                "batches %s); they stay there, and the next worker of this crawl "
                "returns them to %s once they have been untouched for its "
                "FRONTIER_LEASE_TIMEOUT (%gs in this worker's settings)",
                error or "no answer at the scheduler's close", self.redis_key,
                sum(stuck.values()), ", ".join(sorted(stuck)),
                self.redis_key, self.lease_timeout, extra={"spider": self},
            )

    def _warn_committed_stay(self, why: object) -> None:
        """Log that the batches whose requests are in the frontier stay
        registered (Redis did not answer at close: ``why``)."""
        assert self._intake is not None
        logger.warning(
            "Redis unreachable at close (%s): %d intake batches of %s whose "
            "requests are in the frontier stay registered; the next worker "
            "returns their seeds to %s and they are crawled again",
            why, len(self._committed), self._intake.keys.registry, self.redis_key,
            extra={"spider": self},
        )

    def _requests_from(self, data: bytes) -> list[Request]:
        """The requests :meth:`make_request_from_data` makes of one seed.

        As scrapy-redis reads its return value: a request, or any iterable
        of them (a list, a generator); None or an empty iterable make none.
        Anything else it returns (an item, a dict), or an exception it
        raises, is logged as an error naming the seed, counted in
        ``frontier/seeds/bad``, and the seed's other requests are crawled.
        """
        try:
            made: Any = self.make_request_from_data(data)
            if made is None:
                return []
            if isinstance(made, Request):
                return [made]
            if isinstance(made, Iterable) and not isinstance(made, str | bytes | dict):
                made = list(made)
            else:
                made = [made]
        except Exception:
            self.crawler.stats.inc_value("frontier/seeds/bad")
            logger.exception(
                "make_request_from_data failed on seed %r from %s: skipped",
                data[:200], self.redis_key, extra={"spider": self},
            )
            return []
        requests = [r for r in made if isinstance(r, Request)]
        if len(requests) < len(made):
            self.crawler.stats.inc_value("frontier/seeds/bad")
            logger.error(
                "make_request_from_data gave %s for seed %r from %s: only requests "
                "can be crawled, the rest is skipped",
                ", ".join(sorted({type(r).__name__ for r in made if not isinstance(r, Request)})),
                data[:200], self.redis_key, extra={"spider": self},
            )
        return requests

    def make_request_from_data(self, data: bytes) -> Request | None:
        """Turn one seed into a request, or log why it is bad and return None.

        Overrides scrapy-redis's method, which logs with colour codes; JSON
        seeds are read as scrapy-redis 0.9.1 reads them (keys other than the
        frontier's are form data: a ``FormRequest``), see
        :mod:`crawler.frontier.seeds` for the accepted forms. A subclass may
        return a request, any iterable of requests, or None.
        """
        try:
            request = request_from_seed(self, data)
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
        return request

    def _seed_callback(self, name: str) -> Any:
        """The spider method a JSON seed names as its callback
        (:func:`seed_callback`)."""
        return seed_callback(self, name)

    def spider_idle(self) -> None:
        """Let the spider close once :meth:`start` has given up for idleness.

        Replaces scrapy-redis's handler, which reads seeds here (we read them
        in :meth:`start`) and keeps the spider open with ``DontCloseSpider``.
        The engine sends this signal only after :meth:`start` has returned.
        """
        return None


class FrontierCrawlSpider(FrontierSpider, CrawlSpider):
    """:class:`FrontierSpider` with Scrapy's ``CrawlSpider`` rules: seeds are
    read as :class:`FrontierSpider` reads them (durably, from
    ``<name>:start_urls``, ``start_urls`` pushed once per crawl) and their
    responses go through ``rules`` as in a ``CrawlSpider``; scrapy-redis's
    ``RedisCrawlSpider`` in the frontier's image.

    A JSON seed without a ``callback`` is parsed by the rules (and
    ``parse_start_url``); name none of the rules' callbacks there.
    """


def seed_callback(spider: Any, name: str) -> Any:
    """The method of ``spider`` a JSON seed names as its callback.

    Only ``parse`` and the public methods a spider defines itself are
    callbacks: not private names, nor the machinery of :class:`FrontierSpider`
    (and so of scrapy-redis's and Scrapy's spiders: ``start``, ``close``, ...).

    :raises BadSeed: for any other name.
    """
    if name.startswith("_") or (name != "parse" and hasattr(FrontierSpider, name)):
        raise BadSeed(f"{name!r} is not a callback of this spider")
    callback = getattr(spider, name, None)
    if not callable(callback):
        raise BadSeed(f"spider has no callback {name!r}")
    return callback


def request_from_seed(spider: Any, data: bytes) -> Request:
    """The request of one seed, as :class:`FrontierSpider` makes it.

    :param spider: a scrapy-redis spider (its ``redis_encoding`` decodes
        ``data``; a seed's ``callback`` names one of its methods).
    :param data: the raw seed, see :mod:`crawler.frontier.seeds`: JSON keys
        other than the frontier's are form data (a ``FormRequest``), as
        scrapy-redis 0.9.1 reads them, numbers sent as their JSON text.
    :raises BadSeed: the seed cannot become a request (why in the message).
    :raises ValueError, TypeError: Scrapy refused the request.
    """
    seed = parse_seed(data, spider.redis_encoding)
    callback = None if seed.callback is None else seed_callback(spider, seed.callback)
    common: dict[str, Any] = {
        "callback": callback,
        "method": seed.method,
        "headers": seed.headers or None,
        "meta": seed.meta,
        "priority": seed.priority,
        "cb_kwargs": seed.cb_kwargs,
        "dont_filter": True,
    }
    if seed.formdata:
        return FormRequest(seed.url, formdata=seed.formdata, **common)
    return Request(seed.url, body=seed.body, **common)
