"""Whole sharded crawls under faults: every page stored once, nothing lost.

Real ``scrapy crawl pages`` workers on a sharded frontier
(``FRONTIER_SHARDS`` > 1 on one plain Redis, and the default 16 shards on a
Redis Cluster), mostly through the fault proxy (:mod:`tests.faultproxy`),
many sites over the shards: replies lost to each script, random losses,
workers killed after a reply or by a poison request (:mod:`tests.poison`),
signals during an outage, Redis rolled back a moment, malformed values and
queue entries written mid-crawl. Each case checks the totals: every page
stored once, every shard's audit clean, nothing queued, leased or
dead-lettered unless expected. A request leased beside a poison request is
not dead-lettered with it, as its last delivery is made alone
(``tests/test_last_chance.py``). The long cases (minutes in all) are marked
``slow``; the in-process faults of a sharded frontier are in
``tests/test_shards_faults.py``.
"""
from __future__ import annotations

import json
import random
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from redis.cluster import RedisCluster

from crawler import settings as project
from crawler.frontier.shards import FrontierShards
from crawler.keys import shard_of, shard_prefixes
from devtools.embedded import RedisServer
from tests.faultproxy import FaultProxy
from tests.test_shards import _Sites, served_sites
from tests.waiting import wait_for
from tests.workers import PROJECT_DIR, start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.workers, pytest.mark.faults]

PAGES = 5
LUA = PROJECT_DIR / "crawler" / "frontier" / "lua"
SHORT = json.dumps({"socket_timeout": 1.5, "socket_connect_timeout": 1.5})


@pytest.fixture
def proxy(redis_url: str, rds: redis.Redis) -> Iterator[FaultProxy]:
    rds.script_flush()
    with FaultProxy(redis_url) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def sites() -> Iterator[_Sites]:
    with served_sites(pages=PAGES, delay=0.05) as server:
        yield server


class Crawl:
    """The workers of one test, pointed at the proxy."""

    def __init__(self, env: dict[str, str], tmp_path: Path, settings: dict[str, object]) -> None:
        self.env, self.tmp_path, self.settings = env, tmp_path, settings
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.killed: set[int] = set()

    def start(self, **settings: object) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"w{len(self.logs)}.log"
        proc = start_worker("pages", self.env, log, {**self.settings, **settings})
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        self.killed.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def wait(self, timeout: float = 60) -> list[Any]:
        pairs = [(p, g) for p, g in zip(self.procs, self.logs, strict=True)
                 if p.pid not in self.killed]
        return wait_workers([p for p, _ in pairs], [g for _, g in pairs], timeout)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def make_crawl(
    proxy: FaultProxy, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> Iterator[Any]:
    made: list[Crawl] = []

    def make(**settings: object) -> Crawl:
        c = Crawl(worker_env(proxy.url, mongo_uri, mongo_db), tmp_path, {
            "FRONTIER_LEASE_TIMEOUT": 4, "MAX_IDLE_TIME_BEFORE_CLOSE": 3, **settings})
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def assert_totals(
    workers: list[Any], rds: redis.Redis, db: Any, sites: _Sites, n: int, shards: int,
    dead: int = 0,
) -> None:
    """Every page stored once, every shard clean, ``dead`` dead letters."""
    assert [w.returncode for w in workers] == [0] * len(workers), [w.log[-3000:] for w in workers]
    assert db.pages.count_documents({}) == n * PAGES - dead
    assert len(db.pages.distinct("url")) == n * PAGES - dead
    frontier = FrontierShards.build(rds, "pages", shards)
    assert frontier.audit() == {}
    assert frontier.pending() == 0
    got = [rds.llen(p + "dead") for p in shard_prefixes("pages", shards)]
    assert sum(got) == dead, [rds.lrange(p + "dead", 0, -1)
                              for p in shard_prefixes("pages", shards)]
    assert rds.llen("pages:start_urls") == 0
    assert not rds.keys("{pages:start_urls}:intake:*")


@pytest.mark.slow
@pytest.mark.parametrize(("script", "shards", "mode", "skip"), [
    ("commit.lua", 3, "drop", 3),
    ("commit.lua", 5, "hold", 8),
    ("lease.lua", 3, "hold", 5),
    ("lease.lua", 5, "drop", 12),
    ("extend.lua", 3, "drop", 0),
    ("alive.lua", 5, "hold", 1),
    ("seeds_take.lua", 3, "drop", 0),
    ("seeds_done.lua", 5, "drop", 0),
])
def test_lost_replies_on_a_sharded_crawl(
    script: str, shards: int, mode: str, skip: int, proxy: FaultProxy, rds: redis.Redis,
    db: Any, sites: _Sites, make_crawl: Any,
) -> None:
    n = 15
    if script in ("extend.lua", "alive.lua"):  # (heartbeats while pages download)
        sites.delay = 0.4
    rds.lpush("pages:start_urls", *sites.urls(n))
    crawl = make_crawl(FRONTIER_SHARDS=shards, REDIS_PARAMS=SHORT, FRONTIER_LEASE_TIMEOUT=6,
                       FRONTIER_SEED_BATCH=4)
    rule = proxy.lose_replies(script=(LUA / script).read_text(), skip=skip, times=3,
                              mode=mode)  # type: ignore[arg-type]
    crawl.start()
    crawl.start()
    workers = crawl.wait()
    assert rule.acted >= 1
    assert_totals(workers, rds, db, sites, n, shards)


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "shards"), [(1, 3), (2, 5), (3, 3)])
def test_random_losses_on_a_sharded_crawl(
    seed: int, shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites,
    make_crawl: Any,
) -> None:
    n = 15
    rds.lpush("pages:start_urls", *sites.urls(n))
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_SEED_BATCH=4)
    proxy.lose_randomly(20, seed=seed)
    crawl.start()
    crawl.start()
    # (a fifth of all replies lost: 20 to 50 s alone, past 60 s beside the
    # rest of the suite; what is checked is that nothing is lost)
    workers = crawl.wait(timeout=180)
    proxy.stop_losing()
    assert proxy.lost > 0
    assert_totals(workers, rds, db, sites, n, shards)


BAD_VALUES: dict[str, list[bytes]] = {
    "delay": [b"2s", b"inf", b"nan", b"-1", b"9" * 400, "\uff11\uff10".encode(), b"1e3", b"",
              b" 5", b"2.5", b"0x10", "\u0662".encode(), b"\xff\xfe"],
    "conc": [b"0", b"inf", b"-5", b"9" * 30, "\u2167".encode(), b"1.0", b"nan", b"01"],
    "slow": [b"nan", b"-3", b"1.5", b"inf", b"9" * 40, b"\xff"],
    "rdelay": [b"nan", b"-3", b"1.5", b"inf", b"9" * 40, "\u0663".encode()],
    "robots": [b"no newline here", b"inf\nUser-agent: *\nDisallow: /", b"nan\n",
               b"\xff\xfe\nUser-agent: *", b"-1e400\nDisallow: /", b"1e400\nDisallow: /"],
}


def _prefix_of(site: str, shards: int) -> str:
    return shard_prefixes("pages", shards)[shard_of(site, shards)]


@pytest.mark.slow
@pytest.mark.parametrize("shards", [3, 5])
def test_bad_live_overrides_of_every_kind_on_a_sharded_crawl(
    shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites, make_crawl: Any,
) -> None:
    n = 14
    sites.delay = 0.15
    urls = sites.urls(n)
    names = [u.split("//")[1].rstrip("/") for u in urls]
    rds.lpush("pages:start_urls", *urls)
    crawl = make_crawl(FRONTIER_SHARDS=shards)
    crawl.start()
    crawl.start()
    wait_for(lambda: db.pages.count_documents({}) >= 8, 30, "8 pages")
    written = 0
    for kind, values in BAD_VALUES.items():
        for i, value in enumerate(values):
            site = names[(written + i) % n]
            rds.hset(_prefix_of(site, shards) + kind, site, value)
        written += 3
    # Keys of the wrong type in one shard (none of its sites has overrides).
    last = _prefix_of(names[-1], shards)
    rds.delete(last + "delay", last + "conc", last + "slow")
    rds.set(last + "delay", "5")
    rds.rpush(last + "conc", "1")
    rds.sadd(last + "slow", "x")
    workers = crawl.wait()
    assert_totals(workers, rds, db, sites, n, shards)
    for w in workers:
        warned = [line.split("Bad value in Redis: ", 1)[1] for line in w.log.splitlines()
                  if "Bad value in Redis: " in line]
        assert len(warned) == len(set(warned)), warned  # once each
    logs = "\n".join(w.log for w in workers)
    assert "Traceback" not in logs
    assert "Redis unreachable" not in logs
    assert "refused" not in logs


@pytest.mark.slow
@pytest.mark.parametrize("shards", [3, 5])
def test_a_poison_request_on_a_sharded_crawl_is_dead_lettered(
    shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites, make_crawl: Any,
) -> None:
    n, limit = 10, 3
    urls = sites.urls(n)
    poison = urls[3] + "p2"
    rds.lpush("pages:start_urls", *urls)
    middlewares = {**project.SPIDER_MIDDLEWARES, "tests.poison.KillOnPoisonMiddleware": 45}
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_MAX_DELIVERIES=limit,
                       FRONTIER_LEASE_TIMEOUT=3, CONCURRENT_REQUESTS=2,
                       SPIDER_MIDDLEWARES=json.dumps(middlewares))
    crawl.env = {**crawl.env, "POISON_URLS": poison}
    kills = _restart_killed(crawl, 2, timeout=50)
    workers = crawl.wait()
    dead = [json.loads(d) for p in shard_prefixes("pages", shards)
            for d in rds.lrange(p + "dead", 0, -1)]
    assert poison in [d["url"] for d in dead], dead
    [entry] = [d for d in dead if d["url"] == poison]
    assert entry.get("deliveries") == limit, entry
    assert kills == limit
    in_shard = rds.lrange(_prefix_of(poison.split("//")[1].split("/")[0], shards) + "dead", 0, -1)
    assert poison in [json.loads(d)["url"] for d in in_shard]
    # Every other page stored: the requests leased beside the poison died
    # with it, but its last delivery was made alone, so only it is
    # dead-lettered. Nothing lost.
    assert [d["url"] for d in dead] == [poison], dead
    stored = set(db.pages.distinct("url"))
    assert stored | {poison} == {u + p for u in urls
                                 for p in ["", *(f"p{i}" for i in range(1, PAGES))]}
    assert [w.returncode for w in workers] == [0] * len(workers)
    frontier = FrontierShards.build(rds, "pages", shards)
    assert frontier.audit() == {}
    assert frontier.pending() == 0


@pytest.mark.slow
@pytest.mark.parametrize(("script", "shards", "skip"), [
    ("lease.lua", 5, 4), ("commit.lua", 3, 6), ("seeds_take.lua", 5, 1), ("commit.lua", 5, 15),
])
def test_a_worker_killed_right_after_a_reply_and_restarted_under_its_id(
    script: str, shards: int, skip: int, proxy: FaultProxy, rds: redis.Redis, db: Any,
    sites: _Sites, make_crawl: Any,
) -> None:
    n = 15
    rds.lpush("pages:start_urls", *sites.urls(n))
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_SEED_BATCH=4, FRONTIER_LEASE_TIMEOUT=3,
                       FRONTIER_WORKER_ID="w1")
    live: list[subprocess.Popen[bytes]] = []
    kills = 0

    def kill() -> None:
        nonlocal kills
        kills += 1
        crawl.killed.add(live[-1].pid)
        live[-1].send_signal(signal.SIGKILL)

    rules = [proxy.after_reply(kill, script=(LUA / script).read_text(), skip=skip + 5 * k)
             for k in range(3)]
    live.append(crawl.start())
    other = crawl.start(FRONTIER_WORKER_ID="w2")
    deadline = time.monotonic() + 40
    while kills < 3 and time.monotonic() < deadline and other.poll() is None:
        if live[-1].poll() is not None:
            live.append(crawl.start())  # at once, under its id
            time.sleep(0.3)  # (one kill each, in turn: the rules count replies)
        time.sleep(0.02)
    if live[-1].poll() is not None:
        live.append(crawl.start())
    workers = crawl.wait()
    assert sum(r.acted for r in rules) >= 1
    assert_totals(workers, rds, db, sites, n, shards)


def _corrupt(rds: redis.Redis, shards: int, names: list[str]) -> list[str]:
    """Hand-write malformed values into frontier keys of every shard, as an
    operator with redis-cli could; returns what was done."""
    done = []
    prefixes = shard_prefixes("pages", shards)
    by_shard: dict[int, list[str]] = {}
    for site in names:
        by_shard.setdefault(shard_of(site, shards), []).append(site)
    for i, sites_here in by_shard.items():
        p, site = prefixes[i], sites_here[0]
        rds.hset(p + "active", site, "x")
        rds.hset(p + "due", site, "soon")
        rds.hset(p + "joined", site, "-1.5e9")
        rds.hset(p + "wactive", f"w9#ghost\t{site}", "many")
        rds.zadd(p + "alive", {"w9#ghost": 4e12})  # a phantom worker, live for ages
        rds.zadd(p + "wait", {"no-such-site:1": 0})
        rds.zadd(p + "ready", {"no-such-site:2": -1})
        rds.hset(p + "prio", "x", "y")
        rds.hset(p + "lslot", "w9#ghost:1", "no-such-site:3")
        rds.zadd(p + "leases", {"w9#ghost:2": 1})  # expired, no data
        rds.hset(p + "ldata", "w9#ghost:3", "garbage")
        rds.zadd(p + "leases", {"w9#ghost:3": 1})  # expired, unreadable data
        rds.set(p + "sent:w9#ghost", "not a number")
        done.append(p)
        # a live lease's data overwritten, if one is held now
        for lease_id in rds.zrange(p + "leases", 0, -1):
            if not lease_id.startswith(b"w9#"):
                rds.hset(p + "ldata", lease_id, b"\x00garbage\t\t")
                done.append(lease_id.decode())
                break
    return done


@pytest.mark.slow
@pytest.mark.parametrize("shards", [3, 5])
def test_malformed_frontier_values_mid_crawl(
    shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites, make_crawl: Any,
) -> None:
    n = 12
    sites.delay = 0.2
    urls = sites.urls(n)
    names = [u.split("//")[1].rstrip("/") for u in urls]
    rds.lpush("pages:start_urls", *urls)
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_LEASE_TIMEOUT=3)
    crawl.start()
    crawl.start()
    wait_for(lambda: db.pages.count_documents({}) >= 12, 30, "12 pages")
    done = _corrupt(rds, shards, names)
    workers = crawl.wait()
    logs = "\n".join(w.log for w in workers)
    assert "Traceback" not in logs, logs[-5000:]
    prefixes = shard_prefixes("pages", shards)
    dead = [json.loads(d) for p in prefixes for d in rds.lrange(p + "dead", 0, -1)]
    # what may be dead-lettered: the unreadable lease data written by hand
    stored = set(db.pages.distinct("url"))
    assert db.pages.count_documents({}) == len(stored)
    assert len(stored) == n * PAGES, (len(stored), dead, done)
    for p in prefixes:
        rds.hdel(p + "prio", "x")
        rds.zrem(p + "alive", "w9#ghost")
        # (junk naming no lease and no live worker, or written for a site
        # whose work was done: nothing reads it again)
        rds.hdel(p + "lslot", "w9#ghost:1")
        for site, value in rds.hgetall(p + "active").items():
            if value == b"x":
                rds.hdel(p + "active", site)
        for site, value in rds.hgetall(p + "joined").items():
            if value == b"-1.5e9":
                rds.hdel(p + "joined", site)
        for field in rds.hkeys(p + "wactive"):
            if field.startswith(b"w9#ghost"):
                rds.hdel(p + "wactive", field)
    # (only the unreadable lease data written by hand)
    assert [d.get("reason") for d in dead] == ["malformed lease data"] * len(dead), dead
    frontier = FrontierShards.build(rds, "pages", shards)
    assert frontier.audit() == {}, done
    assert frontier.pending() == 0


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "shards"), [("drop", 3), ("hold", 5)])
def test_sigterm_whose_giveback_and_leave_replies_are_lost(
    mode: str, shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites,
    make_crawl: Any,
) -> None:
    n = 12
    sites.delay = 0.3
    rds.lpush("pages:start_urls", *sites.urls(n))
    crawl = make_crawl(FRONTIER_SHARDS=shards, REDIS_PARAMS=SHORT, FRONTIER_LEASE_TIMEOUT=8,
                       CONCURRENT_REQUESTS=8)
    first = crawl.start()
    wait_for(lambda: db.pages.count_documents({}) >= 10, 30, "10 pages")
    commit = proxy.lose_replies(script=(LUA / "commit.lua").read_text(), times=2,
                                mode=mode)  # type: ignore[arg-type]
    leave = proxy.lose_replies(command="ZREM", mode=mode)  # type: ignore[arg-type]
    first.send_signal(signal.SIGTERM)
    first.wait(30)
    assert first.returncode == 0
    assert commit.acted >= 1
    crawl.start()
    workers = crawl.wait()
    assert_totals(workers, rds, db, sites, n, shards)
    assert leave.acted <= 1


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "shards", "extra"), [
    (5, 3, {"FRONTIER_HOUSEKEEPING_INTERVAL": 0.5, "FRONTIER_SITE_FORGET_AFTER": 1}),
    (6, 5, {"DUPEFILTER_CLASS": "crawler.frontier.bloom.BloomDupeFilter",
            "FRONTIER_BLOOM_CAPACITY": 10000}),
    (7, 3, {"FRONTIER_REVISIT_AFTER": 3600, "FRONTIER_HOUSEKEEPING_INTERVAL": 0.5}),
])
def test_random_losses_and_kills_with_housekeeping_bloom_revisits(
    seed: int, shards: int, extra: dict[str, object], proxy: FaultProxy, rds: redis.Redis,
    db: Any, sites: _Sites, make_crawl: Any,
) -> None:
    rng = random.Random(seed)
    n = 16
    sites.delay = 0.1
    rds.lpush("pages:start_urls", *sites.urls(n))
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_SEED_BATCH=3, FRONTIER_LEASE_TIMEOUT=3,
                       CONCURRENT_REQUESTS=4, **extra)
    proxy.lose_randomly(25, seed=seed)
    live = {w: crawl.start(FRONTIER_WORKER_ID=w) for w in ("w1", "w2", "w3")}
    for _ in range(4):
        time.sleep(rng.uniform(0.5, 2.0))
        w = rng.choice(sorted(live))
        if live[w].poll() is None:
            crawl.kill(live[w])
            live[w] = crawl.start(FRONTIER_WORKER_ID=w)
    # Losses end with the kills: idle workers keep calling Redis, and with
    # replies still lost they never count as idle; a robots.txt read that
    # keeps failing backs off up to 30 s (REDIS_BACKOFF_CAP), documented.
    proxy.stop_losing()
    workers = crawl.wait()
    assert_totals(workers, rds, db, sites, n, shards)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["KILL", "TERM"])
@pytest.mark.parametrize("shards", [3, 5])
def test_a_signal_during_an_outage_after_seed_intake_on_a_sharded_crawl(
    signum: int, shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites,
    make_crawl: Any,
) -> None:
    n = 20
    urls = sites.urls(n)
    rds.lpush("pages:start_urls", *urls)
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_SEED_BATCH=5, CONCURRENT_REQUESTS=8)
    # Redis becomes unreachable as the worker gets its second batch.
    host = urls[0].split("//")[1].split(":")[0].rsplit(".", 1)[0].encode()
    proxy.outage_after(reply=host, skip=1, command="EVALSHA")
    first = crawl.start()
    wait_for(lambda: proxy.in_outage, 20, "the outage")
    crawl.killed.add(first.pid)
    first.send_signal(signum)
    first.wait(30)
    proxy.end_outage()
    crawl.start()
    crawl.start()
    workers = crawl.wait()
    assert_totals(workers, rds, db, sites, n, shards)


@pytest.mark.slow
@pytest.mark.parametrize(("shards", "at", "more"), [
    (3, 15, 6),
    # A snapshot taken at the first page stored loses pages under load, on
    # main and on the commit before the core redesign alike (about 1 run in
    # 10 beside other crawls: 4 to 24 of 70 pages never crawled, every
    # worker idle, nothing left in Redis; not this worker's local
    # fingerprints: FRONTIER_LOCAL_SEEN=0 loses them too). Open, not fixed.
    pytest.param(5, 1, 3, marks=pytest.mark.xfail(
        strict=False, reason="open: a rollback to the first moments of a crawl can lose pages")),
    (3, 30, 15),
    (1, 5, 5),
])
def test_redis_rolled_back_a_moment_mid_crawl_on_a_sharded_crawl(
    shards: int, at: int, more: int, mongo_uri: str, mongo_db: str, db: Any, sites: _Sites,
    tmp_path: Path,
) -> None:
    """Redis comes back with its state of a moment before (a snapshot
    taken, the crawl going on, the server killed and started from the
    snapshot: what a failover to a lagging replica or a crash with
    ``appendfsync everysec`` does). The README: that moment's leases come
    back and are crawled again, nothing is dropped as a duplicate."""
    n = 14
    sites.delay = 0.1
    with RedisServer(appendonly=False) as server:
        rds = redis.Redis.from_url(server.url)
        rds.lpush("pages:start_urls", *sites.urls(n))
        crawl = Crawl(worker_env(server.url, mongo_uri, mongo_db), tmp_path, {
            "FRONTIER_LEASE_TIMEOUT": 4, "MAX_IDLE_TIME_BEFORE_CLOSE": 3,
            "FRONTIER_SHARDS": shards, "FRONTIER_SEED_BATCH": 4, "REDIS_PARAMS": SHORT})
        try:
            crawl.start()
            crawl.start()
            wait_for(lambda: db.pages.count_documents({}) >= at, 30, f"{at} pages")
            rds.save()
            before = db.pages.count_documents({})
            # (60 s: 15 more pages took past 30 s beside the suite, before
            # and after the core redesign alike; at most the crawl's pages:
            # the pipeline writes in batches, so the count can pass ``at``
            # by more than one page, with fewer than ``more`` left to crawl)
            after = min(before + more, n * PAGES)
            wait_for(lambda: db.pages.count_documents({}) >= after, 60, "more pages")
            server.kill()
            server.start()
            workers = crawl.wait()
        finally:
            crawl.stop()
        rds = redis.Redis.from_url(server.url)
        assert_totals(workers, rds, db, sites, n, shards)


@pytest.mark.slow
@pytest.mark.parametrize("shards", [3, 5])
def test_malformed_queue_entries_mid_crawl(
    shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites, make_crawl: Any,
) -> None:
    n = 10
    # (slow pages: the queues fill while each site serves one at a time, on
    # a busy machine too)
    sites.delay = 0.6
    rds.lpush("pages:start_urls", *sites.urls(n))
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_CONCURRENCY=1, FRONTIER_LEASE_TIMEOUT=3)
    crawl.start()
    prefixes = shard_prefixes("pages", shards)

    def queued() -> int:
        return sum(int(rds.get(p + "count") or 0) for p in prefixes)

    wait_for(lambda: queued() >= 20, 60, "20 queued")
    done = []
    for p in prefixes:
        fields = sorted(rds.hkeys(p + "qm"))
        if fields:
            rds.hset(p + "qm", fields[0], "x y")
            done.append(("qm", p, fields[0]))
        lv = sorted(rds.hkeys(p + "lv"))
        if len(lv) > 1:
            rds.hset(p + "lv", lv[1], "zz 9 \xff")
            done.append(("lv", p, lv[1]))
        prio = sorted(rds.hkeys(p + "prio"))
        if prio:
            rds.hset(p + "prio", prio[0], "many")
            done.append(("prio", p, prio[0]))
    workers = crawl.wait()
    logs = "\n".join(w.log for w in workers)
    assert "Traceback" not in logs, logs[-5000:]
    dead = [json.loads(d) for p in prefixes for d in rds.lrange(p + "dead", 0, -1)]
    stored = set(db.pages.distinct("url"))
    assert (len(stored), dead) == (n * PAGES, []), done
    frontier = FrontierShards.build(rds, "pages", shards)
    assert frontier.audit() == {}, done
    assert frontier.pending() == 0


@pytest.mark.slow
@pytest.mark.parametrize(("shards", "mode"), [(3, "drop"), (5, "hold")])
def test_the_reads_that_find_out_a_lost_round_trip_lose_their_replies_too(
    shards: int, mode: str, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites,
    make_crawl: Any,
) -> None:
    n = 12
    rds.lpush("pages:start_urls", *sites.urls(n))
    crawl = make_crawl(FRONTIER_SHARDS=shards, REDIS_PARAMS=SHORT, FRONTIER_LEASE_TIMEOUT=8)
    commit = proxy.lose_replies(script=(LUA / "commit.lua").read_text(), skip=4, times=2,
                                mode=mode)  # type: ignore[arg-type]
    reads = proxy.lose_replies(b":sent:", command="GET", times=4,
                               mode=mode)  # type: ignore[arg-type]
    hmget = proxy.lose_replies(command="HMGET", times=2, mode=mode)  # type: ignore[arg-type]
    crawl.start()
    crawl.start()
    workers = crawl.wait()
    assert commit.acted >= 1 and reads.acted >= 1, (commit.acted, reads.acted, hmget.acted)
    assert_totals(workers, rds, db, sites, n, shards)


@pytest.mark.slow
@pytest.mark.cluster
def test_poison_and_bad_overrides_on_a_cluster_with_the_default_16_shards(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, db: Any, sites: _Sites,
    tmp_path: Path,
) -> None:
    n, limit, shards = 12, 3, 16
    urls = sites.urls(n)
    names = [u.split("//")[1].rstrip("/") for u in urls]
    poison = urls[3] + "p2"
    rc = RedisCluster.from_url(redis_cluster_url)
    middlewares = {**project.SPIDER_MIDDLEWARES, "tests.poison.KillOnPoisonMiddleware": 45}
    env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1",
           "POISON_URLS": poison}
    crawl = Crawl(env, tmp_path, {
        "FRONTIER_LEASE_TIMEOUT": 3, "MAX_IDLE_TIME_BEFORE_CLOSE": 3,
        "FRONTIER_MAX_DELIVERIES": limit, "CONCURRENT_REQUESTS": 1,
        "SPIDER_MIDDLEWARES": json.dumps(middlewares)})
    try:
        rc.lpush("pages:start_urls", *urls)
        for i, (kind, value) in enumerate([("delay", "2s"), ("conc", "inf"), ("conc", "0"),
                                           ("slow", "nan"), ("rdelay", "-1")]):
            site = names[i + 5]
            rc.hset(_prefix_of(site, shards) + kind, site, value)
        kills = _restart_killed(crawl, 2, timeout=60)
        workers = crawl.wait()
        prefixes = shard_prefixes("pages", shards)
        dead = [json.loads(d) for p in prefixes for d in rc.lrange(p + "dead", 0, -1)]
        assert [(d["url"], d["deliveries"]) for d in dead] == [(poison, limit)], dead
        assert kills == limit
        stored = set(db.pages.distinct("url"))
        assert db.pages.count_documents({}) == len(stored)
        assert stored | {poison} == {
            u + p for u in urls for p in ["", *(f"p{i}" for i in range(1, PAGES))]}
        assert [w.returncode for w in workers] == [0] * len(workers)
        frontier = FrontierShards.build(rc, "pages", shards)
        assert frontier.audit() == {}
        assert frontier.pending() == 0
    finally:
        crawl.stop()
        rc.close()


def _restart_killed(
    crawl: Crawl, n: int, timeout: float, first: subprocess.Popen[bytes] | None = None
) -> int:
    """Start ``n`` workers (ids ``w1``..; with ``first``, that one worker
    started already, under the crawl's own id), restart each one the
    poison kills at once under its id, until all exit on their own;
    returns the kills."""
    if first is not None:
        live, ids = [first], [None]
    else:
        ids = [f"w{i + 1}" for i in range(n)]
        live = [crawl.start(FRONTIER_WORKER_ID=i) for i in ids]
    kills = 0

    def ended() -> bool:
        nonlocal kills
        for i, proc in enumerate(live):
            if proc.poll() == -signal.SIGKILL:
                kills += 1
                crawl.killed.add(proc.pid)
                live[i] = crawl.start() if ids[i] is None else crawl.start(
                    FRONTIER_WORKER_ID=ids[i])
        return all(p.poll() is not None for p in live)

    wait_for(ended, timeout, "the crawl to end", 0.05)
    return kills


def _crawl_with_poison(
    crawl: Crawl, poison: str, first: subprocess.Popen[bytes], timeout: float = 40
) -> tuple[list[Any], int]:
    """Restart the worker under its id each time the poison kills it, until
    it exits on its own; returns the finished workers and the kills."""
    kills = _restart_killed(crawl, 1, timeout, first)
    return crawl.wait(), kills


@pytest.mark.parametrize("shards", [3])
def test_a_request_leased_beside_a_poison_request_is_not_dead_lettered_with_it(
    shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites, make_crawl: Any,
) -> None:
    """Two seeds of two sites, one of them poison (its download kills the
    worker): a worker leases both in one call and dies; restarted at once
    under its id, it leases both again once the leases expire, and dies
    again. Only the poison should end in the dead letters, after
    FRONTIER_MAX_DELIVERIES deliveries; the other page should be stored."""
    limit = 3
    poison, healthy = (u + "p1" for u in sites.urls(2))
    rds.lpush("pages:start_urls", poison, healthy)
    middlewares = {**project.DOWNLOADER_MIDDLEWARES,
                   "tests.poison.KillOnPoisonMiddleware": 50}
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_MAX_DELIVERIES=limit,
                       FRONTIER_LEASE_TIMEOUT=2, CONCURRENT_REQUESTS=2,
                       FRONTIER_WORKER_ID="w1", MAX_IDLE_TIME_BEFORE_CLOSE=2,
                       DOWNLOADER_MIDDLEWARES=json.dumps(middlewares))
    crawl.env = {**crawl.env, "POISON_URLS": poison}
    workers, kills = _crawl_with_poison(crawl, poison, crawl.start())
    assert [w.returncode for w in workers] == [0]
    assert kills == limit
    dead = [json.loads(d) for p in shard_prefixes("pages", shards)
            for d in rds.lrange(p + "dead", 0, -1)]
    assert [(d["url"], d["deliveries"]) for d in dead] == [(poison, limit)]
    # (the healthy page was stored, and the pages it links to were crawled)
    stored = db.pages.distinct("url")
    assert healthy in stored and poison not in stored
    assert db.pages.count_documents({}) == len(stored)


@pytest.mark.parametrize("shards", [1, 3])
def test_a_poison_seed_that_kills_its_worker_as_its_download_starts_is_dead_lettered(
    shards: int, proxy: FaultProxy, rds: redis.Redis, db: Any, sites: _Sites, make_crawl: Any,
) -> None:
    """A seed whose download kills its worker at once (before the seed's
    intake batch was deleted, a reactor turn after the commit that queued
    its request): the batch was returned to the seed list after each death
    and a fresh copy of the poison queued, with no delivery counted, so it
    was fetched again and again (6 kills instead of 3 here; with two
    seeds and CONCURRENT_REQUESTS=2, the workers never stopped being
    killed). Now it ends in the dead letters after its deliveries, and a
    seed pushed after it is crawled."""
    limit = 3
    poison, healthy = (u + "p1" for u in sites.urls(2))
    rds.lpush("pages:start_urls", poison)
    middlewares = {**project.DOWNLOADER_MIDDLEWARES,
                   "tests.poison.KillOnPoisonMiddleware": 50}
    crawl = make_crawl(FRONTIER_SHARDS=shards, FRONTIER_MAX_DELIVERIES=limit,
                       FRONTIER_LEASE_TIMEOUT=2, CONCURRENT_REQUESTS=1,
                       FRONTIER_WORKER_ID="w1", MAX_IDLE_TIME_BEFORE_CLOSE=2,
                       DOWNLOADER_MIDDLEWARES=json.dumps(middlewares))
    crawl.env = {**crawl.env, "POISON_URLS": poison}
    first = crawl.start()
    wait_for(lambda: first.poll() is not None, 20, "the first kill")
    rds.lpush("pages:start_urls", healthy)
    workers, kills = _crawl_with_poison(crawl, poison, first)
    assert [w.returncode for w in workers] == [0]
    assert kills == limit
    dead = [json.loads(d) for p in shard_prefixes("pages", shards)
            for d in rds.lrange(p + "dead", 0, -1)]
    assert [(d["url"], d["deliveries"]) for d in dead] == [(poison, limit)]
    base = healthy.removesuffix("p1")  # (its page links to p1 ... p4)
    assert sorted(db.pages.distinct("url")) == [f"{base}p{i}" for i in range(1, PAGES)]
    assert rds.llen("pages:start_urls") == 0
    assert not rds.keys("{pages:start_urls}:intake:*")
    frontier = FrontierShards.build(rds, "pages", shards)
    assert frontier.audit() == {}
    assert frontier.pending() == 0
