"""The scheduler's heartbeats: a worker's leases stay its own while it lives.

Job: every third of ``FRONTIER_LEASE_TIMEOUT``, mark the worker live
(``alive.lua``) and extend the leases it holds (``extend.lua``) on each
shard, so that they expire only when the worker is gone. Two heartbeats do
it, both idempotent, side by side:

* :class:`Heartbeats` beats on the reactor (:meth:`Heartbeats.beat`): it
  also sends the outbox, ends an outage's backoff as soon as Redis answers
  again, and then has the eviction watch check Redis
  (:meth:`crawler.frontier.eviction.EvictionWatch.watch`);
* :class:`HeartbeatThread` beats from a daemon thread of its own, with a
  Redis client of its own (never the reactor's pool): a Scrapy callback
  that blocks the reactor (a long parse, a synchronous call) stops every
  looping call with it, the reactor's heartbeat included, but not this one.
  It never touches Twisted or Scrapy objects: it is handed the lease ids
  held (:meth:`HeartbeatThread.hold`, a snapshot copied under a lock) from
  the reactor.

Collaborators: the :class:`~crawler.frontier.session.Session` (Redis's
health, the backoff, failures), the
:class:`~crawler.frontier.leasebook.LeaseBook` (the leases held), the
crawl's shards (:class:`~crawler.frontier.shards.FrontierShards`), and two
callables of the scheduler: ``flush`` (send the outbox) and ``after_beat``
(the eviction check).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisClusterException, RedisError
from scrapy.utils.asyncio import create_looping_call

from crawler.frontier.backoff import UNREACHABLE
from crawler.frontier.connection import drop_connections, get_redis, is_no_master
from crawler.frontier.health import may_call_redis

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from redis import Redis
    from scrapy.crawler import Crawler

    from crawler.frontier.leasebook import LeaseBook
    from crawler.frontier.session import Session
    from crawler.frontier.shards import FrontierShards
    from crawler.frontier.store import Frontier

__all__ = ["HeartbeatThread", "Heartbeats"]

logger = logging.getLogger(__name__)
#: The scheduler's logger: the reactor's heartbeat logs as the scheduler does.
scheduler_logger = logging.getLogger("crawler.frontier.scheduler")


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


class Heartbeats:
    """The reactor's heartbeat of one worker (``holder``) and its
    :class:`HeartbeatThread`, every ``max(0.1, lease_timeout / 3)`` seconds.

    :param crawler: the crawl's crawler (its settings give the thread's
        Redis client).
    :param session: the worker's session.
    :param holder: the worker's holder id.
    :param lease_timeout: ``FRONTIER_LEASE_TIMEOUT``, seconds.
    :param flush: sends the outbox; returns False when Redis could not be
        reached.
    :param after_beat: called after a beat Redis answered.
    :ivar book: the worker's lease book (the leases held), set before
        :meth:`start`.
    :ivar loop: the reactor's heartbeat (a looping call of :meth:`beat`),
        None before :meth:`start`.
    :ivar thread: the heartbeat thread, None when it is stopped or could
        not be made.
    """

    shards: FrontierShards
    book: LeaseBook
    spider: Any = None

    def __init__(
        self, crawler: Crawler, session: Session, holder: str, lease_timeout: float, *,
        flush: Callable[[], bool], after_beat: Callable[[], None],
    ) -> None:
        self.crawler = crawler
        self.session = session
        self.holder = holder
        self.interval = max(0.1, lease_timeout / 3)
        self.flush = flush
        self.after_beat = after_beat
        self.loop: Any = None
        self.thread: HeartbeatThread | None = None

    def start(self, shards: FrontierShards, spider: Any) -> None:
        """Start both heartbeats: :meth:`beat` on the reactor, and
        :class:`HeartbeatThread`, with a Redis client of its own. Without
        the thread (its client failed: a cluster that does not answer now)
        the reactor's heartbeat beats alone, and a callback that blocks the
        reactor longer than a lease loses the worker's leases."""
        self.shards, self.spider = shards, spider
        self.loop = create_looping_call(self.beat)
        self.loop.start(self.interval, now=False)
        try:
            client = get_redis(self.crawler.settings)
        except (*UNREACHABLE, ValueError) as exc:
            scheduler_logger.warning(
                "No heartbeat thread (its Redis client failed: %s): a callback that blocks "
                "the reactor for longer than FRONTIER_LEASE_TIMEOUT loses this worker's "
                "leases (restart the worker once Redis answers to get one)", exc,
                extra={"spider": spider},
            )
            return
        self.thread = HeartbeatThread(shards.frontiers, client, self.holder, self.interval)
        self.publish_held()
        self.thread.start()

    def stop(self, timeout: float) -> None:
        """Stop both heartbeats, waiting up to ``timeout`` seconds for a
        beat of the thread in progress (a beat after a give-back would
        extend leases given back)."""
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        if self.thread is not None:
            self.thread.stop(timeout=timeout)
            self.thread = None

    def publish_held(self) -> None:
        """Hand the heartbeat thread the lease ids held now (a snapshot)."""
        if self.thread is not None:
            self.thread.hold(self.book.held())

    def beat(self) -> None:
        """The reactor's heartbeat: send the outbox, mark this worker live
        (``{s}:alive``) and extend the leases it holds, then
        ``after_beat``.

        It also goes while an outage's backoff runs (up to
        ``OUTAGE_BACKOFF_CAP``, 30 s, past the outage's end): both writes
        are idempotent. When Redis answers, the backoff ends there, so the
        leases are extended and the worker goes on within a heartbeat of
        Redis's return, instead of its leases expiring (another worker would
        crawl them again) and the other workers' fair shares counting it
        dead; when Redis is still down, nothing changes (the outage is
        logged already). After a configuration error it sends nothing (the
        crawl is closing). A refused call is no outage: the heartbeat goes.
        While no synchronous Redis call may be made on the reactor (an
        outage met elsewhere, the spider closing), only the thread is told
        the leases held.
        """
        if not may_call_redis(self.crawler):
            self.publish_held()  # (the heartbeat thread extends them)
            return
        self.flush()
        probing = self.session.probing()
        if probing and self.session.config_stopped:
            return  # a configuration error: no call until the crawl closes
        # Leases stay extended until their ack is in Redis (an ack refused
        # or in doubt waits in the outbox).
        held = self.book.held()
        if self.thread is not None:
            self.thread.hold(held)
        try:
            # (a node that restarted without the scripts gets them loaded:
            # FrontierShards._each)
            self.shards.alive(self.holder)
            if held:
                self.shards.extend(held)
        except UNREACHABLE as exc:
            if not probing:
                self.session.failed(exc)
            elif is_no_master(exc):  # (still a replica behind the endpoint)
                drop_connections(self.session.server)
            return
        if probing:
            scheduler_logger.info("Redis answers the heartbeat: the outage's backoff ends",
                                  extra={"spider": self.spider})
            self.session.down_until = 0.0
            self.flush()
        self.after_beat()
