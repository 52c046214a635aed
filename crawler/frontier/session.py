"""The scheduler's session with Redis: round trips, lost replies, backoff.

Job: send the :class:`~crawler.frontier.outbox.Outbox`'s commits and a
lease call in one round trip (:meth:`Session.exchange`), never a call twice
on the client's own initiative; when a reply is lost, find out what the
calls did before anything else is sent (:meth:`Session.resolve`); and keep
the worker's view of Redis's health: an outage waited out with doubling
pauses, a refused call, a configuration error that stops the crawl
(:class:`~crawler.frontier.backoff.Backoff`, which this class extends).

Collaborators: the outbox (what to send; :meth:`Outbox.remove` once it is
in Redis), the crawl's :class:`~crawler.frontier.shards.FrontierShards`
(``commit``, ``lease_many``, ``recover``, set at open as :attr:`shards`),
and a :class:`SessionHost` (the scheduler) told what each round trip did:
commits answered, leases found after a lost reply, lease results passed
over.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, overload

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, ResponseError

from crawler.frontier.backoff import UNREACHABLE, Backoff
from crawler.frontier.connection import (
    CLUSTER_BUSY,
    NOT_RUN,
    drop_connections,
    is_no_master,
    redis_location,
)
from crawler.frontier.store import Commit, Committed, Frontier, Lease, NotDue

if TYPE_CHECKING:
    from crawler.frontier.outbox import Op
    from crawler.frontier.replicas import ReplicaWait
    from crawler.frontier.shards import FrontierShards

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["InDoubt", "Session", "SessionHost"]


@dataclass
class InDoubt:
    """A round trip whose reply was lost: each of its calls may or may not
    have run.

    :ivar seq: the sequence number its commits carried (None: no commit).
    :ivar commits: the outbox ops of each shard's commit, by shard.
    :ivar lease_ids: the lease ids it asked for.
    :ivar lease_shard: the shard the lease call went to.
    """

    seq: int | None
    commits: dict[int, list[Op]]
    lease_ids: list[str]
    lease_shard: int = 0


class SessionHost(Protocol):
    """What the session tells the scheduler, and asks it."""

    def lease_options(self, shard: int) -> dict[str, Any]:
        """The keywords of ``Frontier.lease_many`` for a lease call on
        ``shard`` besides the ids and the client (built as it is sent)."""

    def committed(self, shard: int, ops: list[Op], reply: Committed | None) -> None:
        """``ops``, ``shard``'s commit, are in Redis and left the outbox;
        ``reply`` is None when a lost reply was found out to have run."""

    def leases_found(self, leases: list[Lease]) -> None:
        """The leases a lease call whose reply was lost took."""

    def passed_over(self, result: Lease | NotDue, shard: int) -> None:
        """A lease result that is sent again (what it met is counted)."""

    def forget_shard(self, shard: int) -> None:
        """What was learnt of ``shard`` may be out of date (a lost reply)."""

    def forget_seen(self) -> None:
        """Redis may hold an older dupefilter: forget the local fingerprints."""

    def wake(self) -> None:
        """Redis answers again: wake the engine."""


class Session(Backoff):
    """Round trips to the frontier's shards for one worker (``holder``).

    :ivar in_doubt: the round trip whose reply was lost, until resolved.
    :ivar seq: the sequence number of the last round trip with commits.
    :ivar busy: a ``CLUSTERDOWN``/``TRYAGAIN`` (or no master) of the last
        round trip: the call did not run; once more, then an outage.
    """

    shards: FrontierShards

    def __init__(self, server: Any, crawler: Any, holder: str, outbox: Any,
                 host: SessionHost) -> None:
        super().__init__(server, crawler, outbox, host)
        self.holder = holder
        self.in_doubt: InDoubt | None = None
        self.seq = 0
        self.busy: ResponseError | None = None

    def _lost_state(self) -> None:
        self.in_doubt = None

    @overload
    def exchange(self, lease_ids: None, shard: int = 0) -> bool | None: ...

    @overload
    def exchange(self, lease_ids: list[str], shard: int = 0) -> list[Lease] | NotDue | None: ...

    def exchange(
        self, lease_ids: list[str] | None, shard: int = 0
    ) -> list[Lease] | NotDue | bool | None:
        """Send the outbox (one ``commit.lua`` call per shard it has writes
        for) and, with ``lease_ids``, lease from ``shard`` after it: one
        round trip.

        A call whose reply was lost is found out first (:meth:`resolve`);
        scripts Redis forgot (a restart, a failover) are loaded and the calls
        that met ``NOSCRIPT``, which did not run, are sent once more; so is
        a lease that ran but found nothing due before a commit of its shard
        that did not run (what that commit queues is leased at once). A
        call that a Redis Cluster did not serve twice (``CLUSTERDOWN``,
        ``TRYAGAIN``: :data:`~crawler.frontier.connection.CLUSTER_BUSY`) is an
        outage: backoff, a warning, ``frontier/redis/outages``.

        :returns: None when Redis could not be reached, refused the call or
            left it in doubt (the writes stay queued); else the lease's
            result, or True when none was asked.
        """
        if time.monotonic() < self.down_until or not self.may_call():
            return None
        if self.in_doubt is not None and not self.resolve():
            return None
        asked, result, ids = lease_ids is not None, None, lease_ids
        for attempt in (1, 2):
            step = self.round_trip(lease_ids, shard)
            if step is None:  # unreachable, in doubt, or refused
                return None
            not_run, leased = step
            if leased is not None:
                result, lease_ids = leased, None
                if isinstance(leased, NotDue) and shard in not_run and attempt == 1:
                    # It ran before a commit of its shard that did not:
                    # "nothing due" may be out of date once that commit
                    # runs. It leased nothing, so it goes again after it,
                    # under the same ids.
                    self.host.passed_over(leased, shard)
                    result, lease_ids = None, ids
            if not not_run:
                break
            if attempt == 2:
                if self.busy is not None:
                    # The cluster still does not serve the slot (a master
                    # rejoining, every slot once one is marked failed): an
                    # outage, waited out with backoff, not tried again at
                    # every flush.
                    self.outage(self.busy)
                    return None
                break
            # Redis restarted (or failed over) and forgot the scripts, or a
            # slot moved: the calls that met it did not run.
            if not self.scripts_lost():
                break
        if asked:
            return result
        return None if self.outbox.writes() else True

    def round_trip(
        self, lease_ids: list[str] | None, shard: int = 0
    ) -> tuple[set[int | None], list[Lease] | NotDue | None] | None:
        """One round trip: each shard's commit of the outbox, then the lease
        call on ``shard``.

        :returns: None when Redis could not be reached (the calls are then
            in doubt) or refused one; else the calls that did not run and may
            be sent again (``NOSCRIPT``, ``MOVED``, ...): the shards of such
            commits, and None for such a lease; and the lease's result (None
            when not asked or not run).
        """
        groups, batches = self.outbox.batches()
        if self.outbox.acks_held and lease_ids is not None:
            self.outbox.arm()  # (for them)
        if batches:
            self.seq += 1
            for batch in batches.values():
                batch.marker = (self.holder, self.seq)
        lease = None if lease_ids is None else (shard, lease_ids)
        try:
            committed, leased = self.send(batches, lease)
        except UNREACHABLE as exc:  # sent or not, its reply is lost
            if batches or lease_ids is not None:
                self.in_doubt = InDoubt(
                    self.seq if batches else None,
                    {i: groups[i] for i in batches},
                    list(lease_ids or []),
                    shard,
                )
                self.stats.inc_value("frontier/redis/in_doubt")
            self.outage(exc)
            return None
        for i, reply in committed.items():
            if isinstance(reply, Committed):
                self.outbox.remove(groups[i])
                self.host.committed(i, groups[i], reply)
        self.outbox.settle()
        result = Frontier.leases_of(leased, lease_ids or []) if isinstance(leased, list) else None
        errors = [r for r in (*committed.values(), leased) if isinstance(r, ResponseError)]
        no_master = next((r for r in errors if is_no_master(r)), None)
        if no_master is not None:
            # A failover: the pooled connections may reach the demoted
            # master. The calls did not run (NOT_RUN); they go once more
            # through new connections, then it is an outage.
            drop_connections(self.server)
            self.stats.inc_value("frontier/redis/no_master")
            logger.warning(
                "Redis is no master (%s): a failover; connections dropped, %d writes kept, "
                "sent again through %s", no_master, len(self.outbox),
                redis_location(self.crawler.settings), extra={"spider": self.spider},
            )
        self.busy = next(
            (r for r in errors if isinstance(r, CLUSTER_BUSY) or is_no_master(r)), None
        )
        refused = next((r for r in errors if not isinstance(r, NOT_RUN)), None)
        if refused is not None:
            self.refused(refused)
            return None if result is None else (set(), result)
        if not errors or (
            # (commits that ran beside one a cluster did not serve end no
            # outage: its backoff goes on doubling, not back to 0.5 s)
            self.busy is None and any(isinstance(r, Committed) for r in committed.values())
        ):
            self.recovered()
        not_run: set[int | None] = {
            i for i, r in committed.items() if isinstance(r, ResponseError)
        }
        if isinstance(leased, ResponseError):
            not_run.add(None)
        return not_run, result

    def send(
        self, batches: dict[int, Commit], lease: tuple[int, list[str]] | None
    ) -> tuple[dict[int, Committed | ResponseError], list[Any] | ResponseError | None]:
        """Send the commits ``batches`` (by shard) and the lease call
        (``(shard, lease ids)``), never twice: one pipeline on one Redis, one
        per master on a cluster (the lease's last).

        :returns: each commit's reply by shard and the lease's reply (None
            when not sent), a :class:`ResponseError` where a script answered
            one.
        :raises redis.exceptions.RedisError: a connection failed, or
            (:exc:`~crawler.frontier.replicas.NotReplicated`) fewer replicas
            than ``FRONTIER_MIN_REPLICAS`` acknowledged the calls: whether
            they survive is unknown.
        """
        if not batches and lease is None:
            return {}, None
        shards = self.shards
        wanted = [i for i in batches if lease is None or i != lease[0]]
        if lease is not None:
            wanted.append(lease[0])  # last: it sees the slots freed before it
        committed: dict[int, Committed | ResponseError] = {}
        leased: list[Any] | ResponseError | None = None
        groups = shards.groups(wanted)
        if lease is not None:  # the lease's pipeline last
            groups.sort(key=lambda group: lease[0] in group[1])
        for pipe, indices in groups:
            calls: list[tuple[str, int]] = []
            with pipe:
                for i in indices:
                    if i in batches:
                        shards[i].commit(batches[i], client=pipe)
                        calls.append(("commit", i))
                    if lease is not None and i == lease[0]:
                        shards[i].lease_many(lease[1], client=pipe, **self.host.lease_options(i))
                        calls.append(("lease", i))
                replies = self.execute(pipe, shards[indices[0]].replica_wait)
            for (call, i), reply in zip(calls, replies, strict=True):
                if call == "lease":
                    leased = reply
                else:
                    committed[i] = (
                        reply if isinstance(reply, ResponseError) else Committed.of(reply)
                    )
        return committed, leased

    @staticmethod
    def execute(pipe: Any, wait: ReplicaWait | None = None) -> list[Any]:
        """``pipe.execute``, each script's error in its place; with ``wait``
        (``FRONTIER_MIN_REPLICAS``), ``WAIT`` after the calls, its reply
        checked unless every call was refused (nothing was written).

        :raises redis.exceptions.RedisError: a connection failed, or too few
            replicas acknowledged (:exc:`~crawler.frontier.replicas.NotReplicated`):
            whether the calls survive is unknown.
        """
        if wait is not None:
            wait.queue(pipe)
        try:
            replies: list[Any] = pipe.execute(raise_on_error=False)
        except RedisClusterException as exc:  # no RedisError, but unreachable
            raise RedisConnectionError(str(exc)) from exc
        waited = replies.pop() if wait is not None else None
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                raise reply  # a connection error in the replies: lost
        if wait is not None and not all(isinstance(r, ResponseError) for r in replies):
            wait.check(waited)
        return replies

    def resolve(self) -> bool:
        """Find out what the round trip whose reply was lost did, shard by
        shard, and go on from there: the writes of each commit that ran
        leave the outbox (the others are sent again), and the leases it
        took are handed to the host.

        :returns: False while Redis cannot tell (still unreachable).
        """
        doubt = self.in_doubt
        assert doubt is not None
        shards = self.shards
        asked = sorted({*doubt.commits, *([doubt.lease_shard] if doubt.lease_ids else [])})
        found: dict[int, tuple[bool, list[Lease]]] = {}
        try:
            for i in asked:
                found[i] = shards[i].recover(
                    self.holder,
                    doubt.seq if i in doubt.commits else None,
                    doubt.lease_ids if doubt.lease_ids and i == doubt.lease_shard else [],
                )
        except UNREACHABLE as exc:
            self.failed(exc)
            return False
        self.in_doubt = None
        for i in asked:
            # (its best and head as learnt before the call, which may
            # have leased that head, or queued a site whose join time
            # the lost reply told: peeked at again before it is chosen)
            self.host.forget_shard(i)
        ran = [i for i in doubt.commits if found[i][0]]
        for i in ran:
            self.outbox.remove(doubt.commits[i])
            self.host.committed(i, doubt.commits[i], None)
        if ran:
            self.recovered()
        self.outbox.settle()
        leases = [lease for _, taken in found.values() for lease in taken]
        self.host.leases_found(leases)
        logger.info(
            "A frontier call's reply was lost; found out: %s, %d leases taken",
            "no commit" if doubt.seq is None else (
                "committed" if len(ran) == len(doubt.commits)
                else f"{len(ran)} of {len(doubt.commits)} shard commits ran"
                if ran else "not committed"
            ),
            len(leases), extra={"spider": self.spider},
        )
        return True

    def scripts_lost(self) -> bool:
        """Redis restarted (or failed over) and forgot the scripts, or a
        slot moved: refresh a cluster's slot map and load the scripts. What
        Redis holds may be older than what this worker recorded: the local
        fingerprints are forgotten.

        :returns: False when Redis could not be reached (an outage).
        """
        self.host.forget_seen()
        try:
            refresh = getattr(getattr(self.server, "nodes_manager", None), "initialize", None)
            if refresh is not None:
                refresh()  # a cluster's slot map
            self.shards.load_scripts()
        except UNREACHABLE as exc:
            self.outage(exc)
            return False
        return True

