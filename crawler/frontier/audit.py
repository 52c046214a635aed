"""What is wrong with a crawl's Redis structures (``scrapy frontier audit``).

:func:`audit_crawl` reads every shard of a crawl and returns
:class:`Finding` s, each naming its key and what is wrong:

``vanished``
    the crawl's keys vanished (a flush, an eviction, a Redis restarted
    without persistence), judged by ``{<spider>}:created``
    (:func:`crawler.frontier.eviction.vanished_keys`), or queue chunks that
    ``{s}:qm`` names are gone from ``{s}:qc``, chunks of a queue ``{s}:qm``
    no longer names, a queue's priority gone from ``{s}:lv``. (The loss of
    a key that leaves nothing to compare with, the dupefilter or the
    ``wait`` and ``ready`` indexes, is found through the marker only.)
``absent``
    nothing of the crawl's frontier is in Redis: never started, cleared,
    or all of it vanished. Never reported as a clean crawl.
``evicting``
    the Redis may evict keys (``maxmemory-policy`` not ``noeviction``).
``wrong-type``
    a key of another type than the scripts write (the scripts refuse calls
    that touch it).
``count`` / ``prio``
    ``{s}:count`` / ``{s}:prio`` disagree with the requests in the queues.
``lease``
    a lease deadline without its data (``{s}:leases`` without
    ``{s}:ldata``), data without a deadline (it would never expire: its
    request is stranded), or data that cannot be read.
``slots``
    the download slots counted in ``{s}:active`` / ``{s}:wactive`` disagree
    with the slots held in ``{s}:lslot``, or a slot held by no lease.
``bad-value``
    a value the scripts cannot read (an override, a due time, a counter), or
    a queue value the frontier never writes: a site's priorities in
    ``{s}:lv``, a queue's bounds in ``{s}:qm``, a join time in
    ``{s}:joined``. The scripts trust the queue values: they leave such a
    value as it is, pass its site or queue over (its requests wait, none
    is lost) and name it in their reply; the worker that gets it runs
    :func:`repair_damage`, the repair ``--repair`` makes of that one value,
    and logs one WARNING line.

With ``repair``, what can be fixed safely is fixed, each under ``WATCH`` of
the keys it reads (a crawl that writes them meanwhile makes that repair
give up, and the finding says so): counters recomputed from the queues and
slots, a deadline of now given to stranded lease data (the next lease call
returns its request to its queue), deadlines without data deleted, bad
override, due-time, pace and join-time values deleted (the scripts already
use the default in their place), and the queue values above rebuilt
(``lua/repair.lua``, one atomic call each: a queue's bounds from its
chunks in ``{s}:qc``, a site's priorities from ``{s}:qm``; the site is put
back in ``{s}:wait``). Repairs are idempotent: run twice, the second
finds nothing to do. Vanished structures, wrong types and unreadable
lease data are not repaired: the first need a re-seed, the others a look
by hand (lease data that cannot be read is dead-lettered when it expires).

The counters are read apart from the queues (``HSCAN``): with workers
running they may disagree for a moment; a finding that goes away when
the command is run again was such a moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from redis.exceptions import WatchError

from crawler.frontier.eviction import NOEVICTION, evicted_keys, eviction_policy, missing_message
from crawler.frontier.protocol import Damage
from crawler.frontier.store import PRIORITY_LIMIT, _lease_entry, chunk_entries, holder_of
from crawler.keys import created_key, shards_key
from crawler.overrides import CONCURRENCY, DELAY, REVISIT, stored_value_ok

if TYPE_CHECKING:
    from redis import Redis

    from crawler.frontier.shards import FrontierShards
    from crawler.frontier.store import Frontier

__all__ = ["REPAIR_COMMAND", "Finding", "audit_crawl", "repair_damage"]

#: The command that finds and repairs what the workers repair one value at
#: a time (``SPIDER``: the spider's name).
REPAIR_COMMAND = "scrapy frontier audit --repair {spider}"

#: The type each shard key must have (``none``, absent, is always fine).
TYPES: dict[str, str] = {
    "wait": "zset", "leases": "zset", "ldata": "hash", "active": "hash", "due": "hash",
    "retries": "zset", "delay": "hash", "conc": "hash", "count": "string", "slow": "hash",
    "alive": "zset", "wactive": "hash", "rdelay": "hash", "lslot": "hash", "robots": "hash",
    "dead": "list", "revisits": "zset", "rdata": "hash", "ready": "zset", "seq": "string",
    "prio": "hash", "qm": "hash", "qc": "hash", "lv": "hash", "joined": "hash",
    "revisit": "hash",
}
#: Hashes of whole ms >= 0 whose bad values the scripts ignore (a bad
#: value means 0 or the default there, so deleting it changes nothing).
_WHOLE_MS = ("due", "slow", "rdelay")
#: The hash of join times (whole µs, up to 16 digits), read as "long ago"
#: (0) by the scripts when a value is not one.
JOINED = "joined"
#: How many times a repair is tried when the crawl writes its keys meanwhile.
_TRIES = 3


@dataclass
class Finding:
    """One thing wrong with a crawl's structures.

    :ivar kind: see the module's docstring.
    :ivar key: the key it is about (``{quotes}:count``).
    :ivar detail: what is wrong, for people.
    :ivar fix: what ``--repair`` does about it, or "" (it cannot).
    :ivar repaired: whether ``--repair`` did it.
    """

    kind: str
    key: str
    detail: str
    fix: str = ""
    repaired: bool = False

    @property
    def repairable(self) -> bool:
        """Whether ``--repair`` fixes it."""
        return bool(self.fix)

    def line(self) -> str:
        """``<kind> <key>: <detail>`` and what was repaired, one line."""
        text = f"{self.kind} {self.key}: {self.detail}"
        if self.repaired:
            text += f" - repaired: {self.fix}"
        elif self.fix:
            text += f" (--repair: {self.fix})"
        return text

    def as_dict(self) -> dict[str, Any]:
        """``{"kind", "key", "detail", "fix", "repaired"}`` (``fix``: "" when
        it cannot be repaired)."""
        return {"kind": self.kind, "key": self.key, "detail": self.detail,
                "fix": self.fix, "repaired": self.repaired}


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _whole(raw: bytes | str | None) -> int | None:
    """A stored whole number >= 0, or None when it is not one."""
    text = _text(raw) if raw is not None else ""
    return int(text) if text.isdigit() and len(text) <= 15 else None


def audit_crawl(
    crawl: FrontierShards, *, stats_key: str, workers_key: str, repair: bool = False
) -> list[Finding]:
    """Everything wrong with ``crawl``'s structures; with ``repair``, what
    can be fixed safely is fixed (:attr:`Finding.repaired` says how).

    :param stats_key: ``{<spider>}:stats``, kept by ``frontier clear``.
    :param workers_key: ``{<spider>}:workers``, kept by ``frontier clear``.
    :raises redis.exceptions.RedisError: Redis failed.
    """
    r = crawl.redis
    spider = crawl.spider
    found: list[Finding] = []
    policy = eviction_policy(r)
    if policy != NOEVICTION:
        evicted = evicted_keys(r)
        found.append(Finding(
            "evicting", "maxmemory-policy",
            f"this Redis may evict the crawl's keys (maxmemory-policy {policy}; "
            f"{'unknown' if evicted is None else evicted} keys evicted since it started): "
            "set it to noeviction",
        ))
    if missing := crawl.missing():
        found.append(Finding("vanished", ", ".join(missing), missing_message(spider, missing)))
    elif not r.exists(created_key(spider), shards_key(spider)):
        kept = r.exists(stats_key, workers_key)
        found.append(Finding(
            "absent", created_key(spider),
            "no frontier of this crawl is in Redis: "
            + ("cleared (scrapy frontier clear keeps its stats and worker records), or its "
               "keys vanished" if kept else
               "never started, or all its keys vanished (a flush, an eviction, a Redis "
               "restarted without persistence)")
            + "; nothing to audit, and not a clean crawl",
        ))
        return found
    for frontier in crawl.frontiers:
        found.extend(_audit_shard(frontier, repair))
    return found


def _audit_shard(f: Frontier, repair: bool) -> list[Finding]:
    r = f.redis
    found: list[Finding] = []
    with r.pipeline(transaction=False) as pipe:
        for name in TYPES:
            pipe.type(f.key(name))
        kinds = {name: _text(k) for name, k in zip(TYPES, pipe.execute(), strict=True)}
    wrong = {n for n, k in kinds.items() if k not in ("none", TYPES[n])}
    for name in sorted(wrong):
        found.append(Finding(
            "wrong-type", f.key(name),
            f"is a {kinds[name]}, not a {TYPES[name]}: the frontier's scripts refuse every "
            "call that touches it (delete or fix it by hand)",
        ))
    if not wrong & {"count", "prio", "qm", "qc", "lv"}:
        found.extend(_queues(f, repair))
    if not wrong & {"leases", "ldata", "lslot", "active", "wactive"}:
        found.extend(_leases(f, repair))
    for name in sorted({DELAY, CONCURRENCY, REVISIT, JOINED, *_WHOLE_MS} - wrong):
        found.extend(_values(f, name, repair))
    return found


def _scan_queues(r: Redis, f: Frontier) -> tuple[dict[str, int], set[str], list[str]]:
    """Requests queued by priority, the chunk fields of ``{s}:qc``, and the
    chunks that cannot be read."""
    by_priority: dict[str, int] = {}
    fields: set[str] = set()
    unreadable: list[str] = []
    for raw_name, chunk in r.hscan_iter(f.key("qc"), count=1000):
        name = _text(raw_name)
        if name in fields:
            continue  # (HSCAN may return a field twice)
        fields.add(name)
        parts = name.split("\t")
        try:
            entries = len(chunk_entries(chunk))
        except ValueError:
            unreadable.append(name)
            continue
        if len(parts) == 3:
            by_priority[parts[1]] = by_priority.get(parts[1], 0) + entries
    return by_priority, fields, unreadable


def _queues(f: Frontier, repair: bool) -> list[Finding]:
    found: list[Finding] = []
    if repair:
        # (what a worker does when a lease call reports {s}:count damaged)
        found.extend(repair_damage(f, Damage("count", "")))
    counted, fields, unreadable = _counters(f, repair)
    found.extend(counted)
    for name in unreadable:
        found.append(Finding("bad-value", f"{f.key('qc')} {name}",
                             "a queue chunk that cannot be read (the scripts dead-letter it)"))
    found.extend(_chunks(f, fields, repair))
    return found


def _counters(f: Frontier, repair: bool) -> tuple[list[Finding], set[str], list[str]]:
    """``{s}:count`` and ``{s}:prio`` against the queues (with ``repair``:
    set from them under ``WATCH``), the chunk fields of ``{s}:qc`` and the
    chunks that cannot be read."""
    r = f.redis
    found: list[Finding] = []
    fields: set[str] = set()
    unreadable: list[str] = []
    for attempt in range(_TRIES):
        with r.pipeline(transaction=True) as pipe:
            if repair:
                cast("Any", pipe).watch(f.key("count"), f.key("prio"), f.key("qc"))
            by_priority, fields, unreadable = _scan_queues(pipe if repair else r, f)
            raw_count = (pipe if repair else r).get(f.key("count"))
            # (a field at 0 is harmless: not reported)
            counted = {_text(k): _text(v) for k, v in
                       (pipe if repair else r).hgetall(f.key("prio")).items() if v != b"0"}
            queued = sum(by_priority.values())
            count = _whole(raw_count) if raw_count is not None else 0
            want_prio = {p: str(n) for p, n in by_priority.items() if n}
            # (with a chunk that cannot be read, what the queues hold is not known)
            fix = not unreadable
            found = []
            if count != queued:
                shown = f"not a whole number {raw_count!r}" if count is None else count
                found.append(Finding(
                    "count", f.key("count"),
                    f"counts {shown} queued requests; the queues ({f.key('qc')}) hold {queued}",
                    fix="set to the requests queued" if fix else "",
                ))
            if counted != want_prio:
                found.append(Finding(
                    "prio", f.key("prio"),
                    f"counts {dict(sorted(counted.items()))} by priority; the queues hold "
                    f"{dict(sorted(want_prio.items()))}", fix="set from the queues" if fix else "",
                ))
            if not repair or not fix or not found:
                break
            try:
                pipe.multi()
                pipe.set(f.key("count"), queued)
                pipe.delete(f.key("prio"))
                if want_prio:
                    pipe.hset(f.key("prio"), mapping=want_prio)  # type: ignore[arg-type]
                pipe.execute()
            except WatchError:
                if attempt == _TRIES - 1:
                    for finding in found:
                        finding.detail += " (not repaired: the crawl wrote its queues meanwhile)"
                continue
            for finding in found:
                finding.repaired = True
            break
    return found, fields, unreadable


def _priority_ok(word: str) -> bool:
    """Whether ``word`` is a priority as the scripts write it in ``{s}:lv``
    (an integer within ``PRIORITY_LIMIT``, at most 8 characters)."""
    digits = word[1:] if word.startswith("-") else word
    return len(word) <= 8 and digits.isascii() and digits.isdigit() \
        and abs(int(word)) <= PRIORITY_LIMIT


def _bounds_ok(raw: str) -> bool:
    """Whether ``raw`` is a queue's bounds as the scripts write them in
    ``{s}:qm`` (``<head> <tail>``, head <= tail; lib.lua's q_bounds)."""
    parts = raw.split(" ")
    if len(parts) != 2:
        return False
    numbers = []
    for part in parts:
        digits = part[1:] if part.startswith("-") else part
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 14 or \
                (len(digits) > 1 and digits.startswith("0")) or part == "-0":
            return False
        numbers.append(int(part))
    return numbers[0] <= numbers[1]


def _repaired(finding: Finding, lines: list[str]) -> Finding:
    """``finding`` marked repaired; ``lines`` (what the repair did) added."""
    finding.repaired = True
    if lines:
        finding.detail += " [" + "; ".join(lines) + "]"
    return finding


def _levels(f: Frontier, bounds_of: dict[str, str], repair: bool) -> list[Finding]:
    """Sites whose priorities in ``{s}:lv`` are no frontier's, or lack a
    queue's of ``{s}:qm`` (``bounds_of``); with ``repair``, rebuilt from
    ``{s}:qm`` (:func:`repair_damage`)."""
    raw_levels = {_text(k): _text(v) for k, v in f.redis.hscan_iter(f.key("lv"), count=1000)}
    levels = {site: v.split() for site, v in raw_levels.items()}
    rebuild: dict[str, Finding] = {}
    for site, words in sorted(levels.items()):
        if not all(_priority_ok(w) for w in words):
            rebuild[site] = Finding(
                "bad-value", f"{f.key('lv')} {site}",
                f"{raw_levels[site]!r} is not the site's priorities: the scripts pass the "
                "site over, its requests queued, until it is rebuilt",
                fix=f"rebuilt from {f.key('qm')}",
            )
    for queue in sorted(bounds_of):
        site, _, prio = queue.rpartition("\t")
        if prio not in levels.get(site, []) and site not in rebuild:
            rebuild[site] = Finding(
                "vanished", f"{f.key('lv')} {site}",
                f"lacks priority {prio}, whose queue is in {f.key('qm')}: its requests "
                "are never leased (evicted, or a value edited by hand?)",
                fix=f"rebuilt from {f.key('qm')}",
            )
    if repair:
        for site, finding in rebuild.items():
            _repaired(finding, f.repair("lv", site))
    return list(rebuild.values())


def _chunks(f: Frontier, fields: set[str], repair: bool = False) -> list[Finding]:
    """Queues of ``{s}:qm`` whose chunks are gone from ``{s}:qc``, chunks
    of no queue in ``{s}:qm``, queues whose bounds in ``{s}:qm`` are no
    frontier's, and sites whose priorities in ``{s}:lv`` are not those of
    their queues (the scripts lease from none of them; with ``repair``,
    the last two are rebuilt: :func:`repair_damage`)."""
    found: list[Finding] = []
    bounds_of = {_text(k): _text(v) for k, v in f.redis.hscan_iter(f.key("qm"), count=1000)}
    strays: dict[str, int] = {}
    for name in fields:
        queue = name.rsplit("\t", 1)[0]
        if queue not in bounds_of:
            strays[queue] = strays.get(queue, 0) + 1
    for queue, n in sorted(strays.items()):
        found.append(Finding(
            "vanished", f"{f.key('qm')} {queue}",
            f"gone, while {n} chunk(s) of that queue are in {f.key('qc')}: "
            "their requests are never leased (evicted?)",
        ))
    found.extend(_levels(f, bounds_of, repair))
    for queue, raw in sorted(bounds_of.items()):
        if not _bounds_ok(raw):
            finding = Finding(
                "bad-value", f"{f.key('qm')} {queue}",
                f"{raw!r} is not '<head> <tail>': the scripts pass its site over, its "
                "requests queued, until it is rebuilt",
                fix=f"rebuilt from its chunks in {f.key('qc')}",
            )
            found.append(finding)
            if repair:
                _repaired(finding, f.repair("qm", queue))
            continue
        bounds = raw.split(" ")
        gone = [n for n in range(int(bounds[0]), int(bounds[1]) + 1)
                if f"{queue}\t{n}" not in fields]
        if gone:
            found.append(Finding(
                "vanished", f"{f.key('qc')} {queue}",
                f"{len(gone)} of its chunks are gone ({', '.join(map(str, gone[:5]))}"
                f"{', ...' if len(gone) > 5 else ''}): their requests are lost (evicted?)",
            ))
    return found


def _leases(f: Frontier, repair: bool) -> list[Finding]:
    r = f.redis
    names = ("leases", "ldata", "lslot", "active", "wactive")
    keys = [f.key(n) for n in names]
    for attempt in range(_TRIES):
        with r.pipeline(transaction=True) as pipe:
            if repair:
                cast("Any", pipe).watch(*keys)
                reader: Any = pipe
                deadlines = dict(reader.zrange(keys[0], 0, -1, withscores=True))
                data, slots, active, wactive = (reader.hgetall(k) for k in keys[1:])
            else:
                pipe.zrange(keys[0], 0, -1, withscores=True)
                for k in keys[1:]:
                    pipe.hgetall(k)
                pairs, data, slots, active, wactive = pipe.execute()
                deadlines = dict(pairs)
            found = _lease_findings(f, deadlines=deadlines, data=data, slots=slots,
                                    active=active, wactive=wactive)
            fixable = [x for x in found if x.repairable]
            if not repair or not fixable:
                return found
            try:
                pipe.multi()
                _repair_leases(pipe, f, deadlines=deadlines, data=data, slots=slots)
                pipe.execute()
            except WatchError:
                if attempt == _TRIES - 1:
                    for x in fixable:
                        x.detail += " (not repaired: the crawl wrote its leases meanwhile)"
                    return found
                continue
            for x in fixable:
                x.repaired = True
            return found
    return []


def _lease_findings(
    f: Frontier, *, deadlines: dict[bytes, float], data: dict[bytes, bytes],
    slots: dict[bytes, bytes], active: dict[bytes, bytes], wactive: dict[bytes, bytes],
) -> list[Finding]:
    found: list[Finding] = []
    for lease_id in sorted(set(deadlines) - set(data)):
        found.append(Finding("lease", f"{f.key('leases')} {_text(lease_id)}",
                             f"deadline without data in {f.key('ldata')}",
                             fix="deadline deleted"))
    for lease_id in sorted(set(data) - set(deadlines)):
        found.append(Finding(
            "lease", f"{f.key('ldata')} {_text(lease_id)}",
            f"stranded: data without a deadline in {f.key('leases')}, so it never expires "
            "and its request is never crawled",
            fix="given a deadline of now: the next lease call returns its request to its queue",
        ))
    for lease_id, entry in sorted(data.items()):
        if _lease_entry(entry) is None:
            found.append(Finding("lease", f"{f.key('ldata')} {_text(lease_id)}",
                                 "cannot be read (dead-lettered when its lease expires)"))
    held, held_by = _slots_held(slots, data)
    for lease_id in sorted(set(slots) - set(data) - set(deadlines)):
        found.append(Finding(
            "slots", f"{f.key('lslot')} {_text(lease_id)}",
            "a download slot held by no lease: its site's concurrency stays lowered",
            fix="slot freed",
        ))
    for key, counted, want in ((f.key("active"), active, held),
                               (f.key("wactive"), wactive, held_by)):
        now = {_text(k): _text(v) for k, v in counted.items() if _text(v) != "0"}
        if now != {k: str(n) for k, n in want.items() if n}:
            found.append(Finding(
                "slots", key,
                f"counts {dict(sorted(now.items()))} slots taken; the leases hold "
                f"{dict(sorted(want.items()))} ({f.key('lslot')})",
                fix="counted again from the slots held",
            ))
    return found


def _slots_held(
    slots: dict[bytes, bytes], data: dict[bytes, bytes]
) -> tuple[dict[str, int], dict[str, int]]:
    """Slots taken by site and by ``holder\\tsite``, from ``{s}:lslot``
    (a value "1", from before it kept sites, takes its site from the
    lease's data); slots of no lease are left out."""
    by_site: dict[str, int] = {}
    by_holder: dict[str, int] = {}
    for raw_id, raw_site in slots.items():
        if raw_id not in data:
            continue
        site = _text(raw_site)
        if site == "1":
            parsed = _lease_entry(data[raw_id])
            if parsed is None:
                continue
            site = parsed[0]
        by_site[site] = by_site.get(site, 0) + 1
        worker = f"{holder_of(_text(raw_id))}\t{site}"
        by_holder[worker] = by_holder.get(worker, 0) + 1
    return by_site, by_holder


def _repair_leases(
    pipe: Any, f: Frontier, *, deadlines: dict[bytes, float], data: dict[bytes, bytes],
    slots: dict[bytes, bytes],
) -> None:
    """Queue the lease repairs on ``pipe`` (in ``MULTI``)."""
    if gone := sorted(set(deadlines) - set(data)):
        pipe.zrem(f.key("leases"), *gone)
    if stranded := sorted(set(data) - set(deadlines)):
        # (a deadline of 0, as a give-back has: expired now, on any clock)
        pipe.zadd(f.key("leases"), dict.fromkeys(stranded, 0), nx=True)
    if orphans := sorted(set(slots) - set(data) - set(deadlines)):
        pipe.hdel(f.key("lslot"), *orphans)
    held, held_by = _slots_held(slots, data)
    for name, want in (("active", held), ("wactive", held_by)):
        pipe.delete(f.key(name))
        if want:
            pipe.hset(f.key(name), mapping=want)


def _ok(name: str, raw: bytes | str) -> bool:
    """Whether ``raw`` is a good value of the hash ``name``."""
    value = raw.encode() if isinstance(raw, str) else raw
    if name == DELAY:
        return stored_value_ok(DELAY, value)
    if name == CONCURRENCY:
        return stored_value_ok(CONCURRENCY, value)
    if name == REVISIT:
        return stored_value_ok(REVISIT, value)
    if name == JOINED:
        return value.isdigit() and len(value) <= 16
    return _whole(value) is not None


def _values(f: Frontier, name: str, repair: bool) -> list[Finding]:
    """Bad values of the hash ``name`` (an override, or whole ms)."""
    r = f.redis
    key = f.key(name)
    found: list[Finding] = []
    bad: list[bytes] = []
    for field, raw in r.hscan_iter(key, count=1000):
        if not _ok(name, raw):
            if name == JOINED:
                finding = Finding(
                    "bad-value", f"{key} {_text(field)}",
                    f"{_text(raw)!r} is not whole µs: the scripts count the site as joined "
                    "long ago (first in its priority across shards)",
                    fix="deleted (joined long ago, as the scripts read it)",
                )
                found.append(finding)
                if repair:
                    _repaired(finding, f.repair("joined", _text(field)))
                continue
            bad.append(field)
            found.append(Finding(
                "bad-value", f"{key} {_text(field)}",
                f"{_text(raw)!r} cannot be read: the scripts use the default in its place",
                fix="deleted (the default applies)",
            ))
    if repair and bad:
        # (a value set again meanwhile is deleted only if still bad: each
        # field is checked under WATCH)
        for field, finding in zip(bad, found, strict=True):
            with r.pipeline(transaction=True) as pipe:
                try:
                    cast("Any", pipe).watch(key)
                    raw = pipe.hget(key, field)
                    still_bad = raw is not None and not _ok(name, raw)
                    pipe.multi()
                    if still_bad:
                        pipe.hdel(key, field)
                    pipe.execute()
                    finding.repaired = True
                except WatchError:
                    finding.detail += " (not repaired: written meanwhile)"
    return found


def repair_damage(f: Frontier, damage: Damage) -> list[Finding]:
    """The repair ``scrapy frontier audit --repair`` makes of one damaged
    value (a script's reply named it: :class:`~crawler.frontier.protocol.Damage`),
    on shard ``f`` only. Safe while workers run, and idempotent: one
    atomic ``repair.lua`` call (a value that is fine by then is left as it
    is; see :meth:`crawler.frontier.store.Frontier.repair`).

    :returns: what was found and done (empty: nothing was wrong any more).
    :raises redis.exceptions.RedisError: Redis failed, or a key has the
        wrong type (nothing was written).
    """
    key = f"{f.key(damage.kind)} {damage.field}".rstrip()
    lines = f.repair(damage.kind, damage.field)
    return [Finding("bad-value", key, line, fix="repaired", repaired=True) for line in lines]
