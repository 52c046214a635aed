"""Whether a synchronous Redis call may start on the reactor thread now.

A synchronous Redis call made on the reactor thread blocks it until Redis
answers, or for up to the client's ``socket_timeout`` (10 s by default) when
Redis does not: a partition that leaves connections open and carries no
replies (a *silent* Redis) then stalls the downloads, the heartbeat and a
graceful stop, one socket timeout per call. So, while the reactor runs:

* during an outage (:class:`RedisHealth` ``failing``: a frontier call met
  an unreachable Redis), no reactor-thread call starts until a ``PING``
  sent from a thread of its own has been answered (:meth:`RedisHealth.may_call`);
* once the spider is closing (a graceful stop, an idle close), only the
  scheduler's bounded close calls Redis (:func:`may_call_redis`).

Best-effort callers (the seed reader) skip their call and try again later;
the scheduler keeps its writes in its outbox. The politeness middlewares
(:mod:`crawler.politeness`) run their Redis calls in the reactor's thread
pool, and while the gate is closed wait for it a probe interval
(:data:`PROBE_INTERVAL`) at a time (the adaptive slowdown once, then goes
on without its call).
Outside a running reactor (a scheduler driven by a test, a command), calls
are synchronous as before: nothing is gated.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from scrapy.utils.reactor import is_reactor_installed
from twisted.internet.defer import Deferred

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

__all__ = [
    "RedisHealth", "may_call_redis", "note_redis_failure", "on_running_reactor",
    "redis_answered", "redis_is_failing", "spider_closing",
]

logger = logging.getLogger(__name__)

#: Seconds between the end of a failed probe and the start of the next.
PROBE_INTERVAL = 0.5
#: Seconds between two reminders that Redis is still unreachable.
STILL_DOWN_EVERY = 30.0


def _reactor() -> Any:
    # (imported here: importing it installs the default reactor)
    from twisted.internet import reactor  # noqa: PLC0415

    return reactor


def on_running_reactor() -> bool:
    """Whether this is the thread of a running Twisted reactor (a call here
    blocks the reactor)."""
    if not is_reactor_installed():
        return False
    from twisted.python import threadable  # noqa: PLC0415

    in_io_thread: Callable[[], bool] = threadable.isInIOThread
    return bool(_reactor().running) and in_io_thread()


class RedisHealth:
    """The frontier's view of Redis, for calls on the reactor thread.

    :param ping: a call that raises unless Redis answers (``Redis.ping``);
        it runs in a daemon thread of its own, one at a time.
    :param answered: called on the reactor thread when a ``PING`` sent
        during an outage was answered (the scheduler ends its backoff).
    :param on_failure: called, on the failing call's thread, whenever any
        component meets an unreachable Redis (the scheduler forgets its
        local fingerprints: Redis may come back from an older snapshot).
    :param still_down: called, from the probe's thread, with the seconds
        since the outage began and the probe's error, every
        :data:`STILL_DOWN_EVERY` seconds while probes fail (the scheduler
        logs what it waits for and how to stop it).
    """

    def __init__(
        self, ping: Callable[[], object], answered: Callable[[], None],
        on_failure: Callable[[], None] | None = None,
        still_down: Callable[[float, BaseException], None] | None = None,
    ) -> None:
        self._ping = ping
        self._answered_cb = answered
        self._on_failure = on_failure
        self._still_down = still_down
        #: time.monotonic() when the outage began (None: none), and when
        #: it was last said to go on
        self._down_since: float | None = None
        self._told_at = 0.0
        #: A Redis call met an unreachable Redis, and none succeeded since.
        self.failing = False
        #: A ``PING`` sent since the last failure was answered.
        self._answered = threading.Event()
        self._probing = threading.Lock()
        #: ``time.monotonic()`` before which no new probe starts.
        self._next_probe = 0.0

    @property
    def answered(self) -> bool:
        """Whether a ``PING`` sent since the last failure was answered."""
        return self._answered.is_set()

    def failed(self) -> None:
        """A Redis call could not reach Redis (or answered too late): calls
        ``on_failure`` (any thread), then gates the reactor's calls."""
        if self._on_failure is not None:
            self._on_failure()
        if self._down_since is None:
            self._down_since = self._told_at = time.monotonic()
        self.failing = True
        self._answered.clear()

    def recovered(self) -> None:
        """A Redis call succeeded."""
        self.failing = False
        self._down_since = None
        self._answered.clear()

    def may_call(self) -> bool:
        """Whether a synchronous Redis call may start now: always off a
        running reactor's thread, or while Redis is not failing; during an
        outage, once a ``PING`` was answered since (else one is sent from a
        thread, if none is under way, and False is returned)."""
        if not self.failing or self._answered.is_set() or not on_running_reactor():
            return True
        self.probe()
        return False

    def probe(self) -> None:
        """Send a ``PING`` from a daemon thread unless one is under way or
        one ended less than :data:`PROBE_INTERVAL` ago (never waited for:
        the process may exit while it runs)."""
        if time.monotonic() < self._next_probe or not self._probing.acquire(blocking=False):
            return
        threading.Thread(target=self._run_probe, name="frontier-redis-probe", daemon=True).start()

    def _run_probe(self) -> None:
        try:
            self._ping()
        except Exception as exc:
            if not redis_answered(exc):
                logger.debug("Redis probe failed: %s", exc)
                now = time.monotonic()
                since = self._down_since
                if (self._still_down is not None and since is not None
                        and now - self._told_at >= STILL_DOWN_EVERY):
                    self._told_at = now
                    self._still_down(now - since, exc)
                return
            # Redis answered with a refusal (a password rotated, an ACL):
            # the calls go ahead and meet it, a configuration error.
            self._answered.set()
            if is_reactor_installed() and _reactor().running:
                _reactor().callFromThread(self._answered_cb)
        else:
            self._answered.set()
            if is_reactor_installed() and _reactor().running:
                _reactor().callFromThread(self._answered_cb)
        finally:
            self._next_probe = time.monotonic() + PROBE_INTERVAL
            self._probing.release()


def redis_answered(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a Redis call, is an answer of Redis's (a
    refusal: a wrong password, a missing permission, an error reply), not
    the lack of one (a connection refused or reset, a timeout)."""
    if isinstance(exc, AuthenticationError):  # (a ConnectionError in redis-py)
        return True
    return not isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError))


def _scheduler(crawler: Crawler) -> Any:
    """The engine's slot and its scheduler, (None, None) before the crawl
    starts (Scrapy's ``Crawler.engine`` raises RuntimeError until then)."""
    try:
        engine = crawler.engine
    except (AttributeError, RuntimeError):
        return None, None
    slot = getattr(engine, "_slot", None)
    return slot, getattr(slot, "scheduler", None)


def spider_closing(crawler: Crawler) -> bool:
    """Whether the engine is closing the spider (a graceful stop, an idle
    close, ``CloseSpider``): its slot's ``closing`` is a Deferred (Scrapy's
    ``scrapy.core.engine._Slot``; an engine stand-in, a ``Mock``, never is)."""
    slot, _ = _scheduler(crawler)
    return isinstance(getattr(slot, "closing", None), Deferred)


def may_call_redis(crawler: Crawler) -> bool:
    """Whether a synchronous Redis call may start now: always off a running
    reactor's thread; on it, not once the spider is closing (the
    scheduler's bounded close sends what is left), nor during an outage
    until a probe was answered (:meth:`RedisHealth.may_call`). When False,
    skip the call and try again later."""
    if not on_running_reactor():
        return True
    if spider_closing(crawler):
        return False
    _, scheduler = _scheduler(crawler)
    health = getattr(scheduler, "redis_health", None)
    return not isinstance(health, RedisHealth) or health.may_call()


def redis_is_failing(crawler: Crawler) -> bool:
    """Whether the frontier scheduler's last Redis call met an unreachable
    Redis (:attr:`RedisHealth.failing`), on any thread."""
    _, scheduler = _scheduler(crawler)
    health = getattr(scheduler, "redis_health", None)
    return isinstance(health, RedisHealth) and health.failing


def note_redis_failure(crawler: Crawler) -> None:
    """Tell the frontier scheduler's :class:`RedisHealth` that a Redis call
    failed to reach Redis (the next reactor-thread calls wait for a probe)."""
    _, scheduler = _scheduler(crawler)
    health = getattr(scheduler, "redis_health", None)
    if isinstance(health, RedisHealth):
        health.failed()
