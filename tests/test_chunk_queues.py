"""The queues in fixed keys of ``lib.lua`` (``q_push``/``q_pop``), driven
directly on a real redis-server: order, chunking, bad values."""

from __future__ import annotations

import random
from importlib import resources
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import redis

_DRIVER = """
K.qm, K.qc, K.lv, K.dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local out = {}
local i = 1
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'push' or op == 'front' then
    local why = q_push(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], op == 'front')
    out[#out + 1] = why or 'ok'
    i = i + 4
  elseif op == 'pop' then
    local data, empty = q_pop(ARGV[i + 1], ARGV[i + 2], function(chunk, why)
      redis.call('RPUSH', K.dead, why)
    end)
    out[#out + 1] = data or '<nil>'
    out[#out + 1] = empty and 'empty' or 'more'
    i = i + 3
  elseif op == 'best' then
    out[#out + 1] = q_best(ARGV[i + 1]) or '<nil>'
    i = i + 2
  end
end
out[#out + 1] = problems
return out
"""


@pytest.fixture
def run(rds: redis.Redis) -> Any:
    lib = resources.files("crawler.frontier").joinpath("lua/lib.lua").read_text()
    script = rds.register_script(lib + "\n" + _DRIVER)
    keys = ["{t}:qm", "{t}:qc", "{t}:lv", "{t}:deadq"]

    def call(*args: Any) -> list[Any]:
        reply = script(keys=keys, args=list(args))
        return [x.decode() if isinstance(x, bytes) else x for x in reply]

    yield call
    rds.delete(*keys)


def _pops(run: Any, site: str, prio: str, n: int) -> list[str]:
    out = run(*[a for _ in range(n) for a in ("pop", site, prio)])[:-1]
    return out[0::2]


def test_first_in_first_out_across_chunks(run: Any, rds: redis.Redis) -> None:
    entries = [f"entry-{i:05d}-" + "x" * random.Random(i).randint(0, 300) for i in range(400)]
    for e in entries:
        assert run("push", "a.example", "0", e)[0] == "ok"
    assert rds.hlen("{t}:qc") > 10  # chunked
    assert _pops(run, "a.example", "0", 400) == entries
    assert run("pop", "a.example", "0")[:2] == ["<nil>", "empty"]
    assert rds.exists("{t}:qm", "{t}:qc", "{t}:lv") == 0


def test_front_pushes_come_out_first_in_their_order(run: Any) -> None:
    for i in range(100):
        run("push", "a", "0", f"back{i}" + "y" * 100)
    for i in reversed(range(60)):
        run("front", "a", "0", f"front{i}" + "z" * 100)
    got = _pops(run, "a", "0", 160)
    assert got[:60] == [f"front{i}" + "z" * 100 for i in range(60)]
    assert got[60:] == [f"back{i}" + "y" * 100 for i in range(100)]


def test_levels_highest_first(run: Any, rds: redis.Redis) -> None:
    for p in ("0", "9", "-3", "5", "9"):
        run("push", "a", p, "r" + p)
    assert rds.hget("{t}:lv", "a") == b"9 5 0 -3"
    assert run("best", "a")[0] == "9"
    assert run("pop", "a", "9")[:2] == ["r9", "more"]
    assert run("pop", "a", "9")[:2] == ["r9", "empty"]
    assert rds.hget("{t}:lv", "a") == b"5 0 -3"


def test_entries_with_any_bytes(run: Any) -> None:
    data = ["a:b", "12:34", "\n\t\x00", ":", "9999999999:x"]
    for d in data:
        run("push", "a", "1", d)
    assert _pops(run, "a", "1", len(data)) == data


def test_a_malformed_levels_value_is_rebuilt(run: Any, rds: redis.Redis) -> None:
    run("push", "a", "1", "one")
    run("push", "a", "7", "seven")
    rds.hset("{t}:lv", "a", "garbage")
    out = run("best", "a")
    assert out[0] == "7"
    assert "is malformed: rebuilt" in out[-1][0].decode()
    assert rds.hget("{t}:lv", "a") == b"7 1"


def test_an_unreadable_chunk_is_dead_lettered_and_the_queue_goes_on(
    run: Any, rds: redis.Redis
) -> None:
    for i in range(40):
        run("push", "a", "0", f"{i:03d}" + "q" * 100)
    rds.hset("{t}:qc", "a\t0\t0", "not a netstring")
    out = _pops(run, "a", "0", 40)
    assert out[0] == "<nil>" or out[0].startswith("0")
    assert rds.llen("{t}:deadq") == 1
    rest = [x for x in out if x != "<nil>"]
    assert rest and rest[-1].startswith("039")


@pytest.mark.parametrize("bad", ["x y", "5 2", "", "1e400 2", "-1 9999999999999999"])
def test_a_malformed_bounds_value_is_rebuilt_from_the_chunks_and_nothing_is_stranded(
    run: Any, rds: redis.Redis, bad: str
) -> None:
    data = [f"{i:03d}" + "q" * 300 for i in range(20)]  # several chunks
    for entry in data:
        run("push", "a", "0", entry)
    rds.hset("{t}:qm", "a\t0", bad)
    out = run("pop", "a", "0")
    assert out[:2] == [data[0], "more"]
    assert "is malformed: rebuilt from its chunks" in out[-1][0].decode()
    assert run("push", "a", "0", "new")[0] == "ok"  # a push repairs it as well
    assert _pops(run, "a", "0", 20) == [*data[1:], "new"]
    assert rds.hlen("{t}:qc") == 0 and not rds.hexists("{t}:qm", "a\t0")


def test_a_malformed_bounds_value_without_chunks_is_dropped(run: Any, rds: redis.Redis) -> None:
    run("push", "a[1]*", "0", "x")  # (glob characters in the site's name)
    run("pop", "a[1]*", "0")
    rds.hset("{t}:qm", "a[1]*\t0", "garbage")
    rds.hset("{t}:qc", "a[1]*x\t0\t0", "1:y")  # another queue's chunk: not matched
    out = run("pop", "a[1]*", "0")
    assert out[:2] == ["<nil>", "empty"]
    assert "no chunk of the queue left" in out[-1][0].decode()
    assert not rds.hexists("{t}:qm", "a[1]*\t0")
    assert run("push", "a[1]*", "0", "new")[0] == "ok"
    assert _pops(run, "a[1]*", "0", 1) == ["new"]


def test_a_rebuilt_queue_is_renumbered_so_no_pop_walks_a_gap(run: Any, rds: redis.Redis) -> None:
    # Chunk numbers far apart (keys edited by hand): the rebuilt queue is
    # one chunk after another, so a pop does not loop over 10^13 missing
    # chunks; numbers the scripts never write ("007", 15 digits) are left
    # alone and counted.
    rds.hset("{t}:qc", mapping={
        "a\t0\t-5": "5:first", "a\t0\t99999999999999": "4:last", "a\t0\t3": "6:middle",
        "a\t0\t007": "3:odd", "a\t0\t123456789012345": "3:big",
    })
    rds.hset("{t}:qm", "a\t0", "garbage")
    out = run("pop", "a", "0", "pop", "a", "0", "pop", "a", "0", "pop", "a", "0")
    assert out[:-1] == ["first", "more", "middle", "more", "last", "empty", "<nil>", "empty"]
    problem = out[-1][0].decode()
    assert "2 chunks with numbers the frontier never writes" in problem
    assert "rebuilt from its chunks in {t}:qc (3 found)" in problem
    assert set(rds.hkeys("{t}:qc")) == {b"a\t0\t007", b"a\t0\t123456789012345"}


@pytest.mark.parametrize("bad", ["0 123456789012345", "007 9", "1e3 1e4"])
def test_bounds_the_scripts_never_write_are_malformed(
    run: Any, rds: redis.Redis, bad: str
) -> None:
    run("push", "a", "0", "kept")
    rds.hset("{t}:qm", "a\t0", bad)
    out = run("pop", "a", "0")
    assert out[:2] == ["kept", "empty"]
    assert "is malformed: rebuilt" in out[-1][0].decode()
