"""Seed intake: no seed exists only in a worker's memory (issue 11, item 5).

The scripts in process against a real Redis and a real Redis Cluster, and
real worker processes killed or stopped while they hold seeds that are not
in the frontier yet.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from redis.crc import key_slot
from scrapy import Request, Spider
from scrapy.settings import Settings

from crawler.frontier.connection import get_redis
from crawler.frontier.intake import IntakeKeys, Reclaimed, SeedIntake
from devtools.embedded import RedisServer
from devtools.replay import Page
from tests import scheduler_harness as harness
from tests.waiting import wait_for
from tests.workers import start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator
    from pathlib import Path

    from devtools.replay import SiteServer
    from tests.conftest import SiteFactory

SEEDS = "pages:start_urls"
REGISTRY = "{pages:start_urls}:intake"
#: A worker whose engine never starts a download (so it never leases, and
#: its lease calls never carry its writes) and whose writes wait 30 s in its
#: outbox (its heartbeat, which also sends them, comes every 20 s): the
#: requests made from the seeds it takes exist only in its memory.
HOLDS_WRITES: dict[str, object] = {
    "SCRAPER_SLOT_MAX_ACTIVE_SIZE": -1,
    "FRONTIER_OUTBOX_DELAY": 30,
    "FRONTIER_LEASE_TIMEOUT": 60,
    "MAX_IDLE_TIME_BEFORE_CLOSE": 0,
}
#: A worker that reclaims abandoned batches within seconds.
FAST: dict[str, object] = {"FRONTIER_LEASE_TIMEOUT": 3, "MAX_IDLE_TIME_BEFORE_CLOSE": 3}


def numbered_pages(path: str, nth: int) -> Page | None:
    """``/p/<n>``: a small HTML page without links, for any n."""
    if path.startswith("/p/"):
        return Page(200, [("Content-Type", "text/html")], b"<title>p</title>")
    return None


@pytest.fixture
def intake(rds: redis.Redis) -> SeedIntake:
    return SeedIntake(rds, SEEDS, "test#0")


def push(client: Any, *seeds: str) -> None:
    """LPUSH ``seeds`` one after the other: the first is the oldest."""
    for seed in seeds:
        client.lpush(SEEDS, seed)


def drain(client: Any) -> list[bytes]:
    """The seed list in the order workers take it (oldest first)."""
    return list(reversed(client.lrange(SEEDS, 0, -1)))


# -- keys ------------------------------------------------------------------------


@pytest.mark.parametrize(("seeds", "registry"), [
    ("quotes:start_urls", "{quotes:start_urls}:intake"),
    ("{crawl}:seeds", "{crawl}:seeds:intake"),
    ("a{b", "{a{b}:intake"),
    ("a{}b", None),
    ("a}b", None),
])
def test_intake_keys_live_in_the_seed_lists_slot(seeds: str, registry: str | None) -> None:
    if registry is None:
        with pytest.raises(ValueError, match="slot"):
            IntakeKeys.for_seed_list(seeds)
        return
    keys = IntakeKeys.for_seed_list(seeds)
    assert keys.registry == registry
    assert keys.batch_prefix == registry + ":"
    batch = SeedIntake(redis.Redis(), seeds, "w#1").new_batch()  # no I/O
    for key in (registry, batch):
        assert key_slot(key.encode()) == key_slot(seeds.encode())


# -- the scripts, in process -------------------------------------------------------


def test_take_moves_the_oldest_seeds_into_a_registered_batch(
    rds: redis.Redis, intake: SeedIntake
) -> None:
    push(rds, "s1", "s2", "s3", "s4", "s5")
    batch = intake.new_batch()
    taken = intake.take(batch, 3)
    assert taken.seeds == [b"s1", b"s2", b"s3"]
    assert not taken.reused
    assert drain(rds) == [b"s4", b"s5"]
    assert rds.lrange(batch, 0, -1) == [b"s1", b"s2", b"s3"]
    assert rds.zscore(REGISTRY, batch) is not None
    # Sent again after a lost reply: the same seeds, nothing more taken.
    again = intake.take(batch, 3)
    assert again.seeds == [b"s1", b"s2", b"s3"]
    assert again.reused
    assert drain(rds) == [b"s4", b"s5"]
    # Its requests are in the frontier: the batch is let go of, once.
    assert intake.done([batch]) == 1
    assert intake.done([batch]) == 0
    assert not rds.exists(batch)
    assert rds.zcard(REGISTRY) == 0
    assert intake.pending() == 0


def test_taking_from_an_empty_seed_list_leaves_nothing_registered(
    rds: redis.Redis, intake: SeedIntake
) -> None:
    taken = intake.take(intake.new_batch(), 10)
    assert taken.seeds == []
    assert rds.zcard(REGISTRY) == 0
    assert rds.keys("*") == []


def test_reclaiming_a_stale_batch_from_many_workers_at_once_returns_its_seeds_once_in_order(
    redis_url: str, rds: redis.Redis, intake: SeedIntake
) -> None:
    push(rds, *[f"s{i}" for i in range(1, 8)])
    older, newer = intake.new_batch(), intake.new_batch()
    assert intake.take(older, 3).seeds == [b"s1", b"s2", b"s3"]
    assert intake.take(newer, 2).seeds == [b"s4", b"s5"]
    push(rds, "s8")  # pushed while the batches were out
    # Fresh batches are not stale.
    assert intake.reclaim_stale(60.0) == []
    # Their owner died: eight workers reclaim them at the same moment.
    results: list[list[Reclaimed]] = []
    barrier = threading.Barrier(8)

    def reclaim(n: int) -> None:
        client = redis.Redis.from_url(redis_url)
        worker = SeedIntake(client, SEEDS, f"other#{n}")
        barrier.wait()
        results.append(worker.reclaim_stale(0.0))
        client.close()

    threads = [threading.Thread(target=reclaim, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    done = sorted((r.batch, r.seeds) for rs in results for r in rs)
    assert done == sorted([(older, 3), (newer, 2)])
    # Each seed once, in the order they were first pushed, before s8.
    assert drain(rds) == [f"s{i}".encode() for i in range(1, 9)]
    assert rds.zcard(REGISTRY) == 0
    assert not rds.exists(older, newer)


def test_a_refreshed_batch_is_not_reclaimed_and_a_reclaimed_one_is_not_revived(
    rds: redis.Redis, intake: SeedIntake
) -> None:
    push(rds, "s1", "s2")
    mine, lost = intake.new_batch(), intake.new_batch()
    intake.take(mine, 1)
    intake.take(lost, 1)
    # The owner was slow: another worker found one batch stale first ...
    rds.zadd(REGISTRY, {lost: 1})
    other = SeedIntake(rds, SEEDS, "other#1")
    assert other.reclaim_stale(30.0) == [Reclaimed(lost, 1)]
    # ... and the other one is as old when the owner's heartbeat comes: it
    # keeps that one, and does not register the reclaimed one again.
    rds.zadd(REGISTRY, {mine: 1})
    assert intake.refresh([mine, lost]) == [lost]
    assert rds.zscore(REGISTRY, lost) is None
    assert other.reclaim_stale(30.0) == []
    assert rds.lrange(mine, 0, -1) == [b"s1"]
    assert drain(rds) == [b"s2"]


def test_a_worker_returns_its_own_batch_whatever_its_age(
    rds: redis.Redis, intake: SeedIntake
) -> None:
    push(rds, "s1", "s2", "s3")
    batch = intake.new_batch()
    intake.take(batch, 2)
    assert intake.return_batch(batch) == 2
    assert intake.return_batch(batch) == 0  # gone already
    assert drain(rds) == [b"s1", b"s2", b"s3"]
    assert rds.zcard(REGISTRY) == 0


def test_malformed_intake_values_are_refused_or_set_aside(
    rds: redis.Redis, intake: SeedIntake, caplog: pytest.LogCaptureFixture
) -> None:
    # A registry member that is no batch of this seed list: removed.
    rds.zadd(REGISTRY, {"not-a-batch": 1})
    # A registered batch key holding a string: unregistered, left in place.
    bad = intake.new_batch()
    rds.set(bad, "x")
    rds.zadd(REGISTRY, {bad: 1})
    assert intake.reclaim_stale(0.0) == [Reclaimed(bad, 0, malformed=True)]
    assert "not an intake batch" in caplog.text
    assert rds.zcard(REGISTRY) == 0
    assert rds.get(bad) == b"x"
    # A seed list that is not a list: the take is refused, nothing written.
    rds.set(SEEDS, "x")
    with pytest.raises(redis.ResponseError, match="nothing was written"):
        intake.take(intake.new_batch(), 5)
    assert rds.zcard(REGISTRY) == 0


def test_an_idle_wait_leaves_the_seed_in_the_list(rds: redis.Redis, intake: SeedIntake) -> None:
    assert intake.wait_for_seeds(0.1) is False
    push(rds, "s1", "s2")
    assert intake.wait_for_seeds(1.0) is True
    assert drain(rds) == [b"s1", b"s2"]


# -- Redis Cluster -------------------------------------------------------------------


class _Spider(Spider):
    name = "c"


@pytest.fixture
def cluster_intake(redis_cluster_url: str) -> Iterator[SeedIntake]:
    client = get_redis(Settings({"REDIS_URL": redis_cluster_url, "FRONTIER_REDIS_CLUSTER": True}))
    yield SeedIntake(client, "c:start_urls", "cluster#0")
    client.close()


@pytest.fixture
def event_loop_set() -> None:
    """The scheduler harness schedules on the current event loop; a test
    run earlier may have left none (``asyncio.run`` unsets it)."""
    try:
        loop = asyncio.get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        asyncio.set_event_loop(asyncio.new_event_loop())


@pytest.mark.usefixtures("event_loop_set", "stop_heartbeats")
def test_the_intake_works_on_a_redis_cluster(
    redis_cluster_url: str, cluster_intake: SeedIntake
) -> None:
    client: Any = cluster_intake.redis
    seeds = cluster_intake.keys.seeds
    assert client.keyslot(cluster_intake.keys.registry) == client.keyslot(seeds)
    client.script_flush()  # every primary: the scripts load when first called
    for i in range(5):
        client.lpush(seeds, f"https://a.example/{i}")
    assert cluster_intake.wait_for_seeds(1.0)

    # Take, schedule through a real scheduler, let go once committed.
    scheduler, _ = harness.open_scheduler(
        redis_cluster_url, _Spider, FRONTIER_REDIS_CLUSTER=True
    )
    batch = cluster_intake.new_batch()
    taken = cluster_intake.take(batch, 3)
    assert taken.seeds == [f"https://a.example/{i}".encode() for i in range(3)]
    for seed in taken.seeds:
        scheduler.enqueue_request(Request(seed.decode(), dont_filter=True))
    scheduler.after_commit(lambda: cluster_intake.done([batch]))
    assert client.exists(batch)
    assert scheduler.flush_outbox()
    assert not client.exists(batch)
    assert cluster_intake.pending() == 0
    assert sorted(r.url for r in harness.lease_all(scheduler)) == [
        f"https://a.example/{i}" for i in range(3)
    ]

    # A batch whose owner died goes back, in order, ahead of the rest.
    dead = cluster_intake.new_batch()
    assert cluster_intake.take(dead, 1).seeds == [b"https://a.example/3"]
    assert cluster_intake.refresh([dead]) == []
    assert cluster_intake.reclaim_stale(0.0) == [Reclaimed(dead, 1)]
    assert list(reversed(client.lrange(seeds, 0, -1))) == [
        b"https://a.example/3", b"https://a.example/4"
    ]


# -- worker processes ----------------------------------------------------------------


def batches(client: Any) -> list[str]:
    return [m.decode() for m in client.zrange(REGISTRY, 0, -1)]


def wait_for_one_full_batch(client: Any, n: int, proc: subprocess.Popen[bytes]) -> str:
    """Wait until the worker has taken all ``n`` seeds into one batch."""
    def taken() -> bool:
        assert proc.poll() is None, "the worker exited"
        held = batches(client)
        return client.llen(SEEDS) == 0 and len(held) == 1 and client.llen(held[0]) == n

    wait_for(taken)
    [batch] = batches(client)
    return batch


def assert_every_seed_crawled_once_more_at_most(site: SiteServer, n: int) -> None:
    fetched = [h.path for h in site.hits() if h.path.startswith("/p/")]
    assert sorted(set(fetched)) == sorted(f"/p/{i}" for i in range(n))


@pytest.mark.workers
def test_a_worker_killed_with_seeds_in_intake_loses_none(
    site_factory: SiteFactory, env: dict[str, str], rds: redis.Redis, tmp_path: Path
) -> None:
    site = site_factory(handler=numbered_pages)
    n = 300
    push(rds, *[site.url_for(f"/p/{i}") for i in range(n)])
    log = tmp_path / "killed.log"
    victim = start_worker("pages", env, log, HOLDS_WRITES)
    try:
        batch = wait_for_one_full_batch(rds, n, victim)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    finally:
        victim.kill()
    # The requests made from the seeds never reached the frontier: the
    # seeds are in the dead worker's intake batch, and only there.
    assert rds.get("{pages}:count") is None
    assert rds.llen(batch) == n

    logs = [tmp_path / "second.log"]
    [worker] = wait_workers([start_worker("pages", env, logs[0], FAST)], logs)

    assert worker.returncode == 0, worker.log[-3000:]
    assert worker.stats["frontier/seeds/reclaimed"] == n
    assert worker.stats["frontier/seeds/read"] == n
    assert_every_seed_crawled_once_more_at_most(site, n)
    assert f"Returned {n} seeds of abandoned intake batch {batch}" in worker.log
    assert rds.llen(SEEDS) == 0
    assert rds.zcard(REGISTRY) == 0
    assert list(rds.scan_iter(match="{pages:start_urls}*")) == []


@pytest.mark.workers
def test_sigterm_during_a_redis_outage_leaves_the_seeds_in_intake_for_the_next_worker(
    site_factory: SiteFactory, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    site = site_factory(handler=numbered_pages)
    n = 50
    with RedisServer(appendonly=True) as server:
        env = worker_env(server.url, mongo_uri, mongo_db)
        client = redis.Redis.from_url(server.url)
        push(client, *[site.url_for(f"/p/{i}") for i in range(n)])
        # Its heartbeat (every 7 s) would send its writes: Redis stops first
        # (with room for a slow start on a busy machine).
        log = tmp_path / "stopped.log"
        proc = start_worker("pages", env, log, {**HOLDS_WRITES, "FRONTIER_LEASE_TIMEOUT": 21})
        try:
            batch = wait_for_one_full_batch(client, n, proc)
            server.stop()  # graceful: the append-only file has the batch
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0
        text = log.read_text()
        # The batch is named; so may be the next one, when Redis stopped
        # while the worker was opening it (its reply lost: it may exist).
        said = re.search(
            rf"seeds taken from {re.escape(SEEDS)} whose requests are not known to be stored "
            rf"in the frontier were not crawled by this worker \({n} known, in intake batches "
            r"([^)]*)\); they stay there, and the next worker of this crawl returns them", text)
        assert said is not None, text[-3000:]
        assert batch in said.group(1).split(", ")
        assert "Returned" not in text

        server.start()
        client = redis.Redis.from_url(server.url)
        assert client.llen(batch) == n
        assert client.get("{pages}:count") is None
        logs = [tmp_path / "next.log"]
        [worker] = wait_workers([start_worker("pages", env, logs[0], FAST)], logs)
        assert worker.returncode == 0, worker.log[-3000:]
        assert worker.stats["frontier/seeds/reclaimed"] == n
        assert_every_seed_crawled_once_more_at_most(site, n)
        assert client.zcard(REGISTRY) == 0
        client.close()


@pytest.mark.workers
def test_seeds_whose_requests_were_not_stored_go_back_to_the_seed_list_at_close(
    site_factory: SiteFactory, env: dict[str, str], rds: redis.Redis, tmp_path: Path
) -> None:
    site = site_factory(handler=numbered_pages)
    n = 30
    urls = [site.url_for(f"/p/{i}") for i in range(n)]
    push(rds, *urls)
    # The frontier refuses every write (its request counter is not a number):
    # Redis answers, but the requests made from the seeds are never stored.
    rds.set("{pages}:count", "x")
    log = tmp_path / "refused.log"
    proc = start_worker("pages", env, log, {**HOLDS_WRITES, "FRONTIER_LEASE_TIMEOUT": 3})
    try:
        wait_for_one_full_batch(rds, n, proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert f"Returned {n} seeds to {SEEDS}: their requests were not" in log.read_text()
    # Back where they were taken from, in their order.
    assert drain(rds) == [u.encode() for u in urls]
    assert rds.zcard(REGISTRY) == 0
    assert site.hits() == []


@pytest.mark.workers
def test_an_idle_worker_takes_a_new_seed_at_once(
    site_factory: SiteFactory, env: dict[str, str], rds: redis.Redis, tmp_path: Path
) -> None:
    site = site_factory(handler=numbered_pages)
    log = tmp_path / "idle.log"
    never_idle: dict[str, object] = {"MAX_IDLE_TIME_BEFORE_CLOSE": 0}
    proc = start_worker("pages", env, log, never_idle)
    try:
        # Idle: blocked on the seed list (robots.txt is fetched with the
        # first seed; wait for it so that the second one is timed alone).
        push(rds, site.url_for("/p/0"))
        wait_for(lambda: any(h.path == "/p/0" for h in site.hits()))
        wait_for(lambda: any(c.get("cmd") == "blmove" for c in rds.client_list()))
        pushed = time.monotonic()
        push(rds, site.url_for("/p/1"))
        wait_for(lambda: any(h.path == "/p/1" for h in site.hits()), timeout=5)
        [hit] = [h for h in site.hits() if h.path == "/p/1"]
        assert hit.started - pushed < 0.5
        wait_for(lambda: rds.zcard(REGISTRY) == 0, timeout=5)
        assert rds.llen(SEEDS) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0
