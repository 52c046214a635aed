"""Nothing lost, proven: real workers against a Redis that misbehaves.

Every worker is a real ``scrapy crawl pages`` process whose ``REDIS_URL`` is
pytestmark = pytest.mark.faults


a :class:`~tests.faultproxy.FaultProxy` in front of the session's
``redis-server``: the proxy loses the replies to chosen commands (Redis ran
them, the worker never hears back), cuts Redis off, or lets the test kill a
worker at a chosen moment. Each case then checks what was stored and what
the frontier holds:

- every page stored once in MongoDB (the ``pages`` collection's count);
- the frontier clean: ``Frontier.audit()`` finds no lease left, no download
  slot taken and a pending count equal to what is queued, and nothing went
  to the dead-letter list ``{pages}:dead`` unless the case expects it.

Cases a to g are those of issue 11; h is one the soak (``bench/soak.py``)
found.

The proxy's own behaviour is checked first, against the real server.
"""

from __future__ import annotations

import json
import queue
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

import pytest
import redis

from crawler.frontier.store import Frontier
from devtools.replay import Page, default_warc_path, generated_site, load_warc
from tests.faultproxy import FaultProxy
from tests.waiting import wait_for
from tests.workers import PROJECT_DIR, Worker, start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from devtools.replay import SiteServer
    from tests.conftest import SiteFactory

SPIDER = "pages"
#: Short leases, so that a lease whose reply was lost (or whose worker was
#: killed) comes back within seconds; workers close after 3 idle seconds.
FAST: dict[str, object] = {"FRONTIER_LEASE_TIMEOUT": 3, "MAX_IDLE_TIME_BEFORE_CLOSE": 3}
#: A worker's Redis calls time out after 1.5 s (for held replies; the
#: default, 10 s, would make each hold last that long).
SHORT_REDIS_TIMEOUT = json.dumps({"socket_timeout": 1.5, "socket_connect_timeout": 1.5})
#: Settings of a worker whose replies are held past its socket timeout.
HOLD: dict[str, object] = {"REDIS_PARAMS": SHORT_REDIS_TIMEOUT, "FRONTIER_LEASE_TIMEOUT": 6}
#: Longest a crawl of a test may take before its workers are killed.
CRAWL_TIMEOUT = 50.0
#: HTML pages of the quotes capture that the pages spider stores.
QUOTES_PAGES = 213
LUA = PROJECT_DIR / "crawler" / "frontier" / "lua"


def lua_source(name: str) -> bytes:
    """A script's source as it is on disk now (it may be loaded with a
    prefix: the proxy matches any loaded script that contains it)."""
    return (LUA / name).read_bytes()


# -- fixtures and helpers -------------------------------------------------------


@pytest.fixture
def proxy(redis_url: str, rds: redis.Redis) -> Iterator[FaultProxy]:
    """A fault proxy in front of this test's Redis, stopped after the test.

    Redis forgets its scripts first, so that the workers load every script
    through the proxy, which learns their SHA1s.
    """
    rds.script_flush()
    with FaultProxy(redis_url) as fault_proxy:
        yield fault_proxy


class Pool:
    """The ``pages`` worker processes of one test, all pointed at the proxy."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        self.env, self.tmp_path = env, tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.signalled: set[int] = set()  # pids this test killed or stopped

    def start(self, **settings: object) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"{SPIDER}-{len(self.logs)}.log"
        proc = start_worker(SPIDER, self.env, log, {**FAST, **settings})
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def signal(self, proc: subprocess.Popen[bytes], signum: int) -> None:
        """Send ``signum``; the worker no longer counts among those that
        must exit cleanly."""
        self.signalled.add(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signum)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL ``proc`` and reap it."""
        self.signal(proc, signal.SIGKILL)
        proc.wait(timeout=10)

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def wait(self, timeout: float = CRAWL_TIMEOUT) -> list[Worker]:
        """Wait for the workers not signalled to exit on their own (idle)."""
        pairs = [(p, log) for p, log in zip(self.procs, self.logs, strict=True)
                 if p.pid not in self.signalled]
        return wait_workers([p for p, _ in pairs], [log for _, log in pairs], timeout)

    def wait_signalled(self, timeout: float = 30.0) -> None:
        """Wait for the signalled workers to exit; kill and fail past ``timeout``."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            if proc.pid in self.signalled:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    raise AssertionError(
                        f"worker {proc.pid} still running {timeout}s after its signal"
                    ) from None

    def log_text(self) -> str:
        return "\n".join(log.read_text() for log in self.logs if log.exists())

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def pool(proxy: FaultProxy, mongo_uri: str, mongo_db: str, tmp_path: Path) -> Iterator[Pool]:
    workers = Pool(worker_env(proxy.url, mongo_uri, mongo_db), tmp_path)
    yield workers
    workers.stop_all()


def quotes_site(site_factory: SiteFactory, latency: float = 0.0) -> SiteServer:
    """The quotes capture served on 127.0.0.1 (every page links to others)."""
    warc = default_warc_path()
    if not warc.is_file():
        pytest.skip(f"WARC capture not found at {warc}")
    return site_factory(load_warc(warc), latency=latency)


def site_name(site: SiteServer) -> str:
    """The frontier's name for the site (host:port)."""
    return f"{site.host}:{site.port}"


def assert_clean_exits(workers: list[Worker]) -> None:
    assert [w.returncode for w in workers] == [0] * len(workers), [
        w.log[-3000:] for w in workers
    ]


def assert_frontier_clean(rds: redis.Redis) -> None:
    """Nothing queued, leased, held as a slot or dead-lettered."""
    assert Frontier(rds, SPIDER).audit() == {}
    dead = [json.loads(d) for d in rds.lrange(f"{{{SPIDER}}}:dead", 0, -1)]
    assert dead == []
    assert rds.llen(f"{SPIDER}:start_urls") == 0


def assert_fetched_once(site: SiteServer) -> None:
    """No path was downloaded twice (duplicates in the frontier would be)."""
    counts = Counter(h.path for h in site.hits())
    assert [p for p, n in counts.items() if n > 1] == []


def resent_calls(proxy: FaultProxy, script: bytes) -> list[tuple[bytes, ...]]:
    """Calls of ``script`` whose reply was lost and that were sent again
    with the very same arguments (same lease ids: a blind resend)."""
    calls = proxy.commands(script=script)
    sent = Counter(c.args for c in calls)
    ours = set(calls)
    lost = [c for loss in proxy.losses() for c in loss.commands if c in ours]
    return [c.args for c in lost if sent[c.args] > 1]


# -- the proxy itself -------------------------------------------------------------


def direct_and_proxied(proxy: FaultProxy, redis_url: str) -> tuple[redis.Redis, redis.Redis]:
    """A client of Redis itself and one through the proxy that never retries
    (a lost reply surfaces as the error the caller sees)."""
    return (
        redis.Redis.from_url(redis_url),
        redis.Redis.from_url(proxy.url, retry=None, socket_timeout=1),
    )


def test_proxy_forwards_commands_and_records_them(proxy: FaultProxy, redis_url: str) -> None:
    direct, client = direct_and_proxied(proxy, redis_url)
    assert client.set("k", "v")
    assert client.get("k") == b"v"
    assert direct.get("k") == b"v"
    assert [c.args for c in proxy.commands("SET")] == [(b"k", b"v")]
    assert proxy.lost == 0


def test_a_dropped_reply_leaves_the_command_run(proxy: FaultProxy, redis_url: str) -> None:
    direct, client = direct_and_proxied(proxy, redis_url)
    rule = proxy.lose_replies(b"INCR", mode="drop")
    with pytest.raises(redis.ConnectionError):
        client.incr("k")
    assert direct.get("k") == b"1"  # Redis ran it
    assert proxy.lost == 1
    assert rule.acted == 1
    [loss] = proxy.losses()
    assert loss.reply == b":1\r\n"
    assert client.incr("k") == 2  # the rule is spent; a new connection works


def test_a_held_reply_times_the_client_out(proxy: FaultProxy, redis_url: str) -> None:
    direct, client = direct_and_proxied(proxy, redis_url)
    proxy.lose_replies(b"INCR", mode="hold", hold=10)
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.incr("k")
    assert 0.9 < time.monotonic() - started < 5  # the client's 1 s timeout
    assert direct.get("k") == b"1"
    wait_for(lambda: proxy.connections == 0, 5, "the held connection to close")


def test_a_lost_transaction_reply_comes_after_the_whole_transaction_ran(
    proxy: FaultProxy, redis_url: str
) -> None:
    direct, client = direct_and_proxied(proxy, redis_url)
    proxy.lose_replies(b"EXEC")
    pipe = client.pipeline(transaction=True)
    pipe.incr("a").incr("b").rpush("l", "x")
    with pytest.raises(redis.ConnectionError):
        pipe.execute()
    assert (direct.get("a"), direct.get("b"), direct.lrange("l", 0, -1)) == (b"1", b"1", [b"x"])
    [loss] = proxy.losses()
    assert [c.name for c in loss.commands] == [b"MULTI", b"INCRBY", b"INCRBY", b"RPUSH", b"EXEC"]


def test_a_script_is_chosen_by_its_source_even_when_loaded_with_a_prefix(
    proxy: FaultProxy, redis_url: str
) -> None:
    direct, client = direct_and_proxied(proxy, redis_url)
    body = b"return redis.call('INCR', KEYS[1])"
    script = client.register_script(b"-- a shared prefix\n" + body)
    client.script_load(script.script)  # the proxy learns its SHA1 from this
    rule = proxy.lose_replies(script=body, reply=b":2")  # only its second run
    assert script(keys=["k"]) == 1
    with pytest.raises(redis.ConnectionError):
        script(keys=["k"])
    assert direct.get("k") == b"2"
    assert rule.acted == 1
    assert len(proxy.commands(script=body)) == 2
    assert proxy.script_shas(body) == {script.sha}


def test_random_losses_follow_their_seed(proxy: FaultProxy, redis_url: str) -> None:
    def run(seed: int) -> list[int]:
        client = redis.Redis.from_url(proxy.url, retry=None, socket_timeout=1)
        client.ping()
        proxy.lose_randomly(5, seed=seed)
        failed = []
        for i in range(60):
            try:
                client.incr("n")
            except redis.ConnectionError:
                failed.append(i)  # the next call reconnects
        proxy.stop_losing()
        client.close()
        return failed

    # One client, one call at a time: the writes (reconnections' handshakes
    # included) come in the same order, so the same seed loses the same calls.
    first, second = run(7), run(7)
    assert first == second
    assert 3 < len(first) < 40


def test_an_outage_refuses_connections_until_it_ends(
    proxy: FaultProxy, redis_url: str
) -> None:
    direct, client = direct_and_proxied(proxy, redis_url)
    assert client.ping()
    with proxy.outage():
        with pytest.raises(redis.ConnectionError):
            client.ping()  # the open connection was cut
        with pytest.raises(redis.ConnectionError, match="refused"):
            redis.Redis.from_url(proxy.url, retry=None).ping()
        assert direct.ping()  # Redis itself runs on
    assert client.ping()
    assert proxy.outages == 1


def test_an_outage_can_start_right_after_a_chosen_reply(
    proxy: FaultProxy, redis_url: str
) -> None:
    direct, client = direct_and_proxied(proxy, redis_url)
    direct.lpush("seeds", "first", "second")
    proxy.outage_after(command="RPOP", reply=b"first")
    assert client.rpop("seeds", 1) == [b"first"]  # delivered, then Redis is gone
    wait_for(lambda: proxy.in_outage, 5, "the outage")  # begun right after the reply went out
    with pytest.raises(redis.ConnectionError):
        client.rpop("seeds", 1)
    proxy.end_outage()
    assert client.rpop("seeds", 1) == [b"second"]


# -- a. a lost reply to the lease call ------------------------------------------------


@pytest.mark.workers
@pytest.mark.parametrize("mode", ["drop", "hold"])
def test_a_lost_lease_reply_loses_no_request(
    mode: Literal["drop", "hold"], proxy: FaultProxy, pool: Pool, site_factory: SiteFactory,
    rds: redis.Redis, db: Any,
) -> None:
    site = quotes_site(site_factory, latency=0.05)
    lease = lua_source("lease.lua")
    # Replies that leased something (they name the site), mid-crawl.
    rule = proxy.lose_replies(
        script=lease, reply=site_name(site).encode(), skip=2, times=2, mode=mode
    )
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    # Held: workers block 1.5 s on the call; leases (and seed batches) last
    # well beyond that, as in production (10 s timeouts, 60 s leases).
    settings = HOLD if mode == "hold" else {}
    pool.start(**settings)
    pool.start(**settings)
    finished = pool.wait()

    assert rule.acted == 2, "the lease replies were not lost"
    assert_clean_exits(finished)
    assert db.pages.count_documents({}) == QUOTES_PAGES
    assert_frontier_clean(rds)
    # A lease call whose reply was lost is never sent again as it was
    # (the same lease ids would lease other requests over the first ones).
    assert resent_calls(proxy, lease) == []


# -- b. a lost reply to the outbox's write ---------------------------------------------


@pytest.mark.workers
@pytest.mark.parametrize("mode", ["drop", "hold"])
def test_a_lost_outbox_reply_loses_and_duplicates_nothing(
    mode: Literal["drop", "hold"], proxy: FaultProxy, pool: Pool, site_factory: SiteFactory,
    rds: redis.Redis, db: Any,
) -> None:
    site = quotes_site(site_factory, latency=0.05)
    # The worker's writes (new requests, acks, freed slots) go in one call
    # of commit.lua (inside MULTI/EXEC, the proxy would lose EXEC's reply).
    # Lose the reply to the seed's commit, then to two mid-crawl ones that
    # carry acks and the links found.
    commit = lua_source("commit.lua")
    first = proxy.lose_replies(script=commit, times=1, mode=mode)
    later = proxy.lose_replies(script=commit, skip=6, times=2, mode=mode)
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    # Held: workers block 1.5 s on the call; leases (and seed batches) last
    # well beyond that, as in production (10 s timeouts, 60 s leases).
    settings = HOLD if mode == "hold" else {}
    pool.start(**settings)
    pool.start(**settings)
    finished = pool.wait()

    assert (first.acted, later.acted) == (1, 2), "the commit replies were not lost"
    assert_clean_exits(finished)
    assert db.pages.count_documents({}) == QUOTES_PAGES
    assert_frontier_clean(rds)
    assert_fetched_once(site)  # nothing queued twice
    assert resent_calls(proxy, commit) == []


# -- c. a worker restarted under the same id ---------------------------------------------


@pytest.mark.workers
def test_a_worker_restarted_under_its_id_loses_no_lease(
    pool: Pool, site_factory: SiteFactory, rds: redis.Redis, db: Any
) -> None:
    site = quotes_site(site_factory, latency=0.15)
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    # The killed w1's leases are still held (6 s) while the new w1 leases:
    # each downloads 4 at once, so the new one has room on the site (10),
    # and its lease ids must neither be taken for nor overwrite the old ones.
    settings = {"FRONTIER_WORKER_ID": "w1", "FRONTIER_CONCURRENCY": 10,
                "CONCURRENT_REQUESTS": 4, "FRONTIER_LEASE_TIMEOUT": 6}
    first = pool.start(**settings)

    wait_for(lambda: rds.zcard(f"{{{SPIDER}}}:leases") >= 3, 30, "w1 to hold 3 leases")
    pool.kill(first)
    pool.start(**settings)  # at once, under the same id
    finished = pool.wait()

    assert_clean_exits(finished)
    assert db.pages.count_documents({}) == QUOTES_PAGES
    assert_frontier_clean(rds)


# -- d. kills at random moments ----------------------------------------------------------

KILL_SEED = 20240611


@pytest.mark.workers
def test_workers_killed_at_random_moments_lose_nothing(
    pool: Pool, site_factory: SiteFactory, rds: redis.Redis, db: Any
) -> None:
    rng = random.Random(KILL_SEED)
    site = quotes_site(site_factory, latency=0.1)
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    for _ in range(3):
        pool.start()
    # Four kills, each when the site has served a random number of pages.
    for threshold in sorted(rng.sample(range(15, QUOTES_PAGES - 40), 4)):
        wait_for(lambda t=threshold: len(site.hits()) >= t, 40, f"{threshold} hits")
        live = pool.live()
        pool.kill(live[rng.randrange(len(live))])
        pool.start()
    finished = pool.wait()

    assert_clean_exits(finished)
    assert db.pages.count_documents({}) == QUOTES_PAGES, f"seed {KILL_SEED}"
    assert_frontier_clean(rds)


# -- e. bad per-site overrides ------------------------------------------------------------


def small_site(site_factory: SiteFactory, n: int = 30) -> SiteServer:
    return site_factory(generated_site(n))


#: Blocking list commands an idle worker may wait for a seed with.
BLOCKING = {"brpop", "blpop", "blmove", "brpoplpush", "blmpop"}


def wait_idle_on_seeds(rds: redis.Redis, proc: subprocess.Popen[bytes]) -> None:
    """Wait until a worker blocks on the seed list: it is idle."""
    wait_for(
        lambda: proc.poll() is not None
        or any(c.get("cmd") in BLOCKING for c in rds.client_list()),
        20, "a worker blocked on the seed list",
    )
    assert proc.poll() is None, "the worker exited"


def assert_site_takes_a_new_seed_at_once(
    pool: Pool, rds: redis.Redis, site: SiteServer, within: float = 2.0
) -> None:
    """A fresh worker fetches a new seed of the site at once: the site is
    not held up by a slot counter or a due time left behind."""
    proc = pool.start(MAX_IDLE_TIME_BEFORE_CLOSE=20)
    wait_idle_on_seeds(rds, proc)
    before = len(site.hits())
    pushed = time.monotonic()
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/?fresh=1"))
    wait_for(lambda: len(site.hits()) > before, within + 10, "the new seed to be fetched")
    fetched = site.hits()[-1]
    assert fetched.path == "/?fresh=1"
    assert fetched.started - pushed < within, "the site was held up"
    pool.signal(proc, signal.SIGTERM)
    pool.wait_signalled()


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] [A-Z]+: ", re.MULTILINE)


def log_messages(text: str) -> list[str]:
    """The messages of a Scrapy log, without their time, logger and level."""
    return [m.strip() for m in _LOG_LINE.split(text) if m.strip()]


@pytest.mark.parametrize(("key", "value"), [
    ("delay", "2s"),
    ("conc", "1O"),
    ("conc", "-1"),
    ("conc", ""),
])
@pytest.mark.workers
def test_a_bad_site_override_neither_stalls_nor_duplicates(
    key: str, value: str, pool: Pool, site_factory: SiteFactory, rds: redis.Redis, db: Any
) -> None:
    site = small_site(site_factory)
    full_key = f"{{{SPIDER}}}:{key}"
    rds.hset(full_key, site_name(site), value)
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    pool.start()
    finished = pool.wait(timeout=30)

    assert_clean_exits(finished)
    assert db.pages.count_documents({}) == len(site.pages)
    assert_fetched_once(site)
    assert Frontier(rds, SPIDER).audit() == {}
    assert rds.llen(f"{{{SPIDER}}}:dead") == 0
    # One log message names the key and shows the value.
    shown = [value] if value else ["''", '""', "empty"]
    messages = [m for m in log_messages(pool.log_text()) if full_key in m]
    assert messages, f"no log message names {full_key}"
    assert any(v in m for m in messages for v in shown), (
        f"no log message about {full_key} shows the bad value {value!r}: {messages[:3]}"
    )
    assert_site_takes_a_new_seed_at_once(pool, rds, site)


# -- f. a poison request --------------------------------------------------------------------

MAX_DELIVERIES = 3


@pytest.mark.workers
def test_a_request_that_kills_its_worker_ends_in_the_dead_letters(
    pool: Pool, site_factory: SiteFactory, rds: redis.Redis, db: Any
) -> None:
    pages = generated_site(12)
    html = [("Content-Type", "text/html")]
    pages["/"] = Page(200, html, b'<title>Home</title><a href="/p/0">0</a> '
                      b'<a href="/poison">poison</a>')
    hits: queue.Queue[threading.Event] = queue.Queue()

    def poison(path: str, nth: int) -> Page | None:
        if path != "/poison":
            return None
        if nth <= MAX_DELIVERIES:
            # Hold the response until the test has killed the workers.
            killed = threading.Event()
            hits.put(killed)
            killed.wait(30)
        return Page(200, html, b"<title>poison</title>")

    site = site_factory(pages, handler=poison)
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    settings = {"FRONTIER_MAX_DELIVERIES": MAX_DELIVERIES}
    frontier = Frontier(rds, SPIDER)
    for _ in range(2):
        pool.start(**settings)
    deadline = time.monotonic() + 60
    while pool.live():
        assert time.monotonic() < deadline, "the crawl did not end"
        try:
            killed = hits.get(timeout=0.1)
        except queue.Empty:
            continue
        # The poison is being downloaded: let the rest finish, then it
        # kills every worker that could have leased it.
        try:
            wait_for(lambda: frontier.pending() <= 1, 15, "all but the poison to be done")
        finally:
            for proc in pool.live():
                pool.kill(proc)
            killed.set()
        for _ in range(2):
            pool.start(**settings)
    finished = pool.wait()

    poison_hits = [h for h in site.hits() if h.path == "/poison"]
    assert len(poison_hits) == MAX_DELIVERIES
    assert_clean_exits(finished)
    dead = [json.loads(d) for d in rds.lrange(f"{{{SPIDER}}}:dead", 0, -1)]
    assert [d.get("url") for d in dead] == [site.url_for("/poison")], dead
    assert MAX_DELIVERIES in (dead[0].get("deliveries"), dead[0].get("attempts")), dead
    assert dead[0].get("reason")
    assert db.pages.count_documents({}) == len(pages)  # all but the poison
    assert frontier.audit() == {}


# -- g. signals during seed intake and during an outage -------------------------------------

SEEDS = 40


def seeds_site(site_factory: SiteFactory) -> SiteServer:
    html = [("Content-Type", "text/html")]
    pages = {f"/s/{i}": Page(200, html, f"<title>seed {i}</title>".encode())
             for i in range(SEEDS)}
    return site_factory(pages, latency=0.1)


def assert_every_seed_crawled(site: SiteServer, db: Any, rds: redis.Redis) -> None:
    fetched = {h.path for h in site.hits() if h.status == 200}
    missing = [f"/s/{i}" for i in range(SEEDS) if f"/s/{i}" not in fetched]
    assert missing == [], f"{len(missing)} seeds never crawled"
    assert db.pages.count_documents({}) == SEEDS
    assert_frontier_clean(rds)


#: Seeds move into the frontier five at a time, so a crawl takes many.
INTAKE = {"FRONTIER_SEED_BATCH": 5, "CONCURRENT_REQUESTS": 8}


@pytest.mark.workers
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_signal_during_seed_intake_loses_no_seed(
    signum: int, proxy: FaultProxy, pool: Pool, site_factory: SiteFactory,
    rds: redis.Redis, db: Any,
) -> None:
    site = seeds_site(site_factory)
    rds.lpush(f"{SPIDER}:start_urls", *[site.url_for(f"/s/{i}") for i in range(SEEDS)])
    workers: list[subprocess.Popen[bytes]] = []
    # The signal lands as the worker gets its second batch of seeds (a reply
    # with seed URLs, whatever the command that took them).
    rule = proxy.after_reply(
        lambda: pool.signal(workers[0], signum), reply=site.url.encode() + b"/s/", skip=1
    )
    workers.append(pool.start(**INTAKE))
    wait_for(lambda: rule.acted, 20, "the second batch of seeds")
    pool.wait_signalled()
    pool.start(**INTAKE)
    pool.start(**INTAKE)
    finished = pool.wait()

    assert_clean_exits(finished)
    assert_every_seed_crawled(site, db, rds)


@pytest.mark.workers
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_signal_during_a_redis_outage_loses_no_seed(
    signum: int, proxy: FaultProxy, pool: Pool, site_factory: SiteFactory,
    rds: redis.Redis, db: Any,
) -> None:
    site = seeds_site(site_factory)
    rds.lpush(f"{SPIDER}:start_urls", *[site.url_for(f"/s/{i}") for i in range(SEEDS)])
    # Redis becomes unreachable as the worker gets its second batch.
    proxy.outage_after(reply=site.url.encode() + b"/s/", skip=1)
    worker = pool.start(**INTAKE)
    wait_for(lambda: proxy.in_outage, 20, "the outage")
    pool.signal(worker, signum)
    pool.wait_signalled()
    proxy.end_outage()
    pool.start(**INTAKE)
    pool.start(**INTAKE)
    finished = pool.wait()

    assert_clean_exits(finished)
    assert_every_seed_crawled(site, db, rds)


# -- h. a lost reply to a Redis read on the download path -----------------------------


@pytest.mark.workers
def test_a_lost_reply_to_the_shared_robots_read_does_not_dead_letter_the_request(
    proxy: FaultProxy, pool: Pool, site_factory: SiteFactory, rds: redis.Redis, db: Any
) -> None:
    """Found by the soak: the robots.txt middleware reads the site's
    robots.txt from Redis before the first download of each site; a lost
    reply there must be waited out like any Redis outage, not taken for a
    failed download."""
    site = small_site(site_factory)
    rule = proxy.lose_replies(b"{pages}:robots", command="HGET")
    rds.lpush(f"{SPIDER}:start_urls", site.url_for("/"))
    pool.start()
    finished = pool.wait(timeout=30)

    assert rule.acted == 1
    assert_clean_exits(finished)
    assert db.pages.count_documents({}) == len(site.pages)
    assert_frontier_clean(rds)
