"""The frontier's protocol between Python and its shard scripts (``lua/``).

Keys. One table, :data:`SHARD_KEYS`, names a shard's keys in one order.
Every shard script (:data:`SHARD_SCRIPTS`) receives the same key list,
:func:`shard_keys`, built from it: ``KEYS[i]`` is the ``i``-th key of the
table, then the call's own keys (:data:`EXTRA_KEYS`: the holder's commit
marker; then the Bloom bitmaps a commit's pushes name). ``lua/lib.lua``,
prepended to each script, binds them by name once (``K.ready``,
``K.qm``...): its binding block is :func:`lua_binding`'s text, which a
test checks. All keys of a call share the shard's hash tag (its prefix),
so a call touches one Redis Cluster slot.

Calls. ``ARGV[1]`` of every call is its header, one JSON object::

    {"v": 1, "op": "lease", "o": {<options by name>}, "ops": {"ids": 3}}

``v`` is the protocol version (:data:`VERSION`): a script refuses another
one before anything else, with ``ERR frontier protocol <v> not understood
by this script (speaks <VERSION>)``, which :func:`refusal` turns into the
one-line configuration error that :mod:`crawler.frontier.connection`
reports (workers of two versions on one crawl stop, they never run two
protocols silently). ``op`` names the script, ``o`` holds the call's
options by name, ``ops`` how many records of each payload group follow.
The payloads are ``ARGV[2..]``: the groups of :data:`PAYLOADS` in that
order, each record its fields in order (raw bytes: requests are binary,
which JSON cannot carry).

Replies. A reply is a flat list of names and values (``{"wait", 0,
"leases", {...}, ...}``, written out in each script's ``return``):
:func:`fields` reads it into a dict once, and :func:`leases_of`,
:func:`committed_of`, :func:`delay_of` and :func:`forgot_of` turn it into
typed objects (:class:`Lease`, :class:`NotDue`, :class:`Committed`,
:class:`DelaySet`). A name missing from a reply means None.

Damage. The scripts trust the queue values the frontier writes and repair
none: a value there that it never writes (``{s}:lv``'s priorities,
``{s}:qm``'s bounds, ``{s}:count`` with every queue empty, ``{s}:joined``'s
times) is left as it is and named in the reply's ``damaged`` (kind,
field pairs), read into :class:`Damage` s; the worker runs
:func:`crawler.frontier.audit.repair_damage` on each.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _encode_string
from typing import TYPE_CHECKING, Any, NamedTuple

from crawler.frontier.lifecycle import LEASED, SUSPECT

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "DAMAGE_KINDS",
    "EXTRA_KEYS",
    "PAYLOADS",
    "SHARD_KEYS",
    "SHARD_SCRIPTS",
    "VERSION",
    "Committed",
    "Damage",
    "DelaySet",
    "Lease",
    "NotDue",
    "committed_of",
    "delay_of",
    "fields",
    "forgot_of",
    "header",
    "key_numbers",
    "leases_of",
    "lua_binding",
    "refusal",
    "repaired_of",
    "shard_keys",
]

#: The protocol version every header carries and every script checks.
VERSION = 1

#: The scripts of ``lua/`` that run on one shard's keys, each with
#: ``lib.lua`` prepended; the crawl-wide ones (``seeds_*.lua``,
#: ``forget_workers.lua``, ``bloom.lua``) keep their own few keys.
SHARD_SCRIPTS: tuple[str, ...] = (
    "lease.lua", "commit.lua", "delay.lua", "extend.lua", "alive.lua", "trim_dead.lua",
    "forget_sites.lua", "repair.lua",
)

#: A shard's keys, in the one order of every shard script's ``KEYS``: the
#: name a script binds it to (``K.<name>``), and the key's suffix after the
#: shard's prefix ``{s}:`` (the layout is :mod:`crawler.frontier.store`'s).
SHARD_KEYS: tuple[tuple[str, str], ...] = (
    ("wait", "wait"),
    ("leases", "leases"),
    ("ldata", "ldata"),
    ("active", "active"),
    ("due", "due"),
    ("retries", "retries"),
    ("delay", "delay"),
    ("conc", "conc"),
    ("count", "count"),
    ("slow", "slow"),
    ("alive", "alive"),
    ("wactive", "wactive"),
    ("rdelay", "rdelay"),
    ("lslot", "lslot"),
    ("robots", "robots"),
    ("dead", "dead"),
    ("revisits", "revisits"),
    ("rdata", "rdata"),
    ("ready", "ready"),
    ("seq", "seq"),
    ("prio", "prio"),
    ("qm", "qm"),
    ("qc", "qc"),
    ("lv", "lv"),
    ("joined", "joined"),
    ("dupefilter", "dupefilter"),
    ("revisit", "revisit"),
    ("retryat", "retryat"),
    ("robots_down", "robots:down"),
    ("forget", "forget"),
    ("dead_trimmed", "dead:trimmed"),
    ("speaks", "speaks"),
)

#: The keys of one call after :data:`SHARD_KEYS`: ``K.marker`` is the
#: holder's commit marker ``{s}:sent:<holder>`` (``{s}:sent:`` when the call
#: has no holder); the Bloom bitmaps a commit's pushes name follow it,
#: named by their index in ``KEYS`` (see ``lua/commit.lua``).
EXTRA_KEYS: tuple[str, ...] = ("marker",)

#: Payload groups in ``ARGV[2..]``, in order: name -> the fields of one record.
PAYLOADS: dict[str, tuple[str, ...]] = {
    # lease.lua, extend.lua: the lease ids
    "ids": ("lease_id",),
    # commit.lua: the dead letter to take out of {s}:dead first (its exact bytes)
    "claim": ("record",),
    "push": ("fingerprint", "dont_filter", "site", "priority", "data", "bloom"),
    "retry": ("priority", "site", "data", "delay_ms"),
    "dead": ("record",),
    "slot": ("lease_id",),
    "ack": ("lease_id",),
    "give": ("lease_id",),
    "revisit": ("fingerprint", "site", "priority", "data"),
    # forget_sites.lua: the sites to look at
    "sites": ("site",),
}

#: (group name, fields per record) of :data:`PAYLOADS`, in order.
_WIDTHS: tuple[tuple[str, int], ...] = tuple((n, len(f)) for n, f in PAYLOADS.items())

_BEGIN = "-- BEGIN protocol (crawler/frontier/protocol.py: lua_binding)"
_END = "-- END protocol"


def shard_keys(prefix: str, marker: str = "") -> list[str]:
    """A call's ``KEYS``: :data:`SHARD_KEYS` under ``prefix`` (``{s}:``),
    then the commit marker of holder ``marker`` (:data:`EXTRA_KEYS`)."""
    return [prefix + suffix for _, suffix in SHARD_KEYS] + [f"{prefix}sent:{marker}"]


def lua_binding() -> str:
    """The block of ``lua/lib.lua`` that binds a call's keys and payload
    layout by name: ``local K = {wait = KEYS[1], ...}`` (``KEYS`` read
    through a local: one global lookup per call, not one per key) in
    :data:`SHARD_KEYS` order, ``PROTOCOL``, and ``PAYLOADS`` (group name,
    width, name, width..., in :data:`PAYLOADS` order). A test checks that ``lib.lua``
    holds exactly this text."""
    n = len(SHARD_KEYS)
    lines = [_BEGIN, "local PROTOCOL = " + str(VERSION), "local KEYS = KEYS", "local K = {"]
    lines += [f"  {name} = KEYS[{i}]," for i, (name, _) in enumerate(SHARD_KEYS, 1)]
    lines += [f"  {name} = KEYS[{n + i}]," for i, name in enumerate(EXTRA_KEYS, 1)]
    lines += ["}", f"local N_KEYS = {n + len(EXTRA_KEYS)}", "local PAYLOADS = {"]
    lines += [f"  '{name}', {len(f)}," for name, f in PAYLOADS.items()]
    lines += ["}", _END]
    return "\n".join(lines) + "\n"


def key_numbers() -> dict[str, int]:
    """Each key's name -> its place in a shard call's ``KEYS`` (1-based):
    :data:`SHARD_KEYS`, then :data:`EXTRA_KEYS` (the binding's ``K``)."""
    names = [name for name, _ in SHARD_KEYS] + list(EXTRA_KEYS)
    return {name: i for i, name in enumerate(names, 1)}


def lua_binding_in(source: str) -> str | None:
    """The binding block of a Lua source (``lib.lua``), or None."""
    start = source.find(_BEGIN)
    end = source.find(_END, start)
    if start < 0 or end < 0:
        return None
    return source[start : end + len(_END)] + "\n"


def _json_scalar(value: Any) -> str:
    """``value`` as JSON text: ints, bools and strings written directly
    (they are most options), anything else by :func:`json.dumps`."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is str:
        return _encode_string(value)
    return json.dumps(value, separators=(",", ":"))


def _json_members(values: dict[str, Any]) -> str:
    """The members of a JSON object (no braces) of ``values``, less the
    None ones. The names are the code's own (option and group names: no
    character JSON escapes)."""
    return ",".join(
        f'"{name}":{_json_scalar(value)}' for name, value in values.items() if value is not None
    )


class _Header:
    """A header's constant part, encoded once: ``{"v":1,"op":...,"o":{...``
    with the options every call of a frontier shares."""

    __slots__ = ("_head", "_open")

    def __init__(self, op: str, constant: dict[str, Any]) -> None:
        body = json.dumps(constant, separators=(",", ":"))[1:-1]
        self._head = f'{{"v":{VERSION},"op":"{op}","o":{{{body}'
        #: whether the constant options are none (the next one needs no comma)
        self._open = not body

    def __call__(self, options: dict[str, Any] | None = None,
                 ops: dict[str, int] | None = None) -> str:
        """The header with ``options`` added to the constant ones (None
        values left out), and the payload counts ``ops``."""
        text = self._head
        if options:
            more = _json_members(options)
            if more:
                text += more if self._open else "," + more
        if ops:
            return text + '},"ops":{' + ",".join(
                f'"{name}":{n:d}' for name, n in ops.items()) + "}}"
        return text + "}}"


def header(op: str, constant: dict[str, Any] | None = None) -> _Header:
    """A header maker for operation ``op``: ``header(op, constant)(options,
    ops)`` is the JSON text of ``ARGV[1]``. None values are left out (a
    script reads a missing option as nil)."""
    return _Header(op, {k: v for k, v in (constant or {}).items() if v is not None})


def payloads(ops: dict[str, Sequence[Sequence[Any]]]) -> tuple[dict[str, int], list[Any]]:
    """The counts and flat ``ARGV[2..]`` of payload groups ``ops`` (group
    -> records, each a sequence of the group's fields), in
    :data:`PAYLOADS` order; empty groups are left out."""
    counts: dict[str, int] = {}
    flat: list[Any] = []
    for name, width in _WIDTHS:
        records = ops.get(name)
        if not records:
            continue
        counts[name] = len(records)
        for record in records:
            if len(record) != width:
                raise ValueError(f"a {name} record has {width} fields, not {len(record)}")
            flat.extend(record)
    return counts, flat


_REFUSAL = re.compile(r"frontier protocol (\S+) not understood by this script \(speaks (\S+)\)")
_MIXED = re.compile(r"frontier protocol mixed: worker (\S+) speaks (\S+), seen (\S+) s ago")


def refusal(error: BaseException | str) -> str | None:
    """The one-line configuration error for a script's refusal of this
    worker's protocol version, or None when ``error`` is no such refusal."""
    mixed = _MIXED.search(str(error))
    if mixed is not None:
        worker, speaks, ago = mixed.groups()
        spoken = "an older protocol" if speaks == "none" else f"protocol {speaks}"
        return (
            f"worker {worker}, live on this crawl ({ago} s ago), speaks {spoken}; this "
            f"worker speaks {VERSION}: stop every worker (scrapy frontier stop SPIDER), "
            "upgrade them all, then start them (a killed worker counts as live for "
            "FRONTIER_LEASE_TIMEOUT)"
        )
    found = _REFUSAL.search(str(error))
    if found is None:
        return None
    return (
        f"the frontier's Redis scripts speak protocol {found.group(2)}, this worker sent "
        f"{found.group(1)}: run one version of the crawler on every worker of the crawl"
    )


# -- replies -------------------------------------------------------------------------


def fields(reply: Sequence[Any]) -> dict[str, Any]:
    """A script's reply, ``[name, value, name, value...]``, by name."""
    it = iter(reply)
    return {_text(name): value for name, value in zip(it, it, strict=True)}


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None or value in (b"", "") else int(value)


def _problems(value: Iterable[Any] | None) -> tuple[str, ...]:
    return tuple(_text(p) for p in value or ())


#: The kinds of :class:`Damage`: the key (``{s}:<kind>``) whose value it is.
DAMAGE_KINDS = ("lv", "qm", "count", "joined")


class Damage(NamedTuple):
    """A queue value the frontier never writes, met by a script, which left
    it as it is (see the module's docstring).

    :ivar kind: the key's name in the shard: ``lv`` (a site's priorities),
        ``qm`` (a queue's bounds), ``count`` (requests counted with every
        queue empty), ``joined`` (a site's join time).
    :ivar field: the hash field (the site; ``site\tprio`` for ``qm``), ""
        for ``count``.
    """

    kind: str
    field: str


def _damaged(value: Sequence[Any] | None) -> tuple[Damage, ...]:
    """The reply's ``damaged``, ``[kind, field, ...]``, as :class:`Damage` s
    (kinds not in :data:`DAMAGE_KINDS` are left out)."""
    items = [_text(v) for v in value or ()]
    pairs = zip(items[0::2], items[1::2], strict=False)
    return tuple(Damage(kind, name) for kind, name in pairs if kind in DAMAGE_KINDS)


class Committed(NamedTuple):
    """What :meth:`crawler.frontier.store.Frontier.commit` did.

    :ivar pushed: per push, True when queued, False when filtered as seen.
    :ivar freed: slots freed (of ``slots``).
    :ivar acked: leases ended (of ``acks``; leases that had expired meanwhile
        are not counted).
    :ivar given: leases given back (of ``givebacks``).
    :ivar problems: bad values met in Redis, one line of text each (the key,
        the field, the value and what was done instead).
    :ivar claimed: False when ``claim`` was not in the list (nothing done).
    :ivar joined: when the commit ran, µs of the Redis server's clock (the
        sites it put in ``{s}:ready`` joined then), with join times kept
        (several shards); else None.
    :ivar damaged: the queue values met that the frontier never writes
        (:class:`Damage`), left as they are.
    """

    pushed: list[bool]
    freed: int
    acked: int
    given: int
    problems: list[str]
    claimed: bool
    joined: int | None = None
    damaged: tuple[Damage, ...] = ()

    @classmethod
    def of(cls, reply: Sequence[Any]) -> Committed:
        """Read ``commit.lua``'s reply (:func:`committed_of`)."""
        return committed_of(reply)


def committed_of(reply: Sequence[Any]) -> Committed:
    """``commit.lua``'s reply as a :class:`Committed`."""
    f = fields(reply)
    return Committed(
        [bool(p) for p in f.get("pushed") or ()], int(f.get("freed") or 0),
        int(f.get("acked") or 0), int(f.get("given") or 0), list(_problems(f.get("problems"))),
        bool(f.get("claimed")), _int_or_none(f.get("joined")), _damaged(f.get("damaged")),
    )


class Lease(NamedTuple):
    """A request handed to this worker until it is acknowledged (a named
    tuple: a call's replies make many, cheaply).

    :ivar data: the encoded request.
    :ivar site: the site it belongs to.
    :ivar lease_id: the id to acknowledge.
    :ivar deliveries: how often it was handed out, this time included.
    :ivar expired: leases of others this call returned to the queue.
    :ivar retried: due retries this call moved into the queue.
    :ivar dead: requests this call moved to the dead-letter list (past their
        deliveries, or unreadable).
    :ivar problems: bad values the call met in Redis (see :class:`Committed`).
    :ivar best: the best priority among the sites due after the call, or
        None when none is (set on a call's first lease).
    :ivar head: when the first site at that priority (the next one served)
        joined the shard's ready index, µs of the Redis server's clock (0:
        not known, queued by an older version: long ago), or None when no
        site is due (set on a call's first lease).
    :ivar last_passed: the site of a request on its last chance that the
        call put back (see ``lease_many``'s ``held_all``) because this
        worker held leases, or None (set on a call's first lease).
    :ivar state: its state in the life cycle as ``lease.lua`` decided it
        (:mod:`crawler.frontier.lifecycle`): :data:`~crawler.frontier.lifecycle.SUSPECT`
        for a last chance leased alone (the reply's ``alone``), else
        :data:`~crawler.frontier.lifecycle.LEASED`.
    :ivar damaged: see :class:`Committed` (set on a call's first lease).
    """

    data: bytes
    site: str
    lease_id: str
    deliveries: int = 1
    expired: int = 0
    retried: int = 0
    dead: int = 0
    problems: tuple[str, ...] = ()
    best: int | None = None
    head: int | None = None
    last_passed: str | None = None
    state: str = LEASED
    damaged: tuple[Damage, ...] = ()


@dataclass(frozen=True)
class NotDue:
    """Nothing can be leased now.

    :ivar wait: seconds until a site or a retry becomes due, or None when
        nothing is queued or waiting to be retried.
    :ivar best: the best priority among the sites due now (held back by
        this worker's fair share or a concurrency), or None when none is.
    :ivar head: when the first site at that priority joined the shard's
        ready index, µs (see :class:`Lease`), or None when none is due.
    :ivar last_passed: see :class:`Lease`.
    :ivar damaged: see :class:`Committed`.
    """

    wait: float | None
    expired: int
    retried: int
    dead: int = 0
    problems: tuple[str, ...] = ()
    best: int | None = None
    head: int | None = None
    last_passed: str | None = None
    damaged: tuple[Damage, ...] = ()


def leases_of(reply: Sequence[Any], lease_ids: Sequence[str]) -> list[Lease] | NotDue:
    """``lease.lua``'s reply to a call with ``lease_ids``: the leases it
    took (the first ids, in order; the call's summary on the first), or a
    :class:`NotDue` when it took none."""
    f = fields(reply)
    expired, retried, dead = int(f.get("expired") or 0), int(f.get("retried") or 0), int(
        f.get("dead") or 0)
    problems = _problems(f.get("problems"))
    best = _int_or_none(f.get("best"))
    head = _int_or_none(f.get("head")) if best is not None else None
    passed = _text(f.get("passed") or b"") or None
    damaged = _damaged(f.get("damaged"))
    taken = f.get("leases") or []
    if not taken:
        wait = int(f.get("wait", -1))
        return NotDue(None if wait < 0 else wait / 1000, expired, retried, dead, problems,
                      best, head, passed, damaged)
    leases = []
    for i in range(len(taken) // 3):
        data, site, deliveries = taken[3 * i : 3 * i + 3]
        if i:
            leases.append(Lease(data, _text(site), lease_ids[i], int(deliveries)))
        else:
            state = SUSPECT if f.get("alone") in (1, b"1", "1") else LEASED
            leases.append(Lease(data, _text(site), lease_ids[0], int(deliveries), expired,
                                retried, dead, problems, best, head, passed, state,
                                damaged))
    return leases


def forgot_of(reply: Sequence[Any]) -> tuple[int, list[str]]:
    """``forget_sites.lua``'s reply: sites forgotten, and the problems met."""
    f = fields(reply)
    return int(f.get("forgotten") or 0), list(_problems(f.get("problems")))


class DelaySet(NamedTuple):
    """What ``delay.lua`` did: whether an override was removed, the ms the
    site's next request moved by (negative: sooner), the bad values met."""

    removed: bool
    moved: int
    problems: tuple[str, ...]


def delay_of(reply: Sequence[Any]) -> DelaySet:
    """``delay.lua``'s reply as a :class:`DelaySet`."""
    f = fields(reply)
    return DelaySet(bool(f.get("removed")), int(f.get("moved") or 0),
                    _problems(f.get("problems")))


def repaired_of(reply: Sequence[Any]) -> list[str]:
    """``repair.lua``'s reply: what it found wrong and did, a line each
    (empty: nothing was)."""
    return list(_problems(fields(reply).get("repaired")))
