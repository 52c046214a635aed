"""The sharded frontier on a real Redis Cluster whose master or worker fails
mid-crawl: two ``scrapy crawl pages`` workers, the default shard count (16
over three masters), many loopback sites; one master is stopped (SIGTERM,
or SIGKILL: its append-only file is fsynced on every write) and started
again on its port with its data, or one worker is SIGKILLed and started
again under its ``FRONTIER_WORKER_ID``. Every page ends up stored once and
the frontier holds nothing."""

from __future__ import annotations

import json
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest
from redis import Redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError
from scrapy import Request, Spider

from crawler.frontier.shards import FrontierShards
from crawler.keys import CLUSTER_SHARDS, shard_prefixes, site_prefix
from tests import scheduler_harness as harness
from tests.cluster import RedisClusterServers
from tests.test_shards import PAGES_PER_SITE, _assert_stored_once, served_sites
from tests.test_shards_ops import _scrapy
from tests.waiting import wait_for
from tests.workers import Worker, start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from subprocess import Popen

    from tests.test_shards import _Sites

#: Sites crawled (6 pages each), and the seconds each page takes to serve.
SITES, DELAY = 150, 0.02
#: Seconds a stopped master stays down at least (under the cluster's node
#: timeout, 5 s, so the other masters never mark it failed).
pytestmark = [pytest.mark.faults, pytest.mark.cluster]


DOWN = 1.5


@pytest.fixture(scope="module")
def durable_cluster() -> Iterator[RedisClusterServers]:
    """A three-master cluster whose masters keep their data over a restart."""
    with RedisClusterServers(masters=3, appendonly=True) as cluster:
        yield cluster


@pytest.fixture
def cluster(durable_cluster: RedisClusterServers) -> Iterator[RedisClusterServers]:
    yield durable_cluster
    for node in durable_cluster.nodes:
        node.start()  # (a test that failed with a master down)
    durable_cluster.wait_ready()
    durable_cluster.flushall()


@pytest.fixture
def sites() -> Iterator[_Sites]:
    with served_sites(delay=DELAY) as server:
        yield server


def _start(env: dict[str, str], tmp_path: Path, name: str, **settings: object
           ) -> tuple[Popen[bytes], Path]:
    log = tmp_path / f"{name}.log"
    return start_worker("pages", env, log, {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, **settings}), log


def _fetched(sites: _Sites) -> int:
    with sites.lock:
        return sum(n for (_, path), n in sites.hits.items() if path != "/robots.txt")


def _assert_frontier_empty(rc: RedisCluster, env: dict[str, str]) -> None:
    """Nothing queued, leased or dead, on the keys and by ``frontier status``."""
    assert FrontierShards.build(rc, "pages", CLUSTER_SHARDS).audit() == {}
    prefixes = shard_prefixes("pages", CLUSTER_SHARDS)
    assert sum(int(rc.get(p + "count") or 0) for p in prefixes) == 0
    assert [rc.llen(p + "dead") for p in prefixes] == [0] * CLUSTER_SHARDS
    assert rc.llen("pages:start_urls") == 0
    status = _scrapy(env, "frontier", "status", "pages", "--json")
    assert status.returncode == 0, status.stderr
    spider = json.loads(status.stdout)["spiders"]["pages"]
    assert (spider["queued"], spider["leases"], spider["dead_letters"]) == (0, 0, 0), spider
    assert spider["items"]["pages"] == SITES * PAGES_PER_SITE


def _crawl_a_quarter(
    rc: RedisCluster, cluster: RedisClusterServers, mongo_uri: str, mongo_db: str,
    sites: _Sites, tmp_path: Path,
) -> tuple[dict[str, str], tuple[Popen[bytes], ...], tuple[Path, ...], float]:
    """Seed every site, start two workers on the cluster and wait until a
    quarter of the pages are fetched. Returns the workers' environment, the
    processes, their logs and when they were started (``time.monotonic()``)."""
    rc.lpush("pages:start_urls", *sites.urls(SITES))
    env = {**worker_env(cluster.url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
    started = time.monotonic()
    procs, logs = zip(*(_start(env, tmp_path, f"w{i}") for i in range(2)), strict=True)
    total = SITES * PAGES_PER_SITE
    wait_for(lambda: _fetched(sites) >= total // 4, 60, "a quarter of the pages", 0.05)
    return env, procs, logs, started


def _assert_no_crash(workers: list[Worker]) -> None:
    for w in workers:
        assert "Traceback" not in w.log and "] CRITICAL:" not in w.log, w.log[-5000:]
        assert "] ERROR:" not in w.log, w.log[-5000:]
        assert "MOVED" not in w.log and "CROSSSLOT" not in w.log, w.log[-5000:]


@pytest.mark.workers
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_master_restarted_mid_crawl_loses_nothing(
    cluster: RedisClusterServers, mongo_uri: str, mongo_db: str, db: Any, sites: _Sites,
    tmp_path: Path, signum: signal.Signals,
) -> None:
    """A master stopped once a quarter of the pages are fetched, started
    again on its port at least :data:`DOWN` s later (and once a worker has
    logged the outage): the workers wait it out and finish; every page is
    fetched and stored once, the frontier is empty."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        env, procs, logs, started = _crawl_a_quarter(
            rc, cluster, mongo_uri, mongo_db, sites, tmp_path
        )
        total = SITES * PAGES_PER_SITE
        node = cluster.nodes[1]
        down_at, fetched_at_stop = time.monotonic(), _fetched(sites)
        if signum == signal.SIGKILL:
            node.kill()
        else:
            node.stop()
        wait_for(lambda: any("Redis unreachable" in p.read_text() for p in logs if p.exists()),
                 10, "a worker to log the outage", 0.05)
        logged = time.monotonic() - down_at
        time.sleep(max(0.0, down_at + DOWN - time.monotonic()))  # the outage itself
        node.start()
        up = time.monotonic() - down_at
        cluster.wait_ready()
        outage = time.monotonic() - down_at
        assert all(p.poll() is None for p in procs), "a worker stopped during the outage"
        workers = wait_workers(list(procs), list(logs), 90)
        elapsed = time.monotonic() - started
        print(f"{signum.name}: {total} pages in {elapsed:.1f}s; master down {outage:.1f}s "
              f"(logged at {logged:.1f}s, up at {up:.1f}s) after {fetched_at_stop} fetched")
        _assert_no_crash(workers)
        _assert_stored_once(db, sites, SITES, workers)
        assert sum(w.stats.get("frontier/redis/outages", 0) for w in workers) >= 1
        # The restarted master answers CLUSTERDOWN until it has joined the
        # others again: an outage, not a refusal (a bad key, logged as ERROR).
        assert sum(w.stats.get("frontier/redis/refused", 0) for w in workers) == 0
        _assert_frontier_empty(rc, env)
    finally:
        rc.close()


@pytest.mark.workers
def test_a_worker_killed_mid_crawl_and_restarted_under_its_id_loses_nothing(
    cluster: RedisClusterServers, mongo_uri: str, mongo_db: str, db: Any, sites: _Sites,
    tmp_path: Path,
) -> None:
    """Worker w1 is SIGKILLed once a quarter of the pages are fetched and
    started again at once under the same FRONTIER_WORKER_ID: every page is
    stored once (those w1 held are fetched again), the frontier is empty."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        rc.lpush("pages:start_urls", *sites.urls(SITES))
        env = {**worker_env(cluster.url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
        settings = {"FRONTIER_LEASE_TIMEOUT": 5}
        started = time.monotonic()
        w1, _ = _start(env, tmp_path, "w1", FRONTIER_WORKER_ID="w1", **settings)
        w2, w2_log = _start(env, tmp_path, "w2", FRONTIER_WORKER_ID="w2", **settings)
        total = SITES * PAGES_PER_SITE
        wait_for(lambda: _fetched(sites) >= total // 4, 60, "a quarter of the pages", 0.05)
        w1.send_signal(signal.SIGKILL)
        w1.wait(10)
        fetched_at_kill = _fetched(sites)
        again, again_log = _start(env, tmp_path, "w1-again", FRONTIER_WORKER_ID="w1", **settings)
        workers = wait_workers([w2, again], [w2_log, again_log], 90)
        print(f"{total} pages in {time.monotonic() - started:.1f}s; w1 killed after "
              f"{fetched_at_kill} fetched; {_fetched(sites) - total} fetched again")
        _assert_no_crash(workers)
        assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
        assert db.pages.count_documents({}) == total
        assert len(db.pages.distinct("url")) == total
        _assert_frontier_empty(rc, env)
    finally:
        rc.close()


class _Pages(Spider):
    name = "pages"


def test_a_slot_the_cluster_does_not_serve_is_an_outage_waited_out_with_backoff(
    cluster: RedisClusterServers,
) -> None:
    """The master of a shard's slot stops serving it (``CLUSTER DELSLOTS``:
    it answers ``CLUSTERDOWN Hash slot not served``, as while a restarted
    master rejoins): the commit did not run, is sent once more after the
    slot map is read again, then the worker backs off as from any outage,
    instead of sending it again at every flush. Once the slot is served
    again, the request is committed and leased once."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        scheduler, crawler = harness.open_scheduler(
            cluster.url, _Pages, FRONTIER_REDIS_CLUSTER=True, CONCURRENT_REQUESTS=4
        )
        site = "down.example"
        prefix = site_prefix("pages", site, CLUSTER_SHARDS)
        slot = key_slot((prefix + "count").encode())
        owner = rc.get_redis_connection(rc.get_node_from_key(prefix + "count"))
        owner.execute_command("CLUSTER DELSLOTS", slot)
        try:
            assert scheduler.enqueue_request(Request(f"https://{site}/1"))
            assert not scheduler.flush_outbox()
            assert scheduler.session.down_until > time.monotonic()
            assert crawler.stats.get_value("frontier/redis/outages") == 1
            assert not crawler.stats.get_value("frontier/redis/refused")
            busy = owner.info("errorstats").get("errorstat_CLUSTERDOWN", {}).get("count", 0)
            assert 1 <= busy <= 2  # sent, then once more after the slot map
            for _ in range(5):  # backing off: nothing sent
                assert not scheduler.flush_outbox()
            again = owner.info("errorstats").get("errorstat_CLUSTERDOWN", {}).get("count", 0)
            assert again == busy
        finally:
            owner.execute_command("CLUSTER ADDSLOTS", slot)
        cluster.wait_ready()
        scheduler.session.down_until = 0.0  # (the backoff's end)
        assert scheduler.flush_outbox()
        got = harness.wait_for_request(scheduler, 3.0)
        assert got.url == f"https://{site}/1"
        harness.finish(scheduler, got)
        assert scheduler.next_request() is None
        assert scheduler.queue.shards.audit() == {}
    finally:
        rc.close()


def _cluster_failed(cluster: RedisClusterServers, down: int) -> bool:
    """Whether every running master says ``cluster_state:fail`` (a master
    was marked failed: the whole cluster answers ``CLUSTERDOWN``)."""
    for i, node in enumerate(cluster.nodes):
        if i == down:
            continue
        client = Redis(host=cluster.host, port=node.port, socket_timeout=2)
        try:
            if client.cluster("info").get("cluster_state") != "fail":
                return False
        finally:
            client.close()
    return True


@pytest.mark.workers
def test_a_master_down_past_the_node_timeout_is_an_outage_the_workers_wait_out(
    cluster: RedisClusterServers, mongo_uri: str, mongo_db: str, db: Any, sites: _Sites,
    tmp_path: Path,
) -> None:
    """A master stopped until the others mark it failed (the cluster's node
    timeout, 5 s): every master answers ``CLUSTERDOWN`` for every slot, and
    still after it is started again, until it has rejoined. The workers keep
    running, log the outage as a WARNING and back off (a bounded number of
    warnings, not one per flush), refuse nothing (the seed calls included),
    and finish: every page stored once, the frontier empty. (About 40 s:
    Redis clears a master's FAIL flag two node timeouts after it was set,
    and a worker's backoff may have doubled to 16 s by then.)"""
    rc = RedisCluster.from_url(cluster.url)
    try:
        env, procs, logs, started = _crawl_a_quarter(
            rc, cluster, mongo_uri, mongo_db, sites, tmp_path
        )
        total = SITES * PAGES_PER_SITE
        node = cluster.nodes[1]
        down_at, fetched_at_stop = time.monotonic(), _fetched(sites)
        node.stop()
        wait_for(lambda: _cluster_failed(cluster, 1), 15, "the cluster to fail", 0.1)
        failed = time.monotonic() - down_at
        node.start()
        cluster.wait_ready()
        outage = time.monotonic() - down_at
        assert all(p.poll() is None for p in procs), "a worker stopped during the outage"
        workers = wait_workers(list(procs), list(logs), 90)
        elapsed = time.monotonic() - started
        warnings = [w.log.count("Redis unreachable") for w in workers]
        print(f"{total} pages in {elapsed:.1f}s; cluster failed at {failed:.1f}s, ok again at "
              f"{outage:.1f}s after {fetched_at_stop} fetched; 'Redis unreachable' {warnings}; "
              f"outages {[w.stats.get('frontier/redis/outages') for w in workers]}")
        _assert_no_crash(workers)
        # (redis-py words CLUSTERDOWN "The cluster is down"): an outage for
        # the frontier calls and the seed calls alike, not a refusal
        logs_text = "".join(w.log for w in workers)
        assert "Redis unreachable (" in logs_text and "The cluster is down" in logs_text
        # The seed reader pauses while the frontier's Redis is failing
        # (crawler/frontier/health.py), so it may never meet the outage; when
        # it does, it is an outage there too, never a refusal.
        seed_lines = [line for line in logs_text.splitlines() if "while reading seeds" in line]
        unreachable = "Redis unreachable while reading seeds"
        assert all(unreachable in line for line in seed_lines), seed_lines
        assert "Redis refused" not in logs_text, [w.log[-3000:] for w in workers]
        assert all(1 <= n <= 40 for n in warnings), warnings
        _assert_stored_once(db, sites, SITES, workers)
        assert sum(w.stats.get("frontier/redis/refused", 0) for w in workers) == 0
        _assert_frontier_empty(rc, env)
    finally:
        rc.close()


def test_a_closing_worker_leaves_the_shards_of_every_master_that_answers(
    cluster: RedisClusterServers,
) -> None:
    """With one master down at close, the worker still leaves the fair
    shares (and deletes its commit markers) on the others, then reports
    the failure: the live workers there need not wait a lease's length."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        scheduler, _ = harness.open_scheduler(
            cluster.url, _Pages, FRONTIER_REDIS_CLUSTER=True, CONCURRENT_REQUESTS=4
        )
        shards = scheduler.queue.shards
        node_of = {i: rc.get_node_from_key(f.key("alive")).port for i, f in enumerate(shards)}
        assert all(rc.zscore(f.key("alive"), scheduler.holder) for f in shards)
        down = cluster.nodes[0]
        down.stop()
        with pytest.raises((RedisError, RedisClusterException)):
            shards.leave(scheduler.holder)
        live = [f for i, f in enumerate(shards) if node_of[i] != down.port]
        assert live and len(live) < len(shards)
        assert not any(rc.zscore(f.key("alive"), scheduler.holder) for f in live)
    finally:
        rc.close()


def test_commits_that_ran_beside_one_the_cluster_did_not_serve_end_no_outage(
    cluster: RedisClusterServers, caplog: pytest.LogCaptureFixture,
) -> None:
    """While a master rejoins, one round trip's commits run on the masters
    that serve their slots and meet CLUSTERDOWN on the one that does not:
    the outage goes on (its backoff doubles), it is not "reachable again"
    at every flush."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        scheduler, _ = harness.open_scheduler(
            cluster.url, _Pages, FRONTIER_REDIS_CLUSTER=True, CONCURRENT_REQUESTS=4
        )
        sites = [f"p{i}.example" for i in range(40)]
        owner_of = {s: rc.get_node_from_key(site_prefix("pages", s, CLUSTER_SHARDS) + "count")
                    for s in sites}
        down_site = sites[0]
        others = [s for s in sites if owner_of[s].name != owner_of[down_site].name]
        slot = key_slot((site_prefix("pages", down_site, CLUSTER_SHARDS) + "count").encode())
        owner = rc.get_redis_connection(owner_of[down_site])
        owner.execute_command("CLUSTER DELSLOTS", slot)
        backoffs = []
        try:
            for n in range(3):
                scheduler.enqueue_request(Request(f"https://{down_site}/{n}"))
                scheduler.enqueue_request(Request(f"https://{others[n]}/"))
                assert not scheduler.flush_outbox()
                backoffs.append(scheduler.session.backoff)
                scheduler.session.down_until = 0.0  # (the backoff's end)
        finally:
            owner.execute_command("CLUSTER ADDSLOTS", slot)
        assert backoffs == [0.5, 1.0, 2.0]
        assert "Redis reachable again" not in caplog.text
        cluster.wait_ready()
        assert scheduler.flush_outbox()
        got = [harness.wait_for_request(scheduler, 3.0) for _ in range(6)]
        assert sorted(r.url for r in got) == sorted(
            [f"https://{down_site}/{n}" for n in range(3)]
            + [f"https://{others[n]}/" for n in range(3)])
        for r in got:
            harness.finish(scheduler, r)
        assert scheduler.queue.shards.audit() == {}
    finally:
        rc.close()


@pytest.mark.workers
def test_a_worker_started_before_its_cluster_answers_waits_for_it_then_crawls(
    mongo_uri: str, mongo_db: str, db: Any, sites: _Sites, tmp_path: Path
) -> None:
    """No node answers when the worker starts (a cluster client learns the
    slots when it is made): it logs the wait at WARNING, with backoff, no
    traceback, and crawls once the cluster is up."""
    late = RedisClusterServers(masters=3)  # its ports are chosen, nothing runs
    try:
        env = {**worker_env(late.url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
        proc, log = _start(env, tmp_path, "early")
        wait_for(lambda: log.exists() and log.read_text().count("unreachable") >= 2, 30,
                 "the worker to try the cluster twice", 0.05)
        assert proc.poll() is None
        late.start()
        with RedisCluster.from_url(late.url) as rc:
            rc.lpush("pages:start_urls", *sites.urls(3))
        (worker,) = wait_workers([proc], [log], 60)
    finally:
        late.close()
    assert "Redis Cluster at redis://127.0.0.1" in worker.log
    assert "] WARNING:" in worker.log and "trying again in 1.0s" in worker.log
    _assert_no_crash([worker])
    _assert_stored_once(db, sites, 3, [worker])


def _sites_on_two_masters(rc: RedisCluster) -> tuple[str, str]:
    """A site and another site whose shards are on another master."""
    def node(site: str) -> Any:
        return rc.get_node_from_key(site_prefix("pages", site, CLUSTER_SHARDS) + "count")

    page_site = "s0.example"
    child_site = next(
        f"s{i}.example" for i in range(1, 1000)
        if node(f"s{i}.example").name != node(page_site).name
    )
    return page_site, child_site


def test_an_ack_is_never_committed_while_the_master_of_its_pages_child_is_down(
    cluster: RedisClusterServers,
) -> None:
    """A page's shard and its child's shard on two masters; the child's
    master is stopped before the outbox (freed slot and ack for the page's
    shard, the child for the other) is sent, so only the page's master
    answers; the worker then stops without sending more (a SIGKILL). Once
    the master is back, a new worker gets the page again when its lease
    expires (its ack was held back), or its child: never neither."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        settings: dict[str, Any] = {
            "FRONTIER_REDIS_CLUSTER": True, "CONCURRENT_REQUESTS": 4,
            "FRONTIER_LEASE_TIMEOUT": 1,
        }
        first, _ = harness.open_scheduler(cluster.url, _Pages, **settings)
        page_site, child_site = _sites_on_two_masters(rc)
        page, child = f"https://{page_site}/page", f"https://{child_site}/child"
        assert first.enqueue_request(Request(page))
        assert first.flush_outbox()
        leased = harness.wait_for_request(first, 3.0)
        assert leased.url == page
        first._download_ended(leased)
        assert first.enqueue_request(Request(child))
        first.crawler.engine._slot.remove_request(leased)
        assert [op.kind for op in first.outbox.ops] == ["slots", "pushes", "acks"]
        down_port = rc.get_node_from_key(
            site_prefix("pages", child_site, CLUSTER_SHARDS) + "count").port
        node = next(n for n in cluster.nodes if n.port == down_port)
        node.stop()
        try:
            assert not first.flush_outbox()  # the page's master ran its commit
            assert first.session.in_doubt is not None
            assert "acks" in [op.kind for op in first.outbox.ops]
        finally:
            node.start()
        # (the worker is killed: its outbox is never sent)
        cluster.wait_ready()
        second, _ = harness.open_scheduler(cluster.url, _Pages, **settings)
        # The child's master was down: the child is not queued, so the page
        # must come back once its lease expired (its ack was not committed).
        got = harness.wait_for_request(second, 5.0)
        assert got.url == page
        harness.finish(second, got)
        assert second.next_request() is None
    finally:
        rc.close()
