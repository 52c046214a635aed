"""The scripts' batched writes against the one-by-one writes they replaced.

A seeded random run of commits, leases and hand edits of the frontier's keys
(malformed values, wrong types) goes to two frontiers on one redis-server:
one runs the scripts as they are, the other those of commit 8a5375e (before
the writes were batched, read with ``git show``). Both read one fake clock
(the scripts' ``TIME`` is replaced by a read of a key both share), so every
reply and every key must be the same after every step, but for the one
change documented: an ack whose ``{s}:ldata`` is gone now also drops its
``{s}:leases`` entry (the run never deletes ``{s}:ldata`` by hand, so no
ack meets that case). The old scripts are called in their positional
layout, translated from the named protocol (``_OldCommit``, ``_OldLease``)
and their replies given by name. lease.lua's ``held_all`` and ``passed``
(a request's last chance held back: ``tests/test_last_chance.py``) came
later: the run leaves ``held_all`` uncounted, which holds nothing back.
The live-holder rule came later too (an expired lease whose holder was seen
in ``{s}:alive`` at its deadline or after is requeued without counting that
delivery: ``tests/test_blocking_callbacks.py``): the run's holders lease
often enough to meet it, so the reference gets the same rule, written here
apart from the script (``_live_holder_rule``), and the two must agree.
The one dead-letter shape came later too: dead letters are compared in it
(``crawler.frontier.deadletters.upgrade``), without the ``worker`` the
scripts name since; lease.lua's reply field ``alone`` is never 1 here.
The scripts trust the queue values they write since (``{s}:lv``,
``{s}:qm``, ``{s}:joined``): the run edits none of them (their damage, left
as it is, reported and repaired apart, is tested in test_chunk_queues,
test_ops_audit and test_shards_variants). ``{s}:count`` with every queue
empty is reported as damaged, no longer reset by lease.lua: the run gives
it the worker's repair (:func:`crawler.frontier.audit.repair_damage`)
right after the call, which ends as the old reset did, and the old
script's line about it is left out of its problems. A commit with pushes
checks ``{s}:retries``' type first (a request for a damaged queue would be
parked there): the run's commits meet no wrong type there (a lease call is
made instead)."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis as redis_lib

from crawler.frontier import protocol
from crawler.frontier.audit import repair_damage
from crawler.frontier.bloom import BloomFilter
from crawler.frontier.deadletters import upgrade
from crawler.frontier.store import Commit, Frontier, Push, Retry, Revisit

if TYPE_CHECKING:
    import redis

BEFORE = "8a5375e"
ROOT = Path(__file__).resolve().parent.parent
CLOCK = "diff:clock"
# (one with the characters HSCAN patterns escape)
SITES = ["a.example", "b.example", "c.example", "d.example", "we[i]rd*?.example"]
PRIOS = [-2, 0, 0, 1, 3]
HOLDERS = ["w1", "w2", "w3"]
ODD = ["abc", "-3", "-2", "-1", "007", "01", "1234567890123456", "-0", "0", "1", "2", "3"]


def _lua(source: str) -> str:
    """``source`` reading the shared fake clock instead of ``TIME``."""
    assert source.count("redis.call('TIME')") >= 2, "lib.lua reads TIME otherwise now"
    patched = source.replace("redis.call('TIME')", f"redis.call('HMGET', '{CLOCK}', 's', 'us')")
    assert "TIME')" not in patched
    return patched


# The live-holder rule, as three edits of the reference's lease.lua: each
# anchor must be met once.
_LIVE_HOLDER = [
    ("read('ZSCORE', KEYS[11], holder)\n",
     "local seen_before = tonumber(read('ZSCORE', KEYS[11], holder))\n"),
    ("local buried = 0\n",
     "local buried = 0\n"
     "local function holder_alive(id, deadline)\n"
     "  local h = string.match(id, '^(.*):%d+$')\n"
     "  if not h or not deadline then return false end\n"
     "  local seen = seen_before\n"
     "  if h ~= holder then seen = tonumber(redis.call('ZSCORE', KEYS[11], h)) end\n"
     "  return seen ~= nil and seen >= deadline\n"
     "end\n"),
    ("    if prio then d, data = deliveries_of(rest) end\n",
     "    if prio then d, data = deliveries_of(rest) end\n"
     "    if prio and d > 0 and holder_alive(id, tonumber(redis.call('ZSCORE', leases, id)))"
     " then\n"
     "      d = d - 1\n"
     "    end\n"),
]


def _live_holder_rule(lease: str) -> str:
    """The reference's ``lease.lua`` with the live-holder rule added."""
    for anchor, replacement in _LIVE_HOLDER:
        assert lease.count(anchor) == 1, anchor
        lease = lease.replace(anchor, replacement)
    return lease


def _sources(rev: str | None) -> dict[str, str]:
    out = {}
    for name in ("lib", "commit", "lease"):
        if rev is None:
            out[name] = (ROOT / "crawler/frontier/lua" / f"{name}.lua").read_text()
        else:
            done = subprocess.run(
                ["git", "show", f"{rev}:crawler/frontier/lua/{name}.lua"],
                cwd=ROOT, capture_output=True, text=True, check=False,
            )
            if done.returncode:
                pytest.skip(f"git show {rev} failed: {done.stderr.strip()}")
            out[name] = done.stdout
    if rev is not None:
        out["lease"] = _live_holder_rule(out["lease"])
    return out


class _Script:
    def __init__(self, rds: redis.Redis, source: str) -> None:
        self.script = rds.register_script(_lua(source))

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        return self.script(keys=keys, args=args)


def _named(keys: list[Any], args: list[Any]) -> tuple[dict[str, str], dict[str, Any],
                                                       dict[str, list[Any]]]:
    """A call of the named protocol (:mod:`crawler.frontier.protocol`):
    its keys by name, its header's options, and its payload groups as
    lists of records."""
    names = [name for name, _ in protocol.SHARD_KEYS] + list(protocol.EXTRA_KEYS)
    by_name = dict(zip(names, keys, strict=False))
    header = json.loads(args[0])
    groups: dict[str, list[Any]] = {}
    i = 1
    for name, fields in protocol.PAYLOADS.items():
        n = header.get("ops", {}).get(name, 0)
        w = len(fields)
        groups[name] = [args[i + j * w : i + (j + 1) * w] for j in range(n)]
        i += n * w
    assert i == len(args)
    return by_name, header["o"], groups


def _flag(value: Any) -> str:
    return "1" if value else "0"


class _OldCommit(_Script):
    """commit.lua as it was, called in its positional layout: 24 KEYS (the
    Bloom bitmaps after them), 17 ARGVs, then the groups; its reply given
    by name, as commit.lua gives it now."""

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        k, o, g = _named(keys, args)
        fixed = len(protocol.SHARD_KEYS) + len(protocol.EXTRA_KEYS)
        old_keys = [k[n] for n in (
            "dupefilter", "wait", "active", "due", "conc", "count", "leases", "ldata",
            "wactive", "lslot", "robots", "retries", "dead", "marker", "revisits", "rdata",
            "revisit", "ready", "seq", "prio", "qm", "qc", "lv", "joined",
        )] + keys[fixed:]
        pushes = []
        for fp, dont, site, prio, data, spec in g["push"]:
            old_spec = spec
            if spec:  # (a bitmap's index in KEYS: 24 fixed keys before it, not `fixed`)
                index, offsets = spec.split(b" ", 1)
                old_spec = str(int(index) - fixed + 24).encode() + b" " + offsets
            pushes += [fp, dont, site, prio, data, old_spec]
        claim = g["claim"][0][0] if g["claim"] else b""
        old_args = [
            k["wait"][: -len("wait")], o["cap"], "set" if "bloom" not in o else "bloom",
            o.get("bloom", ""), _flag(o.get("gate")), o.get("seq", ""), o["marker_ms"], claim,
            *(len(g[n]) for n in ("push", "retry", "dead", "slot", "ack", "give")),
            o["revisit_ms"], len(g["revisit"]), _flag(o.get("join")), *pushes,
            *(v for n in ("retry", "dead", "slot", "ack", "give", "revisit")
              for record in g[n] for v in record),
        ]
        pushed, freed, ended, given, problems, claimed, joined = self.script(
            keys=old_keys, args=old_args)
        if not claimed:
            return [b"claimed", 0]
        return [b"pushed", pushed, b"freed", freed, b"acked", ended, b"given", given,
                b"problems", problems, b"claimed", claimed, b"joined", joined]


class _OldLease(_Script):
    """lease.lua as it was, called in its positional layout (25 KEYS, 15
    ARGVs, the lease ids), without the leases the worker holds on all
    shards (which the run leaves uncounted), the site it drained for, and
    the delay's jitter; its reply given by name, as lease.lua gives it now
    (without ``passed``: see :class:`_NewLease`)."""

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        k, o, g = _named(keys, args)
        assert o.get("held_all") is None and o.get("drained_for") is None
        assert o["jitter"] == 0.0 and "jitters" not in o
        old_keys = [k[n] for n in (
            "wait", "leases", "ldata", "active", "due", "retries", "delay", "conc", "count",
            "slow", "alive", "wactive", "rdelay", "lslot", "robots", "dead", "revisits",
            "rdata", "ready", "seq", "prio", "qm", "qc", "lv", "joined",
        )]
        old_args = [
            k["wait"][: -len("wait")], o["max_deliveries"], o["lease_ms"], o["delay_ms"],
            o["cap"], o["candidates"], o["housekeeping"], o["holder"], o["recheck_ms"],
            repr(float(o["margin"])), _flag(o.get("gate")), o["held"], o.get("least", ""),
            o.get("least_us", ""), _flag(o.get("join")), *(r[0] for r in g["ids"]),
        ]
        reply = self.script(keys=old_keys, args=old_args)
        n, wait, expired, retried, dead, problems = reply[:6]
        # (the reset of {s}:count the new script leaves to the repair)
        problems = [p for p in problems if not p.endswith(b"with every queue empty: reset to 0")]
        best, head = reply[6 + 3 * n :]
        out = [] if n else [b"wait", wait]
        return [*out, b"expired", expired, b"retried", retried, b"dead", dead,
                b"problems", problems, b"leases", reply[6 : 6 + 3 * n], b"best", best,
                b"head", head]


class _NewLease(_Script):
    """lease.lua as it is, its reply without ``passed`` (the site of a
    last chance put back: never, with held_all uncounted) and ``alone`` (a
    last chance leased alone: never, either)."""

    frontier: Frontier

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        reply = _repaired(self.frontier, self.script(keys=keys, args=args))
        if reply[-2:-1] == [b"alone"]:
            assert reply[-1] == 0, reply[-2:]
            reply = reply[:-2]
        assert reply[-2:] == [b"passed", b""], reply[-2:]
        return reply[:-2]


class _NewCommit(_Script):
    """commit.lua as it is, its reply without ``damaged`` (see _repaired)."""

    frontier: Frontier

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        return _repaired(self.frontier, self.script(keys=keys, args=args))


def _repaired(f: Frontier, reply: list[Any]) -> list[Any]:
    """``reply`` without its ``damaged``, after the worker's repair of each
    (``{s}:count`` only: the run edits no other value the scripts trust)."""
    if reply[-2:-1] != [b"damaged"]:
        return reply
    damaged = protocol.committed_of(reply[-2:]).damaged
    assert all(d.kind == "count" for d in damaged), damaged
    for damage in damaged:
        repair_damage(f, damage)
    return reply[:-2]


def _frontier(
    rds: redis.Redis, prefix: str, src: dict[str, str], *, old: bool, **kw: Any
) -> Frontier:
    bloom = kw.pop("bloom", False)
    settings: dict[str, Any] = {
        "default_concurrency": 2, "lease_timeout": 4.0, "max_deliveries": 3, "candidates": 8,
        "housekeeping": 20, "revisit_after": 3.0, **kw,
    }
    f = Frontier(
        rds, "t", prefix=prefix,
        bloom=BloomFilter.for_capacity(prefix + "bloom", 2000, 0.01) if bloom else None,
        **settings,
    )
    commit = _OldCommit if old else _NewCommit
    f._commit = commit(rds, src["lib"] + "\n" + src["commit"])  # type: ignore[assignment]
    lease = _OldLease if old else _NewLease
    f._lease = lease(rds, src["lib"] + "\n" + src["lease"])  # type: ignore[assignment]
    cast("Any", f._commit).frontier = cast("Any", f._lease).frontier = f
    return f


def _norm(value: Any, prefix: str) -> Any:
    if isinstance(value, bytes):
        return value.replace(prefix.encode(), b"{s}:")
    if isinstance(value, str):
        return value.replace(prefix, "{s}:")
    if isinstance(value, (list, tuple)):
        return [_norm(v, prefix) for v in value]
    return value


def _dead_letter(raw: bytes) -> bytes:
    """A dead letter in the one shape (:func:`upgrade`), without the
    worker the scripts name since."""
    record = upgrade(json.loads(raw))
    record.pop("worker")
    return json.dumps(record, sort_keys=True).encode()


def _dump(rds: redis.Redis, prefix: str) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for key in rds.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*"):
        if key.endswith((b":retryat", b":speaks")):
            # (written since: each site's last retry time, for housekeeping;
            # the protocol each live worker speaks, protocol.py)
            continue
        kind = rds.type(key)
        if kind == b"hash":
            value: Any = sorted(rds.hgetall(key).items())
        elif kind == b"zset":
            value = rds.zrange(key, 0, -1, withscores=True)
        elif kind == b"list":
            value = rds.lrange(key, 0, -1)
            if key.endswith(b":dead"):
                value = [_dead_letter(raw) for raw in value]
        elif kind == b"set":
            value = sorted(rds.smembers(key))
        else:
            value = rds.get(key)
        out[_norm(key, prefix)] = (kind, _norm(value, prefix))
    return out


def _call(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except redis_lib.ResponseError as e:
        # (the script's SHA and line differ between the two versions)
        return ("error", re.sub(r" script: \w+, on @user_script:\d+\.", "", str(e)))


class _Run:
    """One seeded run: the same steps on the old and the new frontier."""

    def __init__(self, rds: redis.Redis, seed: int, *, big: bool = False, **kw: Any) -> None:
        self.rds = rds
        self.big = big
        self.rng = random.Random(seed)
        self.new = _frontier(rds, "{n}:", _sources(None), old=False, **kw)
        self.old = _frontier(rds, "{o}:", _sources(BEFORE), old=True, **kw)
        self.now_ms = 1_700_000_000_000
        self.seq = {h: 0 for h in HOLDERS}
        self.held: dict[str, list[str]] = {h: [] for h in HOLDERS}
        self.n = 0
        self.log: list[str] = []
        self._tick(0)

    def _tick(self, ms: int) -> None:
        self.now_ms += ms
        s, m = divmod(self.now_ms, 1000)
        self.rds.hset(CLOCK, mapping={"s": s, "us": m * 1000 + self.rng.randint(0, 999)})

    def _data(self) -> bytes:
        self.n += 1
        size = self.rng.choice([0, 5, 40, 300, 700, 1500, 2100])
        return f"/{self.n}".encode() + b"x" * self.rng.randint(0, size)

    def _push(self) -> Push:
        site = self.rng.choice(SITES)
        fp = None if self.rng.random() < 0.1 else f"fp{self.rng.randint(0, 300)}".encode()
        return Push(self._data(), site, self.rng.choice(PRIOS), fp, self.rng.random() < 0.1)

    def _ids(self, k: int, forget: bool) -> list[str]:
        holder = self.rng.choice(HOLDERS)
        pool = self.held[holder]
        picked = self.rng.sample(pool, min(k, len(pool)))
        if forget:
            for x in picked:
                pool.remove(x)
        if picked and self.rng.random() < 0.3:
            picked.append(self.rng.choice(picked))
        if self.rng.random() < 0.1:
            picked.append(f"{holder}:999999")
        self.rng.shuffle(picked)
        return picked

    def commit(self) -> Commit:
        r = self.rng
        n_push = r.choice([0, 0, 1, 3, 10, 40, 200, *([1500] if self.big else [])])
        batch = Commit(
            pushes=[self._push() for _ in range(n_push)],
            retries=[Retry(self._data(), r.choice(SITES), r.choice(PRIOS), r.choice([0, 1, 3]))
                     for _ in range(r.choice([0, 0, 0, 1, 2]))],
            dead=[b'{"x": 1}'] if r.random() < 0.05 else [],
            slots=self._ids(r.choice([0, 0, 1, 4, 20, *([1500] if self.big else [])]),
                            forget=False),
            acks=self._ids(r.choice([0, 1, 4, 20, 100, *([1500] if self.big else [])]),
                           forget=True),
            givebacks=self._ids(r.choice([0, 0, 0, 1, 3]), forget=True),
            revisits=[Revisit(self._data(), r.choice(SITES), r.choice(PRIOS),
                              f"fp{r.randint(0, 300)}".encode())
                      for _ in range(r.choice([0, 0, 0, 1]))],
        )
        return batch

    def lease(self) -> tuple[str, list[str], int, int | None, int | None]:
        r = self.rng
        holder = r.choice(HOLDERS)
        k = r.choice([1, 1, 2, 5, 16, 64, 300, *([1200] if self.big else [])])
        ids = [f"{holder}:{self.seq[holder] + i}" for i in range(k)]
        self.seq[holder] += k
        if k > 1 and r.random() < 0.05:
            ids[-1] = ids[0]  # one id twice
        least = r.choice([None, None, None, 0, 1, 3])
        joined = None if least is None or r.random() < 0.5 else r.randint(0, 2 ** 40)
        return holder, ids, r.choice([0, 0, 2, 10]), least, joined

    def corrupt(self) -> list[tuple[str, str, str, str]]:
        r = self.rng
        site = r.choice(SITES)
        prio = str(r.choice(PRIOS))
        holder = r.choice(HOLDERS)
        ids = self.held[holder]
        choices: list[tuple[str, str, str]] = [
            ("active", site, r.choice(ODD)),
            ("wactive", f"{holder}\t{site}", r.choice(ODD)),
            ("prio", prio, r.choice([*ODD, "many"])),
            # (values the scripts trust: drawn, never written; see the docstring)
            ("lv", site, r.choice(["x", "0 x", "", "3 1 0", "7"])),
            ("qm", f"{site}\t{prio}", r.choice(["bad", "3 1", "0 0", "0 5"])),
            ("conc", site, r.choice(["1", "2", "0", "abc", "5", "1000"])),
            ("delay", site, r.choice(["0", "0", "300", "abc"])),
            ("due", site, r.choice([str(self.now_ms + 1000), "abc", "0"])),
            ("robots", site, "x"),
            ("joined", site, r.choice(["abc", "5"])),
            ("qc", f"{site}\t{prio}\t0", r.choice(["zz", "3:abc"])),
        ]
        if ids:
            choices.append(("lslot", r.choice(ids), "1"))
            choices.append(("ldata", r.choice(ids), r.choice(["garbage", "x\ty\tz"])))
        name, field, value = r.choice(choices)
        if name in ("lv", "qm", "joined"):
            return []
        return [("hset", name, field, value)]

    def step(self, i: int) -> None:
        r = self.rng
        self._tick(r.choice([0, 0, 1, 50, 400, 1500, 3000]))
        what = r.random()
        if what < 0.12:
            edits = self.corrupt()
            for _, name, field, value in edits:
                for f in (self.old, self.new):
                    self.rds.hset(f.key(name), field, value)
            self.log.append(f"{i} edit {edits}")
            return
        if what < 0.14:
            # a key of the wrong type for one call, then back as it was
            name = r.choice(["prio", "active", "lslot", "qm", "ready", "wactive", "count",
                             "ldata", "leases", "lv", "due", "conc", "joined", "robots",
                             "dupefilter", "retries", "dead", "qc", "wait"])
            saved = {f: self.rds.dump(f.key(name)) for f in (self.old, self.new)}
            for f in (self.old, self.new):
                self.rds.delete(f.key(name))
                self.rds.sadd(f.key(name), "x")
            self.log.append(f"{i} wrong type {name}")
            self._op(i, lease=name == "retries")
            for f in (self.old, self.new):
                self.rds.delete(f.key(name))
                if saved[f] is not None:
                    self.rds.restore(f.key(name), 0, saved[f])
            return
        self._op(i)

    def _op(self, i: int, *, lease: bool = False) -> None:
        if self.rng.random() < 0.5 and not lease:
            batch = self.commit()
            self.log.append(f"{i} commit {batch!r:.300}")
            got = [_call(lambda f=f: f.commit(batch)) for f in (self.old, self.new)]
            old, new = (_norm(g[1] if g[0] == "error" else list(g[1]), p)
                        for g, p in zip(got, ("{o}:", "{n}:"), strict=True))
            self._same(i, got, old, new)
        else:
            holder, ids, held, least, joined = self.lease()
            self.log.append(f"{i} lease {holder} {len(ids)} held={held} least={least} {joined}")
            got = [_call(lambda f=f: f._lease_call(holder, ids, held, None, least=least,
                                                  least_joined=joined))
                   for f in (self.old, self.new)]
            old, new = (_norm(g[1], p) for g, p in zip(got, ("{o}:", "{n}:"), strict=True))
            self._same(i, got, old, new)
            if got[0][0] == "ok":
                self.held[holder] += ids[: len(protocol.fields(got[0][1])["leases"]) // 3]

    def _same(self, i: int, got: list[Any], old: Any, new: Any) -> None:
        if (got[0][0], old) != (got[1][0], new):
            if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
                old, new = zip(*[(a, b) for a, b in zip(old, new, strict=True) if a != b],
                               strict=True)
            pytest.fail(f"{self._where(i)}\nreplies differ:\nold {_short(old)}\nnew {_short(new)}")

    def _where(self, i: int) -> str:
        return f"step {i}:\n" + "\n".join(self.log[-6:])

    def check(self, i: int) -> None:
        old, new = _dump(self.rds, "{o}:"), _dump(self.rds, "{n}:")
        if old != new:
            diff = {k: (old.get(k), new.get(k)) for k in set(old) | set(new)
                    if old.get(k) != new.get(k)}
            pytest.fail(f"{self._where(i)}\nkeys differ (old, new): {str(diff)[:3000]}")


def _short(value: Any) -> str:
    """A reply with long requests cut short."""
    if isinstance(value, bytes) and len(value) > 24:
        return repr(value[:20] + b"...")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return repr(value)


def _run(rds: redis.Redis, seed: int, steps: int, **kw: Any) -> None:
    run = _Run(rds, seed, **kw)
    for i in range(steps):
        run.step(i)
        run.check(i)


@pytest.mark.parametrize(("seed", "kw"), [
    (1, {}),
    (2, {"bloom": True}),
    (3, {"join_times": True, "default_concurrency": 40}),
    (4, {"robots_gate": True}),
    (5, {"default_delay": 0.2, "default_concurrency": 1000}),
    (6, {"default_concurrency": 1000, "big": True}),
])
def test_the_batched_scripts_match_the_one_by_one_writes(
    rds: redis.Redis, seed: int, kw: dict[str, Any]
) -> None:
    _run(rds, seed, 150 if kw.get("big") else 200, **kw)
