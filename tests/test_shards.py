"""The sharded frontier (``FRONTIER_SHARDS``): keys, one Redis, a Redis Cluster."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Literal

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot
from scrapy import Request, Spider
from scrapy.settings import Settings

from crawler.config import config_error_of
from crawler.frontier import router as router_module
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Push
from crawler.keys import CrawlKeys, shard_of, shard_prefixes, slot_warning
from tests import scheduler_harness as harness
from tests.faultproxy import Command, FaultProxy
from tests.scheduler_harness import finish, lease_all, wait_for_request
from tests.workers import PROJECT_DIR, crawl, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")

PAGES_PER_SITE = 6


class _Spider(Spider):
    name = "t"


# -- keys ----------------------------------------------------------------------------


def test_shard_of_is_a_stable_hash_of_the_site_and_spreads_sites_evenly() -> None:
    assert shard_of("a.example", 1) == 0
    digest = hashlib.blake2b(b"a.example", digest_size=8).digest()
    assert shard_of("a.example", 7) == int.from_bytes(digest, "big") % 7
    # Names that differ in one character spread too (CRC-32 put these ten
    # sites in 2 of 8 shards).
    shops = [f"www.example-shop{i}.com" for i in range(10)]
    assert len({shard_of(site, 8) for site in shops}) >= 4
    shops = [f"www.example-shop{i}.com" for i in range(120)]
    assert max(Counter(shard_of(site, 12) for site in shops).values()) <= 2 * 120 / 12
    sites = [f"127.0.{1 + i // 100}.{1 + i % 100}:8080" for i in range(120)]
    for n in (3, 6):
        counts = Counter(shard_of(site, n) for site in sites)
        assert sorted(counts) == list(range(n))
        assert max(counts.values()) <= 2 * 120 / n, counts


def test_one_shard_keeps_the_keys_of_today_and_shards_have_a_tag_each() -> None:
    one = CrawlKeys.for_spider("s", Settings({"FRONTIER_SHARDS": 1}))
    assert [k.prefix for k in one.shards] == ["{s}:"]
    assert (one.count, one.wait, one.dead) == ("{s}:count", "{s}:wait", "{s}:dead")
    assert one.shards[0].dupefilter == "{s}:dupefilter"
    four = CrawlKeys.for_spider("s", Settings({"FRONTIER_SHARDS": 4}))
    prefixes = [k.prefix for k in four.shards]
    assert prefixes == shard_prefixes("s", 4)
    assert all(p.startswith("{s:") for p in prefixes)
    # Each shard in its own quarter of the slots: one per master of four.
    slots = [key_slot(p.encode() + b"wait") for p in prefixes]
    assert [slot * 4 // 16384 for slot in slots] == [0, 1, 2, 3]
    assert four.shards[2].dupefilter == prefixes[2] + "dupefilter"
    assert four.shard_for("a.example").index == shard_of("a.example", 4)
    # Crawl-wide keys stay.
    assert (four.stats, four.control, four.shards_key) == ("{s}:stats", "{s}:control", "{s}:shards")


@pytest.mark.parametrize("spider", ["a}b", "pages}", "x{y}z"])
def test_a_closing_brace_in_the_spider_name_is_warned_of_where_it_puts_every_shard_in_one_slot(
    spider: str,
) -> None:
    """Redis hashes a key by the text up to the first ``}``: the warning is
    given exactly when the shards' keys share one slot (redis-py's
    ``key_slot`` computes what the cluster does)."""
    slots = {key_slot(p.encode() + b"wait") for p in shard_prefixes(spider, 4)}
    assert len(slots) == 1
    warning = slot_warning(spider, 4)
    assert warning is not None
    assert repr(spider) in warning and "4 shards" in warning
    assert slot_warning(spider, 1) is None  # one shard is one slot anyway
    assert slot_warning("pages", 4) is None
    assert len({key_slot(p.encode() + b"wait") for p in shard_prefixes("pages", 4)}) == 4


def test_a_spider_name_that_starts_with_a_closing_brace_is_warned_of_crossslot() -> None:
    prefix = shard_prefixes("}x", 1)[0]
    assert key_slot(prefix.encode() + b"wait") != key_slot(prefix.encode() + b"count")
    warning = slot_warning("}x", 1)
    assert warning is not None and "CROSSSLOT" in warning


# -- one Redis ------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 3])
def test_requests_of_every_site_are_leased_once_across_shards(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=shards)
    urls = [f"https://s{i}.example/{j}" for i in range(12) for j in range(3)]
    for url in urls:
        scheduler.enqueue_request(Request(url))
    assert scheduler.flush_outbox()
    prefixes = shard_prefixes("t", shards)
    assert sum(int(rds.get(p + "count") or 0) for p in prefixes) == len(urls)
    got = lease_all(scheduler)
    assert sorted(r.url for r in got) == sorted(urls)
    for request in got:
        finish(scheduler, request)
    assert not scheduler.has_pending_requests()
    assert scheduler.queue.shards.audit() == {}
    assert sum(rds.scard(p + "dupefilter") for p in prefixes) == len(urls)
    assert int(rds.get("{t}:shards") or 0) == shards


def test_an_undecodable_entry_is_acked_and_dead_lettered_in_its_own_shard(
    redis_url: str, rds: redis.Redis
) -> None:
    """Its lease was acked on shard 0 (no such lease there): the real lease
    held the site's slot until it expired and the entry came back, one more
    dead letter each time."""
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=3)
    site = next(f"s{i}.example" for i in range(100) if shard_of(f"s{i}.example", 3) == 2)
    shards = scheduler.queue.shards
    shards.for_site(site).push(b"/\x00not-a-request\tgarbage", site=site, priority=0,
                               fingerprint=None, dont_filter=True)
    assert scheduler.next_request() is None
    assert scheduler.flush_outbox()
    prefixes = shard_prefixes("t", 3)
    assert [rds.llen(p + "dead") for p in prefixes] == [0, 0, 1]
    assert shards.audit() == {}


@pytest.mark.parametrize("shards", [1, 3, 8])
def test_the_best_priority_is_served_first_across_shards(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """A priority-9 request on the 41st due site, in another shard than the
    first in turn, comes before every priority-0 request (before the
    scheduler ranked shards by their best priority, the shards were asked in
    turn, and it came after a batch or two of each other shard's)."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    for i in range(40):
        for j in range(3):
            scheduler.enqueue_request(Request(f"https://s{i}.example/{j}"))
    last = shards - 1
    top = next(f"h{i}.example" for i in range(100) if shard_of(f"h{i}.example", shards) == last)
    scheduler.enqueue_request(Request(f"https://{top}/top", priority=9))
    assert scheduler.flush_outbox()
    got = []
    for _ in range(12):
        request = scheduler.next_request()
        assert request is not None
        got.append(request.priority)
        finish(scheduler, request)
    assert got[0] == 9, got
    assert got[1:] == [0] * 11


def test_a_worker_with_another_shard_count_stops_with_a_configuration_error(
    redis_url: str, rds: redis.Redis
) -> None:
    rds.set("{t}:shards", 4)
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=2)
    message = config_error_of(crawler)
    assert message is not None
    assert "FRONTIER_SHARDS is 2" in message and "4 shards" in message
    assert scheduler.next_request() is None  # no frontier call
    assert rds.get("{t}:shards") == b"4"


def test_sharding_an_unsharded_crawl_is_refused(redis_url: str, rds: redis.Redis) -> None:
    rds.set("{t}:count", 3)
    _, crawler = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=3)
    message = config_error_of(crawler)
    assert message is not None and "1 shards" in message
    assert not rds.exists("{t}:shards")


# -- whole crawls: many sites on loopback addresses -------------------------------------


class _Sites(ThreadingHTTPServer):
    """One HTTP server for many sites: ``http://127.0.x.y:<port>/`` links to
    ``/p1`` ... ``/p<pages - 1>``, which link back, each page served after
    ``delay`` seconds; robots.txt is 404. Counts hits by (host, path)."""

    daemon_threads = True

    def __init__(self, pages: int = PAGES_PER_SITE, delay: float = 0.0) -> None:
        super().__init__(("0.0.0.0", 0), _Handler)  # all of 127.0.0.0/8
        self.hits: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()
        self.pages, self.delay = pages, delay

    def urls(self, n: int) -> list[str]:
        """The seeds of ``n`` sites."""
        port = self.server_address[1]
        return [f"http://127.0.{1 + i // 200}.{1 + i % 200}:{port}/" for i in range(n)]


class _Handler(BaseHTTPRequestHandler):
    server: _Sites

    def do_GET(self) -> None:
        host = self.headers.get("Host", "")
        with self.server.lock:
            self.server.hits[(host, self.path)] += 1
        if self.path == "/robots.txt":
            self.send_error(404)
            return
        if self.server.delay:
            time.sleep(self.server.delay)  # (a slow site)
        links = "".join(f'<a href="/p{i}">p{i}</a>' for i in range(1, self.server.pages))
        body = f"<html><head><title>{host}{self.path}</title></head><body>{links}</body></html>"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def served_sites(pages: int = PAGES_PER_SITE, delay: float = 0.0) -> Iterator[_Sites]:
    """A :class:`_Sites` server running in a thread, shut down afterwards."""
    server = _Sites(pages, delay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def sites() -> Iterator[_Sites]:
    with served_sites() as server:
        yield server


def bytes_per_master(rc: RedisCluster, spider: str) -> list[int]:
    """The bytes (``MEMORY USAGE``) of the keys of ``spider``'s crawl on
    each master of the cluster."""
    per_master = []
    for node in rc.get_primaries():
        client = rc.get_redis_connection(node)
        per_master.append(sum(
            int(client.memory_usage(key) or 0)
            for key in client.scan_iter(match=f"*{spider}*", count=1000)
        ))
    return per_master


def _assert_stored_once(db: Any, sites: _Sites, n: int, workers: list[Any]) -> None:
    assert [w.returncode for w in workers] == [0] * len(workers), [w.log[-3000:] for w in workers]
    assert db.pages.count_documents({}) == n * PAGES_PER_SITE
    assert len(db.pages.distinct("url")) == n * PAGES_PER_SITE
    pages = {k: v for k, v in sites.hits.items() if k[1] != "/robots.txt"}
    assert len(pages) == n * PAGES_PER_SITE
    assert [k for k, v in pages.items() if v > 1] == []


@pytest.mark.workers
def test_a_crawl_on_one_redis_with_four_shards_stores_every_page_once(
    redis_url: str, rds: redis.Redis, mongo_uri: str, mongo_db: str, db: Any,
    sites: _Sites, tmp_path: Path,
) -> None:
    n = 20
    rds.lpush("pages:start_urls", *sites.urls(n))
    workers = crawl(
        "pages", worker_env(redis_url, mongo_uri, mongo_db), tmp_path,
        settings={"FRONTIER_SHARDS": 4},
    )
    _assert_stored_once(db, sites, n, workers)
    prefixes = shard_prefixes("pages", 4)
    # Each shard that holds one of the sites has its fingerprints (which
    # shards do depends on the server's free port, part of each site: all
    # four in about 99% of runs).
    held = {shard_of(url.split("//")[1].rstrip("/"), 4) for url in sites.urls(n)}
    assert [rds.scard(p + "dupefilter") > 0 for p in prefixes] == [
        i in held for i in range(4)
    ]
    assert not rds.exists("{pages}:dupefilter")


@pytest.mark.workers
def test_a_crawl_of_120_sites_spreads_over_the_masters_of_a_cluster(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, db: Any,
    sites: _Sites, tmp_path: Path,
) -> None:
    n = 120
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        rc.lpush("pages:start_urls", *sites.urls(n))
        env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
        workers = crawl("pages", env, tmp_path, workers=2, settings={"FRONTIER_SHARDS": 6})
        _assert_stored_once(db, sites, n, workers)
        assert all("MOVED" not in w.log and "CROSSSLOT" not in w.log for w in workers)
        per_master = bytes_per_master(rc, "pages")
        assert max(per_master) <= 0.6 * sum(per_master), per_master
    finally:
        rc.close()


def test_shards_found_empty_are_not_asked_on_every_lease(
    redis_url: str, rds: redis.Redis
) -> None:
    """Work on one shard of eight: the others answered "nothing queued" once
    and are skipped (for EMPTY_SHARD_RECHECK, 1 s), so a lease costs its own
    round trip's calls, not one call per empty shard."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=8, CONCURRENT_REQUESTS=1
    )
    for j in range(30):
        scheduler.enqueue_request(Request(f"https://one.example/{j}"))
    assert scheduler.flush_outbox()
    first = scheduler.next_request()  # learns which shards are empty
    assert first is not None
    finish(scheduler, first)

    def calls() -> int:
        return int(rds.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    before = calls()
    for _ in range(10):
        request = scheduler.next_request()
        assert request is not None
        finish(scheduler, request)
    # Per lease: the outbox's commit and the lease call (plus one peek of
    # the 8 shards should a second pass); 9 per lease if every shard were asked.
    assert calls() - before <= 10 * 3 + 8


def _push(url: str) -> Push:
    return Push(url.encode(), url.split("/")[2], 0, url.encode(), False)


def test_with_fair_share_filtering_every_due_site_a_worker_asks_each_shard_once_a_second(
    redis_url: str, rds: redis.Redis
) -> None:
    """The call-rate test of ``test_lease_priority`` with 4 shards: a worker
    that holds its share of every due site asks each shard about once a
    second (FRONTIER_IDLE_WAIT), peeks included: no shard is asked again
    and again."""
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_CONCURRENCY=2, FRONTIER_SHARDS=4
    )
    shards = scheduler.queue.shards
    shards.alive("other#1")  # a second live worker: one slot of each site each
    for i in range(40):
        site = f"s{i}.example"
        shards.for_site(site).push_many(
            [_push(f"https://{site}/{j}") for j in range(3)]
        )
    held = 0
    for k in range(4):
        result = shards[k].lease_many([f"{scheduler.holder}:h{k}-{n}" for n in range(64)])
        held += len(result) if isinstance(result, list) else 0
    assert held == 40  # this worker's share of every site
    rds.config_resetstat()
    deadline = time.monotonic() + 2.0
    while (now := time.monotonic()) < deadline:  # as the spider's idle loop
        assert scheduler.next_request() is None
        due = scheduler.next_due
        time.sleep(min(1.0 if due is None else due, 1.0, deadline - now))
    calls = int(rds.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    # 2 s, 4 shards: one call per shard per second, and as many peeks at most.
    assert crawler.stats.get_value("frontier/lease_calls/not_due") <= 4 * 3
    assert calls <= 4 * 3 * 2, calls


# -- faults: the peek at stale shards ---------------------------------------------------

#: lease.lua as on disk (the proxy matches the script loaded with lib.lua before it).
LEASE_LUA = (PROJECT_DIR / "crawler" / "frontier" / "lua" / "lease.lua").read_bytes()
#: Three shards, one request leased per call (the buffer is empty before
#: each next_request, so each one peeks first).
FAULT_SETTINGS: dict[str, Any] = {"FRONTIER_SHARDS": 3, "FRONTIER_LEASE_BATCH": 1}
FAULT_URLS = [f"https://s{i}.example/{j}" for i in range(12) for j in range(2)]


@pytest.fixture
def proxy(redis_url: str, rds: redis.Redis) -> Iterator[FaultProxy]:
    """A fault proxy in front of this test's Redis; Redis forgets its
    scripts first, so that the proxy learns their SHA1s as the worker loads
    them."""
    rds.script_flush()
    with FaultProxy(redis_url) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def peek_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shard is stale at once: each next_request with an empty buffer
    peeks at all the shards before its lease call (no waiting for the
    second of EMPTY_SHARD_RECHECK)."""
    monkeypatch.setattr(router_module, "EMPTY_SHARD_RECHECK", 0.0)


def is_peek(command: Command, holder: str) -> bool:
    """A lease.lua call of ``holder`` that asks for no lease id (its
    header, the first ARGV: :mod:`crawler.frontier.protocol`)."""
    header = json.loads(command.args[2 + int(command.args[1])])
    return bool(header["o"].get("holder") == holder and not header.get("ops"))


def start_sharded_crawl(proxy: FaultProxy, **settings: Any) -> tuple[Any, Any, list[str]]:
    """A scheduler through the proxy with FAULT_URLS queued and one of them
    leased and handled; returns it, its crawler and the URLs handled."""
    scheduler, crawler = harness.open_scheduler(
        proxy.url, _Spider, **FAULT_SETTINGS, **settings
    )
    for url in FAULT_URLS:
        scheduler.enqueue_request(Request(url))
    assert scheduler.flush_outbox()
    request = scheduler.next_request()
    assert request is not None
    finish(scheduler, request)
    return scheduler, crawler, [request.url]


def crawl_the_rest(scheduler: Any, done: list[str]) -> None:
    """Lease and handle every request left (waiting out a backoff)."""
    while len(done) < len(FAULT_URLS):
        request = wait_for_request(scheduler)
        finish(scheduler, request)
        done.append(request.url)
    assert sorted(done) == sorted(FAULT_URLS)  # each once: nothing lost, none twice
    assert scheduler.next_request() is None


def assert_sharded_frontier_clean(rds: redis.Redis) -> None:
    shards = FrontierShards.build(rds, "t", 3)
    assert shards.audit() == {}
    prefixes = shard_prefixes("t", 3)
    assert [rds.llen(p + "dead") for p in prefixes] == [0, 0, 0]
    assert sum(int(rds.get(p + "count") or 0) for p in prefixes) == 0


@pytest.mark.usefixtures("peek_always")
@pytest.mark.parametrize("mode", ["drop", "hold"])
def test_a_peek_whose_reply_was_lost_leases_nothing_and_the_crawl_goes_on(
    mode: Literal["drop", "hold"], proxy: FaultProxy, rds: redis.Redis
) -> None:
    """The peek ran in Redis (its lease.lua call's housekeeping included);
    its reply is lost: nothing is leased, the frontier stays consistent, no
    lease call follows it at once, and every request is leased once."""
    # Held: the client gives up after its socket timeout.
    settings = {"REDIS_PARAMS": json.dumps({"socket_timeout": 0.5})} if mode == "hold" else {}
    scheduler, crawler, done = start_sharded_crawl(proxy, **settings)
    sent = len(proxy.commands(script=LEASE_LUA))
    rule = proxy.lose_replies(script=LEASE_LUA, mode=mode)

    assert scheduler.next_request() is None  # its peek's reply was lost
    assert rule.acted == 1
    [loss] = proxy.losses()
    assert [is_peek(c, scheduler.holder) for c in loss.commands] == [True]
    after = proxy.commands(script=LEASE_LUA)[sent:]
    assert after and all(is_peek(c, scheduler.holder) for c in after)  # no lease call
    assert sum(rds.zcard(p + "leases") for p in shard_prefixes("t", 3)) == 0
    assert FrontierShards.build(rds, "t", 3).audit() == {}
    assert crawler.stats.get_value("frontier/redis/in_doubt") is None  # nothing to find out

    crawl_the_rest(scheduler, done)
    assert_sharded_frontier_clean(rds)


@pytest.mark.usefixtures("peek_always")
def test_redis_down_during_a_peek_is_an_outage_and_leasing_resumes_once_it_is_back(
    proxy: FaultProxy, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, crawler, done = start_sharded_crawl(proxy)
    sent = len(proxy.commands(script=LEASE_LUA))
    # Redis goes away once the first peek of the pipeline has answered.
    rule = proxy.outage_after(script=LEASE_LUA)
    caplog.set_level(logging.INFO, logger="crawler.frontier.scheduler")

    assert scheduler.next_request() is None  # no crash
    assert rule.acted == 1 and proxy.in_outage
    after = proxy.commands(script=LEASE_LUA)[sent:]
    assert after and all(is_peek(c, scheduler.holder) for c in after)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [m for m in logged if m.startswith("Redis unreachable")], logged
    assert crawler.stats.get_value("frontier/redis/outages") == 1
    # No lease call was sent into the outage, so none is in doubt.
    assert crawler.stats.get_value("frontier/redis/in_doubt") is None
    assert scheduler.next_request() is None  # still down: still no crash

    proxy.end_outage()
    crawl_the_rest(scheduler, done)
    assert any(r.getMessage() == "Redis reachable again" for r in caplog.records)
    assert_sharded_frontier_clean(rds)
