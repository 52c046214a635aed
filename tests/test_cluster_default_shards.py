"""Held-back cases for FRONTIER_SHARDS default None on a cluster (d2747b9)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from redis.cluster import RedisCluster
from scrapy import Request, Spider
from scrapy.settings import Settings

from crawler.frontier.luasource import script_source
from crawler.keys import CLUSTER_SHARDS, shard_of, shard_prefixes, site_prefix
from crawler.metrics import StatusCollector
from crawler.status import StatusReader
from tests import scheduler_harness as harness
from tests.test_shards import _assert_stored_once, bytes_per_master, served_sites
from tests.test_shards_ops import _Quotes, _scrapy
from tests.workers import crawl, start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from pathlib import Path


def _crawl_stored_once(
    rc: RedisCluster, url: str, mongo_uri: str, mongo_db: str, db: Any, tmp_path: Path,
    sites: Any, n: int, workers: int, **settings: Any,
) -> list[Any]:
    """``workers`` workers crawl the first ``n`` of ``sites`` on the cluster
    at ``url`` (FRONTIER_SHARDS unset); every page is stored once."""
    rc.lpush("pages:start_urls", *sites.urls(n))
    env = {**worker_env(url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
    done = crawl("pages", env, tmp_path, workers=workers, settings=settings or None)
    _assert_stored_once(db, sites, n, done)
    return done


@pytest.mark.workers
@pytest.mark.parametrize(("n", "workers"), [(150, 1), (200, 3)])
def test_default_shards_spread_over_masters(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, db: Any, tmp_path: Path,
    n: int, workers: int,
) -> None:
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        with served_sites() as sites:
            done = _crawl_stored_once(rc, redis_cluster_url, mongo_uri, mongo_db, db,
                                      tmp_path, sites, n, workers)
        assert all("MOVED" not in w.log and "CROSSSLOT" not in w.log for w in done)
        assert all("] ERROR:" not in w.log and "Traceback" not in w.log for w in done)
        assert rc.get("{pages}:shards") == str(CLUSTER_SHARDS).encode()
        per_master = bytes_per_master(rc, "pages")
        assert min(per_master) > 0, per_master
        assert max(per_master) <= 0.6 * sum(per_master), per_master
    finally:
        rc.close()


# -- commands on a cluster crawl started with the default ------------------------------


def _sum(rc: RedisCluster, suffix: str, read: str = "get") -> int:
    total = 0
    for p in shard_prefixes("quotes", CLUSTER_SHARDS):
        v = getattr(rc, read)(p + suffix)
        total += int(v or 0)
    return total


@pytest.mark.workers
def test_every_command_on_a_default_cluster_crawl(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str
) -> None:
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        scheduler, _ = harness.open_scheduler(
            redis_cluster_url, _Quotes, FRONTIER_REDIS_CLUSTER=True
        )
        sites = [f"s{i}.example" for i in range(40)]
        for site in sites:
            assert scheduler.enqueue_request(Request(f"https://{site}/a"))
        scheduler.dead_letter(Request("https://gone.example/x", priority=3), "gave up")
        assert scheduler.flush_outbox()
        assert rc.get("{quotes}:shards") == b"16"
        assert _sum(rc, "count") == 40
        assert _sum(rc, "dead", "llen") == 1
        env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db),
               "FRONTIER_REDIS_CLUSTER": "1"}
        st = _scrapy(env, "frontier", "status", "quotes", "--json")
        assert st.returncode == 0, st.stderr

        assert json.loads(st.stdout)["spiders"]["quotes"]["shards"] == 16

        assert '"shards": 16' in st.stdout
        site = sites[7]
        shard = shard_of(site, CLUSTER_SHARDS)
        prefix = site_prefix("quotes", site, CLUSTER_SHARDS)
        for args, key, value in (
            (("delay", "quotes", site, "2"), "delay", b"2000"),
            (("concurrency", "quotes", site, "3"), "conc", b"3"),
            (("revisit", "quotes", site, "60"), "revisit", None),
        ):
            done = _scrapy(env, "frontier", *args)
            assert done.returncode == 0, done.stderr
            if value is not None:
                assert rc.hget(prefix + key, site) == value, (key, shard)
        listed = _scrapy(env, "frontier", "overrides", "quotes")
        assert listed.returncode == 0, listed.stderr
        assert prefix + "delay" in listed.stdout and site in listed.stdout
        dl = _scrapy(env, "deadletters", "list", "quotes", "--json")
        assert dl.returncode == 0, dl.stderr
        assert [x["url"] for x in json.loads(dl.stdout)] == ["https://gone.example/x"]
        rq = _scrapy(env, "deadletters", "requeue", "quotes")
        assert rq.returncode == 0, rq.stderr
        assert "requeued 1 dead letters" in rq.stdout
        assert _sum(rc, "count") == 41 and _sum(rc, "dead", "llen") == 0
        scheduler.dead_letter(Request("https://gone.example/y"), "gave up")
        assert scheduler.flush_outbox()
        pg = _scrapy(env, "deadletters", "purge", "quotes")
        assert pg.returncode == 0, pg.stderr
        assert "purged 1 dead letters" in pg.stdout
        # metrics exporter, in process
        settings = Settings({"REDIS_URL": redis_cluster_url, "FRONTIER_REDIS_CLUSTER": True,
                             "MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db})
        reader = StatusReader.from_settings(settings, ["quotes"])
        try:
            families = {f.name: f for f in StatusCollector(reader).collect()}
        finally:
            reader.close()
        samples = {(f.name, s.name): s.value for f in families.values() for s in f.samples}
        assert samples[("crawler_frontier_shards", "crawler_frontier_shards")] == 16
        shards_metric = [s.value for s in families["crawler_frontier_shards"].samples]
        assert shards_metric == [16], shards_metric
        scheduler.close("shutdown")
        cl = _scrapy(env, "frontier", "clear", "quotes", "--yes")
        assert cl.returncode == 0, cl.stderr
        left = [k for n in rc.get_primaries()
                for k in rc.get_redis_connection(n).scan_iter(match="*quotes*")]
        assert left == [], left
    finally:
        rc.close()


class _Pages(Spider):
    name = "pages"


@pytest.mark.workers
def test_a_one_shard_cluster_crawl_started_with_the_default(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, db: Any, tmp_path: Path
) -> None:
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        scheduler, _ = harness.open_scheduler(
            redis_cluster_url, _Pages, FRONTIER_REDIS_CLUSTER=True, FRONTIER_SHARDS=1
        )
        for i in range(10):
            assert scheduler.enqueue_request(Request(f"http://127.0.0.{i + 1}:1/x"))
        assert scheduler.flush_outbox()
        scheduler.close("shutdown")  # persisted
        assert rc.get("{pages}:shards") == b"1"
        assert int(rc.get("{pages}:count") or 0) == 10
        rc.lpush("pages:start_urls", *[f"http://127.0.1.{i + 1}:1/" for i in range(5)])
        before = sorted(k for n in rc.get_primaries()
                        for k in rc.get_redis_connection(n).scan_iter(match="*pages*"))
        env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db),
               "FRONTIER_REDIS_CLUSTER": "1"}
        log = tmp_path / "w.log"
        [worker] = wait_workers(
            [start_worker("pages", env, log, {"MAX_IDLE_TIME_BEFORE_CLOSE": 2})], [log], 60
        )
        errors = [x for x in worker.log.splitlines() if "] ERROR:" in x or "] CRITICAL:" in x]
        assert worker.returncode != 0, worker.log[-3000:]
        assert "Traceback" not in worker.log, worker.log[-5000:]
        assert len(errors) == 1, errors
        assert "FRONTIER_SHARDS = 1" in errors[0] or "FRONTIER_SHARDS=1" in errors[0], errors
        assert "FRONTIER_SHARDS is not set: 16 is its default on a Redis Cluster" in errors[0]
        assert int(rc.get("{pages}:count") or 0) == 10
        assert rc.llen("pages:start_urls") == 5
        assert rc.get("{pages}:shards") == b"1"
        after = sorted(k for n in rc.get_primaries()
                       for k in rc.get_redis_connection(n).scan_iter(match="*pages*"))
        assert not [k for k in after if k.startswith(b"{pages:")], after
        # (the crawl-wide stats, and the worker's closed record in the registry)
        assert set(after) - set(before) <= {b"{pages}:stats", b"{pages}:workers"}, after
    finally:
        rc.close()


@pytest.mark.workers
def test_bloom_crawl_on_a_cluster_with_the_default(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, db: Any, tmp_path: Path
) -> None:
    n = 60
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        with served_sites() as sites:
            done = _crawl_stored_once(
                rc, redis_cluster_url, mongo_uri, mongo_db, db, tmp_path, sites, n, 2,
                DUPEFILTER_CLASS="crawler.frontier.bloom.BloomDupeFilter",
            )
        assert all("MOVED" not in w.log and "CROSSSLOT" not in w.log for w in done)
        assert all("] ERROR:" not in w.log for w in done)
        blooms = [p for p in shard_prefixes("pages", CLUSTER_SHARDS) if rc.exists(p + "bloom")]
        assert len(blooms) >= 12, blooms
        assert not rc.exists("{pages}:bloom") and not rc.exists("{pages}:dupefilter")
        assert not any(rc.exists(p + "dupefilter") for p in shard_prefixes("pages", 16))
        env2 = {**worker_env(redis_cluster_url, mongo_uri, mongo_db),
                "FRONTIER_REDIS_CLUSTER": "1"}
        st = _scrapy(env2, "frontier", "status", "pages", "--json",
                     "-s", "DUPEFILTER_CLASS=crawler.frontier.bloom.BloomDupeFilter")
        assert st.returncode == 0, st.stderr
        spider = json.loads(st.stdout)["spiders"]["pages"]
        assert spider["shards"] == 16 and spider["queued"] == 0 and spider["items"]["pages"] == 360
    finally:
        rc.close()


def _move_slot(rc: RedisCluster, key: str) -> None:
    """Move the slot of ``key`` to another master, keys and all (as
    ``redis-cli --cluster reshard`` does)."""
    slot = rc.keyslot(key)
    src = rc.get_node_from_key(key)
    dst = next(n for n in rc.get_primaries() if n.name != src.name)
    src_c, dst_c = rc.get_redis_connection(src), rc.get_redis_connection(dst)
    src_id, dst_id = src_c.execute_command("CLUSTER MYID"), dst_c.execute_command("CLUSTER MYID")
    src_id = src_id.decode() if isinstance(src_id, bytes) else src_id
    dst_id = dst_id.decode() if isinstance(dst_id, bytes) else dst_id
    dst_c.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src_c.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src_c.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
        src_c.execute_command("MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", *keys)
    for node in rc.get_primaries():
        rc.get_redis_connection(node).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
    wait = __import__("tests.waiting", fromlist=["wait_for"]).wait_for
    wait(lambda: all(
        (rc.get_redis_connection(n).execute_command("CLUSTER COUNTKEYSINSLOT", slot) >= 0)
        for n in rc.get_primaries()), 5, "slot moved", 0.05)


@pytest.mark.cluster
def test_a_slot_moved_under_a_worker_is_found_by_moved_and_nothing_is_lost() -> None:
    """The slot of the shard of a new request moved to another master: the
    commit and the lease meet MOVED (they did not run), the slot map is
    read again, both are sent again and the request is handed out once."""
    from tests.cluster import RedisClusterServers

    with RedisClusterServers(masters=3) as cluster:
        rc = RedisCluster.from_url(cluster.url)
        try:
            scheduler, _ = harness.open_scheduler(
                cluster.url, _Pages, FRONTIER_REDIS_CLUSTER=True, CONCURRENT_REQUESTS=4
            )
            site = "moved.example"
            assert scheduler.enqueue_request(Request(f"https://{site}/1"))
            first = harness.wait_for_request(scheduler, 3.0)
            harness.finish(scheduler, first)
            assert scheduler.next_request() is None
            prefix = site_prefix("pages", site, CLUSTER_SHARDS)
            before = rc.get_node_from_key(prefix + "count").name
            _move_slot(rc, prefix + "count")
            rc.nodes_manager.initialize()
            assert rc.get_node_from_key(prefix + "count").name != before
            assert scheduler.enqueue_request(Request(f"https://{site}/2"))
            got = harness.wait_for_request(scheduler, 3.0)
            assert got.url == f"https://{site}/2"
            old = next(n for n in rc.get_primaries() if n.name == before)
            errors = rc.get_redis_connection(old).info("errorstats")
            assert errors.get("errorstat_MOVED", {}).get("count", 0) >= 2, errors  # commit, lease
            assert not scheduler.outbox.ops and scheduler.session.in_doubt is None
            harness.finish(scheduler, got)
            assert scheduler.next_request() is None
            assert scheduler.queue.shards.audit() == {}
            assert rc.scard(prefix + "dupefilter") == 2
        finally:
            rc.close()


def test_one_master_forgot_the_commit_script_the_lease_of_its_shard_is_sent_again(
    redis_cluster_url: str,
) -> None:
    """One master of three forgot every script but lease.lua (a restart
    while another worker was loading them): in one round trip the commits
    of the shards there meet NOSCRIPT, those elsewhere run; the lease on a
    shard there ran before its commit and found nothing. The failed commits
    are sent again once, and the lease after them: the request comes out of
    that same next_request; every request is leased once."""
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        scheduler, _ = harness.open_scheduler(
            redis_cluster_url, _Pages, FRONTIER_REDIS_CLUSTER=True, CONCURRENT_REQUESTS=4
        )
        assert scheduler.next_request() is None  # every shard found empty
        sites = [f"m{i}.example" for i in range(40)]
        prefix = {s: site_prefix("pages", s, CLUSTER_SHARDS) for s in sites}
        node = {s: rc.get_node_from_key(prefix[s] + "count").name for s in sites}
        target = sites[0]
        forgetful = node[target]
        assert len(set(node.values())) == 3
        assert scheduler.enqueue_request(Request(f"https://{target}/top", priority=10))
        for s in sites[1:]:
            assert scheduler.enqueue_request(Request(f"https://{s}/a"))
        master = next(n for n in rc.get_primaries() if n.name == forgetful)
        client = rc.get_redis_connection(master)
        client.script_flush()
        client.script_load(script_source("lease.lua"))
        got = scheduler.next_request()
        assert got is not None and got.url == f"https://{target}/top"
        errors = client.info("errorstats")
        assert errors.get("errorstat_NOSCRIPT", {}).get("count", 0) >= 1, errors
        out = [got]
        while len(out) < len(sites):
            out.append(harness.wait_for_request(scheduler, 3.0))
        assert sorted(r.url for r in out) == sorted(
            [f"https://{target}/top", *(f"https://{s}/a" for s in sites[1:])])
        for r in out:
            harness.finish(scheduler, r)
        assert scheduler.next_request() is None
        assert scheduler.queue.shards.audit() == {}
        assert not scheduler.outbox.ops and scheduler.session.in_doubt is None
    finally:
        rc.close()
