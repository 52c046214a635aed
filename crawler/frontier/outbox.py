"""The scheduler's outbox: Redis writes queued, then sent in batches.

Job: hold the frontier writes a worker has made but not yet sent (new
requests, retries, dead letters, freed slots, acks, leases given back,
revisits, ``after_commit`` callbacks), in the order they were made; arm a
timer that sends them ``FRONTIER_OUTBOX_DELAY`` seconds after the first one
when no lease call carries them sooner; and cut them into one
:class:`~crawler.frontier.store.Commit` per shard (:meth:`Outbox.batches`),
holding back acks that must not reach Redis before the requests queued
before them on other shards.

Collaborators: the :class:`~crawler.frontier.session.Session` sends the
batches and tells the outbox which ops are in Redis (:meth:`Outbox.remove`,
:meth:`Outbox.settle`); the scheduler's parts queue writes
(:meth:`Outbox.write`: the :class:`~crawler.frontier.enqueuer.Enqueuer`,
the :class:`~crawler.frontier.leasebook.LeaseBook`, the
:class:`~crawler.frontier.deadletters.DeadLetters`, the
:class:`~crawler.frontier.revisits.Revisits`, and the
:class:`~crawler.frontier.scheduler.FrontierScheduler`'s ``after_commit``);
the timer calls the ``flush`` callable given at construction (the
scheduler's ``flush_outbox``). No Redis call is made here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later

from crawler.frontier.store import Commit

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy import Request

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["Op", "Outbox"]

#: Kinds of writes that carry no request (an ack waits for none of them).
_NOT_CARRYING = ("acks", "slots")


@dataclass
class Op:
    """A Redis write waiting in the outbox.

    ``kind`` names the :class:`~crawler.frontier.store.Commit` list that
    ``item`` goes to: ``pushes`` (a :class:`~crawler.frontier.store.Push`),
    ``retries`` (a :class:`~crawler.frontier.store.Retry`), ``dead`` (JSON
    bytes), ``slots``, ``acks`` or ``givebacks`` (a lease id), ``revisits``
    (a :class:`~crawler.frontier.store.Revisit`); ``after_commit`` ops carry
    only ``done``.
    """

    kind: str
    item: Any = None
    #: Called once the commit that carried every write queued before this
    #: op is known to be in Redis (``after_commit``).
    done: Callable[[], object] | None = None
    #: The request a ``pushes`` op queues, kept until its commit is
    #: answered: the reply says, per push, whether the shared dupefilter
    #: filtered it, and a filtered request is logged as Scrapy logs one.
    request: Request | None = None
    #: The frontier shard the write goes to (its request's site's).
    shard: int = 0


class Outbox:
    """Writes queued in order, and the timer that sends them.

    :param delay: ``FRONTIER_OUTBOX_DELAY``, seconds from the first write
        queued to the timer's send.
    :param flush: sends the outbox; returns False when it could not
        (Redis unreachable, refused, in doubt): the timer then tries again.
    :param resume_at: ``time.monotonic()`` before which no call is sent (an
        outage's backoff): the timer's next try waits for it.
    """

    def __init__(
        self, delay: float, flush: Callable[[], bool], resume_at: Callable[[], float]
    ) -> None:
        self.delay = delay
        self._flush = flush
        self._resume_at = resume_at
        #: The writes not yet known to be in Redis, oldest first.
        self.ops: list[Op] = []
        #: The timer's pending call (None: not armed).
        self.flush_call: Any = None
        #: Acks the last :meth:`batches` held back (see there).
        self.acks_held = 0

    def __len__(self) -> int:
        return len(self.ops)

    def write(
        self,
        kind: str,
        *,
        item: Any = None,
        done: Callable[[], object] | None = None,
        request: Request | None = None,
        shard: int = 0,
    ) -> None:
        """Queue one write (see :class:`Op`) and arm the timer."""
        self.ops.append(Op(kind, item, done, request, shard))
        self.arm()

    def arm(self) -> None:
        """Send the outbox in ``delay`` seconds, unless a send is set already."""
        if self.flush_call is None:
            self.flush_call = call_later(self.delay, self._flush_soon)

    def cancel(self) -> None:
        """Disarm the timer."""
        if self.flush_call is not None:
            self.flush_call.cancel()
            self.flush_call = None

    def _flush_soon(self) -> None:
        self.flush_call = None
        if not self._flush() and self.ops:
            wait = max(0.05, self._resume_at() - time.monotonic())
            self.flush_call = call_later(wait, self._flush_soon)

    def batches(self) -> tuple[dict[int, list[Op]], dict[int, Commit]]:
        """The outbox's writes by shard, and the commit of each shard that
        has anything to send.

        An ack is held back (left in the outbox, counted in
        :attr:`acks_held`) while a write queued before it for another shard
        carries a request (a push, retry, dead letter, revisit or
        give-back; not a freed slot, not another ack): the commits of one
        round trip to several shards are not atomic together (a round trip
        cut midway, a Redis Cluster master down), and a page's ack must
        never be in Redis before the requests its page yielded, on any
        shard (else a stop before they are sent loses them). The page of a
        write is not known, so every earlier write for another shard
        counts. Such writes are never held, so once the round trip that
        carries them is answered the acks held go, in the next round trip:
        the scheduler's ``flush_outbox`` sends it at once, and a round trip
        with a lease call leaves them to the flush it arms. Writes for one
        shard are sent in outbox order apart from held acks: an ack ends its
        lease, a write after it never needs it ended. One shard, or writes
        for the ack's shard alone before it: nothing is held (the ack goes
        in the same atomic commit as the requests before it).

        A shard whose writes are only slots of leases acked in the same
        outbox has nothing to send: those ops leave the outbox here.
        """
        groups: dict[int, list[Op]] = {}
        carrying: set[int] = set()  # shards with a request-carrying write so far
        self.acks_held = 0
        for op in self.ops:
            if op.kind == "after_commit":
                continue
            if op.kind == "acks" and carrying - {op.shard}:
                self.acks_held += 1
                continue
            if op.kind not in _NOT_CARRYING:
                carrying.add(op.shard)
            groups.setdefault(op.shard, []).append(op)
        batches: dict[int, Commit] = {}
        for i, ops in groups.items():
            batch = self.commit_of(ops)
            if batch:
                batches[i] = batch
            else:  # only slots of leases acked in the same outbox: nothing to send
                self.remove(ops)
        return groups, batches

    @staticmethod
    def commit_of(ops: list[Op]) -> Commit:
        """The :class:`Commit` that carries ``ops`` (an ack frees its lease's
        slot too, so a slot op of an acked lease is left out). Its pushes
        are in the order of ``ops``: the commit's reply flags them so."""
        batch = Commit()
        acks = {op.item for op in ops if op.kind == "acks"}
        for op in ops:
            if op.kind == "after_commit" or (op.kind == "slots" and op.item in acks):
                continue
            getattr(batch, op.kind).append(op.item)
        return batch

    def remove(self, ops: list[Op]) -> None:
        """``ops`` are in Redis: they leave the outbox."""
        sent = {id(op) for op in ops}
        self.ops[:] = [op for op in self.ops if id(op) not in sent]

    def settle(self) -> None:
        """Run the ``after_commit`` callbacks that no unsent write precedes
        any more (every write queued before them is in Redis). A callback
        that raises is logged, never raised."""
        while self.ops and self.ops[0].kind == "after_commit":
            op = self.ops.pop(0)
            if op.done is not None:
                try:
                    op.done()
                except Exception:  # a callback's failure is its own
                    logger.exception("after_commit callback failed")

    def acks(self) -> Iterator[tuple[int, str]]:
        """``(shard, lease id)`` of each ack waiting here."""
        for op in self.ops:
            if op.kind == "acks":
                yield op.shard, op.item

    def pushes(self, shards: set[int]) -> Iterator[Op]:
        """The pushes waiting here for one of ``shards``."""
        return (op for op in self.ops if op.kind == "pushes" and op.shard in shards)

    def only_acks(self) -> bool:
        """Whether every write waiting is an ack (or an ``after_commit``)."""
        return all(op.kind in ("acks", "after_commit") for op in self.ops)

    def writes(self) -> int:
        """The writes waiting, ``after_commit`` callbacks left out."""
        return sum(op.kind != "after_commit" for op in self.ops)

    def give_up(self) -> int:
        """Drop every op (their callbacks never run); returns the writes dropped."""
        given_up = self.writes()
        self.ops.clear()
        return given_up
