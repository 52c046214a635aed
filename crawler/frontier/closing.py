"""The scheduler's closing: leases given back and writes sent, in bounded time.

Job: when the scheduler closes (:meth:`Closing.close`), stop the heartbeats,
find out what a round trip whose reply was lost did, give back the leases
held and send the outbox, trying until ``CLOSE_REDIS_WAIT`` (10 s, or
``FRONTIER_LEASE_TIMEOUT`` when shorter) whatever the socket timeouts, then
leave the shards' registry of live workers; and when the reactor stops
before the scheduler closes (a forced stop: a second SIGTERM or SIGINT,
:meth:`Closing.give_back_at_forced_stop`), finish the local feed exports
and give every held lease back, with the outbox, in one commit that waits
at most ``GIVE_BACK_TIMEOUT`` (2 s).

Nothing is lost when Redis does not answer in time: a lease is acknowledged
only in or after the commits that queue the requests its page yielded
(:meth:`Outbox.batches <crawler.frontier.outbox.Outbox.batches>`), so an
unsent ack and its requests go together, the lease expires and the page is
crawled again (its items, already stored, are stored again in place).

Collaborators: the :class:`~crawler.frontier.session.Session` (lost
replies, the backoff), the :class:`~crawler.frontier.leasebook.LeaseBook`
(the give-backs), the :class:`~crawler.frontier.heartbeat.Heartbeats`
(stopped first: a beat after a give-back would extend leases given back),
the outbox, the crawl's shards (set at open as :attr:`Closing.shards`), its
crawler and stats, and the scheduler's ``flush`` (send the outbox).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from crawler.frontier.backoff import UNREACHABLE
from crawler.frontier.feedstop import finish_local_feeds
from crawler.frontier.forcedstop import CLOSE_REDIS_WAIT, GIVE_BACK_TIMEOUT, run_bounded

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

    from crawler.frontier.heartbeat import Heartbeats
    from crawler.frontier.leasebook import LeaseBook
    from crawler.frontier.outbox import Outbox
    from crawler.frontier.session import Session
    from crawler.frontier.shards import FrontierShards

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["Closing"]


class Closing:
    """The closing of one worker's scheduler (``holder``).

    :param lease_timeout: ``FRONTIER_LEASE_TIMEOUT``, seconds.
    :param flush: sends the outbox; returns False when Redis could not be
        reached.
    """

    shards: FrontierShards
    spider: Any = None

    def __init__(
        self, crawler: Crawler, session: Session, book: LeaseBook, heartbeats: Heartbeats,
        outbox: Outbox, *, holder: str, lease_timeout: float, flush: Callable[[], bool],
    ) -> None:
        self.crawler = crawler
        self.session = session
        self.book = book
        self.heartbeats = heartbeats
        self.outbox = outbox
        self.holder = holder
        self.lease_timeout = lease_timeout
        self.flush = flush
        #: The close said it waits for Redis (once per close).
        self._told = False

    @property
    def stats(self) -> Any:
        return self.crawler.stats

    def close(self) -> bool:
        """Stop the heartbeats, give back the leases held, send the outbox
        and leave the registry of live workers, within ``CLOSE_REDIS_WAIT``
        (in a thread: past it, what was not sent is left out and logged).

        :returns: whether Redis answered (False: no more calls should be
            made; the registry forgets this worker after its last
            heartbeat).
        """
        wait = min(self.lease_timeout, CLOSE_REDIS_WAIT)
        deadline = time.monotonic() + wait
        # (before the give-backs: a beat after them would extend them)
        self.heartbeats.stop(timeout=wait)
        sent = run_bounded(
            lambda: self._send(deadline),
            max(0.0, deadline - time.monotonic()) + 0.5,
            what="The frontier's writes at close",
        )
        if not sent:
            logger.error(
                "Redis unreachable or refusing at close: %d frontier writes not sent "
                "within %.0f s (unacknowledged leases will expire and be crawled again)",
                len(self.outbox), wait, extra={"spider": self.spider},
            )
            if sent is None or self.session.unreachable:  # (no answer: no more calls)
                return False
        try:
            self.shards.leave(self.holder)
        except UNREACHABLE:
            pass  # it stops counting a lease's length after its last heartbeat
        return True

    def _send(self, deadline: float) -> bool:
        """Resolve a call in doubt, give back the leases held, send the
        outbox; try until ``deadline`` (``time.monotonic()``). Returns
        whether everything was sent."""
        started = time.monotonic()
        self.session.closing = True
        if self.session.unreachable:
            self._tell(deadline)
        # A call in doubt first: the leases it took are given back too.
        while self.session.in_doubt is not None and time.monotonic() < deadline:
            self.session.down_until = 0.0
            if not self.session.resolve():
                self._pause_until(deadline)
        held = self.book.give_back_all()
        if held:
            self.stats.inc_value("frontier/leases/released", held)
            logger.info("Gave back %d unfinished leases", held)
        while self.outbox and time.monotonic() < deadline:
            self.session.down_until = 0.0
            if not self.flush():
                self._pause_until(deadline)
        done = self.session.in_doubt is None and not self.outbox
        if done and self._told:
            logger.info(
                "Redis answered at close after %.1f s: the frontier's writes are sent",
                time.monotonic() - started, extra={"spider": self.spider},
            )
        return done

    def _pause_until(self, deadline: float) -> None:
        """Sleep the backoff (0.5 s without one), at most 1 s, until
        ``deadline``; the first time, say that the close waits for Redis."""
        self._tell(deadline)
        time.sleep(max(0.0, min(1.0, self.session.backoff or 0.5, deadline - time.monotonic())))

    def _tell(self, deadline: float) -> None:
        """Say, once per close, that the close waits for Redis until
        ``deadline`` (when it has something to send)."""
        if self._told or not (self.outbox or self.session.in_doubt is not None):
            return
        self._told = True
        logger.warning(
            "Redis unreachable at close: trying for up to %.0f s more to send %d frontier "
            "writes (nothing to do: if Redis stays away, the leases they would "
            "acknowledge expire and are crawled again)",
            max(0.0, deadline - time.monotonic()), len(self.outbox),
            extra={"spider": self.spider},
        )

    def give_back_at_forced_stop(self) -> None:
        """The reactor stops before :meth:`close` ran (a second SIGTERM or
        SIGINT): give every held lease back, with the outbox, in one commit
        that waits at most ``GIVE_BACK_TIMEOUT`` (2 s) for Redis.

        A give-back is not a failed delivery: the request goes back to the
        front of its queue with its delivery count unchanged. A reply lost or
        late is not sent again: the next call of any worker resolves it, or
        the leases expire (and count as a delivery) as after a crash.
        Local feed exports are finished first, before the outbox's acks
        are sent (:func:`~crawler.frontier.feedstop.finish_local_feeds`).
        """
        finish_local_feeds(self.crawler)
        if not self.book.leases:
            return
        # (a beat after the give-back would only extend leases gone)
        self.heartbeats.stop(timeout=0.2)
        held = self.book.give_back_all()
        self.session.down_until = 0.0
        if run_bounded(self.flush, GIVE_BACK_TIMEOUT):
            self.stats.inc_value("frontier/leases/released", held)
            logger.info("Forced stop: gave back %d unfinished leases", held)
        else:
            logger.warning(
                "Forced stop: Redis did not confirm the give-back of %d leases "
                "within %s s (they come back when they expire)",
                held, GIVE_BACK_TIMEOUT,
            )
