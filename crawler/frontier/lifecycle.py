"""A request's life cycle in the frontier: its states, where each lives in
Redis, and the script call that moves it on.

The scripts decide every transition (``lua/lease.lua``, ``lua/commit.lua``,
in one atomic call each); Python reads the outcome: the reply decoding
(:mod:`crawler.frontier.protocol`: a :class:`~crawler.frontier.protocol.Lease`
says whether it is :data:`LEASED` or :data:`SUSPECT`) and the lease book
(:mod:`crawler.frontier.leasebook`) name these states, and
``lua/lib.lua`` carries the same names in a comment block pointing here.

Keys are a shard's (``{s}:`` prefix; :data:`crawler.frontier.protocol.SHARD_KEYS`).
A queued entry is ``<request>``, or ``#<deliveries>#<request>`` once it was
delivered and not acknowledged; a lease's data (``{s}:ldata``) is
``<priority>\\t<site>\\t#<deliveries>#<request>``, deliveries counting this
one. ``max`` is ``FRONTIER_MAX_DELIVERIES``.

=============  ==============================================================
state          in Redis
=============  ==============================================================
queued         its entry in its site's queue (``{s}:qm``, ``{s}:qc``,
               ``{s}:lv``), counted in ``{s}:count`` and ``{s}:prio``; its
               site in ``{s}:ready`` (due) or ``{s}:wait`` (paced), or in
               neither at its concurrency
leased         ``{s}:leases`` id -> deadline (ms), ``{s}:ldata`` id -> its
               data, ``{s}:lslot`` id -> site (it holds a download slot,
               counted in ``{s}:active`` and ``{s}:wactive``); no longer
               queued or counted in ``{s}:count``
fetched        as leased, its slot freed: no ``{s}:lslot`` id, not counted in
               ``{s}:active``/``{s}:wactive``; ``{s}:leases`` and
               ``{s}:ldata`` stay until it is acknowledged
acknowledged   gone: its id in none of ``{s}:leases``, ``{s}:ldata``,
               ``{s}:lslot``; nothing queued (the end)
returned       queued again at the front of its site's queue with the
               deliveries it had before this lease (that one is not counted);
               its lease keys gone, its slot freed
suspect        leased on its last chance (``max - 1`` deliveries before
               this one, ``max`` > 1), alone: the worker holds no other lease
               on the crawl (``held_all`` 0) and leases nothing more until it
               ends (the lease book's ``alone``)
dead           a record in ``{s}:dead`` (the one shape:
               :mod:`crawler.frontier.deadletters`); its lease keys gone
=============  ==============================================================

Transitions (:data:`TRANSITIONS`: from, the call, the event, to):

======================  ======================  ======================================  ============
from                    call                    event                                   to
======================  ======================  ======================================  ============
queued/returned         lease.lua               leased (not its last chance, or the     leased
                                                caller counts no ``held_all``)
queued/returned         lease.lua               its last chance, the worker holds       suspect
                                                nothing: the call's only lease
queued/returned         lease.lua               its last chance, the worker holds       queued
                                                leases: put back where it was (the
                                                reply's ``passed`` names its site)
leased                  commit.lua ``slot``     its download ended                      fetched
suspect                 commit.lua ``slot``     its download ended                      suspect
leased/fetched/suspect  commit.lua ``ack``      handled                                 acknowledged
leased/fetched/suspect  commit.lua ``give``     given back unhandled (a worker          returned
                                                closing)
leased/fetched/suspect  lease.lua housekeeping  its lease expired, its holder seen in   returned
                                                ``{s}:alive`` at the deadline or after
leased/fetched          lease.lua housekeeping  its lease expired, its holder dead,     queued
                                                deliveries < ``max`` (or no limit)      (counted)
leased/fetched/suspect  lease.lua housekeeping  its lease expired, its holder dead,     dead
                                                deliveries >= ``max``
dead                    commit.lua ``claim`` +  ``scrapy deadletters requeue``          queued
                        ``push``
======================  ======================  ======================================  ============

A leased request reaches ``max`` deliveries while not alone only when
``max`` is 1 or the caller does not count ``held_all``; the scheduler
always counts it, so with ``max`` > 1 its dead letters come from suspects.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "ACKNOWLEDGED", "DEAD", "FETCHED", "LEASED", "QUEUED", "RETURNED", "STATES", "SUSPECT",
    "TRANSITIONS", "Transition", "lease_state",
]

QUEUED = "queued"
LEASED = "leased"
FETCHED = "fetched"
ACKNOWLEDGED = "acknowledged"
RETURNED = "returned"
SUSPECT = "suspect"
DEAD = "dead"

#: Every state, in the order of the module's table.
STATES = (QUEUED, LEASED, FETCHED, ACKNOWLEDGED, RETURNED, SUSPECT, DEAD)


class Transition(NamedTuple):
    """One row of the transition table: ``call`` moves a request in one of
    the states ``sources`` to ``target`` on ``event``."""

    sources: tuple[str, ...]
    call: str
    event: str
    target: str


#: The module's transition table.
TRANSITIONS = (
    Transition((QUEUED, RETURNED), "lease.lua", "leased", LEASED),
    Transition((QUEUED, RETURNED), "lease.lua", "last chance, leased alone", SUSPECT),
    Transition((QUEUED, RETURNED), "lease.lua", "last chance, the worker holds leases", QUEUED),
    Transition((LEASED,), "commit.lua slot", "download ended", FETCHED),
    Transition((SUSPECT,), "commit.lua slot", "download ended", SUSPECT),
    Transition((LEASED, FETCHED, SUSPECT), "commit.lua ack", "handled", ACKNOWLEDGED),
    Transition((LEASED, FETCHED, SUSPECT), "commit.lua give", "given back", RETURNED),
    Transition((LEASED, FETCHED, SUSPECT), "lease.lua", "expired, holder alive", RETURNED),
    Transition((LEASED, FETCHED), "lease.lua", "expired, holder dead, below max", QUEUED),
    Transition((LEASED, FETCHED, SUSPECT), "lease.lua", "expired, holder dead, at max", DEAD),
    Transition((DEAD,), "commit.lua claim + push", "requeued", QUEUED),
)


def lease_state(deliveries: int, max_deliveries: int) -> str:
    """The state of a lease its data in Redis shows (``{s}:ldata``: read
    back after a lost lease reply, when ``lease.lua``'s own word, the
    reply's ``alone``, never came): :data:`SUSPECT` when its deliveries,
    this one included, reach ``max_deliveries`` > 1 (``lease.lua`` leases a
    last chance only alone to a caller that counts ``held_all``, as the
    scheduler does), else :data:`LEASED`.

    :param deliveries: deliveries of the lease, this one included.
    :param max_deliveries: ``FRONTIER_MAX_DELIVERIES`` (0: no limit).
    """
    return SUSPECT if max_deliveries > 1 and deliveries >= max(2, max_deliveries) else LEASED
