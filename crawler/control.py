"""Crawl control: pause, resume and stop every worker of a crawl at once.

One Redis string per crawl, ``{<spider>}:control`` (:func:`crawler.keys.control_key`),
holds the crawl's state: ``paused`` or ``stopped``; absent means running.
``scrapy frontier pause|resume|stop SPIDER`` (:mod:`crawler.commands.frontier`)
writes it (:func:`write_state`); every worker reads it with one ``GET`` every
``FRONTIER_CONTROL_INTERVAL`` seconds (:class:`CrawlControl`) and acts:

``paused``
    The engine is paused (Scrapy's ``ExecutionEngine.pause()``): no new
    download starts; what is in flight finishes, goes through the spider
    and the pipelines and is acknowledged. The worker stays up (heartbeats,
    lease extensions) and does not count as idle for
    ``MAX_IDLE_TIME_BEFORE_CLOSE``; its seed intake may still move seeds
    into the frontier (they are not fetched).
``running`` (key absent)
    The engine is unpaused; the idle clock starts again at the resume.
``stopped``
    The spider is closed with the finish reason ``stopped``: in-flight
    downloads finish and are acknowledged, requests leased but not started
    are given back to the frontier at once (the scheduler's close), the
    item pipelines flush, and ``scrapy crawl`` exits with status 0. The
    frontier is kept. A worker started while the crawl is stopped logs
    ``crawl X is stopped; `scrapy frontier resume X` to continue`` and
    exits 0 without crawling.

Errors of the poll: while Redis is unreachable the worker keeps the last
state it read (logged once, and once again when Redis is back); a value
other than ``paused``/``stopped`` (or a key of another type) is logged once
and taken as running; a configuration error (a refused password, an ACL:
:func:`crawler.frontier.connection.config_error`) stops the crawl as
everywhere else (:func:`crawler.config.stop_on_config_error`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, Self

from redis.exceptions import RedisClusterException, RedisError, ResponseError
from scrapy import signals
from scrapy.exceptions import CloseSpider, NotConfigured
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet.threads import deferToThread

from crawler.config import FrontierConfig, close_at_open, stop_on_config_error
from crawler.frontier.connection import config_error_message, get_redis
from crawler.frontier.health import redis_is_failing
from crawler.keys import control_key, spider_name_of

if TYPE_CHECKING:
    from redis import Redis
    from scrapy.crawler import Crawler
    from scrapy.utils.asyncio import AsyncioLoopingCall
    from twisted.internet.task import LoopingCall

logger = logging.getLogger(__name__)

__all__ = [
    "PAUSED",
    "RUNNING",
    "STATES",
    "STOPPED",
    "STOPPED_REASON",
    "ControlState",
    "CrawlControl",
    "parse_state",
    "read_state",
    "write_state",
]

ControlState = Literal["running", "paused", "stopped"]
RUNNING: ControlState = "running"
PAUSED: ControlState = "paused"
STOPPED: ControlState = "stopped"
#: Every state, in the order the metrics list them.
STATES: tuple[ControlState, ...] = (RUNNING, PAUSED, STOPPED)
#: Finish reason of a worker closed by ``scrapy frontier stop``.
STOPPED_REASON = "stopped"
#: Redis errors of a client that cannot reach or use Redis.
_REDIS_ERRORS = (RedisError, RedisClusterException)


def parse_state(raw: bytes | str | None) -> ControlState | None:
    """The state a value of ``{<spider>}:control`` stands for.

    :param raw: the value ``GET`` returned (None: no key).
    :returns: ``"running"`` for None, ``"paused"``/``"stopped"`` for those
        words (ASCII, exact), None for anything else (a malformed value,
        which workers take as running).
    """
    if raw is None:
        return RUNNING
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    if text == PAUSED:
        return PAUSED
    if text == STOPPED:
        return STOPPED
    return None


def read_state(redis: Redis, spider: str) -> tuple[ControlState | None, bytes | None]:
    """One ``GET`` of ``{<spider>}:control``.

    :returns: ``(state, raw)``: the state (:func:`parse_state`; None for a
        malformed value or a key of another type) and the raw value
        (``b"WRONGTYPE"`` for a key of another type).
    :raises redis.exceptions.RedisError: Redis is unreachable or refused the
        call (other than ``WRONGTYPE``).
    """
    try:
        value: bytes | str | None = redis.get(control_key(spider))
    except ResponseError as exc:
        if str(exc).startswith("WRONGTYPE"):
            return None, b"WRONGTYPE"
        raise
    raw = value.encode() if isinstance(value, str) else value
    return parse_state(raw), raw


def write_state(redis: Redis, spider: str, state: ControlState) -> None:
    """Set the crawl's state: ``SET {<spider>}:control paused|stopped``, or
    ``DEL`` it for running (idempotent, safe to resend).

    :raises ValueError: ``state`` is not one of :data:`STATES`.
    :raises redis.exceptions.RedisError: Redis is unreachable or refused it.
    """
    if state not in STATES:
        raise ValueError(f"unknown crawl state {state!r}: expected one of {', '.join(STATES)}")
    key = control_key(spider)
    if state == RUNNING:
        redis.delete(key)
    else:
        redis.set(key, state)


class CrawlControl:
    """Extension: follow the crawl's state in ``{<spider>}:control``.

    Reads it when the spider opens (a stopped crawl closes the spider at
    once, reason ``stopped``; a paused one starts paused) and then every
    ``FRONTIER_CONTROL_INTERVAL`` seconds (default 1.0; one ``GET`` in a
    thread, never two at once), and pauses, unpauses or closes the engine
    accordingly (see the module docstring).

    Stats: ``control/paused`` (times this worker paused), ``control/resumed``.

    :raises NotConfigured: ``FRONTIER_CONTROL_INTERVAL`` is not positive.
    """

    def __init__(self, crawler: Crawler, server: Redis, spider: str, interval: float) -> None:
        self.crawler = crawler
        self.server = server
        self.spider = spider
        self.key = control_key(spider)
        self.interval = interval
        #: The last state acted on.
        self.state: ControlState = RUNNING
        self._polling = False
        self._told: set[str] = set()
        self._task: AsyncioLoopingCall | LoopingCall | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the extension; no Redis I/O here.

        :raises NotConfigured: ``FRONTIER_CONTROL_INTERVAL`` <= 0.
        """
        interval = FrontierConfig.of(crawler).control_interval
        if interval <= 0:
            raise NotConfigured("FRONTIER_CONTROL_INTERVAL must be positive")
        # The spider instance's name is taken again at open (spider_opened).
        ext = cls(crawler, get_redis(crawler.settings), spider_name_of(crawler), interval)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    async def spider_opened(self) -> None:
        """Read the state before the crawl starts, then poll it.

        :raises CloseSpider: the crawl is stopped (reason ``stopped``), or
            Redis refuses this worker's configuration (``config_error``).
        """
        self.spider = spider_name_of(self.crawler)  # set in __init__ or by -a name= too
        self.key = control_key(self.spider)
        try:
            state, raw = await maybe_deferred_to_future(
                deferToThread(read_state, self.server, self.spider)
            )
        except _REDIS_ERRORS as exc:
            message = config_error_message(exc, self.crawler.settings)
            if message is not None:
                raise close_at_open(self.crawler, message) from None
            self._unreachable(exc)
        else:
            if state == STOPPED:
                logger.info(
                    "crawl %s is stopped; `scrapy frontier resume %s` to continue "
                    "(%s = %r): not crawling",
                    self.spider, self.spider, self.key, raw.decode() if raw else raw,
                    extra={"spider": self.crawler.spider},
                )
                self.state = STOPPED
                raise CloseSpider(STOPPED_REASON)
            self._apply(state, raw)
        self._task = create_looping_call(self.poll)
        self._task.start(self.interval, now=False)

    def spider_closed(self) -> None:
        """Stop polling."""
        if self._task is not None and self._task.running:
            self._task.stop()

    def poll(self) -> None:
        """Read the state in a thread and act on it (skipped while a read
        runs, and while the frontier's Redis is failing: the read would hold
        a thread of the reactor's pool, which the process waits for at exit,
        for up to the socket timeout)."""
        if self._polling or redis_is_failing(self.crawler):
            return
        self._polling = True
        d = deferToThread(read_state, self.server, self.spider)
        d.addCallbacks(self._read, self._failed)

    def _read(self, result: tuple[ControlState | None, bytes | None]) -> None:
        self._polling = False
        if "unreachable" in self._told:
            self._told.discard("unreachable")
            logger.info(
                "Redis reachable again: following %s", self.key,
                extra={"spider": self.crawler.spider},
            )
        self._apply(*result)

    def _failed(self, failure: Any) -> None:
        self._polling = False
        exc = failure.value
        message = config_error_message(exc, self.crawler.settings)
        if message is not None:
            stop_on_config_error(self.crawler, message)
            return
        if isinstance(exc, _REDIS_ERRORS):
            self._unreachable(exc)
            return
        logger.error(
            "Reading %s failed: %s", self.key, failure.getErrorMessage(),
            exc_info=(failure.type, failure.value, failure.getTracebackObject()),
            extra={"spider": self.crawler.spider},
        )

    def _unreachable(self, exc: BaseException) -> None:
        if "unreachable" not in self._told:
            self._told.add("unreachable")
            logger.warning(
                "Could not read %s (%s: %s): keeping the crawl %s until Redis answers",
                self.key, type(exc).__name__, exc, self.state,
                extra={"spider": self.crawler.spider},
            )

    def _apply(self, state: ControlState | None, raw: bytes | None) -> None:
        """Pause, unpause or stop the engine to match ``state``."""
        if state is None:
            shown = raw.decode("utf-8", "backslashreplace") if raw else raw
            if f"bad:{shown}" not in self._told:
                self._told.add(f"bad:{shown}")
                logger.error(
                    "%s holds %r, neither 'paused' nor 'stopped': taken as running; "
                    "`scrapy frontier resume|pause|stop %s` sets it right",
                    self.key, shown, self.spider, extra={"spider": self.crawler.spider},
                )
            state = RUNNING
        if self.state in (state, STOPPED):
            return
        engine: Any = self.crawler.engine
        stats: Any = self.crawler.stats
        spider = self.crawler.spider
        previous, self.state = self.state, state
        if state == PAUSED:
            engine.pause()
            stats.inc_value("control/paused")
            logger.info(
                "crawl %s is paused (%s): downloads in flight finish, no new one starts "
                "until `scrapy frontier resume %s`",
                self.spider, self.key, self.spider, extra={"spider": spider},
            )
        elif state == RUNNING:
            engine.unpause()
            stats.inc_value("control/resumed")
            logger.info("crawl %s resumed", self.spider, extra={"spider": spider})
            slot = getattr(engine, "_slot", None)
            if slot is not None:
                slot.nextcall.schedule()  # lease now, not at the engine's next heartbeat
        else:
            logger.info(
                "crawl %s is stopped (%s, was %s): finishing the downloads in flight, "
                "giving back the other leases, then closing; `scrapy frontier resume %s` "
                "lets workers started later continue",
                self.spider, self.key, previous, self.spider, extra={"spider": spider},
            )
            if getattr(engine, "spider", None) is not None:
                deferred_from_coro(engine.close_spider_async(reason=STOPPED_REASON))
