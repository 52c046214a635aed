"""One clock for the times that order writes and judge liveness.

A worker's own clock may be off (a VM restored, NTP broken). The times
that order writes (``first_seen``, ``last_seen``, ``fetched_at`` in
MongoDB) and judge liveness (the heartbeat record's ``last_heartbeat``, the
registry sweep's bound) are read from :data:`CLOCK`: this process's clock
corrected by its offset to a server's clock, so that every worker stamps
with (about) the same clock and none stores a time in the future.

The offset is measured against Redis ``TIME`` on every heartbeat
(:class:`crawler.extensions.ClusterStats`) and against MongoDB's
``hello.localTime`` when :class:`crawler.pipelines.MongoPipeline` opens:
``server time - local time after the reply``: the lower bound of the
offset, so the corrected clock is never ahead of the server's (it is
behind by at most one round trip). Before any measurement the
offset is 0 (the local clock). Leases, seeds and the registry sweep's
removal are judged inside Lua scripts on the Redis clock already.

An offset larger than ``FRONTIER_CLOCK_SKEW_WARN`` seconds (default 2.0)
is logged once per process as a WARNING naming the server and the offset.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from crawler.config import SETTINGS, setting_value

logger = logging.getLogger(__name__)

#: Default of ``FRONTIER_CLOCK_SKEW_WARN``: seconds of offset that are logged.
SKEW_WARN: float = SETTINGS["FRONTIER_CLOCK_SKEW_WARN"].default


class Clock:
    """This process's clock, corrected by its last measured offset to a
    server's clock. Thread-safe (heartbeats measure in a thread)."""

    def __init__(self) -> None:
        #: Seconds to add to ``time.time()`` to get the server's time.
        self.offset = 0.0
        #: Whether an offset was measured yet.
        self.measured = False
        self.warn_after = SKEW_WARN
        self._warned = False
        self._lock = threading.Lock()

    def now(self) -> float:
        """The corrected time, Unix seconds."""
        return time.time() + self.offset

    def utcnow(self) -> datetime:
        """The corrected time as an aware UTC datetime (MongoDB stores
        milliseconds)."""
        return datetime.fromtimestamp(self.now(), UTC)

    def record(self, server: float, before: float, after: float, source: str) -> float:
        """Take the offset from one reading of a server's clock.

        :param server: the server's time, Unix seconds.
        :param before: ``time.time()`` just before the call, seconds.
        :param after: ``time.time()`` just after the reply, seconds.
        :param source: the server, for the warning (``"Redis"``).
        :returns: the offset, seconds (positive: this clock is slow).
        """
        del before  # the server read its clock at some time in [before, after]
        offset = server - after
        with self._lock:
            self.offset, self.measured = offset, True
            warn = abs(offset) > self.warn_after and not self._warned
            if warn:
                self._warned = True
        if warn:
            logger.warning(
                "This worker's clock is %.1fs %s %s's clock (more than "
                "FRONTIER_CLOCK_SKEW_WARN=%gs): times stored and heartbeats "
                "are corrected by that offset; fix the host's clock (NTP)",
                abs(offset), "behind" if offset > 0 else "ahead of", source, self.warn_after,
            )
        return offset

    def measure_redis(self, server: Any) -> float:
        """Measure the offset to Redis ``TIME`` (one round trip; blocking).

        :param server: a redis-py client (a cluster client reads one node).
        :returns: the offset, seconds.
        :raises redis.RedisError: Redis failed (the offset is unchanged).
        """
        before = time.time()
        reply = server.time()
        after = time.time()
        if isinstance(reply, dict):  # a cluster client: {node: (s, us)}
            reply = next(iter(reply.values()))
        seconds, micros = reply
        return self.record(int(seconds) + int(micros) / 1e6, before, after, "Redis")

    def measure_mongo(self, client: Any) -> float:
        """Measure the offset to MongoDB's clock (``hello``'s ``localTime``,
        milliseconds; one round trip; blocking).

        :param client: a pymongo ``MongoClient``.
        :returns: the offset, seconds.
        :raises pymongo.errors.PyMongoError: MongoDB failed.
        :raises KeyError: the server's reply has no ``localTime``.
        """
        before = time.time()
        reply = client.admin.command("hello")
        after = time.time()
        local: datetime = reply["localTime"]
        if local.tzinfo is None:
            local = local.replace(tzinfo=UTC)
        return self.record(local.timestamp(), before, after, "MongoDB")


#: The process's clock.
CLOCK = Clock()


def configure(settings: Any) -> None:
    """Read ``FRONTIER_CLOCK_SKEW_WARN`` (seconds) into :data:`CLOCK`."""
    CLOCK.warn_after = float(setting_value(settings, "FRONTIER_CLOCK_SKEW_WARN"))
