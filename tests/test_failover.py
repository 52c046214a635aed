"""A failover behind one endpoint: the master is demoted (``REPLICAOF``), its
replica promoted, and the address the workers were given (a managed
"primary endpoint": here a :class:`~tests.faultproxy.FaultProxy` whose new
connections go to the new master) now names the new master. Connections
opened before still reach the demoted master, which answers every write
``READONLY``. Real ``redis-server`` processes on loopback, no mock."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import redis
from redis.exceptions import ReadOnlyError, ResponseError
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

from crawler.frontier.connection import (
    NOT_RUN,
    drop_connections,
    is_no_master,
    report_redis_failure,
)
from crawler.frontier.housekeeping import Housekeeper
from crawler.frontier.store import Commit, Frontier, Push
from devtools.embedded import RedisServer
from tests import scheduler_harness as harness
from tests.faultproxy import FaultProxy
from tests.scheduler_harness import finish
from tests.test_faults import (
    CRAWL_TIMEOUT,
    FAST,
    QUOTES_PAGES,
    SPIDER,
    assert_fetched_once,
    quotes_site,
)
from tests.waiting import wait_for
from tests.workers import start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.conftest import SiteFactory

pytestmark = [pytest.mark.usefixtures("stop_heartbeats"), pytest.mark.faults]

#: Seconds within which the worker must lease again once the endpoint names
#: the new master (its backoff starts at 0.5 s and doubles).
RESUME_BOUND = 5.0


class _Spider(Spider):
    name = "fo"


class _Pair:
    """A master ``a`` and its replica ``b`` (clients ``ra``, ``rb``)."""

    def __init__(self, a: RedisServer, b: RedisServer) -> None:
        self.a, self.b = a, b
        self.ra = redis.Redis.from_url(a.url)
        self.rb = redis.Redis.from_url(b.url)

    @staticmethod
    def _address(server: RedisServer) -> tuple[str, int]:
        parts = urlsplit(server.url)
        return parts.hostname or "127.0.0.1", parts.port or 6379

    def replicate(self) -> None:
        """Make ``b`` a replica of ``a`` and wait until it is in sync."""
        self.rb.replicaof(*self._address(self.a))
        wait_for(
            lambda: self.rb.info("replication").get("master_link_status") == "up",
            10, "the replica to sync",
        )

    def fail_over(self) -> None:
        """Promote ``b`` and demote ``a`` to its replica (``REPLICAOF NO
        ONE`` on ``b``, ``REPLICAOF b`` on ``a``), with ``a``'s writes paused
        until ``b`` has every write ``a`` acknowledged (``WAIT``), as a
        managed failover does: no acknowledged write is lost (which only
        FRONTIER_MIN_REPLICAS would promise in an unplanned one)."""
        self.ra.client_pause(10_000, all=False)
        try:
            assert self.ra.execute_command("WAIT", 1, 5000) == 1
            self.rb.replicaof("NO", "ONE")
            self.ra.replicaof(*self._address(self.b))
        finally:
            self.ra.client_unpause()
        wait_for(lambda: self.ra.info("replication").get("role") == "slave", 5, "a demoted")


@pytest.fixture
def pair() -> Iterator[_Pair]:
    with RedisServer() as a, RedisServer() as b:
        servers = _Pair(a, b)
        servers.replicate()
        yield servers
        servers.ra.close()
        servers.rb.close()


@pytest.mark.parametrize("switch_after", [0.0, 1.0], ids=["endpoint-at-once", "endpoint-later"])
def test_a_master_demoted_behind_its_endpoint_is_an_outage_and_the_crawl_resumes(
    pair: _Pair, switch_after: float, caplog: pytest.LogCaptureFixture,
    record_property: Callable[[str, object], None],
) -> None:
    """Mid-crawl, the master is demoted and the endpoint moves to the new
    master (at once, or a second later): the writes answered ``READONLY``
    are kept and sent again to the new master, nothing is refused, no
    request is leased twice, and the worker leases again within seconds."""
    urls = [f"https://s{i % 3}.example/{i}" for i in range(30)]
    with FaultProxy(pair.a.url) as proxy:
        scheduler, crawler = harness.open_scheduler(proxy.url, _Spider, CONCURRENT_REQUESTS=4)
        for url in urls:
            scheduler.enqueue_request(Request(url))
        assert scheduler.flush_outbox()
        fetched: list[str] = []
        for _ in range(12):
            request = harness.wait_for_request(scheduler)
            fetched.append(request.url)
            finish(scheduler, request)
        held = [harness.wait_for_request(scheduler) for _ in range(3)]
        fetched += [r.url for r in held]

        pair.fail_over()
        switched = time.monotonic()
        if switch_after:
            timer = threading.Timer(switch_after, proxy.switch_upstream, (pair.b.url,))
            timer.start()
            switched += switch_after
        else:
            proxy.switch_upstream(pair.b.url)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for request in held:  # their acks meet the demoted master first
                crawler.engine._slot.remove_request(request)
            wait_for(scheduler.flush_outbox, 15, "the acks to reach the new master", 0.01)
            resumed = time.monotonic() - switched
            while len(fetched) < len(urls):
                request = harness.wait_for_request(scheduler)
                fetched.append(request.url)
                finish(scheduler, request)
        if switch_after:
            timer.join()

        record_property("resumed_s", round(resumed, 2))
        assert resumed < RESUME_BOUND, f"resumed {resumed:.1f}s after the endpoint moved"
        assert sorted(fetched) == sorted(urls)  # each once
        assert scheduler.next_request() is None
        assert scheduler.queue.shards.pending() == 0  # every lease acked, on the new master
        assert pair.rb.info("replication")["role"] == "master"
        assert crawler.stats.get_value("frontier/redis/refused") is None
        assert crawler.stats.get_value("frontier/redis/no_master")
        text = caplog.text
        assert "refused" not in text
        assert "is no master" in text


def test_a_frontier_script_sent_to_a_replica_writes_nothing_and_did_not_run(
    pair: _Pair,
) -> None:
    """The frontier's write scripts sent to a replica answer ``READONLY``
    (no success reply, although some of their writes are ``redis.pcall``ed):
    the replica aborts a script at its first write, so nothing is written
    and the call may be sent again (``NOT_RUN``); ``NOSCRIPT`` is not what
    it answers once the scripts are loaded there."""
    master = Frontier(pair.ra, "fo", default_concurrency=8)
    master.load_scripts()
    master.push(b"https://a.example/1", site="a.example", priority=0,
                fingerprint=b"https://a.example/1", dont_filter=False)
    master.push(b"https://a.example/2", site="a.example", priority=0,
                fingerprint=b"https://a.example/2", dont_filter=False)
    leased = master.lease_many(["l1"])
    assert isinstance(leased, list) and len(leased) == 1
    assert pair.ra.execute_command("WAIT", 1, 5000) == 1
    before = {k: pair.rb.dump(k) for k in pair.rb.keys("*")}

    replica = Frontier(pair.rb, "fo", default_concurrency=8)
    replica.load_scripts()
    calls = {
        "push": lambda: replica.push(b"https://b.example/1", site="b.example", priority=0,
                                     fingerprint=b"https://b.example/1", dont_filter=False),
        "lease": lambda: replica.lease_many(["l2"]),
        "ack": lambda: replica.commit(Commit(acks=["l1"], marker=("w", 1))),
        "commit": lambda: replica.commit(Commit(
            pushes=[Push(b"https://c.example/1", "c.example", 0, b"https://c.example/1", False)],
            slots=["l1"], marker=("w", 2),
        )),
        "extend": lambda: replica.extend(["l1"]),
        "alive": lambda: replica.alive("w"),
    }
    for name, call in calls.items():
        with pytest.raises(ReadOnlyError) as caught:
            call()
        assert isinstance(caught.value, NOT_RUN), name
        assert is_no_master(caught.value), name
    assert {k: pair.rb.dump(k) for k in pair.rb.keys("*")} == before


def test_no_master_replies_are_told_apart_from_refusals(pair: _Pair) -> None:
    """``READONLY`` from a real replica and a blocked call cut off by a role
    change (``UNBLOCKED ... instance state changed``) are no-master errors;
    a script's refusal (``WRONGTYPE``) is not. Dropping the pool closes its
    connections: the next call connects again."""
    with pytest.raises(ReadOnlyError) as readonly:
        pair.rb.set("k", "v")
    assert is_no_master(readonly.value)

    blocked: list[BaseException] = []
    client = redis.Redis.from_url(pair.a.url)

    def block() -> None:
        try:
            client.blmove("src", "dst", 10)
        except BaseException as exc:
            blocked.append(exc)

    waiter = threading.Thread(target=block)
    waiter.start()
    wait_for(lambda: pair.ra.info("clients")["blocked_clients"] == 1, 5, "a blocked BLMOVE")
    pair.rb.replicaof("NO", "ONE")
    pair.ra.replicaof(*_Pair._address(pair.b))
    waiter.join(10)
    assert blocked and is_no_master(blocked[0]), blocked

    pair.rb.set("k", "v")
    with pytest.raises(ResponseError) as wrongtype:
        pair.rb.lpush("k", "x")
    assert not is_no_master(wrongtype.value)

    pool = pair.rb.connection_pool
    assert pool._created_connections >= 1  # type: ignore[attr-defined]
    drop_connections(pair.rb)
    assert all(c._sock is None for c in pool._available_connections)  # type: ignore[attr-defined]
    assert pair.rb.ping()
    client.close()


@pytest.mark.workers
def test_a_crawl_goes_on_when_its_master_is_demoted_behind_the_endpoint(
    pair: _Pair, site_factory: SiteFactory, mongo_uri: str, mongo_db: str, db: Any,
    tmp_path: Path, record_property: Callable[[str, object], None],
) -> None:
    """A ``scrapy crawl`` worker of the quotes capture, through an endpoint
    whose master is demoted mid-crawl: it logs a failover (no refusal),
    fetches again within seconds, and every page is fetched and stored once."""
    site = quotes_site(site_factory, latency=0.05)
    with FaultProxy(pair.a.url) as proxy:
        pair.ra.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
        log = tmp_path / "worker.log"
        proc = start_worker(SPIDER, worker_env(proxy.url, mongo_uri, mongo_db), log, FAST)
        try:
            wait_for(lambda: len(site.hits()) >= 40, 40, "40 pages fetched")
            pair.fail_over()
            proxy.switch_upstream(pair.b.url)
            switched, before = time.monotonic(), len(site.hits())
            # (more than the downloads in flight and the leases held then)
            wait_for(lambda: len(site.hits()) >= before + 40, 30, "fetches after the failover")
            resumed = time.monotonic() - switched
            [worker] = wait_workers([proc], [log], CRAWL_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    record_property("resumed_s", round(resumed, 2))
    assert resumed < 2 * RESUME_BOUND, f"40 more pages {resumed:.1f}s after the failover"
    assert worker.returncode == 0, worker.log[-3000:]
    assert "is no master" in worker.log
    assert "refused" not in worker.log
    assert db.pages.count_documents({}) == QUOTES_PAGES
    assert_fetched_once(site)
    assert Frontier(pair.rb, SPIDER).audit() == {}


def test_housekeeping_on_a_demoted_master_is_an_outage_that_drops_the_connections(
    pair: _Pair, caplog: pytest.LogCaptureFixture,
) -> None:
    """Housekeeping whose client reaches a replica (a worker record to
    forget, so its script writes) fails as an outage, not as a bad value in
    Redis: ``READONLY`` is raised, not reported as a refused shard; its
    errback logs "will retry" and drops the client's pooled connections."""
    pair.ra.hset("{hk}:workers", "gone", json.dumps({"last_heartbeat": time.time() - 86400 * 2}))
    assert pair.ra.execute_command("WAIT", 1, 5000) == 1
    keeper = Housekeeper(pair.rb, "hk", worker_forget_after=86400)
    with pytest.raises(ReadOnlyError) as caught:
        keeper.run()
    assert pair.rb.hexists("{hk}:workers", "gone")

    pool = pair.rb.connection_pool
    assert pool._available_connections  # type: ignore[attr-defined]
    crawler = get_crawler(_Spider)
    with caplog.at_level(logging.WARNING):
        report_redis_failure(
            crawler, Failure(caught.value), logging.getLogger("test"),
            retrying="will retry: %s", failed="failed: %s", server=pair.rb,
        )
    assert "will retry" in caplog.text
    assert all(c._sock is None for c in pool._available_connections)  # type: ignore[attr-defined]
