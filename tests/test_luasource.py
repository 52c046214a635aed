"""The text a shard script is loaded as (:mod:`crawler.frontier.luasource`):
only the helpers of ``lib.lua`` it uses, and its keys bound by number."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from crawler.frontier import protocol
from crawler.frontier.luasource import code_names, shard_source, statements
from crawler.frontier.store import Frontier, _Lua

if TYPE_CHECKING:
    import redis

LUA = Path(protocol.__file__).parent / "lua"
LIB = (LUA / "lib.lua").read_text()
#: Every script loaded with lib.lua (the shard scripts and the housekeeping's).
LIB_SCRIPTS = sorted({*protocol.SHARD_SCRIPTS, "repair.lua", "trim_dead.lua", "forget_sites.lua"})


def _declared(source: str) -> set[str]:
    return {name for _, names in statements(source) for name in names}


def test_names_in_comments_and_strings_are_not_code() -> None:
    code = (
        "local a = b -- c d\n"
        "--[[ e\nf ]] local g = 'h' .. \"i\\\"j\" .. [[k\nl]] .. m.n\n"
        "--[==[ o ]==] p(q)"
    )
    assert code_names(code) == {"local", "a", "b", "g", "m", "n", "p", "q"}


def test_lib_reads_as_its_top_level_statements_with_the_names_they_declare() -> None:
    parts = statements(LIB)
    assert "".join(text for text, _ in parts) == LIB
    declared = [names for _, names in parts]
    assert frozenset({"open_call"}) in declared
    assert frozenset({"problems", "reported"}) in declared
    # K.P = ... declares nothing: it is kept whatever the script
    assert any(text.lstrip().startswith("K.P =") or "\nK.P =" in text
               for text, names in parts if not names)


@pytest.mark.parametrize("script", LIB_SCRIPTS)
def test_every_helper_a_loaded_script_names_is_in_it(script: str) -> None:
    source = shard_source(LIB, (LUA / script).read_text(), protocol.key_numbers())
    from_lib = _declared(LIB)
    kept = _declared(source)
    missing = (code_names(source) & from_lib) - kept
    assert not missing, f"{script} names {sorted(missing)} but they were left out"


def test_a_small_script_leaves_out_the_helpers_it_does_not_use() -> None:
    source = shard_source(LIB, (LUA / "extend.lua").read_text(), protocol.key_numbers())
    assert "local function open_call(" in source
    assert "local function q_push(" not in source and "local function bury(" not in source
    assert len(source) < len(LIB) / 4


@pytest.mark.parametrize("script", LIB_SCRIPTS)
def test_a_loaded_script_names_its_keys_by_number(script: str) -> None:
    keys = protocol.key_numbers()
    source = shard_source(LIB, (LUA / script).read_text(), keys)
    assert "local K = {}" in source
    code = "\n".join(line.split("--", 1)[0] for line in source.splitlines())
    assert not set(re.findall(r"\bK\.(\w+)", code)) & set(keys)
    for n in re.findall(r"KEYS\[(\d+)\]", code):
        assert 1 <= int(n) <= len(keys)


def test_a_key_is_bound_to_its_place_in_the_call() -> None:
    keys = protocol.key_numbers()
    source = shard_source(LIB, "return {K.ready, K.marker, K.P}", keys)
    assert source.endswith(f"return {{KEYS[{keys['ready']}], KEYS[{keys['marker']}], K.P}}")
    assert protocol.shard_keys("{c}:", "w#1")[keys["ready"] - 1] == "{c}:ready"


def test_a_lib_without_its_binding_table_is_refused() -> None:
    with pytest.raises(ValueError, match="binding table"):
        shard_source("local x = 1\n", "return x", protocol.key_numbers())


@pytest.mark.parametrize("script", LIB_SCRIPTS)
def test_each_loaded_script_compiles_on_redis(rds: redis.Redis, script: str) -> None:
    lua = _Lua(rds, script, lib=True)
    assert rds.script_load(lua.source) == lua.sha


def test_a_frontier_works_through_the_loaded_scripts(rds: redis.Redis) -> None:
    frontier = Frontier(rds, "luasource", default_delay=0)
    frontier.push(b"r1", site="a.example", priority=0, fingerprint=b"f1", dont_filter=False)
    leases = frontier.lease_many(["w#1:1"])
    assert not isinstance(leases, protocol.NotDue)
    assert [lease.data for lease in leases] == [b"r1"]
