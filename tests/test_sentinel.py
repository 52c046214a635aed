"""``REDIS_URL`` naming Redis Sentinels, and ``FRONTIER_MIN_REPLICAS``.

A real Sentinel group on loopback (:class:`tests.sentinel.SentinelGroup`:
a master, its replica and three sentinels, each a ``redis-server``
process): workers reach the master through the sentinels, a master
SIGKILLed mid-crawl is an outage until the sentinels promote the replica,
and with ``FRONTIER_MIN_REPLICAS=1`` no write the master acknowledged is
lost to that failover, nor counted done while no replica has it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import pytest
from redis.sentinel import MasterNotFoundError
from scrapy import Request, Spider
from scrapy.settings import Settings

from crawler.checks import validate_settings
from crawler.config import (
    SentinelUrl,
    SettingsError,
    masked_url,
    parse_sentinel_url,
)
from crawler.frontier.connection import config_error_message, get_redis
from crawler.frontier.store import Frontier
from devtools.embedded import RedisServer
from tests import scheduler_harness as harness
from tests.faultproxy import FaultProxy
from tests.scheduler_harness import finish
from tests.sentinel import SentinelGroup
from tests.test_failover import _Pair
from tests.test_faults import CRAWL_TIMEOUT, FAST, QUOTES_PAGES, SPIDER, quotes_site
from tests.waiting import wait_for
from tests.workers import start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.conftest import SiteFactory

#: A password of the group, which no log line may carry.
PASSWORD = "sentinel-s3cret"


class _Spider(Spider):
    name = "sn"


def check_settings(settings: Settings) -> list[str]:
    """The lines :func:`validate_settings` refuses ``settings`` with."""
    try:
        validate_settings(settings, warn_unknown=False)
    except SettingsError as exc:
        return exc.problems
    return []


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as started:
        yield started


@pytest.fixture
def locked_group() -> Iterator[SentinelGroup]:
    with SentinelGroup(password=PASSWORD) as started:
        yield started


# -- the URL ---------------------------------------------------------------------


@pytest.mark.parametrize(("url", "parsed"), [
    ("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster/2",
     SentinelUrl((("10.0.0.1", 26379), ("10.0.0.2", 26380)), "mymaster", 2)),
    ("redis+sentinel://:pa%40ss@h1/mymaster",
     SentinelUrl((("h1", 26379),), "mymaster", 0, None, "pa@ss")),
    ("redis+sentinel://app:pw@h1:1,[::1]:2/m/0/",
     SentinelUrl((("h1", 1), ("::1", 2)), "m", 0, "app", "pw")),
    ("redis://h:6379/0", None),
    (None, None),
])
def test_a_sentinel_url_gives_its_sentinels_service_database_and_credentials(
    url: str | None, parsed: SentinelUrl | None,
) -> None:
    assert parse_sentinel_url(url) == parsed


@pytest.mark.parametrize(("url", "words"), [
    ("redis+sentinel://h:26379", "no service name"),
    ("redis+sentinel://h:26379/", "no service name"),
    ("redis+sentinel://h:port/m", "not a number"),
    ("redis+sentinel://h:1/m/x", "the database 'x' is not a number"),
    ("redis+sentinel://h:1/m/0/extra", "too much path"),
    ("redis+sentinel://:secret-word@/m", "without a host"),
])
def test_a_bad_sentinel_url_is_a_configuration_error_without_its_password(
    url: str, words: str,
) -> None:
    errors = check_settings(Settings({"REDIS_URL": url}))
    [line] = [e for e in errors if e.startswith("REDIS_URL=")]
    assert words in line
    assert "secret-word" not in line


def test_sentinels_with_a_redis_cluster_are_a_configuration_error() -> None:
    errors = check_settings(Settings({
        "REDIS_URL": f"redis+sentinel://:{PASSWORD}@h:1/m/0", "FRONTIER_REDIS_CLUSTER": True,
    }))
    assert any("FRONTIER_REDIS_CLUSTER" in e and "Sentinels" in e for e in errors), errors
    assert not any(PASSWORD in e for e in errors)


def test_the_password_of_a_sentinel_url_is_masked() -> None:
    url = f"redis+sentinel://:{PASSWORD}@h1:1,h2:2/m/0"
    assert masked_url(url) == "redis+sentinel://:****@h1:1,h2:2/m/0"


# -- a worker through the sentinels ---------------------------------------------


def test_a_worker_reaches_the_master_through_password_protected_sentinels(
    locked_group: SentinelGroup, caplog: pytest.LogCaptureFixture,
) -> None:
    """The scheduler's client asks the sentinels (with the URL's password)
    for the master and writes there, in the URL's database; the password
    is in no log line."""
    group = locked_group
    url = group.url(3)
    with caplog.at_level(logging.DEBUG):
        scheduler, crawler = harness.open_scheduler(url, _Spider)
        urls = [f"https://s{i}.example/" for i in range(4)]
        for u in urls:
            scheduler.enqueue_request(Request(u))
        assert scheduler.flush_outbox()
        fetched = []
        for _ in urls:
            request = harness.wait_for_request(scheduler)
            fetched.append(request.url)
            finish(scheduler, request)
    assert sorted(fetched) == sorted(urls)
    master = group.master.client()
    master.select(3)  # (a connection of its own: the pool is not shared)
    assert Frontier(master, "sn").audit() == {}
    assert master.exists("{sn}:dupefilter")
    assert scheduler.queue.shards.pending() == 0
    client = get_redis(crawler.settings)
    assert client.connection_pool.get_master_address() == (group.master.host, group.master.port)
    assert PASSWORD not in caplog.text
    master.close()


def test_a_password_the_sentinels_refuse_is_a_configuration_error(
    locked_group: SentinelGroup,
) -> None:
    """Sentinels refusing the URL's password name no master; that is a
    configuration error (no wait fixes it), told in one line without the
    password."""
    settings = Settings({"REDIS_URL": locked_group.url(0, password="not-the-password")})
    client = get_redis(settings)
    with pytest.raises(MasterNotFoundError) as caught:
        client.ping()
    message = config_error_message(caught.value, settings)
    assert message is not None
    assert "sentinels refused the credentials" in message
    assert "not-the-password" not in message
    client.close()


# -- FRONTIER_MIN_REPLICAS --------------------------------------------------------


@pytest.mark.faults
def test_with_min_replicas_writes_are_not_done_while_the_replica_is_down(
    group: SentinelGroup,
) -> None:
    """``FRONTIER_MIN_REPLICAS=1`` and the replica stopped: a worker's
    writes reach the master but are not counted done (``flush_outbox`` says
    False, they stay queued, nothing is leased); the replica back, the
    writes are found to have run (not sent again) and the crawl goes on,
    each request leased once."""
    settings = {"FRONTIER_MIN_REPLICAS": 1, "FRONTIER_MIN_REPLICAS_TIMEOUT": 0.2}
    scheduler, crawler = harness.open_scheduler(group.url(), _Spider, **settings)
    scheduler.enqueue_request(Request("https://a.example/0"))
    assert scheduler.flush_outbox()
    first = harness.wait_for_request(scheduler)

    group.replica.stop()
    urls = [f"https://a.example/{i}" for i in range(1, 4)]
    for u in urls:
        scheduler.enqueue_request(Request(u))
    scheduler.crawler.engine._slot.remove_request(first)  # its ack
    assert not scheduler.flush_outbox()
    assert scheduler.outbox.ops, "the writes were counted done without a replica"
    master = group.master.client()
    # (they ran on the master: the ack and the three pushes)
    assert master.zcard("{sn}:leases") == 0
    assert master.scard("{sn}:dupefilter") == 4
    assert crawler.stats.get_value("frontier/redis/not_replicated") >= 1
    scheduler.session.down_until = 0.0  # (no backoff: the writes are still not done)
    assert scheduler.next_request() is None
    assert scheduler.session.in_doubt is not None

    group.restart_as_replica(group.replica, group.master)
    started = time.monotonic()
    wait_for(lambda: _retry_now(scheduler) and scheduler.flush_outbox(), 10,
             "the writes to be done once the replica is back", 0.05)
    resumed = time.monotonic() - started
    assert resumed < 5, f"{resumed:.1f}s after the replica was back"
    fetched = [first.url]
    while len(fetched) < 1 + len(urls):
        request = harness.wait_for_request(scheduler)
        fetched.append(request.url)
        finish(scheduler, request)
    assert sorted(fetched) == sorted([first.url, *urls])  # each once
    assert scheduler.queue.shards.pending() == 0
    assert master.scard("{sn}:dupefilter") == 4
    assert master.execute_command("WAIT", 1, 2000) == 1
    replica = group.replica.client()
    assert Frontier(replica, "sn").audit() == {}
    assert replica.scard("{sn}:dupefilter") == 4
    master.close()
    replica.close()


@pytest.mark.faults
def test_with_min_replicas_writes_the_promoted_replica_lacks_are_sent_again() -> None:
    """An unplanned failover behind one endpoint with ``FRONTIER_MIN_REPLICAS=1``:
    the replica is cut off and promoted, the worker's next writes reach only
    the old master (no replica acknowledges them: not done), the endpoint
    moves to the new master and the old one becomes its replica (dropping
    those writes). The worker finds out that they did not survive (no
    commit marker on the new master) and sends them again there: every
    request is queued and leased once, the ack is kept."""
    urls = [f"https://a.example/{i}" for i in range(1, 4)]
    with RedisServer() as a, RedisServer() as b:
        pair = _Pair(a, b)
        pair.replicate()
        with FaultProxy(a.url) as proxy:
            scheduler, crawler = harness.open_scheduler(
                proxy.url, _Spider, FRONTIER_MIN_REPLICAS=1, FRONTIER_MIN_REPLICAS_TIMEOUT=0.2,
            )
            scheduler.enqueue_request(Request("https://a.example/0"))
            assert scheduler.flush_outbox()
            first = harness.wait_for_request(scheduler)

            pair.rb.replicaof("NO", "ONE")  # cut off and promoted
            wait_for(lambda: pair.ra.info("replication")["connected_slaves"] == 0, 10,
                     "the old master to lose its replica")
            for u in urls:
                scheduler.enqueue_request(Request(u))
            scheduler.crawler.engine._slot.remove_request(first)  # its ack
            assert not scheduler.flush_outbox()
            assert pair.ra.scard("{sn}:dupefilter") == 4  # ran on the old master only
            assert pair.rb.scard("{sn}:dupefilter") == 1

            proxy.switch_upstream(b.url)
            pair.ra.replicaof(*_Pair._address(b))
            wait_for(lambda: pair.ra.info("replication").get("master_link_status") == "up",
                     10, "the old master to sync as a replica")
            wait_for(lambda: _retry_now(scheduler) and scheduler.flush_outbox(), 15,
                     "the writes to be done on the new master", 0.05)
            fetched = [first.url]
            while len(fetched) < 1 + len(urls):
                request = harness.wait_for_request(scheduler)
                fetched.append(request.url)
                finish(scheduler, request)
        assert sorted(fetched) == sorted([first.url, *urls])  # each once
        assert pair.rb.scard("{sn}:dupefilter") == 4
        assert Frontier(pair.rb, "sn").audit() == {}
        assert Frontier(pair.rb, "sn").pending() == 0
        assert crawler.stats.get_value("frontier/redis/not_replicated") >= 1
        pair.ra.close()
        pair.rb.close()


def _retry_now(scheduler: Any) -> bool:
    """Skip the scheduler's backoff (the test waits on the event instead)."""
    scheduler.session.down_until = 0.0
    return True


@pytest.mark.faults
def test_with_min_replicas_a_round_trip_waits_in_the_same_pipeline() -> None:
    """``WAIT`` goes in the pipeline of the writes (one round trip), after
    them: its reply is dropped from the replies the scheduler reads."""
    from crawler.frontier.replicas import NotReplicated, ReplicaWait
    from devtools.embedded import RedisServer

    with RedisServer() as server:
        client = get_redis(Settings({"REDIS_URL": server.url}))
        frontier = Frontier(client, "rw", replica_wait=ReplicaWait(1, 50))
        frontier.load_scripts()
        with frontier.pipeline() as pipe:
            frontier.alive("w", client=pipe)
            ReplicaWait(1, 50).queue(pipe)
            replies = pipe.execute()
        assert replies[-1] == 0  # no replica
        with pytest.raises(NotReplicated):
            ReplicaWait(1, 50).check(replies[-1])
        with pytest.raises(NotReplicated):
            frontier.recover("w", 1, [])
        ReplicaWait(0 + 1, 50).check(1)
        client.close()


# -- a crawl through a failover ------------------------------------------------------


@pytest.mark.workers
@pytest.mark.faults
@pytest.mark.slow
def test_a_crawl_through_sentinels_loses_nothing_when_the_master_is_killed(
    group: SentinelGroup, site_factory: SiteFactory, mongo_uri: str, mongo_db: str, db: Any,
    tmp_path: Path, record_property: Callable[[str, object], None],
) -> None:
    """Two ``scrapy crawl`` workers of the quotes capture through the
    sentinels, ``FRONTIER_MIN_REPLICAS=1``; mid-crawl the master is
    SIGKILLed, the sentinels promote the replica, and the old master comes
    back (empty) as the new master's replica: the workers wait it out as an
    outage, find the new master through the sentinels, and every page is
    stored once; the new master's frontier ends clean."""
    site = quotes_site(site_factory, latency=0.05)
    master = group.master.client()
    master.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    master.close()
    env = worker_env(group.url(), mongo_uri, mongo_db)
    settings = {**FAST, "FRONTIER_MIN_REPLICAS": 1, "FRONTIER_MIN_REPLICAS_TIMEOUT": 0.5}
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    procs = [start_worker(SPIDER, env, log, settings) for log in logs]
    try:
        wait_for(lambda: len(site.hits()) >= 40, 40, "40 pages fetched")
        old = group.server_at(group.master_address())
        assert old is group.master
        killed = time.monotonic()
        new = group.kill_master_and_wait_for_promotion()
        promoted = time.monotonic() - killed
        group.restart_as_replica(old, new)
        before = len(site.hits())
        wait_for(lambda: len(site.hits()) >= before + 20, 30, "fetches after the failover")
        resumed = time.monotonic() - killed
        workers = wait_workers(procs, logs, CRAWL_TIMEOUT + 30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    record_property("promoted_s", round(promoted, 2))
    record_property("resumed_s", round(resumed, 2))
    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    assert db.pages.count_documents({}) == QUOTES_PAGES
    assert len(db.pages.distinct("url")) == QUOTES_PAGES
    client = new.client()
    assert client.info("replication")["role"] == "master"
    assert Frontier(client, SPIDER).audit() == {}
    assert Frontier(client, SPIDER).pending() == 0
    client.close()
    text = "".join(w.log for w in workers)
    assert "Redis refused" not in text
    assert "Traceback" not in text
