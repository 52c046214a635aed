"""The queues in fixed keys of ``lib.lua`` (``q_push``/``q_pop``), driven
directly on a real redis-server (the ``queue_lib`` fixture of conftest.py):
order, chunking, bad values."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import redis


def _pops(queue_lib: Any, site: str, prio: str, n: int) -> list[str]:
    out = queue_lib(*[a for _ in range(n) for a in ("pop", site, prio)])[:-1]
    return out[0::2]


def test_first_in_first_out_across_chunks(queue_lib: Any, rds: redis.Redis) -> None:
    entries = [f"entry-{i:05d}-" + "x" * random.Random(i).randint(0, 300) for i in range(400)]
    for e in entries:
        assert queue_lib("push", "a.example", "0", e)[0] == "ok"
    assert rds.hlen("{t}:qc") > 10  # chunked
    assert _pops(queue_lib, "a.example", "0", 400) == entries
    assert queue_lib("pop", "a.example", "0")[:2] == ["<nil>", "empty"]
    assert rds.exists("{t}:qm", "{t}:qc", "{t}:lv") == 0


def test_front_pushes_come_out_first_in_their_order(queue_lib: Any) -> None:
    for i in range(100):
        queue_lib("push", "a", "0", f"back{i}" + "y" * 100)
    for i in reversed(range(60)):
        queue_lib("front", "a", "0", f"front{i}" + "z" * 100)
    got = _pops(queue_lib, "a", "0", 160)
    assert got[:60] == [f"front{i}" + "z" * 100 for i in range(60)]
    assert got[60:] == [f"back{i}" + "y" * 100 for i in range(100)]


def test_levels_highest_first(queue_lib: Any, rds: redis.Redis) -> None:
    for p in ("0", "9", "-3", "5", "9"):
        queue_lib("push", "a", p, "r" + p)
    assert rds.hget("{t}:lv", "a") == b"9 5 0 -3"
    assert queue_lib("best", "a")[0] == "9"
    assert queue_lib("pop", "a", "9")[:2] == ["r9", "more"]
    assert queue_lib("pop", "a", "9")[:2] == ["r9", "empty"]
    assert rds.hget("{t}:lv", "a") == b"5 0 -3"


def test_entries_with_any_bytes(queue_lib: Any) -> None:
    data = ["a:b", "12:34", "\n\t\x00", ":", "9999999999:x"]
    for d in data:
        queue_lib("push", "a", "1", d)
    assert _pops(queue_lib, "a", "1", len(data)) == data


def test_a_malformed_levels_value_is_left_reported_and_rebuilt_by_the_repair(
    queue_lib: Any, queue_repair: Any, rds: redis.Redis
) -> None:
    # The scripts trust {s}:lv as they wrote it: a word that is no priority
    # makes the site have no level for them (nothing leased), the value is
    # left as it is and reported as damaged; the repair (repair.lua, what
    # the worker and `scrapy frontier audit --repair` run) rebuilds it from
    # {s}:qm, and no queued request was lost.
    queue_lib("push", "a", "1", "one")
    queue_lib("push", "a", "7", "seven")
    rds.hset("{t}:lv", "a", "garbage 1")
    out = queue_lib("best", "a", "push", "a", "3", "three")
    assert out == ["<nil>", "ok", ["damaged lv a"]]
    assert rds.hget("{t}:lv", "a") == b"garbage 1"
    lines = queue_repair("lv", "a")
    assert len(lines) == 1 and "set to \"7 3 1\"" in lines[0], lines
    assert rds.hget("{t}:lv", "a") == b"7 3 1"
    assert rds.zscore("{t}:wait", "a") == 0  # (passed over: back in the wait index)
    assert queue_repair("lv", "a") == []  # run twice: nothing more to do
    assert _pops(queue_lib, "a", "7", 1) == ["seven"]
    assert _pops(queue_lib, "a", "3", 1) == ["three"]
    assert _pops(queue_lib, "a", "1", 1) == ["one"]
    assert rds.exists("{t}:lv") == 0


def test_an_unreadable_chunk_is_dead_lettered_and_the_queue_goes_on(
    queue_lib: Any, rds: redis.Redis
) -> None:
    for i in range(40):
        queue_lib("push", "a", "0", f"{i:03d}" + "q" * 100)
    rds.hset("{t}:qc", "a\t0\t0", "not a netstring")
    out = _pops(queue_lib, "a", "0", 40)
    assert out[0] == "<nil>" or out[0].startswith("0")
    assert rds.llen("{t}:deadq") == 1
    rest = [x for x in out if x != "<nil>"]
    assert rest and rest[-1].startswith("039")


@pytest.mark.parametrize("bad", ["x y", "5 2", "", "1e400 2", "-1 9999999999999999"])
def test_a_malformed_bounds_value_is_left_reported_and_rebuilt_from_the_chunks_by_the_repair(
    queue_lib: Any, queue_repair: Any, rds: redis.Redis, bad: str
) -> None:
    data = [f"{i:03d}" + "q" * 300 for i in range(20)]  # several chunks
    for entry in data:
        queue_lib("push", "a", "0", entry)
    chunks = rds.hgetall("{t}:qc")
    rds.hset("{t}:qm", "a\t0", bad)
    out = queue_lib("pop", "a", "0", "push", "a", "0", "new")
    # (nothing taken, nothing written to the queue: the push is parked in
    # the retry set, which the next lease call queues again)
    assert out == ["<nil>", "damaged", "parked", ["damaged qm a\t0"]]
    assert rds.hgetall("{t}:qc") == chunks and rds.hget("{t}:qm", "a\t0") == bad.encode()
    assert rds.zrange("{t}:retries", 0, -1) == [b"0\ta\tnew"]
    lines = queue_repair("qm", "a\t0")
    assert len(lines) == 1 and "rebuilt from its chunks" in lines[0], lines
    assert queue_repair("qm", "a\t0") == []  # run twice: nothing more to do
    assert queue_lib("push", "a", "0", "new")[0] == "ok"
    assert _pops(queue_lib, "a", "0", 21) == [*data, "new"]
    assert rds.hlen("{t}:qc") == 0 and not rds.hexists("{t}:qm", "a\t0")


def test_a_malformed_bounds_value_without_chunks_is_dropped_by_the_repair(
    queue_lib: Any, queue_repair: Any, rds: redis.Redis
) -> None:
    queue_lib("push", "a[1]*", "0", "x")  # (glob characters in the site's name)
    queue_lib("pop", "a[1]*", "0")
    rds.hset("{t}:qm", "a[1]*\t0", "garbage")
    rds.hset("{t}:qc", "a[1]*x\t0\t0", "1:y")  # another queue's chunk: not matched
    out = queue_lib("pop", "a[1]*", "0")
    assert out[:2] == ["<nil>", "damaged"]
    lines = queue_repair("qm", "a[1]*\t0")
    assert "no chunk of the queue left" in lines[0], lines
    assert not rds.hexists("{t}:qm", "a[1]*\t0")
    assert queue_lib("push", "a[1]*", "0", "new")[0] == "ok"
    assert _pops(queue_lib, "a[1]*", "0", 1) == ["new"]


def test_a_rebuilt_queue_is_renumbered_so_no_pop_walks_a_gap(
    queue_lib: Any, queue_repair: Any, rds: redis.Redis
) -> None:
    # Chunk numbers far apart (keys edited by hand): the rebuilt queue is
    # one chunk after another, so a pop does not loop over 10^13 missing
    # chunks; numbers the scripts never write ("007", 15 digits) are left
    # alone and counted.
    rds.hset("{t}:qc", mapping={
        "a\t0\t-5": "5:first", "a\t0\t99999999999999": "4:last", "a\t0\t3": "6:middle",
        "a\t0\t007": "3:odd", "a\t0\t123456789012345": "3:big",
    })
    rds.hset("{t}:qm", "a\t0", "garbage")
    assert queue_lib("pop", "a", "0")[:2] == ["<nil>", "damaged"]
    problem = queue_repair("qm", "a\t0")[0]
    assert "2 chunks with numbers the frontier never writes" in problem
    assert "rebuilt from its chunks in {t}:qc (3 found)" in problem
    out = queue_lib("pop", "a", "0", "pop", "a", "0", "pop", "a", "0", "pop", "a", "0")
    assert out[:-1] == ["first", "more", "middle", "more", "last", "empty", "<nil>", "empty"]
    assert set(rds.hkeys("{t}:qc")) == {b"a\t0\t007", b"a\t0\t123456789012345"}


@pytest.mark.parametrize("bad", ["0 123456789012345", "007 9", "1e3 1e4"])
def test_bounds_the_scripts_never_write_are_malformed(
    queue_lib: Any, queue_repair: Any, rds: redis.Redis, bad: str
) -> None:
    queue_lib("push", "a", "0", "kept")
    rds.hset("{t}:qm", "a\t0", bad)
    assert queue_lib("pop", "a", "0") == ["<nil>", "damaged", ["damaged qm a\t0"]]
    assert "rebuilt from its chunks" in queue_repair("qm", "a\t0")[0]
    assert queue_lib("pop", "a", "0")[:2] == ["kept", "empty"]
