"""The worker's view of Redis's health: outages, refusals, configuration errors.

Job: classify a failed Redis call (:meth:`Backoff.failed`) as an outage
(Redis unreachable, too late, no master, too few replicas: doubling pauses
up to :data:`OUTAGE_BACKOFF_CAP`), a refusal (a script refused a call
before it wrote anything: the same pauses, no outage) or a configuration
error (a wrong password, an ACL: the crawl stops, nothing more is sent);
end the pauses when Redis answers (:meth:`Backoff.recovered`, or a probe
of :class:`~crawler.frontier.health.RedisHealth`); and gate calls while
another component of the worker met an outage first
(:meth:`Backoff.may_call`).

Collaborators: :class:`~crawler.frontier.health.RedisHealth` (the probe,
built here as :attr:`Backoff.redis_health`), the
:class:`~crawler.frontier.outbox.Outbox` (its size is logged; a
configuration error gives its writes up) and the host's ``forget_seen`` and
``wake`` (:class:`~crawler.frontier.session.SessionHost`).
:class:`~crawler.frontier.session.Session` extends this class with the
round trips.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from crawler.config import stop_on_config_error
from crawler.frontier.connection import (
    NOT_RUN,
    config_error_message,
    drop_connections,
    is_no_master,
    redis_location,
)
from crawler.frontier.health import RedisHealth, may_call_redis
from crawler.frontier.replicas import NotReplicated

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["CONFIG_ERROR_PAUSE", "OUTAGE_BACKOFF_CAP", "UNREACHABLE", "Backoff"]

#: Longest pause, in seconds, between attempts to reach Redis during an outage.
OUTAGE_BACKOFF_CAP = 30.0
#: Seconds a worker stopped by a configuration error waits before any other
#: frontier call (it closes meanwhile).
CONFIG_ERROR_PAUSE = 3600.0
#: Errors a Redis client raises when Redis cannot be reached or answered
#: too late (redis-py's cluster client raises RedisClusterException, which
#: is no RedisError).
UNREACHABLE = (RedisError, RedisClusterException)


class Backoff:
    """Outage, refusal and configuration-error state of one worker.

    :ivar backoff: the current pause, seconds (0: Redis answers).
    :ivar down_until: ``time.monotonic()`` before which no call is sent.
    :ivar unreachable: the last call met an outage (or a configuration error).
    :ivar config_stopped: a configuration error stopped the crawl.
    :ivar closing: the scheduler is closing (outages logged at DEBUG).
    :ivar spider: the spider, for the log lines (set at open).
    """

    spider: Any = None

    def __init__(self, server: Any, crawler: Any, outbox: Any, host: Any) -> None:
        self.server = server
        self.crawler = crawler
        self.outbox = outbox
        self.host = host
        self.backoff = 0.0
        self.down_until = 0.0
        self.unreachable = False
        self.config_stopped = False
        #: The scheduler is closing: each failed try is logged at DEBUG
        #: (:class:`~crawler.frontier.closing.Closing` logs the wait).
        self.closing = False
        self._gave_up = False
        #: Gates synchronous Redis calls on the running reactor's thread
        #: during an outage and once the spider is closing (health.py).
        #: Any component's unreachable Redis (the seed reader's, the
        #: robots.txt middleware's) forgets the local fingerprints: a
        #: restart from an older snapshot can reach this worker's
        #: frontier calls without an error of their own.
        self.redis_health = RedisHealth(
            self.ping, self._redis_answered, on_failure=self.host.forget_seen,
            still_down=self._still_down)

    @property
    def stats(self) -> Any:
        return self.crawler.stats

    def _lost_state(self) -> None:
        """Forget what is in doubt (a configuration error gives it up)."""

    def failed(self, exc: Exception) -> None:
        """A Redis call outside the outbox failed: a configuration error (see
        :meth:`config_error`), a refusal (a key of the wrong type answers an
        error) or an outage. A reply that says the call did not run
        (:data:`~crawler.frontier.connection.NOT_RUN`: a cluster not serving
        the slot, or ``NOSCRIPT`` from a server that restarted between the
        pipeline's script check and its call; the next pipeline loads the
        scripts again) is an outage too, never logged as a refusal."""
        if self.config_error(exc):
            return
        if (
            isinstance(exc, ResponseError)
            and not isinstance(exc, NOT_RUN)
            and not is_no_master(exc)
        ):
            self.refused(exc)
        else:
            self.outage(exc)

    def refused(self, exc: ResponseError) -> None:
        """A script refused a call before it wrote anything: no outage, but
        nothing to do until the key it names is fixed. (An ACL's ``NOPERM``
        is a configuration error: :meth:`config_error`; a server that is
        no master is an outage: :meth:`outage`.)"""
        if is_no_master(exc):
            self.outage(exc)
            return
        if self.config_error(exc):
            return
        self.stats.inc_value("frontier/redis/refused")
        self.unreachable = False
        self.backoff = min(OUTAGE_BACKOFF_CAP, max(0.5, self.backoff * 2))
        self.down_until = time.monotonic() + self.backoff
        logger.error(
            "Redis refused a frontier call (%s); %d writes kept; trying again in %.1fs",
            exc, len(self.outbox), self.backoff, extra={"spider": self.spider},
        )

    def outage(self, exc: Exception) -> None:
        """Redis could not be reached, or answered too late: wait with
        doubling pauses. (A refused password is a configuration error,
        although redis-py raises it as a ``ConnectionError``:
        :meth:`config_error`.)

        A server that is no master (``READONLY``, ``LOADING``, ``MASTERDOWN``,
        ``UNBLOCKED``: :func:`~crawler.frontier.connection.is_no_master`, a
        failover) is an outage too: the pooled connections are dropped, so
        that the next call reaches whatever master the configured address
        names by then; the writes stay in the outbox."""
        if self.config_error(exc):
            return
        failover = is_no_master(exc)
        if failover:
            drop_connections(self.server)
        if isinstance(exc, NotReplicated):
            self.stats.inc_value("frontier/redis/not_replicated")
        # Redis may come back from an older snapshot, without fingerprints
        # this worker recorded: ask it again rather than trust the memory
        # (redis_health.failed() forgets them).
        self.unreachable = True
        self.redis_health.failed()
        if not self.backoff:
            self.stats.inc_value("frontier/redis/outages")
        self.backoff = min(OUTAGE_BACKOFF_CAP, max(0.5, self.backoff * 2))
        self.down_until = time.monotonic() + self.backoff
        # (at close, the closing logs one line when it starts trying and one
        # when it ends: not one per try)
        logger.log(
            logging.DEBUG if self.closing else logging.WARNING,
            "Redis %s (%s); %d writes waiting; trying again in %.1fs (an outage is waited "
            "out; check that Redis runs if this goes on)",
            "is no master (a failover): connections dropped" if failover
            else "has too few replicas" if isinstance(exc, NotReplicated) else "unreachable",
            exc, len(self.outbox), self.backoff, extra={"spider": self.spider},
        )

    def config_error(self, exc: Exception) -> bool:
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
        given_up = self.outbox.give_up()
        self._lost_state()
        self.host.forget_seen()
        self.config_stopped = True
        self.unreachable = True
        self.backoff = OUTAGE_BACKOFF_CAP
        self.down_until = time.monotonic() + CONFIG_ERROR_PAUSE
        stop_on_config_error(self.crawler, message)
        if given_up and not self._gave_up:
            self._gave_up = True
            logger.warning(
                "Gave up %d frontier writes: the leases they would have acknowledged "
                "expire and are crawled again by the other workers",
                given_up, extra={"spider": self.spider},
            )
        return True

    def stop(self) -> None:
        """A configuration error found at open: no call until the crawl closes."""
        self.config_stopped = True
        self.unreachable = True
        self.down_until = time.monotonic() + CONFIG_ERROR_PAUSE

    def recovered(self) -> None:
        """Redis answered a call: the backoff ends."""
        if self.backoff:
            logger.info("Redis reachable again", extra={"spider": self.spider})
        self.backoff = 0.0
        self.down_until = 0.0
        self.unreachable = False
        self.redis_health.recovered()

    def may_call(self) -> bool:
        """:func:`~crawler.frontier.health.may_call_redis`; when the gate
        holds the call because another component (the seed reader, the
        robots.txt middleware) met an outage first, say so once, as
        :meth:`outage` does for the scheduler's own calls."""
        if may_call_redis(self.crawler):
            return True
        if self.unreachable or not self.redis_health.failing:
            return False
        self.unreachable = True
        self.backoff = max(self.backoff, 0.5)
        self.stats.inc_value("frontier/redis/outages")
        logger.warning(
            "Redis unreachable (met by another component of this worker); %d writes "
            "waiting; trying again once Redis answers a probe",
            len(self.outbox), extra={"spider": self.spider},
        )
        return False

    def probing(self) -> bool:
        """Whether an outage's backoff runs now."""
        return self.unreachable and time.monotonic() < self.down_until

    def _still_down(self, seconds: float, exc: BaseException) -> None:
        """Redis has been unreachable for ``seconds`` (the probe's thread):
        say what the worker waits for, and how to stop it."""
        logger.warning(
            "Redis at %s unreachable for %.0f s (%s): this worker waits for it, whatever "
            "MAX_IDLE_TIME_BEFORE_CLOSE (an outage is waited out; nothing is lost). Check "
            "that Redis runs there and that REDIS_URL names it; Ctrl-C or SIGTERM stops "
            "the worker", redis_location(self.crawler.settings), seconds, exc,
            extra={"spider": self.spider},
        )

    def ping(self) -> None:
        """``PING`` Redis (the probe of :class:`RedisHealth`, in its thread)."""
        self.server.ping()

    def _redis_answered(self) -> None:
        """A probe sent during an outage was answered (reactor thread): end
        the backoff, so that the outbox and the leases go on now."""
        if self.unreachable and not self.config_stopped:
            logger.info("Redis answers a probe: the outage's backoff ends",
                        extra={"spider": self.spider})
            self.down_until = 0.0
            self.host.wake()
