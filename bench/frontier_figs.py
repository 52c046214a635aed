"""Figures measured against Redis directly: c (memory) and d (operations/s).

Both drive the real code paths: ours encodes with
:class:`~crawler.frontier.queue.LeasedPriorityQueue` (our serializer:
``path<TAB>callback<TAB>depth``, then JSON of what else is not a default)
and calls :class:`~crawler.frontier.store.Frontier`'s Lua scripts; stock
encodes with :class:`scrapy_redis.queue.PriorityQueue` (pickle) and
fingerprints with :class:`scrapy_redis.dupefilter.RFPDupeFilter`.
"""

from __future__ import annotations

import importlib
import multiprocessing
import time
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request, Spider
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.test import get_crawler
from scrapy_redis.dupefilter import RFPDupeFilter
from scrapy_redis.queue import PriorityQueue

from crawler.frontier import serializer as json_serializer
from crawler.frontier.housekeeping import Housekeeper
from crawler.frontier.queue import LeasedPriorityQueue
from crawler.frontier.replicas import ReplicaWait
from crawler.frontier.sites import site_of
from crawler.frontier.store import Commit, Frontier, NotDue, Push
from crawler.politeness import compact_robots

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.crawler import Crawler

__all__ = [
    "bytes_per_site", "frontier_ops", "lease_ops_on_due_sites", "redis_memory",
    "typical_requests",
]

#: Requests pushed and leased per cycle in figure d: a worker's
#: CONCURRENT_REQUESTS, i.e. what one reactor turn's outbox carries at most.
OPS_BATCH = 16


class _BenchSpider(Spider):
    """Callback owner for encoding requests (``parse_item`` by name)."""

    name = "bench"

    def parse_item(self, response: Any) -> None:
        """Unused: only its name is encoded."""


def typical_requests(n: int, spider: Spider, tag: str = "") -> Iterator[Request]:
    """``n`` distinct requests: ~70-character URL on 10 hosts, callback, depth meta."""
    for i in range(n):
        url = f"https://www.example-shop{i % 10}.com/catalog/books/item-{tag}{i:07d}.html?ref=list"
        yield Request(url, callback=spider.parse_item, meta={"depth": 2})


def _crawler(redis_url: str, **settings: Any) -> tuple[Crawler, Spider]:
    crawler = get_crawler(
        _BenchSpider,
        {"REDIS_URL": redis_url, "FRONTIER_CONCURRENCY": 64, "FRONTIER_DELAY": 0.0, **settings},
    )
    spider = _BenchSpider()
    spider._set_crawler(crawler)
    crawler.spider = spider
    return crawler, spider


def _ours(server: redis.Redis, spider: Spider) -> Any:
    return LeasedPriorityQueue(server, spider, "{bench}", json_serializer)


def _memory_sum(server: redis.Redis, exclude: set[bytes]) -> int:
    total = 0
    for key in server.scan_iter(count=1000):
        if key not in exclude:
            total += int(server.memory_usage(key, samples=0) or 0)
    return total


def redis_memory(redis_url: str, n: int) -> dict[str, Any]:
    """Figure c: Redis bytes per queued request and per seen URL.

    ``used_memory`` is read before and after pushing ``n`` requests (scripts
    loaded and the database flushed first); the seen set's ``MEMORY USAGE``
    is the per-URL figure and the rest of the growth is the queue's. The
    ``MEMORY USAGE`` sums of the queue keys are reported as a cross-check.
    """
    server = redis.Redis.from_url(redis_url)
    crawler, spider = _crawler(redis_url)
    fingerprint = crawler.request_fingerprinter.fingerprint
    out: dict[str, Any] = {"n": n}

    # Ours.
    queue = _ours(server, spider)
    frontier = queue.frontier
    warm = next(typical_requests(1, spider, "w"))
    frontier.push(queue.encode(warm), site=site_of(warm), priority=0,
                  fingerprint=b"w" * 20, dont_filter=False)
    server.flushall()
    before = int(server.info("memory")["used_memory"])
    requests = list(typical_requests(n, spider))
    for i in range(0, n, 1000):
        with server.pipeline(transaction=False) as pipe:
            for request in requests[i : i + 1000]:
                frontier.push(
                    queue.encode(request), site=site_of(request), priority=request.priority,
                    fingerprint=fingerprint(request), dont_filter=False, client=pipe,
                )
            pipe.execute()
    after = int(server.info("memory")["used_memory"])
    df_key = frontier.key("dupefilter").encode()
    seen = int(server.memory_usage(df_key, samples=0) or 0)
    out["ours"] = {
        "queued_bytes": (after - before - seen) / n,
        "seen_bytes": seen / n,
        "queued_bytes_memory_usage": _memory_sum(server, {df_key}) / n,
        "queued": int(server.get(frontier.key("count")) or 0),
        "encoded_length": len(queue.encode(requests[0])),
    }

    # Stock scrapy-redis.
    server.flushall()
    stock = PriorityQueue(server, spider, "bench:requests")
    dupefilter = RFPDupeFilter(server, "bench:dupefilter")
    before = int(server.info("memory")["used_memory"])
    for i in range(0, n, 1000):
        with server.pipeline(transaction=False) as pipe:
            stock.server = dupefilter.server = pipe
            for request in requests[i : i + 1000]:
                dupefilter.request_seen(request)
                stock.push(request)
            pipe.execute()
    stock.server = dupefilter.server = server
    after = int(server.info("memory")["used_memory"])
    seen = int(server.memory_usage("bench:dupefilter", samples=0) or 0)
    out["stock"] = {
        "queued_bytes": (after - before - seen) / n,
        "seen_bytes": seen / n,
        "queued_bytes_memory_usage": _memory_sum(server, {b"bench:dupefilter"}) / n,
        "queued": int(server.zcard("bench:requests")),
        "encoded_length": len(stock._encode_request(requests[0])),
    }
    server.flushall()
    out["bloom"] = _bloom_memory(server, redis_url, requests)
    server.flushall()
    server.close()
    return out


def _bloom_memory(server: redis.Redis, redis_url: str, requests: list[Request]) -> dict[str, Any]:
    """Bytes per URL of ``crawler.frontier.bloom`` if it exists, else pending.

    The Bloom dupefilter is built as Scrapy builds a ``DUPEFILTER_CLASS``
    (``from_crawler``), sized for the URLs pushed, and fed through its
    ``request_seen``.
    """
    try:
        module = importlib.import_module("crawler.frontier.bloom")
    except ImportError:
        return {"status": "pending", "reason": "crawler/frontier/bloom.py does not exist yet"}
    try:
        classes = [
            obj for obj in vars(module).values()
            if isinstance(obj, type) and obj.__module__ == module.__name__
            and hasattr(obj, "request_seen")
        ]
        if not classes:
            return {"status": "pending", "reason": "no class with request_seen in bloom.py"}
        cls = classes[0]
        crawler, _ = _crawler(
            redis_url, FRONTIER_BLOOM_CAPACITY=len(requests), FRONTIER_BLOOM_ERROR_RATE=0.001
        )
        dupefilter = build_from_crawler(load_object(cls), crawler)
        if hasattr(dupefilter, "open"):
            dupefilter.open()
        false_positives = sum(bool(dupefilter.request_seen(r)) for r in requests)
        # MEMORY USAGE of the bitmap(s): used_memory also counts the script
        # cache and allocator slack of everything else.
        size = sum(
            int(server.memory_usage(key) or 0) for key in server.scan_iter(match="*bloom*")
        )
        return {
            "status": "measured",
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "seen_bytes": size / len(requests),
            "false_positives": false_positives,
        }
    except Exception as exc:  # another helper's work in progress: report, don't fail
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}


# -- figure d ----------------------------------------------------------------


def _execute(pipe: Any, wait: ReplicaWait | None) -> list[Any]:
    """``pipe.execute()``; with ``wait``, ``WAIT`` queued last and checked
    (as the scheduler's pipelines with ``FRONTIER_MIN_REPLICAS``)."""
    if wait is None:
        return list(pipe.execute())
    wait.queue(pipe)
    replies = list(pipe.execute())
    wait.check(replies.pop())
    return replies


def _ops_client(
    redis_url: str, kind: str, *, index: int, seconds: float, barrier: Any, results: Any,
    min_replicas: int = 0,
) -> None:
    """One client process: push, lease and ack (ours) or push and pop (stock)."""
    server = redis.Redis.from_url(redis_url)
    crawler, spider = _crawler(redis_url)
    wait = ReplicaWait(min_replicas, 1000) if min_replicas else None
    pool = list(typical_requests(12_000, spider, f"c{index}-"))
    ops = 0
    if kind == "ours":
        queue = _ours(server, spider)
        frontier = queue.frontier
        fingerprint = crawler.request_fingerprinter.fingerprint
        lease_ids = (f"w{index}:{n}" for n in range(10**9))
        held: list[str] = []
        barrier.wait()
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            # As the scheduler's next_request: this turn's outbox (pushes and
            # the previous leases' acks in one commit.lua call, with its
            # commit marker) and a lease.lua call for up to OPS_BATCH
            # requests, in one pipeline, one round trip.
            pushes = [
                Push(queue.encode(request), site_of(request), request.priority,
                     fingerprint(request), request.dont_filter)
                for request in pool[i : i + OPS_BATCH]
            ]
            ids = [next(lease_ids) for _ in range(OPS_BATCH)]
            with server.pipeline(transaction=False) as pipe:
                frontier.commit(
                    Commit(pushes=pushes, acks=held, marker=(f"w{index}", i)), client=pipe
                )
                frontier.lease_many(ids, client=pipe)
                reply = _execute(pipe, wait)[-1]
            ops += len(pushes) + len(held)
            i = (i + OPS_BATCH) % (len(pool) - OPS_BATCH)
            result = frontier.leases_of(reply, ids)
            held = []
            if not isinstance(result, NotDue):
                for lease in result:
                    queue.decode(lease.data, lease.site)
                    held.append(lease.lease_id)
                ops += len(result)
    else:
        stock = PriorityQueue(server, spider, "bench:requests")
        dupefilter = RFPDupeFilter(server, "bench:dupefilter")
        barrier.wait()
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            # scrapy_redis.scheduler.Scheduler.enqueue_request: SADD, then ZADD.
            for request in pool[i : i + OPS_BATCH]:
                if not dupefilter.request_seen(request):
                    stock.push(request)
                ops += 1
            i = (i + OPS_BATCH) % (len(pool) - OPS_BATCH)
            # next_request: one MULTI (ZRANGE + ZREMRANGEBYRANK) per pop.
            for _ in range(OPS_BATCH):
                if stock.pop() is None:
                    break
                ops += 1
    elapsed = time.monotonic() - start
    results.put((ops, elapsed))
    server.close()


def _prefill(redis_url: str, kind: str, n: int) -> None:
    server = redis.Redis.from_url(redis_url)
    crawler, spider = _crawler(redis_url)
    requests = list(typical_requests(n, spider, "pre-"))
    with server.pipeline(transaction=False) as pipe:
        if kind == "ours":
            queue = _ours(server, spider)
            queue.frontier.load_scripts()
            fingerprint = crawler.request_fingerprinter.fingerprint
            for r in requests:
                queue.frontier.push(queue.encode(r), site=site_of(r), priority=0,
                                    fingerprint=fingerprint(r), dont_filter=False, client=pipe)
        else:
            stock = PriorityQueue(pipe, spider, "bench:requests")
            for r in requests:
                stock.push(r)
        pipe.execute()
    server.close()


def frontier_ops(
    redis_url: str, kind: str, clients: int, seconds: float, min_replicas: int = 0
) -> float:
    """Figure d: operations per second of ``clients`` processes together.

    Each process runs cycles of 16 enqueues and 16 dequeues (plus, for ours,
    the 16 acknowledgements of the previous cycle) against a queue prefilled
    with 20,000 requests on 10 sites, for ``seconds`` after a common start.
    Encoding, fingerprinting and decoding are included, as in a worker. Ours
    sends a cycle as the scheduler does: pushes and acks in one
    ``commit.lua`` call, then the lease of up to 16 requests, in one
    pipeline (two script calls, one round trip); stock makes the stock
    scheduler's calls, one round trip per enqueue (``SADD``, then ``ZADD``)
    and per pop. With ``min_replicas`` (ours only; the server needs that
    many replicas), each pipeline ends with ``WAIT min_replicas 1000`` as
    the scheduler's does with ``FRONTIER_MIN_REPLICAS``.
    """
    server = redis.Redis.from_url(redis_url)
    server.flushall()
    _prefill(redis_url, kind, 20_000)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(clients)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_ops_client,
            args=(redis_url, kind),
            kwargs={"index": i, "seconds": seconds, "barrier": barrier, "results": results,
                    "min_replicas": min_replicas},
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    server.flushall()
    server.close()
    return sum(ops for ops, _ in got) / max(elapsed for _, elapsed in got)


# -- Redis bytes per site ------------------------------------------------------

#: A robots.txt as large sites serve them: groups for several crawlers, a
#: wildcard group, sitemaps (about 3 KiB).
TYPICAL_ROBOTS = (
    "# robots.txt of a large site\nSitemap: https://www.example.com/sitemap.xml\n\n"
    + "".join(
        f"User-agent: {bot}\n" + "".join(f"Disallow: /{bot.lower()}/{d}/\n" for d in range(12))
        + "Crawl-delay: 1\n\n"
        for bot in ("Googlebot", "Bingbot", "Slurp", "DuckDuckBot", "Baiduspider", "YandexBot")
    )
    + "User-agent: *\nDisallow: /cart/\nDisallow: /account/\nDisallow: /search\n"
    "Allow: /search/help\nDisallow: /*?sessionid=\n"
).encode()
#: The user agent the robots.txt is compacted for (the project's).
BENCH_AGENT = "crawler (+https://docs.scrapy.org/en/latest/topics/practices.html)"


def bytes_per_site(redis_url: str, sites: int = 10_000, *, compact: bool = True) -> dict[str, Any]:
    """Redis bytes per site with work, and per finished site before and after
    the housekeeping forgets it (:mod:`crawler.frontier.housekeeping`).

    ``sites`` sites (``s<i>.example``) each get one queued request (no
    dupefilter) and their robots.txt (:data:`TYPICAL_ROBOTS`, compact for
    the project's agent, or the full body with ``compact=False``) as the
    robots middleware stores it; then each request is leased and
    acknowledged; then the housekeeping runs (forget-after 0) until every
    site is forgotten. ``used_memory`` is read after each phase (the
    database flushed and the scripts loaded first).

    :returns: ``{"sites", "with_work", "finished", "forgotten"}`` in bytes
        per site, plus ``"robots_stored"`` (bytes of one site's robots.txt
        as stored) and ``"robots_full"`` (its full body).
    """
    server = redis.Redis.from_url(redis_url)
    server.flushall()
    frontier = Frontier(server, "bench", default_concurrency=1)
    keeper = Housekeeper(server, "bench", site_forget_after=0, batch=1000)
    frontier.load_scripts()
    keeper.forget([])  # loads its script
    server.delete(keeper.key("forget"))
    stored = compact_robots(TYPICAL_ROBOTS, BENCH_AGENT) if compact else TYPICAL_ROBOTS
    names = [f"s{i}.example" for i in range(sites)]

    def used() -> int:
        return int(server.info("memory")["used_memory"])

    before = used()
    for i in range(0, sites, 1000):
        pushes = [
            Push(f'{{"u":"/page-{j}.html"}}'.encode(), site, 0, None, True)
            for j, site in enumerate(names[i : i + 1000])
        ]
        frontier.commit(Commit(pushes=pushes))
        with server.pipeline(transaction=False) as pipe:
            for site in names[i : i + 1000]:
                pipe.hset(frontier.key("robots"), site, f"{time.time()}\n".encode() + stored)
            pipe.execute()
    with_work = used()
    n = 0
    while True:
        ids = [f"bench#0:{n + k}" for k in range(64)]
        n += 64
        result = frontier.lease_many(ids)
        if isinstance(result, NotDue):
            if result.wait is None:
                break
            time.sleep(result.wait)
            continue
        done = [lease.lease_id for lease in result]
        frontier.commit(Commit(slots=done, acks=done))
    finished = used()
    left = sites
    deadline = time.monotonic() + 120
    while left and time.monotonic() < deadline:
        forgotten, _ = keeper.forget_sites()
        left -= forgotten
    forgotten_at = used()
    server.flushall()
    server.close()
    return {
        "sites": sites,
        "with_work": (with_work - before) / sites,
        "finished": (finished - before) / sites,
        "forgotten": (forgotten_at - before) / sites,
        "not_forgotten": left,
        "robots_stored": len(stored),
        "robots_full": len(TYPICAL_ROBOTS),
    }


# -- lease operations on many due sites ---------------------------------------------


def _due_sites_ops(
    server: redis.Redis, redis_url: str, sites: int, per_site: int, seconds: float
) -> dict[str, Any]:
    """Prefill ``sites`` sites with ``per_site`` requests each (all due at
    once), then lease and ack as a worker does for ``seconds``."""
    server.flushall()
    crawler, spider = _crawler(redis_url)
    queue = _ours(server, spider)
    frontier = queue.frontier
    frontier.load_scripts()
    fingerprint = crawler.request_fingerprinter.fingerprint
    batch: list[Push] = []
    for n in range(sites * per_site):
        request = Request(
            f"https://www.site{n % sites:06d}.example/item-{n:07d}.html",
            callback=spider.parse_item, meta={"depth": 2},
        )
        batch.append(Push(queue.encode(request), site_of(request), 0, fingerprint(request),
                          False))
        if len(batch) == 5_000:
            frontier.push_many(batch)
            batch = []
    frontier.push_many(batch)
    server.config_resetstat()
    lease_ids = (f"w:{n}" for n in range(10**9))
    held: list[str] = []
    leases = acks = calls = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        # As the scheduler's next_request: the previous leases' acks
        # (commit.lua) and a lease of up to OPS_BATCH (lease.lua), one
        # round trip.
        ids = [next(lease_ids) for _ in range(OPS_BATCH)]
        with server.pipeline(transaction=False) as pipe:
            if held:
                frontier.commit(Commit(acks=held), client=pipe)
            frontier.lease_many(ids, client=pipe)
            reply = pipe.execute()[-1]
        calls += 1
        acks += len(held)
        result = frontier.leases_of(reply, ids)
        if isinstance(result, NotDue):
            break  # drained: the figure covers what ran
        held = [lease.lease_id for lease in result]
        leases += len(held)
    elapsed = time.monotonic() - start
    stats = server.info("commandstats").get("cmdstat_evalsha", {})
    server.flushall()
    return {
        "sites": sites, "requests": sites * per_site, "seconds": elapsed,
        "lease_calls": calls, "leases": leases, "acks": acks,
        "ops_per_s": (leases + acks) / elapsed if elapsed else float("nan"),
        "script_usec_per_call": float(stats.get("usec_per_call", float("nan"))),
    }


def lease_ops_on_due_sites(
    redis_url: str, sites: int = 100_000, seconds: float = 2.0, baseline_sites: int = 100
) -> dict[str, Any]:
    """Lease and ack operations per second on a frontier of ``sites`` due sites.

    Each site holds one request, all due at once (no delay); one client then
    leases up to 16 requests per call and acks them in its next call (one
    pipeline of ``commit.lua`` and ``lease.lua``, as the scheduler sends
    them) for ``seconds``. The same runs on ``baseline_sites`` sites holding
    as many requests in all, for comparison: a lease's work must not grow
    with the number of due sites. Encoding is done before the clock starts;
    decoding is left out.

    :returns: ``{"sites": ..., "baseline": ..., "ratio": ...}``: each run's
        ``ops_per_s`` (leases plus acks per second), ``lease_calls``,
        ``leases``, ``acks``, ``seconds``, and ``script_usec_per_call`` (the
        mean time Redis spent in one script call, µs, from ``INFO
        commandstats``); ``ratio`` is the ops/s on ``sites`` over those on
        ``baseline_sites``.
    """
    server = redis.Redis.from_url(redis_url)
    try:
        many = _due_sites_ops(server, redis_url, sites, 1, seconds)
        few = _due_sites_ops(
            server, redis_url, baseline_sites, max(1, sites // baseline_sites), seconds
        )
    finally:
        server.close()
    return {"sites": many, "baseline": few, "ratio": many["ops_per_s"] / few["ops_per_s"]}
