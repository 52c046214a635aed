"""Figure h: frontier operations per second of one crawl on a three-master
Redis Cluster (``FRONTIER_SHARDS=12``) against one plain ``redis-server``
(``FRONTIER_SHARDS=1``), and the cost of shards on one plain Redis.

Each client process runs figure d's cycle (:func:`bench.frontier_figs.frontier_ops`:
16 enqueues with encoding and fingerprinting, the acks of the previous
cycle's leases, one lease of up to 16 requests with decoding) but sends it
as the sharded scheduler (:class:`crawler.frontier.scheduler.FrontierScheduler`)
sends it through :class:`~crawler.frontier.shards.FrontierShards`: one
``commit.lua`` call per shard that has pushes or acks (each with its commit
marker), and one ``lease.lua`` call on the next shard in turn (round
robin), in one pipeline per Redis node that holds one of those shards
(:meth:`FrontierShards.groups`), the lease's pipeline last; on one plain
Redis that is one pipeline, one round trip. A shard with nothing due is
followed, as ``next_request`` follows it, by a lease call on the next one
in turn (one more round trip each) until one leases; one found empty is
skipped for a second unless the cycle pushes to it, as the scheduler does. The requests spread over
``sites`` sites (120 by default, so that they spread over the shards), and
the frontier is prefilled with 20,000 of them. Every push, lease and ack
counts as one op.

Besides the rate, each run reports where the CPU went: the clients'
(``time.process_time`` of each process over its timed window, as a share
of one core) and each Redis node's (``INFO cpu``, user + system, as a
share of one core over the window).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import TYPE_CHECKING, Any

import redis
from redis.cluster import RedisCluster
from scrapy import Request

from bench.frontier_figs import OPS_BATCH, _crawler, _ours
from crawler.frontier.scheduler import EMPTY_SHARD_RECHECK
from crawler.frontier.shards import FrontierShards
from crawler.frontier.sites import site_of
from crawler.frontier.store import Commit, Frontier, NotDue, Push

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Spider

__all__ = ["node_cpu", "sharded_ops"]

#: Requests in the frontier when the clients start.
PREFILL = 20_000
SPIDER = "bench"


def spread_requests(n: int, spider: Spider, sites: int, tag: str = "") -> Iterator[Request]:
    """``n`` distinct requests as figure d's (~70-character URL, callback,
    depth meta) on ``sites`` hosts."""
    for i in range(n):
        url = (f"https://www.example-shop{i % sites}.com/catalog/books/"
               f"item-{tag}{i:07d}.html?ref=list")
        yield Request(url, callback=spider.parse_item, meta={"depth": 2})  # type: ignore[attr-defined]


def _client(url: str, *, cluster: bool) -> Any:
    if cluster:
        return RedisCluster.from_url(url)
    return redis.Redis.from_url(url)


def _shards(server: Any, shards: int) -> FrontierShards:
    return FrontierShards.build(
        server, SPIDER, shards, default_delay=0.0, default_concurrency=64
    )


def _send(
    shards: FrontierShards, batches: dict[int, Commit], lease: tuple[int, list[str]]
) -> list[Any]:
    """The scheduler's round trip (``Session.send``): each
    shard's commit and the lease call, one pipeline per node, the lease's
    last; returns the lease's reply."""
    wanted = [i for i in batches if i != lease[0]] + [lease[0]]
    groups = shards.groups(wanted)
    groups.sort(key=lambda group: lease[0] in group[1])
    leased: list[Any] = []
    for pipe, indices in groups:
        calls = []
        with pipe:
            for i in indices:
                if i in batches:
                    shards[i].commit(batches[i], client=pipe)
                    calls.append("commit")
                if i == lease[0]:
                    shards[i].lease_many(lease[1], client=pipe)
                    calls.append("lease")
            replies = pipe.execute()
        for call, reply in zip(calls, replies, strict=True):
            if call == "lease":
                leased = reply
    return leased


def _pick(
    turn: int, asked: set[int], batches: dict[int, Commit], empty_at: list[float]
) -> int | None:
    """The shard to lease from next, as the scheduler's ``_next_shard``
    chooses: in turn from ``turn``, not asked yet, and not found empty within
    ``EMPTY_SHARD_RECHECK`` seconds unless ``batches`` writes to it; the
    first ask of a cycle always goes out. None: stop asking."""
    n, now = len(empty_at), time.monotonic()
    for j in range(n):
        k = (turn + j) % n
        if k not in asked and (k in batches or now - empty_at[k] >= EMPTY_SHARD_RECHECK):
            return k
    return None if asked else turn


def _ops_client(
    url: str, cluster: bool, shards_n: int, sites: int, *,
    index: int, seconds: float, barrier: Any, results: Any,
) -> None:
    """One client process: figure d's cycle, sent through the shards."""
    server = _client(url, cluster=cluster)
    crawler, spider = _crawler(url, FRONTIER_SHARDS=shards_n)
    queue = _ours(redis.Redis(), spider)  # encoding only: no I/O
    shards = _shards(server, shards_n)
    fingerprint = crawler.request_fingerprinter.fingerprint
    pool = list(spread_requests(12_000, spider, sites, f"c{index}-"))
    holder = f"w{index}#{os.getpid():x}"
    lease_ids = (f"{holder}:{n}" for n in range(10**9))
    held: dict[int, list[str]] = {}
    turn = index % shards_n
    empty_at = [float("-inf")] * shards_n
    ops, seq, i = 0, 0, 0
    barrier.wait()
    start, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - start < seconds:
        batches: dict[int, Commit] = {}
        for request in pool[i : i + OPS_BATCH]:
            site = site_of(request)
            push = Push(queue.encode(request), site, request.priority,
                        fingerprint(request), request.dont_filter)
            batches.setdefault(shards.index_of(site), Commit()).pushes.append(push)
            ops += 1
        for shard, ids in held.items():
            batches.setdefault(shard, Commit()).acks.extend(ids)
            ops += len(ids)
        seq += 1
        for batch in batches.values():
            batch.marker = (holder, seq)
        i = (i + OPS_BATCH) % (len(pool) - OPS_BATCH)
        held = {}
        # As next_request: a shard with nothing due is followed by the next
        # in turn (one more round trip each) until one leases or all said
        # no; a shard found empty is skipped for EMPTY_SHARD_RECHECK seconds
        # unless this cycle pushes to it.
        asked: set[int] = set()
        for _ in range(shards_n):
            nxt = _pick(turn, asked, batches, empty_at)
            if nxt is None:
                break
            turn = nxt
            asked.add(turn)
            ids = [next(lease_ids) for _ in range(OPS_BATCH)]
            result = Frontier.leases_of(_send(shards, batches, (turn, ids)), ids)
            batches = {}
            if isinstance(result, NotDue):
                if result.wait is None:
                    empty_at[turn] = time.monotonic()
                turn = (turn + 1) % shards_n
                continue
            for lease in result:
                queue.decode(lease.data, lease.site)
                held.setdefault(shards.index_of(lease.site), []).append(lease.lease_id)
            ops += len(result)
            turn = (turn + 1) % shards_n
            break
    elapsed, cpu = time.monotonic() - start, time.process_time() - cpu
    results.put((ops, elapsed, cpu))
    server.close()


def _prefill(server: Any, shards_n: int, sites: int, n: int) -> None:
    crawler, spider = _crawler("redis://unused", FRONTIER_SHARDS=shards_n)
    queue = _ours(redis.Redis(), spider)
    shards = _shards(server, shards_n)
    shards.load_scripts()
    fingerprint = crawler.request_fingerprinter.fingerprint
    requests = list(spread_requests(n, spider, sites, "pre-"))
    for start in range(0, len(requests), 2000):
        batches: dict[int, Commit] = {}
        for r in requests[start : start + 2000]:
            site = site_of(r)
            batches.setdefault(shards.index_of(site), Commit()).pushes.append(
                Push(queue.encode(r), site, 0, fingerprint(r), False)
            )
        for pipe, indices in shards.groups(list(batches)):
            with pipe:
                for k in indices:
                    shards[k].commit(batches[k], client=pipe)
                pipe.execute()


def node_cpu(urls: list[str]) -> list[float]:
    """CPU seconds (user + system, ``INFO cpu``) each Redis node has used."""
    out = []
    for url in urls:
        client = redis.Redis.from_url(url)
        try:
            info = client.info("cpu")
        finally:
            client.close()
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return out


def _flush(node_urls: list[str]) -> None:
    for url in node_urls:
        client = redis.Redis.from_url(url)
        try:
            client.flushall()
        finally:
            client.close()


def sharded_ops(
    url: str,
    node_urls: list[str],
    *,
    cluster: bool,
    shards: int,
    clients: int = 4,
    seconds: float = 2.0,
    sites: int = 120,
    prefill: int = PREFILL,
) -> dict[str, Any]:
    """Frontier ops/s of ``clients`` processes together (see the module).

    :param url: the Redis to use (a node of the cluster when ``cluster``).
    :param node_urls: every node (each master of a cluster), for their CPU
        time and to flush them before and after.
    :param cluster: ``url`` is a Redis Cluster (``RedisCluster`` client).
    :param shards: ``FRONTIER_SHARDS``.
    :param seconds: each client's timed window.
    :param sites: hosts the requests are spread over.
    :param prefill: requests queued before the clients start.
    :returns: ``{"ops_s": float, "client_cpu": [share of one core per
        client], "redis_cpu": [share of one core per node]}``.
    """
    _flush(node_urls)
    server = _client(url, cluster=cluster)
    try:
        _prefill(server, shards, sites, prefill)
    finally:
        server.close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(clients + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_ops_client,
            args=(url, cluster, shards, sites),
            kwargs={"index": i, "seconds": seconds, "barrier": barrier, "results": results},
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    barrier.wait()  # every client is ready: the window starts now
    before, started = node_cpu(node_urls), time.monotonic()
    got = [results.get(timeout=120) for _ in procs]
    after, window = node_cpu(node_urls), time.monotonic() - started
    for p in procs:
        p.join(30)
    _flush(node_urls)
    return {
        "ops_s": sum(ops for ops, _, _ in got) / max(elapsed for _, elapsed, _ in got),
        "client_cpu": [cpu / elapsed for _, elapsed, cpu in got],
        "redis_cpu": [(b - a) / window for a, b in zip(before, after, strict=True)],
    }
