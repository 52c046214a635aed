"""The heartbeat thread: a worker's leases stay its own while a callback
blocks the reactor.

A Scrapy callback runs on the reactor; one that blocks it (a long parse, a
synchronous call) stops every looping call with it, the scheduler's
heartbeat included. :class:`HeartbeatThread` beats from a daemon thread of
its own, with a Redis client of its own (never the reactor's pool): every
``interval`` seconds it marks the worker live (``alive.lua``) and extends
the leases it holds (``extend.lua``) on each shard. Both calls are
idempotent, so it may run beside the reactor's heartbeat.

It never touches Twisted or Scrapy objects: the scheduler hands it the
lease ids it holds (:meth:`HeartbeatThread.hold`, a snapshot copied under a
lock) from the reactor.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from redis.exceptions import RedisClusterException, RedisError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from redis import Redis

    from crawler.frontier.store import Frontier

__all__ = ["HeartbeatThread"]

logger = logging.getLogger(__name__)


class HeartbeatThread:
    """Mark ``holder`` live and extend its leases every ``interval`` seconds.

    :param frontiers: the crawl's shards (shard ``i`` is ``frontiers[i]``).
    :param client: a Redis client used by this thread only.
    :param holder: the worker's holder id (``{s}:alive`` member).
    :param interval: seconds between beats (> 0).
    """

    def __init__(
        self, frontiers: Sequence[Frontier], client: Redis, holder: str, interval: float
    ) -> None:
        self.frontiers = list(frontiers)
        self.client = client
        self.holder = holder
        self.interval = interval
        #: Beats sent in full (every shard answered).
        self.beats = 0
        self._lock = threading.Lock()
        self._held: dict[int, list[str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, held: Mapping[int, Sequence[str]]) -> None:
        """Replace the lease ids to extend (shard -> ids) with a copy of ``held``."""
        snapshot = {shard: list(ids) for shard, ids in held.items() if ids}
        with self._lock:
            self._held = snapshot

    def held(self) -> dict[int, list[str]]:
        """The lease ids the next beat extends (a copy)."""
        with self._lock:
            return {shard: list(ids) for shard, ids in self._held.items()}

    def start(self) -> None:
        """Start the daemon thread (the first beat one interval from now)."""
        self._thread = threading.Thread(
            target=self._run, name=f"frontier-heartbeat-{self.holder}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop beating and wait up to ``timeout`` seconds (None: for ever)
        for a beat in progress to end; then close the thread's client.
        No beat starts after this returns (unless the wait timed out)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            try:
                self.client.close()
            except (RedisError, RedisClusterException, OSError):
                pass

    def beat(self) -> bool:
        """One beat: ``alive`` then ``extend`` on every shard, with this
        thread's client. Redis errors are logged (debug) and swallowed: the
        reactor's heartbeat reports outages. Returns whether every shard
        answered."""
        held = self.held()
        ok = True
        for i, frontier in enumerate(self.frontiers):
            try:
                frontier.beat(self.holder, held.get(i, []), client=self.client)
            except (RedisError, RedisClusterException, OSError) as exc:
                ok = False
                logger.debug("Heartbeat thread: shard %d did not answer: %s", i, exc)
        if ok:
            self.beats += 1
        return ok

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()
