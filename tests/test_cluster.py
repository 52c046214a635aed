"""The frontier on a real three-master Redis Cluster (``FRONTIER_REDIS_CLUSTER``)."""

from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
from redis.cluster import RedisCluster
from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.reactor import install_reactor, is_reactor_installed
from scrapy.utils.test import get_crawler

from crawler.frontier.bloom import BloomDupeFilter
from crawler.frontier.connection import FrontierRedisCluster, get_redis
from crawler.frontier.scheduler import FrontierScheduler
from tests.workers import crawl, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from crawler.replay import ReplayServer

if not is_reactor_installed():
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")


class _Spider(Spider):
    name = "c"


SETTINGS = {
    "SCHEDULER_QUEUE_CLASS": "crawler.frontier.queue.LeasedPriorityQueue",
    "SCHEDULER_QUEUE_KEY": "{%(spider)s}",
    "FRONTIER_DELAY": 0.0,
    "FRONTIER_CONCURRENCY": 8,
    "SCHEDULER_DUPEFILTER_KEY": "{%(spider)s}:dupefilter",
    "DUPEFILTER_CLASS": "crawler.frontier.dupefilter.FrontierDupeFilter",
    "SCHEDULER_PERSIST": True,
    "FRONTIER_REDIS_CLUSTER": True,
}
_workers = itertools.count()
_opened: list[FrontierScheduler] = []


@pytest.fixture(autouse=True)
def _stop_heartbeats() -> Iterator[None]:
    yield
    while _opened:
        beat = _opened.pop()._heartbeat
        if beat is not None and beat.running:
            beat.stop()


@pytest.fixture
def rc(redis_cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_cluster_url)
    yield client
    client.close()


class _Slot:
    def remove_request(self, request: Request) -> None:
        pass


def open_scheduler(url: str, **settings: Any) -> tuple[FrontierScheduler, Any]:
    worker = {"FRONTIER_WORKER_ID": f"cluster-worker-{next(_workers)}"}
    crawler = get_crawler(_Spider, {**SETTINGS, "REDIS_URL": url, **worker, **settings})
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    crawler.engine = SimpleNamespace(_slot=_Slot())
    scheduler = build_from_crawler(FrontierScheduler, crawler)
    scheduler.open(crawler.spider)
    _opened.append(scheduler)
    return scheduler, crawler


def lease_all(scheduler: FrontierScheduler) -> list[Request]:
    out = []
    while (request := scheduler.next_request()) is not None:
        out.append(request)
    return out


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
    assert rc.scard("{c}:dupefilter") == 3
    assert not scheduler.has_pending_requests()


def test_clearing_the_frontier_scans_every_primary(
    redis_cluster_url: str, rc: RedisCluster
) -> None:
    scheduler, _ = open_scheduler(redis_cluster_url, SCHEDULER_PERSIST=False)
    scheduler.enqueue_request(Request("https://a.example/x"))
    assert scheduler.flush_outbox()
    rc.lpush("c:start_urls", "https://a.example/")
    assert rc.exists("{c}:count")
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
    assert rc.strlen("{c}:bloom") == scheduler.df.bloom.size
    assert scheduler.df.request_seen(Request("https://a.example/1"))
    scheduler.df.load([b"x" * 20])
    assert scheduler.df.contains([b"x" * 20]) == [True]


# -- the quotes crawl of tests/test_crawl.py, on the cluster ------------------------


@pytest.fixture
def db(mongo_uri: str, mongo_db: str) -> Iterator[Any]:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_uri, tz_aware=True)
    yield client[mongo_db]
    client.close()


def test_two_workers_share_the_quotes_crawl_on_a_redis_cluster(
    redis_cluster_url: str, rc: RedisCluster, mongo_uri: str, mongo_db: str, db: Any,
    replay_server: ReplayServer, tmp_path: Path,
) -> None:
    env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
    replay_server.clear_hits()
    rc.lpush("quotes:start_urls", replay_server.url_for("/"))

    workers = crawl("quotes", env, tmp_path, workers=2)

    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    assert db.quotes.count_documents({}) == 100
    assert db.authors.count_documents({}) == 50
    assert all(w.stats.get("downloader/response_count", 0) > 0 for w in workers)
    counts = Counter(h.path for h in replay_server.hits())
    assert counts["/"] == 1
    assert [p for p, n in counts.items() if n > 1] == []
    downloads = sum(w.stats.get("downloader/request_count", 0) for w in workers)
    assert downloads == len(replay_server.hits())
    assert all("DeprecationWarning" not in w.log for w in workers)
    assert all("MOVED" not in w.log and "CROSSSLOT" not in w.log for w in workers)
    # The crawl's state is on the cluster: the seed list was read, the
    # frontier's keys live in the slot of {quotes}.
    assert rc.llen("quotes:start_urls") == 0
    scheduled = [h for h in replay_server.hits() if h.path != "/robots.txt"]
    assert rc.scard("{quotes}:dupefilter") == len(scheduled)
    assert int(rc.get("{quotes}:count") or 0) == 0
