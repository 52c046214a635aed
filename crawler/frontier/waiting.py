"""What an idle worker waits for: the leases of workers that went silent.

A worker whose queue is empty does not close for idleness while requests
are leased anywhere (``FrontierScheduler.has_pending_requests``): the
worker holding them may yield more work. When that worker died, its leases
stay until they expire (``FRONTIER_LEASE_TIMEOUT`` after its last
heartbeat), then any lease call returns them to the queue. Meanwhile the
idle worker would say nothing for up to a lease's length;
:class:`LeaseWaitLog` tells, once per change::

    Waiting for 3 leases held by worker n1:1 (holder n1:1#ab12cd34, last
    heartbeat 12s ago) to expire at 06:41:03 UTC (in 48s); they will be
    crawled again then

It reads, in one round trip, the Redis clock (``TIME``), the first
``limit`` leases by deadline (``{s}:leases``, lease id ``<holder>:<n>`` ->
deadline ms) and the holders' last heartbeats (``{s}:alive``, holder -> ms
of its last heartbeat or lease call); all times are Redis's clock. A holder
is *silent* when its last heartbeat is older than half a lease (heartbeats
come every third of one) or gone from ``{s}:alive`` (lease calls drop
holders silent for a lease's length). The leases of silent holders expire
first (a live holder's deadlines are pushed on at every heartbeat), so the
first ``limit`` by deadline hold them all unless there are more.

With ``FRONTIER_SHARDS`` > 1 every shard has its own ``leases`` and
``alive``: :func:`silent_holders_of` reads each shard (one round trip
each) and adds up a holder's leases over them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisClusterException, RedisError

from crawler.frontier.shards import FrontierShards

if TYPE_CHECKING:
    from crawler.frontier.store import Frontier

logger = logging.getLogger(__name__)

__all__ = ["LeaseWaitLog", "SilentHolder", "silent_holders", "silent_holders_of"]

#: Most leases one reading looks at (the earliest deadlines).
READ_LIMIT = 1000


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@dataclass(frozen=True)
class SilentHolder:
    """The unexpired leases of one silent holder.

    :ivar holder: ``<worker id>#<nonce>`` (see :mod:`crawler.frontier.store`).
    :ivar leases: how many it holds (at least that many when ``more``).
    :ivar first_expiry_ms: the earliest deadline, ms of Redis's clock.
    :ivar last_expiry_ms: the latest deadline read, ms of Redis's clock.
    :ivar last_seen_ms: its last heartbeat or lease call (Redis's clock), or
        None when it is no longer in ``{s}:alive``.
    :ivar more: the reading stopped at its limit: it may hold more.
    """

    holder: str
    leases: int
    first_expiry_ms: int
    last_expiry_ms: int
    last_seen_ms: int | None
    more: bool = False

    @property
    def worker(self) -> str:
        """The worker id: the holder without its process nonce."""
        return self.holder.rpartition("#")[0] or self.holder

    def describe(self, now_ms: int) -> str:
        """The log line, with times relative to ``now_ms`` (Redis's clock)."""
        seen = (
            "no recent heartbeat"
            if self.last_seen_ms is None
            else f"last heartbeat {max(0, now_ms - self.last_seen_ms) / 1000:.0f}s ago"
        )
        first, last = self.first_expiry_ms, self.last_expiry_ms
        if first // 1000 == last // 1000:
            when = f"at {_clock(last)} (in {_secs(last - now_ms)})"
        else:
            when = (
                f"between {_clock(first)} and {_clock(last)} "
                f"(in {_secs(first - now_ms)} to {_secs(last - now_ms)})"
            )
        leases = f"{self.leases} lease{'' if self.leases == 1 else 's'}"
        return (
            f"Waiting for {'at least ' if self.more else ''}{leases} held by "
            f"worker {self.worker} (holder {self.holder}, {seen}) to expire {when}; "
            "they will be crawled again then"
        )


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S UTC")


def _secs(ms: int) -> str:
    return f"{max(0, ms) / 1000:.0f}s"


def silent_holders(
    frontier: Frontier, *, silent_after: float, exclude: str = "", limit: int = READ_LIMIT
) -> tuple[int, list[SilentHolder]]:
    """The unexpired leases of holders silent for ``silent_after`` seconds.

    One round trip (see the module).

    :param silent_after: seconds since a holder's last heartbeat after which
        it counts as silent.
    :param exclude: a holder left out (the caller's own).
    :param limit: most leases read, earliest deadlines first.
    :returns: Redis's clock (ms) and the silent holders, by holder.
    :raises redis.exceptions.RedisError: Redis failed.
    """
    with frontier.pipeline() as pipe:
        pipe.time()
        pipe.zrange(frontier.key("leases"), 0, limit - 1, withscores=True)
        pipe.zrange(frontier.key("alive"), 0, -1, withscores=True)
        (seconds, micros), leases, alive = pipe.execute()
    now = int(seconds) * 1000 + int(micros) // 1000
    seen = {_text(h): int(score) for h, score in alive}
    cutoff = now - int(silent_after * 1000)
    found: dict[str, list[int]] = {}
    for member, score in leases:
        deadline = int(score)
        holder = _text(member).rpartition(":")[0]
        if deadline <= now or holder == exclude:
            continue
        last = seen.get(holder)
        if last is None or last < cutoff:
            found.setdefault(holder, []).append(deadline)
    more = len(leases) >= limit
    return now, [
        SilentHolder(holder, len(deadlines), min(deadlines), max(deadlines), seen.get(holder), more)
        for holder, deadlines in sorted(found.items())
    ]


def silent_holders_of(
    frontiers: Frontier | FrontierShards,
    *,
    silent_after: float,
    exclude: str = "",
    limit: int = READ_LIMIT,
) -> tuple[int, list[SilentHolder]]:
    """:func:`silent_holders` over every shard of a frontier: a holder's
    leases are added up, its earliest and latest deadlines and its last
    heartbeat taken over the shards (one round trip per shard).

    :param frontiers: the crawl's :class:`~crawler.frontier.shards.FrontierShards`,
        or one :class:`Frontier`.
    :param limit: most leases read per shard.
    :returns: Redis's clock (ms; the latest read) and the silent holders, by holder.
    :raises redis.exceptions.RedisError: Redis failed.
    """
    shards = list(frontiers) if isinstance(frontiers, FrontierShards) else [frontiers]
    now = 0
    merged: dict[str, SilentHolder] = {}
    for frontier in shards:
        at, holders = silent_holders(
            frontier, silent_after=silent_after, exclude=exclude, limit=limit
        )
        now = max(now, at)
        for h in holders:
            old = merged.get(h.holder)
            if old is None:
                merged[h.holder] = h
                continue
            seen = [s for s in (old.last_seen_ms, h.last_seen_ms) if s is not None]
            merged[h.holder] = SilentHolder(
                h.holder, old.leases + h.leases,
                min(old.first_expiry_ms, h.first_expiry_ms),
                max(old.last_expiry_ms, h.last_expiry_ms),
                max(seen) if seen else None, old.more or h.more,
            )
    return now, [merged[holder] for holder in sorted(merged)]


class LeaseWaitLog:
    """Logs, once per change, the leases of silent workers an idle worker
    waits for (see the module).

    :param frontier: the crawl's frontier: every shard of
        :class:`~crawler.frontier.shards.FrontierShards`, or one :class:`Frontier`.
    :param holder: this worker's holder (its own leases are left out).
    :param lease_timeout: ``FRONTIER_LEASE_TIMEOUT``, seconds; a holder is
        silent after half of it.
    :param spider: for the log records' ``extra``.
    """

    def __init__(
        self, frontier: Frontier | FrontierShards, holder: str, lease_timeout: float, spider: Any
    ) -> None:
        self.frontier = frontier
        self.holder = holder
        self.silent_after = lease_timeout / 2
        self.spider = spider
        self._told: dict[str, tuple[int, int]] = {}

    def check(self) -> None:
        """Read the silent holders' leases and log the ones that changed
        since the last call (count or expiry, to the second). Never raises:
        a Redis error only skips this reading (logged at debug level)."""
        try:
            now, holders = silent_holders_of(
                self.frontier, silent_after=self.silent_after, exclude=self.holder
            )
        except (RedisError, RedisClusterException) as exc:
            logger.debug("Could not read the leases waited for: %s", exc)
            return
        told = {}
        for silent in holders:
            state = (silent.leases, silent.last_expiry_ms // 1000)
            told[silent.holder] = state
            if self._told.get(silent.holder) != state:
                logger.info("%s", silent.describe(now), extra={"spider": self.spider})
        self._told = told
