"""Seed intake: seeds move from the seed list into the frontier inside Redis.

A worker never holds a seed that exists only in its memory. It moves a
batch of seeds, in one Lua script, from the seed list into an *intake
batch*, a list registered in a sorted set in the same call; it turns them
into requests and schedules them; and once the scheduler has committed
those requests to the frontier it deletes the batch
(:meth:`SeedIntake.done`). A batch whose owner died (or lost Redis for
``FRONTIER_LEASE_TIMEOUT`` seconds) stays registered, and any worker
returns its seeds to the seed list (:meth:`SeedIntake.reclaim_stale`), at
the end seeds are taken from and in their original order.

Keys, for the seed list ``quotes:start_urls`` (no hash tag):

======================================================  ======  ===============================
key                                                     type    holds
======================================================  ======  ===============================
``quotes:start_urls``                                   list    seeds, ``LPUSH``-ed, taken from
                                                                the right (oldest first); a set
                                                                with ``REDIS_START_URLS_AS_SET``
                                                                (``SADD``-ed, no order)
``{quotes:start_urls}:start_urls_seeded``               string  set once the spider's
                                                                ``start_urls`` were pushed for
                                                                this crawl (delete it to push
                                                                them again)
``{quotes:start_urls}:intake``                          zset    intake batch key -> ms (Redis
                                                                clock) of its registration or
                                                                its owner's last refresh
``{quotes:start_urls}:intake:<holder>:<n>``             list    one intake batch, oldest seed
                                                                at the left
======================================================  ======  ===============================

The hash tag of the intake keys is the seed list's whole name, so they live
in the seed list's Redis Cluster slot (a key without a tag hashes its whole
name). A seed list whose name has a tag already (``{crawl}:seeds``) keeps
it: its intake keys are ``{crawl}:seeds:intake...``. A *holder* is a
worker's id and a nonce of its process; ``<n>`` counts its batches (12
digits, so names sort in the order they were taken).

Every key a script touches is passed in ``KEYS``; the scripts read the
Redis server's clock (``TIME``); they live in ``lua/seeds_*.lua``, each with
a comment on every key and argument. Every call here is one round trip (but
:meth:`SeedIntake.reclaim_stale`: one, then one per stale batch) and may
raise :class:`redis.exceptions.RedisError`; none is sent twice on its own.
Each is safe to send again after a lost reply: ``take`` with the same batch
key returns the same seeds, the others are idempotent.

Needs Redis 6.2 or later (``LMOVE``, ``BLMOVE``).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from crawler.hashtags import intake_base

if TYPE_CHECKING:
    from collections.abc import Iterable

    from redis import Redis
    from redis.commands.core import Script

logger = logging.getLogger(__name__)

__all__ = ["IntakeKeys", "Reclaimed", "SeedIntake", "Taken"]

#: Seconds between two looks at a seed set (``REDIS_START_URLS_AS_SET``)
#: by an idle worker: a set cannot be blocked on as a list can.
SET_POLL = 0.2

#: Most stale batches one :meth:`SeedIntake.reclaim_stale` round looks at.
RECLAIM_LIMIT = 100


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class IntakeKeys:
    """The intake keys of one seed list, all in the seed list's slot.

    :ivar seeds: the seed list, e.g. ``quotes:start_urls``.
    :ivar registry: the sorted set of intake batches,
        ``{quotes:start_urls}:intake``.
    :ivar batch_prefix: what every batch key starts with,
        ``{quotes:start_urls}:intake:``.
    :ivar seeded: the marker set when the spider's ``start_urls`` were
        pushed for this crawl, ``{quotes:start_urls}:start_urls_seeded``.
    """

    seeds: str
    registry: str
    batch_prefix: str
    seeded: str

    @classmethod
    def for_seed_list(cls, seeds: str) -> IntakeKeys:
        """The intake keys of the seed list ``seeds``.

        :raises ValueError: ``seeds`` has no usable hash tag and a ``}``, so
            no other key can share its Redis Cluster slot.
        """
        base = intake_base(seeds)
        return cls(seeds, base, f"{base}:", base.removesuffix(":intake") + ":start_urls_seeded")


@dataclass(frozen=True)
class Taken:
    """What :meth:`SeedIntake.take` moved into a batch.

    :ivar batch: the batch key.
    :ivar seeds: the raw seeds, oldest first (empty: the seed list was).
    :ivar reused: the seeds are those an earlier call with this batch key
        took (its reply was lost); nothing was taken now.
    """

    batch: str
    seeds: list[bytes]
    reused: bool


@dataclass(frozen=True)
class Reclaimed:
    """One abandoned batch :meth:`SeedIntake.reclaim_stale` dealt with.

    :ivar batch: its key.
    :ivar seeds: seeds returned to the seed list (0: it was empty).
    :ivar malformed: the key held something other than a list; it was
        unregistered and left in place.
    """

    batch: str
    seeds: int
    malformed: bool = False


class SeedIntake:
    """The atomic seed-intake operations on one seed list.

    :param redis: a redis-py client (standalone or
        :class:`~crawler.frontier.connection.FrontierRedisCluster`),
        returning bytes.
    :param seed_key: the seed list, e.g. ``quotes:start_urls``.
    :param holder: this process's name in batch keys: unique per process
        (a worker id and a nonce), never reused.
    :param as_set: the seeds are in a Redis set, not a list
        (``REDIS_START_URLS_AS_SET``): taken in no particular order, as
        durably (each moved into its batch in the same script), and a
        returned batch's seeds are added back to the set.

    :raises ValueError: see :meth:`IntakeKeys.for_seed_list`.
    """

    def __init__(
        self, redis: Redis, seed_key: str, holder: str, *, as_set: bool = False
    ) -> None:
        self.redis = redis
        self.as_set = as_set
        self._kind = "set" if as_set else "list"
        self.keys = IntakeKeys.for_seed_list(seed_key)
        self.holder = holder
        self._counter = itertools.count(1)
        self._take = self._script("seeds_take.lua")
        self._done = self._script("seeds_done.lua")
        self._refresh = self._script("seeds_refresh.lua")
        self._stale = self._script("seeds_stale.lua")
        self._reclaim = self._script("seeds_reclaim.lua")
        self._once = self._script("seeds_once.lua")

    def _script(self, name: str) -> Script:
        source = resources.files("crawler.frontier").joinpath("lua", name).read_text()
        return self.redis.register_script(source)

    def new_batch(self) -> str:
        """A batch key never used before: ``<batch_prefix><holder>:<n>``."""
        return f"{self.keys.batch_prefix}{self.holder}:{next(self._counter):012d}"

    def take(self, batch: str, most: int) -> Taken:
        """Move up to ``most`` seeds, oldest first, into the registered
        batch ``batch`` (``seeds_take.lua``).

        After a lost reply, call it again with the same ``batch``: if the
        first call ran, its seeds come back (``reused``), else it takes now.

        :raises redis.exceptions.ResponseError: a key holds another type
            (nothing was written).
        """
        reply: list[Any] = self._take(
            keys=[self.keys.seeds, self.keys.registry, batch],
            args=[max(1, int(most)), self._kind],
        )
        return Taken(batch, list(reply[1:]), bool(int(reply[0])))

    def done(self, batches: Iterable[str]) -> int:
        """Delete and unregister ``batches``, whose requests are in the
        frontier (``seeds_done.lua``).

        :returns: how many were still registered.
        """
        keys = list(batches)
        if not keys:
            return 0
        return int(self._done(keys=[self.keys.registry, *keys], args=[]))

    def refresh(self, batches: Iterable[str]) -> list[str]:
        """Refresh the registration of the batches this worker holds
        (``seeds_refresh.lua``), so that no one reclaims them.

        :returns: those no longer registered (another worker returned their
            seeds to the seed list already, or they were let go of).
        """
        keys = list(batches)
        if not keys:
            return []
        flags = self._refresh(keys=[self.keys.registry, *keys], args=[])
        return [k for k, flag in zip(keys, flags, strict=True) if not int(flag)]

    def return_batch(self, batch: str) -> int:
        """Return this worker's own batch to the seed list whatever its age
        (at close, for seeds not in the frontier).

        :returns: seeds returned; 0 when the batch was empty or is no longer
            registered (reclaimed already, or never taken).
        """
        return max(0, self._reclaim_one(batch, None))

    def reclaim_stale(self, timeout: float, limit: int = RECLAIM_LIMIT) -> list[Reclaimed]:
        """Return to the seed list the seeds of every batch not refreshed for
        ``timeout`` seconds, one atomic script call per batch, most recently
        refreshed batch first (so the oldest seeds end at the taking end).

        A registry member that is not one of this seed list's batch keys is
        removed from the registry, with a warning.

        :param timeout: seconds (``FRONTIER_LEASE_TIMEOUT``).
        :param limit: most batches looked at.
        :returns: the batches reclaimed by this call (a batch another worker
            reclaimed first, or that its owner refreshed meanwhile, is not).
        """
        age_ms = max(0, round(timeout * 1000))
        members = self._stale(keys=[self.keys.registry], args=[age_ms, max(1, limit)])
        out = []
        for member in members:
            batch = _text(member)
            if not batch.startswith(self.keys.batch_prefix):
                logger.warning(
                    "Removed %r from %s: not an intake batch of %s",
                    batch, self.keys.registry, self.keys.seeds,
                )
                self.redis.zrem(self.keys.registry, member)
                continue
            n = self._reclaim_one(batch, age_ms)
            if n >= 0:
                out.append(Reclaimed(batch, n))
            elif n == -3:
                out.append(Reclaimed(batch, 0, malformed=True))
        return out

    def _reclaim_one(self, batch: str, age_ms: int | None) -> int:
        return int(
            self._reclaim(
                keys=[self.keys.registry, batch, self.keys.seeds],
                args=["any" if age_ms is None else age_ms, self.keys.batch_prefix, self._kind],
            )
        )

    def seed_once(self, urls: Iterable[str]) -> int:
        """Push ``urls`` (a spider's ``start_urls``) into the seed list, in
        their order, unless this crawl pushed them already: the marker
        :attr:`IntakeKeys.seeded` is set in the same call
        (``seeds_once.lua``), so one worker of a crawl pushes them.

        :returns: URLs pushed; -1 when the marker was set already.
        :raises redis.exceptions.ResponseError: the seed key holds another
            type (nothing was written).
        """
        args = [self._kind, *urls]
        return int(self._once(keys=[self.keys.seeds, self.keys.seeded], args=args))

    def pending(self) -> int:
        """Intake batches registered now, by any worker (``ZCARD``)."""
        return int(self.redis.zcard(self.keys.registry))

    def wait_for_seeds(self, timeout: float) -> bool:
        """Block until the seed list holds a seed, or ``timeout`` seconds.

        ``BLMOVE`` from the seed list to itself, right to right: a seed that
        arrives is popped and pushed back where it was in one command, so it
        never leaves the list (nor Redis); the caller then takes it with
        :meth:`take`. Every worker waiting wakes. Call it from a thread.

        A set cannot be blocked on: it is looked at (``SCARD``) every
        :data:`SET_POLL` seconds instead.

        :returns: whether a seed was there.
        """
        seeds = self.keys.seeds
        if self.as_set:
            deadline = time.monotonic() + timeout
            while not int(self.redis.scard(seeds)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(SET_POLL, left))  # in a thread: a set cannot be blocked on
            return True
        blmove: Any = self.redis.blmove  # typed with an int timeout; Redis takes seconds
        return blmove(seeds, seeds, timeout, "RIGHT", "RIGHT") is not None
