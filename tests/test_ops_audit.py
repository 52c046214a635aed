"""``scrapy frontier audit SPIDER``: what is wrong with a crawl's Redis
structures, in lines or JSON, exit 1 when anything is (a flushed crawl is
never reported empty and clean), and ``--repair`` for what can be fixed
safely. The frontier is written by the real scripts on the test's Redis;
the command runs as a subprocess, as an operator runs it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import redis as redis_lib
from redis.cluster import RedisCluster

from crawler.frontier.audit import audit_crawl, repair_damage
from crawler.frontier.eviction import evicted_keys
from crawler.frontier.protocol import Damage
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Lease, NotDue
from crawler.keys import CrawlKeys, created_key, shards_key
from devtools.embedded import RedisServer
from tests.test_ops_cli import scrapy

if TYPE_CHECKING:
    import redis

SPIDER = "quotes"


def _crawl(rds: redis.Redis, pages: int = 6) -> FrontierShards:
    """A started crawl of ``quotes`` (its marker and shard count written as a
    worker's open writes them) with ``pages`` requests queued on two sites."""
    crawl = FrontierShards.build(rds, SPIDER, 1, lease_timeout=60.0)
    crawl.check_count()
    crawl.load_scripts()
    for i in range(pages):
        site = "a.example" if i % 2 else "b.example"
        url = f"https://{site}/{i}".encode()
        assert crawl[0].push(url, site=site, priority=i % 3, fingerprint=url, dont_filter=False)
    return crawl


def _audit(env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    result = scrapy(env, "frontier", "audit", SPIDER, *args)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout.splitlines()


@pytest.mark.workers
def test_a_consistent_crawl_with_a_live_lease_audits_clean(
    env: dict[str, str], rds: redis.Redis
) -> None:
    crawl = _crawl(rds)
    assert isinstance(crawl[0].lease_many(["w#1:0"])[0], Lease)  # type: ignore[index]
    code, lines = _audit(env)
    assert (code, lines) == (0, [f"crawl {SPIDER}: nothing wrong found"])
    code, lines = _audit(env, "--json")
    assert (code, lines) == (0, ["[]"])


@pytest.mark.workers
def test_a_flushed_crawl_is_reported_absent_not_clean(
    env: dict[str, str], rds: redis.Redis
) -> None:
    _crawl(rds)
    rds.flushdb()
    code, lines = _audit(env)
    assert code == 1, lines
    assert lines[0].startswith(f"absent {{{SPIDER}}}:created: no frontier of this crawl")
    assert "never started, or all its keys vanished" in lines[0]


@pytest.mark.workers
def test_an_evicted_crawl_with_a_live_worker_is_reported_vanished(
    env: dict[str, str], rds: redis.Redis
) -> None:
    crawl = _crawl(rds)
    rds.flushdb()
    crawl.alive("w#1")  # a worker still running writes its liveness again
    code, lines = _audit(env, "--json")
    assert code == 1, lines
    [found] = json.loads("\n".join(lines))
    assert found["kind"] == "vanished"
    assert found["key"] == f"{{{SPIDER}}}:created"
    assert "evicted or flushed" in found["detail"]
    assert found["fix"] == "" and found["repaired"] is False


@pytest.mark.workers
def test_audit_reports_what_is_wrong_and_repair_fixes_what_is_safe(
    env: dict[str, str], rds: redis.Redis
) -> None:
    crawl = _crawl(rds)
    f = crawl[0]
    [lease] = f.lease_many(["w#1:0"])  # type: ignore[misc]
    rds.zrem(f.key("leases"), "w#1:0")  # its data stays: stranded
    rds.zadd(f.key("leases"), {"w#9:0": 1})  # a deadline without data
    rds.set(f.key("count"), 40)
    rds.hset(f.key("active"), "c.example", 3)
    rds.hset(f.key("delay"), "a.example", "abc")
    rds.hset(f.key("conc"), "b.example", "2")  # a good override: not reported
    code, lines = _audit(env)
    assert code == 1, lines
    text = "\n".join(lines)
    assert f"count {{{SPIDER}}}:count: counts 40 queued requests; the queues" in text
    assert f"lease {{{SPIDER}}}:ldata w#1:0: stranded" in text
    assert f"lease {{{SPIDER}}}:leases w#9:0: deadline without data" in text
    assert f"slots {{{SPIDER}}}:active: counts" in text
    assert f"bad-value {{{SPIDER}}}:delay a.example: 'abc' cannot be read" in text
    assert f"{{{SPIDER}}}:conc" not in text
    assert lines[-1] == f"crawl {SPIDER}: 5 problem(s), 5 that --repair fixes"

    code, lines = _audit(env, "--repair", "--json")
    assert code == 0, lines
    found = json.loads("\n".join(lines))
    assert len(found) == 5 and all(x["repaired"] for x in found), found
    assert _audit(env) == (0, [f"crawl {SPIDER}: nothing wrong found"])
    assert int(rds.get(f.key("count")) or 0) == 5
    assert rds.hget(f.key("conc"), "b.example") == b"2"
    # The stranded request goes back to its queue at the next lease call.
    got = f.lease_many([f"w#2:{i}" for i in range(10)])
    assert lease.data in [x.data for x in got]  # type: ignore[union-attr]


@pytest.mark.workers
def test_audit_reports_queue_chunks_that_vanished(env: dict[str, str], rds: redis.Redis) -> None:
    f = _crawl(rds)[0]
    [name] = [k for k in rds.hkeys(f.key("qc")) if k.startswith(b"a.example\t1\t")]
    rds.hdel(f.key("qc"), name)
    code, lines = _audit(env)
    assert code == 1, lines
    assert any(line.startswith(f"vanished {{{SPIDER}}}:qc a.example\t1: 1 of its chunks are gone")
               for line in lines), lines


@pytest.mark.workers
def test_each_frontier_subcommand_has_its_own_help(env: dict[str, str]) -> None:
    audit = scrapy(env, "frontier", "audit", "--help")
    assert audit.returncode == 0, audit.stderr
    assert "scrapy frontier audit SPIDER [--json] [--repair]" in audit.stdout
    assert "clear SPIDER --yes" not in audit.stdout
    clear = scrapy(env, "frontier", "clear", "-h")
    assert "scrapy frontier clear SPIDER --yes" in clear.stdout
    assert "audit" not in clear.stdout
    whole = scrapy(env, "frontier", "--help")
    assert whole.returncode == 0
    assert "    audit " in whole.stdout and "    clear " in whole.stdout  # listed


def _corrupt_and_audit(rds: Any, shards: int) -> None:
    """Two shards' counters off and a lease stranded on the last: each
    found under its shard's keys, repaired, then clean."""
    crawl = FrontierShards.build(rds, SPIDER, shards, lease_timeout=60.0)
    crawl.check_count()
    crawl.load_scripts()
    for i in range(8):
        site = f"s{i}.example"
        url = f"https://{site}/".encode()
        assert crawl.for_site(site).push(url, site=site, priority=0, fingerprint=url,
                                         dont_filter=False)
    last = crawl[shards - 1]
    assert isinstance(last.lease_many(["w#1:0"])[0], Lease)  # type: ignore[index]
    rds.zrem(last.key("leases"), "w#1:0")
    for f in crawl:
        rds.incrby(f.key("count"), 5)
    keys = CrawlKeys.for_spider(SPIDER)
    found = audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers)
    assert sorted((x.kind, x.key.split(" ")[0]) for x in found) == sorted(
        [("count", f.key("count")) for f in crawl] + [("lease", last.key("ldata"))]
    ), [x.line() for x in found]
    repaired = audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers, repair=True)
    assert all(x.repaired for x in repaired), [x.line() for x in repaired]
    assert audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers) == []


def test_audit_finds_and_repairs_each_shard_of_a_sharded_crawl(rds: redis.Redis) -> None:
    _corrupt_and_audit(rds, 2)


@pytest.mark.cluster
def test_audit_finds_and_repairs_on_a_redis_cluster(redis_cluster_url: str) -> None:
    client = RedisCluster.from_url(redis_cluster_url)
    try:
        _corrupt_and_audit(client, 3)
    finally:
        client.close()


def test_audit_names_a_redis_that_may_evict_and_chunks_it_evicted() -> None:
    with RedisServer(args=("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")) as server:
        client = redis_lib.Redis.from_url(server.url)
        try:
            crawl = _crawl(client)
            # another client of a shared Redis fills memory: keys are evicted
            filler = b"x" * 4096
            f = crawl[0]
            ours = [created_key(SPIDER), shards_key(SPIDER),
                    *(f.key(n) for n in ("count", "prio", "qm", "qc", "lv"))]
            held = client.exists(*ours)
            for i in range(100_000):  # (LRU is sampled: until one of ours went)
                client.set(f"cache:{i}", filler)
                if client.exists(*ours) < held:
                    break
            assert evicted_keys(client)
            keys = CrawlKeys.for_spider(SPIDER)
            found = audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers)
        finally:
            client.close()
    kinds = {x.kind for x in found}
    assert "evicting" in kinds, [x.line() for x in found]
    assert "allkeys-lru" in next(x.detail for x in found if x.kind == "evicting")
    # some of the crawl's own keys went too: reported, never clean
    assert kinds & {"vanished", "count", "prio"}, [x.line() for x in found]


def test_wrong_types_and_unreadable_chunks_are_reported_not_repaired(rds: redis.Redis) -> None:
    crawl = _crawl(rds)
    f = crawl[0]
    rds.set(f.key("due"), "x")  # a string where the scripts keep a hash
    [name] = [k for k in rds.hkeys(f.key("qc")) if k.startswith(b"b.example\t0\t")]
    rds.hset(f.key("qc"), name, b"zz")
    keys = CrawlKeys.for_spider(SPIDER)
    found = audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers, repair=True)
    by_kind = {x.kind: x for x in found}
    assert by_kind["wrong-type"].key == f.key("due")
    assert "is a string, not a hash" in by_kind["wrong-type"].detail
    assert by_kind["bad-value"].key == f"{f.key('qc')} {name.decode()}"
    # what the queues hold is not known: the counters are left as they are
    assert by_kind["count"].fix == "" and not by_kind["count"].repaired
    assert not any(x.repaired for x in found), [x.line() for x in found]
    assert rds.get(f.key("count")) == b"6"
    assert rds.type(f.key("due")) == b"string"


def _damage(rds: redis.Redis, f: Any) -> dict[str, bytes]:
    """Hand-damage one value of each kind the scripts trust (a site's
    priorities, a queue's bounds, a join time); returns the values as the
    frontier wrote them."""
    queue = "b.example\t2"  # (its best priority: the next lease call pops it)
    want = {"lv": rds.hget(f.key("lv"), "a.example"), "qm": rds.hget(f.key("qm"), queue)}
    rds.hset(f.key("lv"), "a.example", "zz 9 \xff")
    rds.hset(f.key("qm"), queue, "x y")
    rds.hset(f.key("joined"), "a.example", "soon")
    return want


def test_a_lease_call_leaves_damaged_values_reports_them_and_loses_nothing(
    rds: redis.Redis,
) -> None:
    """The scripts repair nothing: a value the frontier never writes is
    left as it is, its site passed over, and the reply names it; after
    :func:`repair_damage` (what the worker runs) every request is leased."""
    crawl = _crawl(rds)
    f = crawl[0]
    _damage(rds, f)
    before = {k: rds.dump(f.key(k)) for k in ("lv", "qm", "qc")}
    result = f.lease_many(["w#1:0"])
    assert isinstance(result, NotDue), result
    assert set(result.damaged) == {Damage("lv", "a.example"), Damage("qm", "b.example\t2")}
    assert {k: rds.dump(f.key(k)) for k in ("lv", "qm", "qc")} == before
    found = [x for d in result.damaged for x in repair_damage(f, d)]
    assert found and all(x.repaired for x in found), [x.line() for x in found]
    assert [x for d in result.damaged for x in repair_damage(f, d)] == []  # twice: nothing
    leased = [f.lease_many([f"w#1:{i}"]) for i in range(1, 7)]
    assert all(isinstance(x, list) for x in leased), leased


def test_audit_repair_run_twice_is_harmless_and_nothing_is_lost(rds: redis.Redis) -> None:
    crawl = _crawl(rds)
    f = crawl[0]
    want = _damage(rds, f)
    rds.set(f.key("count"), 7)  # (every queue emptied below: a count left over)
    keys = CrawlKeys.for_spider(SPIDER)
    found = audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers)
    assert {(x.kind, x.key.split(" ")[0]) for x in found} >= {
        ("bad-value", f.key("lv")), ("bad-value", f.key("qm")), ("bad-value", f.key("joined")),
    }, [x.line() for x in found]
    first = audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers, repair=True)
    assert all(x.repaired for x in first), [x.line() for x in first]
    assert rds.hget(f.key("lv"), "a.example") == want["lv"]
    assert want["qm"] in rds.hvals(f.key("qm"))
    assert not rds.hexists(f.key("joined"), "a.example")
    second = audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers, repair=True)
    assert second == [], [x.line() for x in second]
    leased = [f.lease_many([f"w#1:{i}"]) for i in range(6)]
    assert all(isinstance(x, list) for x in leased), leased
    assert isinstance(f.lease_many(["w#1:9"]), NotDue)
    assert not {"count", "prio", "joined"} & set(crawl.audit()), crawl.audit()
