"""The named protocol between the frontier and its shard scripts
(:mod:`crawler.frontier.protocol`): one key table bound by name in every
script, a versioned header that a script of another version refuses, and
replies read by name. Real Redis throughout."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.exceptions import ResponseError
from scrapy import Request

import tests.scheduler_harness as harness
from crawler.config import config_error_of
from crawler.frontier import protocol
from crawler.frontier.connection import config_error
from crawler.frontier.spider import FrontierSpider
from crawler.frontier.store import Commit, Frontier, Push, _Lua

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")

LUA = Path(protocol.__file__).parent / "lua"
#: The shard scripts: lib.lua prepended, called with protocol.shard_keys.
SHARD_SCRIPTS = protocol.SHARD_SCRIPTS
#: What a script stores in K besides keys (lib.lua's list).
K_SETTINGS = {"P", "cap", "gate", "join", "now"}


class _Spider(FrontierSpider):
    name = "protocol_test"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None


def test_lib_binds_the_python_key_table_by_name_in_its_order() -> None:
    lib = (LUA / "lib.lua").read_text()
    assert protocol.lua_binding_in(lib) == protocol.lua_binding()
    binding = protocol.lua_binding()
    for i, (name, _) in enumerate(protocol.SHARD_KEYS, 1):
        assert f"  {name} = KEYS[{i}],\n" in binding


@pytest.mark.parametrize("script", SHARD_SCRIPTS)
def test_every_shard_script_uses_keys_and_options_by_name_only(script: str) -> None:
    source = (LUA / script).read_text()
    code = "\n".join(line.split("--", 1)[0] for line in source.splitlines())
    assert not re.search(r"KEYS\[\d", code), "a key by number"
    assert not re.search(r"ARGV\[\d", code), "an argument by number"
    assert "open_call(" in code  # the header is checked first
    names = {name for name, _ in protocol.SHARD_KEYS} | set(protocol.EXTRA_KEYS)
    used = set(re.findall(r"\bK\.(\w+)", code)) - K_SETTINGS
    assert used <= names, used - names


def test_lib_uses_no_key_by_number_outside_the_binding() -> None:
    lib = (LUA / "lib.lua").read_text()
    binding = protocol.lua_binding_in(lib)
    assert binding is not None
    code = "\n".join(line.split("--", 1)[0] for line in lib.replace(binding, "").splitlines())
    assert not re.search(r"KEYS\[\d", code)


def test_every_key_of_a_call_shares_the_shards_hash_tag() -> None:
    keys = protocol.shard_keys("{crawl:3}:", "worker#1")
    assert len(keys) == len(protocol.SHARD_KEYS) + len(protocol.EXTRA_KEYS)
    assert all(key.startswith("{crawl:3}:") for key in keys)
    assert keys[len(protocol.SHARD_KEYS)] == "{crawl:3}:sent:worker#1"


def _frontier(rds: redis.Redis) -> Frontier:
    return Frontier(rds, "proto", default_delay=0)


def _call(frontier: Frontier, script: str, header: str) -> Any:
    lua = _Lua(frontier.redis, script, lib=True)
    return lua(keys=protocol.shard_keys(frontier.prefix), args=[header])


@pytest.mark.parametrize("script", SHARD_SCRIPTS)
def test_a_script_refuses_a_protocol_version_it_does_not_know_naming_it(
    rds: redis.Redis, script: str
) -> None:
    frontier = _frontier(rds)
    frontier.push(b"r", site="a.example", priority=0, fingerprint=b"f", dont_filter=False)
    before = {key: rds.dump(key) for key in rds.keys("*")}
    op = script.removesuffix(".lua")
    header = json.dumps({"v": protocol.VERSION + 1, "op": op, "o": {"holder": "w#1"}})
    with pytest.raises(ResponseError) as refused:
        _call(frontier, script, header)
    assert str(refused.value) == (
        f"frontier protocol {protocol.VERSION + 1} not understood by this script "
        f"(speaks {protocol.VERSION})"
    )
    assert {key: rds.dump(key) for key in rds.keys("*")} == before  # nothing written
    message = config_error(refused.value)
    assert message is not None and "\n" not in message
    assert f"speak protocol {protocol.VERSION}" in message
    assert f"sent {protocol.VERSION + 1}" in message


@pytest.mark.parametrize("header", ["", "not json", "[1, 2]", '{"op": "lease"}'])
def test_a_call_without_a_header_is_refused_as_another_protocol(
    rds: redis.Redis, header: str
) -> None:
    with pytest.raises(ResponseError, match="frontier protocol unknown not understood") as e:
        _call(_frontier(rds), "lease.lua", header)
    assert config_error(e.value) is not None


def test_a_header_sent_to_another_script_or_with_other_counts_is_refused(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    lease = json.dumps({"v": protocol.VERSION, "op": "lease", "o": {}})
    with pytest.raises(ResponseError, match="frontier call lease sent to the commit script"):
        _call(frontier, "commit.lua", lease)
    counted = json.dumps({"v": protocol.VERSION, "op": "extend", "o": {"lease_ms": 1},
                          "ops": {"ids": 2}})
    with pytest.raises(ResponseError, match="carries 1 payload values, its header counts 2"):
        frontier._extend(keys=frontier._keys, args=[counted, "w#1:1"])
    assert rds.dbsize() == 0


def test_replies_are_read_by_name(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    done = frontier.commit(Commit(
        pushes=[Push(b"a", "a.example", 3, b"fa", False), Push(b"a", "a.example", 3, b"fa", False)],
        marker=("w#1", 7),
    ))
    assert done is not None
    assert done.pushed == [True, False] and done.claimed and done.problems == []
    assert rds.get(frontier.marker_key("w#1")) == b"7"
    leases = frontier.lease_many(["w#1:1", "w#1:2"])
    assert isinstance(leases, list) and len(leases) == 1
    assert (leases[0].data, leases[0].site, leases[0].lease_id, leases[0].deliveries) == (
        b"a", "a.example", "w#1:1", 1)
    assert leases[0].best is None and leases[0].last_passed is None
    not_due = frontier.lease_many(["w#1:3"])
    assert isinstance(not_due, protocol.NotDue) and not_due.wait is None
    assert frontier.set_delay("a.example", 500) == (False, 550)  # 500 ms, 10 % margin
    assert frontier.extend(["w#1:404"]) == 0  # (an id never leased is not revived)
    assert rds.zscore(frontier.key("leases"), "w#1:1") is not None


def _evalsha_calls(rds: redis.Redis) -> int:
    stats = rds.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_a_worker_of_another_protocol_stops_with_one_configuration_error(
    redis_url: str, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose calls carry another version (workers of two versions
    on one crawl) stops at its first call with one line naming both
    versions, and sends no more calls: it does not retry, no outage."""
    monkeypatch.setattr(protocol, "VERSION", protocol.VERSION + 1)
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider)
    scheduler.enqueue_request(Request("https://a.example/"))
    assert scheduler.next_request() is None
    message = config_error_of(crawler)
    assert message is not None and "\n" not in message
    assert f"speak protocol {protocol.VERSION - 1}, this worker sent {protocol.VERSION}" in message
    before = _evalsha_calls(rds)
    assert scheduler.next_request() is None
    assert _evalsha_calls(rds) == before
    assert crawler.stats.get_value("frontier/redis/outages") is None


def _alive_key(scheduler: Any) -> str:
    return str(scheduler.queue.shards[0].key("alive"))


def test_a_worker_refuses_to_open_beside_a_live_worker_of_an_older_version(
    redis_url: str, rds: redis.Redis
) -> None:
    """A worker of a version before the named protocol counts itself live
    (``{s}:alive``) and records no protocol: a new worker opening on that
    crawl stops at open with one line naming that worker, and writes no
    liveness of its own (a rolling upgrade never mixes entry formats)."""
    first, _ = harness.open_scheduler(redis_url, _Spider)
    alive = _alive_key(first)
    now_ms = int(rds.time()[0]) * 1000
    rds.zadd(alive, {"old-worker": now_ms})  # (what an older worker's lease call writes)
    second, crawler = harness.open_scheduler(redis_url, _Spider)
    message = config_error_of(crawler)
    assert message is not None and "\n" not in message
    assert "worker old-worker" in message and "speaks an older protocol" in message
    assert "scrapy frontier stop" in message
    assert rds.zscore(alive, second.holder) is None


def test_a_worker_opens_beside_live_workers_of_its_own_protocol_and_after_a_stopped_one(
    redis_url: str, rds: redis.Redis
) -> None:
    """Workers of one version open side by side; an older worker that left
    (its liveness removed at close) or went silent past a lease's length no
    longer stops a new one, and its record is dropped."""
    first, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_LEASE_TIMEOUT=5)
    alive = _alive_key(first)
    speaks = alive.removesuffix("alive") + "speaks"
    now_ms = int(rds.time()[0]) * 1000
    rds.zadd(alive, {"gone-worker": now_ms - 6000})  # silent for longer than a lease
    rds.hset(speaks, "gone-worker", "0")
    second, crawler = harness.open_scheduler(redis_url, _Spider, FRONTIER_LEASE_TIMEOUT=5)
    assert config_error_of(crawler) is None
    assert rds.hget(speaks, second.holder) == str(protocol.VERSION).encode()
    assert rds.hget(speaks, first.holder) == str(protocol.VERSION).encode()
    assert rds.hget(speaks, "gone-worker") is None
    assert rds.zscore(alive, "gone-worker") is None


def test_a_worker_first_seen_by_a_lease_call_counts_as_speaking_its_protocol(
    redis_url: str, rds: redis.Redis
) -> None:
    """A worker whose opening liveness call was lost joins ``{s}:alive`` by
    its first lease call, which records its protocol too: a worker opening
    next to it opens."""
    first, _ = harness.open_scheduler(redis_url, _Spider)
    alive = _alive_key(first)
    speaks = alive.removesuffix("alive") + "speaks"
    rds.zrem(alive, first.holder)
    rds.hdel(speaks, first.holder)  # (as if its opening call never ran)
    first.enqueue_request(Request("https://a.example/"))
    first.flush_outbox()
    assert first.next_request() is not None
    assert rds.hget(speaks, first.holder) == str(protocol.VERSION).encode()
    _, crawler = harness.open_scheduler(redis_url, _Spider)
    assert config_error_of(crawler) is None
