"""The frontier on a real three-master Redis Cluster (``FRONTIER_REDIS_CLUSTER``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from redis.cluster import RedisCluster
from scrapy import Request, Spider
from scrapy.settings import Settings

from crawler.frontier.bloom import BloomDupeFilter
from crawler.frontier.connection import FrontierRedisCluster, get_redis
from crawler.keys import CLUSTER_SHARDS, shard_count, shard_prefixes, site_prefix
from tests import scheduler_harness as harness
from tests.scheduler_harness import lease_all
from tests.workers import assert_quotes_crawled, crawl, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from crawler.frontier.scheduler import FrontierScheduler
    from devtools.replay import ReplayServer

class _Spider(Spider):
    name = "c"


pytestmark = pytest.mark.usefixtures("stop_heartbeats")


@pytest.fixture
def rc(redis_cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_cluster_url)
    yield client
    client.close()


#: The keys of a.example, in its shard of the default count on a cluster.
A = site_prefix("c", "a.example", CLUSTER_SHARDS)


def open_scheduler(url: str, **settings: Any) -> tuple[FrontierScheduler, Any]:
    """A scheduler of spider ``c`` on the cluster, FRONTIER_SHARDS unset."""
    return harness.open_scheduler(url, _Spider, FRONTIER_REDIS_CLUSTER=True, **settings)


def test_a_crawl_on_a_cluster_is_sharded_without_being_told(
    redis_cluster_url: str, rc: RedisCluster
) -> None:
    """FRONTIER_SHARDS unset: 16 shards on a cluster (recorded), spread over
    every master; 1 on one Redis server."""
    scheduler, _ = open_scheduler(redis_cluster_url)
    assert len(scheduler.queue.shards.frontiers) == CLUSTER_SHARDS
    assert rc.get("{c}:shards") == str(CLUSTER_SHARDS).encode()
    owners = {rc.get_node_from_key(p + "count").name for p in shard_prefixes("c", CLUSTER_SHARDS)}
    assert len(owners) == 3
    assert shard_count(Settings({"FRONTIER_REDIS_CLUSTER": True})) == CLUSTER_SHARDS
    assert shard_count(Settings({"FRONTIER_REDIS_CLUSTER": True, "FRONTIER_SHARDS": 1})) == 1
    assert shard_count(Settings({})) == 1


class _BraceSpider(Spider):
    name = "a}b"


def test_a_worker_on_a_cluster_warns_at_open_when_the_spider_name_puts_its_shards_in_one_slot(
    redis_cluster_url: str, rc: RedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """``a}b``: every shard's keys hash to one slot, one master (the crawl
    still runs there); the warning names the spider. ``c`` gets none."""
    with caplog.at_level("WARNING", logger="crawler.frontier.scheduler"):
        scheduler, _ = harness.open_scheduler(
            redis_cluster_url, _BraceSpider, FRONTIER_REDIS_CLUSTER=True
        )
    warned = [r.getMessage() for r in caplog.records if "one slot" in r.getMessage()]
    assert len(warned) == 1 and "'a}b'" in warned[0] and f"{CLUSTER_SHARDS} shards" in warned[0]
    prefixes = shard_prefixes("a}b", CLUSTER_SHARDS)
    assert len({rc.keyslot(p + "wait") for p in prefixes}) == 1
    scheduler.enqueue_request(Request("http://a.example/1"))
    assert [r.url for r in lease_all(scheduler)] == ["http://a.example/1"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="crawler.frontier.scheduler"):
        open_scheduler(redis_cluster_url)
    assert not [r for r in caplog.records if "one slot" in r.getMessage()]


def test_the_cluster_switch_builds_a_cluster_client(redis_cluster_url: str) -> None:
    client = get_redis(Settings({"REDIS_URL": redis_cluster_url, "FRONTIER_REDIS_CLUSTER": True}))
    assert isinstance(client, FrontierRedisCluster)
    assert len(client.get_primaries()) == 3
    # The frontier's keys share one slot; the seed list is elsewhere.
    assert client.keyslot("{quotes}:wait") == client.keyslot("{quotes}:q:a.example:0")
    assert client.keyslot("quotes:start_urls") != client.keyslot("{quotes}:wait")
    client.close()
    # Off by default: a standalone client, built without I/O.
    assert not isinstance(get_redis(Settings({"REDIS_URL": redis_cluster_url})), RedisCluster)


def test_the_outbox_transaction_runs_the_scripts_on_the_cluster(
    redis_cluster_url: str, rc: RedisCluster
) -> None:
    scheduler, crawler = open_scheduler(redis_cluster_url)
    assert isinstance(scheduler.server, FrontierRedisCluster)
    for name in "abc":
        scheduler.enqueue_request(Request(f"https://a.example/{name}"))
    scheduler.enqueue_request(Request("https://a.example/a"))  # a duplicate
    # The scripts are missing on every node (say, after a failover): the
    # outbox loads them before its MULTI/EXEC.
    rc.script_flush()  # on every primary
    leased = lease_all(scheduler)
    assert sorted(r.url for r in leased) == [f"https://a.example/{n}" for n in "abc"]
    for request in leased:
        scheduler.crawler.engine._slot.remove_request(request)
    assert scheduler.flush_outbox()
    assert crawler.stats.get_value("scheduler/enqueued/redis") == 3
    assert crawler.stats.get_value("dupefilter/filtered") == 1
    assert crawler.stats.get_value("frontier/leases/acked") == 3
    assert rc.scard(A + "dupefilter") == 3
    assert not scheduler.has_pending_requests()


def test_clearing_the_frontier_scans_every_primary(
    redis_cluster_url: str, rc: RedisCluster
) -> None:
    scheduler, _ = open_scheduler(redis_cluster_url, SCHEDULER_PERSIST=False)
    scheduler.enqueue_request(Request("https://a.example/x"))
    assert scheduler.flush_outbox()
    rc.lpush("c:start_urls", "https://a.example/")
    assert rc.exists(A + "count")
    scheduler.close("finished")  # not persisted: flush() clears queue and dupefilter
    assert sorted(rc.scan_iter(match="*")) == [b"c:start_urls"]


def test_the_bloom_filter_works_on_the_cluster(redis_cluster_url: str, rc: RedisCluster) -> None:
    scheduler, _ = open_scheduler(
        redis_cluster_url,
        DUPEFILTER_CLASS="crawler.frontier.bloom.BloomDupeFilter",
        FRONTIER_BLOOM_CAPACITY=1000,
    )
    assert isinstance(scheduler.df, BloomDupeFilter)
    scheduler.enqueue_request(Request("https://a.example/1"))
    scheduler.enqueue_request(Request("https://a.example/1"))
    assert len(lease_all(scheduler)) == 1
    assert rc.strlen(A + "bloom") == scheduler.df.bloom_for("a.example").size
    assert scheduler.df.request_seen(Request("https://a.example/1"))
    scheduler.df.load([b"x" * 20], sites=["b.example"])
    assert scheduler.df.contains([b"x" * 20], sites=["b.example"]) == [True]


# -- the quotes crawl of tests/test_crawl.py, on the cluster ------------------------


@pytest.mark.workers
def test_two_workers_share_the_quotes_crawl_on_a_redis_cluster(
    redis_cluster_url: str, rc: RedisCluster, mongo_uri: str, mongo_db: str, db: Any,
    replay_server: ReplayServer, tmp_path: Path,
) -> None:
    env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
    replay_server.clear_hits()
    rc.lpush("quotes:start_urls", replay_server.url_for("/"))

    workers = crawl("quotes", env, tmp_path, workers=2)

    assert len(workers) == 2
    assert_quotes_crawled(workers, db, replay_server)
    assert all("DeprecationWarning" not in w.log for w in workers)
    assert all("MOVED" not in w.log and "CROSSSLOT" not in w.log for w in workers)
    # The crawl's state is on the cluster: the seed list was read, the
    # frontier's keys live in the slot of {quotes}.
    assert rc.llen("quotes:start_urls") == 0
    scheduled = [h for h in replay_server.hits() if h.path != "/robots.txt"]
    prefixes = shard_prefixes("quotes", CLUSTER_SHARDS)  # FRONTIER_SHARDS unset
    assert sum(rc.scard(p + "dupefilter") for p in prefixes) == len(scheduled)
    assert sum(int(rc.get(p + "count") or 0) for p in prefixes) == 0
