"""The scheduler's shard router: which shard the next lease call goes to.

Job: keep what one worker knows of each frontier shard (a
:class:`ShardView`: when it is due, its best priority due, when that
priority's first site joined its ready index) from lease replies, peeks
(:meth:`ShardRouter.peek_stale`), commits and this worker's own pushes; and
from it choose the next shard to lease from (:meth:`ShardRouter.next_shard`:
best priority first, then first in, first out by the Redis clock, then in
turn) and the limits a lease call's batch stops at
(:meth:`ShardRouter.best_elsewhere`). With one shard most of this is moot:
the one shard is asked.

Collaborators: the crawl's :class:`~crawler.frontier.shards.FrontierShards`
(peeks), the :class:`~crawler.frontier.session.Session` (a peek that fails
is an outage; scripts lost are loaded again), the
:class:`~crawler.frontier.outbox.Outbox` (pushes not yet committed) and the
``housekeeping`` callable (what a peek met besides its answer: the
scheduler gives :meth:`Reports.lease_result
<crawler.frontier.reports.Reports.lease_result>`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crawler.frontier.backoff import UNREACHABLE
from crawler.frontier.connection import NOT_RUN
from crawler.frontier.store import Committed, Frontier, Lease, NotDue

if TYPE_CHECKING:
    from collections.abc import Callable

    from crawler.frontier.outbox import Outbox
    from crawler.frontier.session import Session
    from crawler.frontier.shards import FrontierShards

__all__ = ["EMPTY_SHARD_RECHECK", "ShardRouter", "ShardView"]

#: Seconds after which a shard found without queued work is asked again (the
#: requests other workers queue there since are found within this time).
EMPTY_SHARD_RECHECK = 1.0


@dataclass
class ShardView:
    """What this worker knows of one shard (times are ``time.monotonic()``).

    :ivar due: before when it said nothing is due (0: ask it; None: nothing
        queued when last asked).
    :ivar empty_at: when it last said nothing is queued.
    :ivar best: the best priority due there as last learnt (inf: not known;
        -inf: nothing due).
    :ivar best_at: when ``best`` was learnt.
    :ivar head: when its first site at that priority joined its ready
        index, µs of the Redis clock (0: long ago; inf: not known, or a push
        of this worker not committed yet: then the commit's reply tells).
    """

    due: float | None = 0.0
    empty_at: float = 0.0
    best: float = math.inf
    best_at: float = -math.inf
    head: float = math.inf


class ShardRouter:
    """One worker's view of the shards, and its choice among them.

    :ivar views: one :class:`ShardView` per shard (none before open).
    :ivar turn: the shard the next lease call goes to first among equals
        (round robin: shards of equal best priority and head join time).
    """

    shards: FrontierShards

    def __init__(
        self, holder: str, session: Session, outbox: Outbox,
        housekeeping: Callable[[Lease | NotDue, int], None],
    ) -> None:
        self.holder = holder
        self.session = session
        self.outbox = outbox
        self.housekeeping = housekeeping
        self.views: list[ShardView] = []
        self.turn = 0

    def open(self, shards: FrontierShards) -> None:
        """Know ``shards``: nothing learnt yet, each due."""
        self.shards = shards
        self.views = [ShardView() for _ in range(len(shards))]

    def __len__(self) -> int:
        return len(self.views)

    def next_shard(self, asked: set[int]) -> int | None:
        """The shard the next lease call goes to: of the shards not asked
        in this ``next_request`` that may have work due (never asked,
        past the wait it gave, or found empty more than
        :data:`EMPTY_SHARD_RECHECK` seconds ago: other workers' requests may
        have reached it since; this worker's own pushes make it due at
        once), the one whose best due priority is highest as last learnt
        (:meth:`peek_stale`, lease replies, this worker's pushes); among
        equals the one whose first site at that priority joined its ready
        index first (Redis clock: first in, first out across shards), then
        the next in turn. So a sharded crawl serves its best priority first
        across shards, and equal priorities in the order their sites joined,
        as one frontier does across its sites (within what was learnt at most
        :data:`EMPTY_SHARD_RECHECK` seconds ago),
        and shards without work cost about one call a second each. The
        first call of a ``next_request`` asks the shard that has waited
        longest when none is due, as a single frontier is always asked.
        None: every shard was asked, or none may have work due."""
        views = self.views
        n = len(views)
        now = time.monotonic()
        best: int | None = None
        for j in range(n):
            i = (self.turn + j) % n
            due = views[i].due
            if i in asked:
                continue
            if (due is None and now - views[i].empty_at >= EMPTY_SHARD_RECHECK) or (
                due is not None and due <= now
            ):
                if best is None or (views[i].best, -views[i].head) > (
                    views[best].best, -views[best].head
                ):
                    best = i
        if best is not None or asked:
            return best

        def waited(i: int) -> float:
            due = views[i].due
            return views[i].empty_at + EMPTY_SHARD_RECHECK if due is None else due

        return min(range(n), key=waited)

    def best_elsewhere(self, shard: int) -> tuple[int | None, int | None]:
        """The best priority due on the shards other than ``shard`` as last
        learnt (None: none has work due, or it is not known), and the
        earliest time a first site at that priority joined their ready
        index, µs (None: not known), so that a lease call's batch stops
        before lower priorities than that, and before sites of that
        priority that joined later. A shard
        that told this worker to wait (its due sites are ones where it holds
        its share, or none is due) does not count until that wait is over:
        its best is not this worker's to lease, and would cut every batch
        elsewhere to one request."""
        now = time.monotonic()
        known = [
            v for i, v in enumerate(self.views)
            if i != shard and not math.isinf(v.best)
            and (due := v.due) is not None and due <= now
        ]
        if not known:
            return None, None
        best = max(v.best for v in known)
        head = min(v.head for v in known if v.best == best)
        return int(best), None if math.isinf(head) else int(head)

    def learn_best(self, shard: int, best: int | None, head: int | None = None) -> None:
        """Note the best priority due on ``shard`` (None: nothing due) and
        when its first site at that priority joined its ready index (µs)."""
        if self.views:
            view = self.views[shard]
            view.best = -math.inf if best is None else best
            view.head = math.inf if head is None else head
            view.best_at = time.monotonic()

    def leased(self, shard: int, lease: Lease) -> None:
        """A lease call to ``shard`` leased (``lease`` is its first): learn
        its best, and the next call goes to the next shard first."""
        self.learn_best(shard, lease.best, lease.head)
        self.turn = (shard + 1) % len(self.views)

    def not_due(self, shard: int, result: NotDue) -> float:
        """A lease call to ``shard`` found nothing to lease: learn when it
        is due; returns now (``time.monotonic()``)."""
        self.learn_best(shard, result.best, result.head)
        now = time.monotonic()
        view = self.views[shard]
        view.due = None if result.wait is None else now + result.wait
        if result.wait is None:
            view.empty_at = now
        return now

    def committed(self, shard: int, committed: Committed) -> None:
        """A commit of ``shard`` ran: new work or free slots there, so it is
        asked; and when this worker's pushes there raised the shard's best
        priority past what it had learnt (:meth:`note_push`: its head is not
        known), the first site at that priority joined at ``committed.joined``
        (µs, Redis clock) at the latest: the shard's head from now on, so
        that it is ranked and cut against the other shards' heads by time
        (an unknown head ties with every other unknown one, and cuts no
        batch elsewhere)."""
        if not self.views:
            return
        view = self.views[shard]
        view.due = 0.0
        if (
            committed.joined is not None and any(committed.pushed)
            and math.isinf(view.head) and not math.isinf(view.best)
        ):
            view.head = committed.joined

    def slot_freed(self, shard: int, now: float) -> None:
        """A download of a lease of ``shard`` ended: its slot frees, and with
        it this worker's share of the site: worth a lease call there now."""
        if shard < len(self.views):
            view = self.views[shard]
            if view.due is not None and view.due > now:
                view.due = now

    def forget(self, shard: int) -> None:
        """What was learnt of ``shard``'s best may be out of date: peeked at
        again before it is chosen."""
        if shard < len(self.views):
            self.views[shard].best_at = -math.inf

    def note_push(self, shard: int, priority: int, *, ask_now: bool = False) -> None:
        """A push of ``priority`` to ``shard``, not yet committed, tells
        of that shard (several shards only): it has work, so it is asked again
        (when it was taken for empty, or, with ``ask_now``, whatever due time
        a peek just learnt without the push); and its best priority is at
        least ``priority``. A better one joins the shard's ready index after
        the heads learnt so far (at an equal priority, behind the head): its
        head is unknown until the commit's reply tells."""
        if not self.views:
            return
        view = self.views[shard]
        if ask_now or view.due is None:
            view.due = 0.0
        if priority > view.best:
            view.best = priority
            view.head = math.inf

    def earliest_due(self) -> float | None:
        """``time.monotonic()`` when the first shard that has work becomes
        due (None: no shard had any queued when asked)."""
        dues = [v.due for v in self.views if v.due is not None]
        return min(dues) if dues else None

    def peek_stale(self) -> None:
        """With several shards, learn the best priority due on each shard not
        heard from for :data:`EMPTY_SHARD_RECHECK` seconds: one round trip
        (one pipeline per Redis node) of ``lease.lua`` calls that lease
        nothing (:meth:`Frontier.peek`), at most once a second, never on the
        hot path of every lease. They take nothing, so a lost reply needs no
        recovery: what they learnt is lost, and the shards are peeked at
        again once the backoff is over, before the next lease call (which
        would choose blind: in turn, its batch not cut). A peek that did
        not run (``NOSCRIPT``, ``MOVED``, ...) is sent once more after the
        scripts are loaded again (the slot map refreshed); another error
        (a refusal) is passed over: the lease call meets it and deals with
        it. A connection that fails is an outage (:meth:`Session.failed`:
        logged, the usual backoff; a configuration error stops the crawl),
        so no lease call follows it into a Redis that is down (it would be
        left in doubt); the peeks after the backoff find Redis again."""
        views = self.views
        session = self.session
        if (
            len(views) <= 1 or session.in_doubt is not None
            or time.monotonic() < session.down_until
        ):
            return
        now = time.monotonic()
        stale = [i for i, v in enumerate(views) if now - v.best_at >= EMPTY_SHARD_RECHECK]
        if not stale:
            return
        for i in stale:
            views[i].best_at = now
        for attempt in (1, 2):
            try:
                not_run = self._peek(stale, now)
            except UNREACHABLE as exc:  # (a cluster's slot map may raise RedisClusterException)
                for i in stale:  # (peeked at again after the backoff)
                    views[i].best_at = -math.inf
                session.failed(exc)
                return
            # Scripts forgotten (a restart, a failover) or a slot moved: the
            # peeks that met it did not run. Once more after reloading them,
            # else those shards stay unknown for a second (asked in turn,
            # cutting no batch: first in, first out would not hold).
            if not not_run or attempt == 2 or not session.scripts_lost():
                return
            stale = not_run

    def _peek(self, stale: list[int], now: float) -> list[int]:
        """One round trip of peeks at the shards ``stale`` (see
        :meth:`peek_stale`); learn what they tell.

        :returns: the shards whose peek did not run (``NOSCRIPT``, ``MOVED``,
            ...: :data:`~crawler.frontier.connection.NOT_RUN`).
        :raises redis.exceptions.RedisError: a connection failed.
        """
        shards = self.shards
        not_run: list[int] = []
        for pipe, indices in shards.groups(stale):
            with pipe:
                for i in indices:
                    shards[i].peek(self.holder, pipe)
                replies: list[Any] = pipe.execute(raise_on_error=False)
            for i, reply in zip(indices, replies, strict=True):
                if isinstance(reply, Exception):
                    if isinstance(reply, NOT_RUN):
                        not_run.append(i)
                    continue
                result = Frontier.leases_of(reply, [])
                if isinstance(result, NotDue):
                    self.housekeeping(result, i)
                    self.learn_best(i, result.best, result.head)
                    view = self.views[i]
                    if result.best is not None:  # (its wait: it was asked for nothing)
                        view.due = 0.0
                    elif result.wait is None:
                        view.due, view.empty_at = None, now
                    else:
                        view.due = now + result.wait
        self._learn_unsent(stale)
        return not_run

    def _learn_unsent(self, shards: list[int]) -> None:
        """After a peek at ``shards``: the pushes of this worker still in
        its outbox were not in Redis when the peek ran (it goes before the
        round trip that commits them), so what the peek learnt leaves them
        out; note them again as the scheduler's ``enqueue_request`` did.
        Otherwise a worker whose first round trip carried its seeds (or
        whose peek of a shard came between a callback's push there and its
        commit) took a shard for empty, or its best for lower, for a second:
        a priority-9 seed waited behind a whole other shard of priority-0
        ones."""
        for op in self.outbox.pushes(set(shards)):
            self.note_push(op.shard, op.item.priority, ask_now=True)
