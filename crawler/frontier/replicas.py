"""Writes counted done only once replicas have them (``FRONTIER_MIN_REPLICAS``).

Redis replicates asynchronously: a master acknowledges a write before any
replica has it, and a master that dies then takes the write with it, although
the worker went on as if it were stored. After a failover the promoted
replica may lack a lease (the request is crawled twice), an ack (the page is
crawled again once the lease expires) or a push (the new requests a page
yielded are lost, and with them every page only they led to).

With ``FRONTIER_MIN_REPLICAS`` = N > 0, every round trip of the frontier's
writes (``commit.lua`` and ``lease.lua``, :mod:`crawler.frontier.store`)
ends with ``WAIT N timeout`` in the same pipeline (no extra round trip):
Redis answers how many replicas acknowledged every write this connection
sent. Fewer than N within ``FRONTIER_MIN_REPLICAS_TIMEOUT`` seconds, and the
writes are not counted done: the round trip is *in doubt*, exactly as one
whose reply was lost (:exc:`NotReplicated` is a ``RedisError``). Nothing is
sent again blindly: the worker waits with backoff, then finds out what ran
(:meth:`crawler.frontier.store.Frontier.recover`), and that answer is trusted
only once N replicas have it too (:meth:`ReplicaWait.queue_after_read`).
So a worker whose replicas are gone stops counting writes done (it keeps
them and leases nothing new) until they are back, and a failover to a
replica that had acknowledged loses none of them.

``WAIT`` blocks the worker's Redis calls for at most the timeout, only when
replicas lag or are gone. It counts replicas that acknowledged, not replicas
that wrote to disk (Redis's ``WAITAOF`` would).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from crawler.config import FrontierConfig

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["NotReplicated", "ReplicaWait"]


class NotReplicated(RedisError):
    """Fewer replicas than ``FRONTIER_MIN_REPLICAS`` acknowledged the writes
    of a round trip in time: they ran on the master, but a failover may lose
    them. Handled as a lost reply (the call is in doubt)."""


@dataclass(frozen=True)
class ReplicaWait:
    """``WAIT replicas timeout_ms`` after the writes of a pipeline.

    :ivar replicas: replicas that must acknowledge (> 0).
    :ivar timeout_ms: longest wait for them, ms (> 0: ``WAIT`` with 0 blocks
        for ever).
    """

    replicas: int
    timeout_ms: int

    @classmethod
    def from_config(cls, config: FrontierConfig) -> ReplicaWait | None:
        """From ``FRONTIER_MIN_REPLICAS`` and ``FRONTIER_MIN_REPLICAS_TIMEOUT``
        (seconds); None when the first is 0."""
        if config.min_replicas <= 0:
            return None
        return cls(config.min_replicas, max(1, round(config.min_replicas_timeout * 1000)))

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ReplicaWait | None:
        """:meth:`from_config` of ``settings``' :class:`~crawler.config.FrontierConfig`."""
        return cls.from_config(FrontierConfig.from_settings(settings))

    def queue(self, pipe: Any) -> None:
        """Queue ``WAIT`` on the redis-py pipeline ``pipe``, after its writes."""
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)

    def queue_after_read(self, pipe: Any, marker_key: str, marker_ttl_ms: int) -> None:
        """Queue ``WAIT`` after a recovery's reads, with a write before it.

        ``WAIT`` waits for the writes *this connection* sent, and a
        recovery's connection may have sent none (a new one after an
        outage): ``WAIT`` would then answer at once. The marker
        ``marker_key`` is written (created empty, which no sequence number
        equals, when missing; its expiry renewed either way), so that
        ``WAIT`` covers everything the master holds up to the reads,
        the write whose reply was lost included.
        """
        pipe.set(marker_key, "", nx=True, px=marker_ttl_ms)
        pipe.pexpire(marker_key, marker_ttl_ms)
        self.queue(pipe)

    def check(self, reply: Any) -> None:
        """Raise :exc:`NotReplicated` unless ``reply`` (``WAIT``'s, or the
        error Redis answered instead) counts enough replicas."""
        if isinstance(reply, Exception) or int(reply) < self.replicas:
            got = reply if isinstance(reply, Exception) else f"{int(reply)} replicas"
            raise NotReplicated(
                f"{got} acknowledged within {self.timeout_ms} ms, FRONTIER_MIN_REPLICAS="
                f"{self.replicas}: the writes are in doubt until a master and its "
                "replicas confirm them"
            )
