"""The scheduler's lease book: the leases one worker holds, and their ends.

Job: turn leases taken from Redis into requests in a local buffer
(:meth:`LeaseBook.take`, :meth:`LeaseBook.hand_out`); remember which lease
each request is and which shard it came from; queue the writes that end a
lease's parts in the :class:`~crawler.frontier.outbox.Outbox` (its download
slot freed: :meth:`LeaseBook.download_ended`; the lease acknowledged:
:meth:`LeaseBook.finished`; every lease given back:
:meth:`LeaseBook.give_back_all`); tell what is held for the heartbeats
(:meth:`LeaseBook.held`); and keep the last-chance rule: a request one
death short of ``FRONTIER_MAX_DELIVERIES`` is leased alone, and nothing
more is leased while it is held or while a drain for one runs
(:meth:`LeaseBook.holding_back`).

Collaborators: the outbox (the writes), the crawl's
:class:`~crawler.frontier.queue.LeasedPriorityQueue` (decoding, shards;
set at open as :attr:`LeaseBook.queue`), the crawl's stats, and two
callbacks: ``dead_entry`` (a leased entry that cannot be decoded: the
scheduler gives :meth:`DeadLetters.entry
<crawler.frontier.deadletters.DeadLetters.entry>`) and ``changed`` (the
leases held changed: :meth:`Heartbeats.publish_held
<crawler.frontier.heartbeat.Heartbeats.publish_held>` tells the heartbeat
thread).
"""

from __future__ import annotations

import collections
import itertools
import logging
from typing import TYPE_CHECKING, Any

from crawler.frontier.lifecycle import SUSPECT

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

    from crawler.frontier.outbox import Outbox
    from crawler.frontier.queue import LeasedPriorityQueue
    from crawler.frontier.store import Lease, NotDue

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["REVISIT_META", "LeaseBook"]

#: Request meta key of a revisit (``FRONTIER_REVISIT_AFTER``): the
#: validators of the last response, ``{"etag": str, "modified": str}`` (each
#: optional), sent as ``If-None-Match`` / ``If-Modified-Since``
#: (:class:`crawler.middlewares.RevisitMiddleware`). A revisit leased is
#: counted in ``frontier/revisits/leased``.
REVISIT_META = "frontier_revisit"


class LeaseBook:
    """The leases of one worker (``holder``).

    :ivar leases: each leased request's lease id.
    :ivar entries: with revisits on, each leased request's entry as queued
        and its site: a revisit is built from it, not from the request as
        the downloader middlewares left it (their headers and meta are this
        download's, e.g. USER_AGENT, cookies).
    :ivar lease_shards: lease id -> the shard it was taken from (until its
        ack or give-back is queued).
    :ivar ready: leased requests not handed to the engine yet.
    :ivar alone: the lease of a request on its last chance (one death short
        of ``FRONTIER_MAX_DELIVERIES``), leased alone (``lease.lua`` says so:
        its state is :data:`~crawler.frontier.lifecycle.SUSPECT`): nothing more is
        leased while it is held, so that if it kills the worker it dies
        alone.
    :ivar drain_shard: a shard whose lease call put back a request's last
        chance because this worker held leases: nothing more is leased
        until it holds none, then that shard is asked first.
    :ivar drained_for: that shard and the last chance's site, until a lease
        call there holding nothing is sent: it looks at that site first
        (:meth:`drain_hint`), so better work queued elsewhere does not make
        the worker meet the last chance beside it, and drain, again and
        again.
    """

    queue: LeasedPriorityQueue
    spider: Any = None

    def __init__(
        self, holder: str, outbox: Outbox, stats: Any,
        dead_entry: Callable[[bytes, str, Exception, str | None], None],
        changed: Callable[[], None],
    ) -> None:
        self.holder = holder
        self.outbox = outbox
        self.stats = stats
        self.dead_entry = dead_entry
        self.changed = changed
        self.leases: dict[Request, str] = {}
        self.entries: dict[Request, tuple[bytes, str]] = {}
        self.lease_shards: dict[str, int] = {}
        self.ready: collections.deque[Request] = collections.deque()
        self._ids = itertools.count()
        self.alone: str | None = None
        self.drain_shard: int | None = None
        self.drained_for: tuple[int, str] | None = None

    def new_ids(self, n: int) -> list[str]:
        """``n`` lease ids never asked for before: ``<holder>:<n>``."""
        return [f"{self.holder}:{next(self._ids)}" for _ in range(n)]

    def take(self, leases: list[Lease]) -> None:
        """Decode leased requests into :attr:`ready` (an undecodable entry
        goes to the ``dead_entry`` callback, which dead-letters and acks it)."""
        queue = self.queue
        for lease in leases:
            # (first: an undecodable entry's ack and dead letter go to its shard)
            self.lease_shards[lease.lease_id] = queue.shards.index_of(lease.site)
            try:
                request = queue.decode(lease.data, lease.site)
            except Exception as exc:  # whatever Redis held, never crash the worker
                self.dead_entry(lease.data, lease.lease_id, exc, lease.site)
                continue
            self.leases[request] = lease.lease_id
            self.changed()
            if lease.state == SUSPECT:  # (lease.lua leased its last chance alone)
                self.alone = lease.lease_id
                self.stats.inc_value("frontier/last_chance/leased")
            if queue.frontier.revisit_after_ms:
                self.entries[request] = (lease.data, lease.site)
            self.ready.append(request)
            if REVISIT_META in request.meta and not request.meta.get("retry_times"):
                self.stats.inc_value("frontier/revisits/leased")

    def hand_out(self) -> Request:
        """The next request of :attr:`ready` (counted as dequeued)."""
        self.stats.inc_value("scheduler/dequeued/redis")
        return self.ready.popleft()

    def holding_back(self) -> bool:
        """Whether to lease nothing now, for a request on its last chance
        (``lease.lua`` leases it alone): while this worker holds such a
        lease, or while it drains for one that a lease call put back
        because it held other leases. A poison request then kills the worker
        alone, and a request leased beside it is not dead-lettered with it."""
        if self.alone is not None:
            if self.alone in self.lease_shards:
                return True
            self.alone = None
        return self.drain_shard is not None and bool(self.lease_shards)

    def last_passed(self, result: Lease | NotDue, shard: int) -> None:
        """Start a drain when a lease call to ``shard`` put back a request's
        last chance (see :meth:`holding_back`)."""
        if result.last_passed:
            self.drained_for = (shard, result.last_passed)
            if self.drain_shard is None:
                self.stats.inc_value("frontier/last_chance/drains")
                logger.debug(
                    "A request on its last delivery waits for this worker to hold nothing "
                    "(shard %d): leasing nothing more until then", shard,
                    extra={"spider": self.spider},
                )
            self.drain_shard = shard

    def drain_hint(self, shard: int) -> str | None:
        """For a lease call on ``shard`` now: the site of the last chance
        this worker drained for there, once it holds nothing (then given
        once); else None."""
        hint = self.drained_for
        if hint is not None and hint[0] == shard and not self.lease_shards:
            self.drained_for = None
            return hint[1]
        return None

    def held_on(self, shard: int) -> int:
        """Leases held that were taken from ``shard``."""
        return sum(1 for s in self.lease_shards.values() if s == shard)

    def download_ended(self, request: Request) -> int | None:
        """``request``'s download ended: its slot is freed (a ``slots``
        write). Returns its lease's shard; None for a request not leased here."""
        lease_id = self.leases.get(request)
        if lease_id is None:
            return None
        shard = self.lease_shards.get(lease_id, 0)
        self.outbox.write("slots", item=lease_id, shard=shard)
        return shard

    def finished(self, request: Request) -> bool:
        """The engine is done with ``request``: its lease is acknowledged
        (an ``acks`` write). Returns whether this ends a drain or a last
        chance held alone (then the next lease call may go now)."""
        self.entries.pop(request, None)
        lease_id = self.leases.pop(request, None)
        if lease_id is None:
            return False
        self.outbox.write("acks", item=lease_id, shard=self.lease_shards.pop(lease_id, 0))
        self.changed()
        return not self.lease_shards and (self.drain_shard is not None or bool(self.alone))

    def give_back_all(self) -> int:
        """Queue a give-back of every lease held, and forget the buffer;
        returns how many leases."""
        held = list(self.leases.values())
        self.leases.clear()
        self.ready.clear()
        self.entries.clear()
        for lease_id in held:
            self.outbox.write("givebacks", item=lease_id, shard=self.lease_shards.pop(lease_id, 0))
        return len(held)

    def held(self) -> dict[int, list[str]]:
        """The lease ids this worker holds, by shard: its leases, and those
        whose ack waits in the outbox (they stay extended until the ack is
        in Redis)."""
        held: dict[int, list[str]] = {}
        for lease_id in self.leases.values():
            held.setdefault(self.lease_shards.get(lease_id, 0), []).append(lease_id)
        for shard, lease_id in self.outbox.acks():
            held.setdefault(shard, []).append(lease_id)
        return held
