"""Figures measured with real ``scrapy crawl`` workers: a, b and f.

Throughput is measured at the site server: pages served per second over the
middle 80% of the crawl (between the 10th and the 90th percentile of
response times), so worker start-up and the last stragglers of a crawl,
which are the same for every variant, do not dilute the steady rate.

The variants of a figure run in turn, their order reversed every other
repeat (A B, B A, A B, ...: :func:`in_turn`), and figures a and g first
run one crawl that is not counted. On this machine (figure a,
2026-12-02) the first crawl of a process was the slowest of its kind in
both of two runs of eight crawls (278 and 297 pages/s against medians of
301-394); with ours always first in its pair (A B A B ...) ours lost all
four pairs (ratio of the medians 0.76), where A B B A A B B A on the
same code gave 1.03; six in-memory crawls in a row ranged 317-364
pages/s. Whatever weighs on a position in the sequence then weighs on
every variant alike.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from typing import TYPE_CHECKING, TypeVar

import redis

from bench.sites import FastSite, flat_site
from bench.workers import start_worker, stop_workers, wait_blocked
from devtools.replay import generated_site

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from bench.sites import ServedHit

logger = logging.getLogger(__name__)

__all__ = ["cpu_scaling", "crawl_throughput", "in_turn", "scaling_throughput", "seed_pickup"]

T = TypeVar("T")

#: Settings of the CPU-bound crawl, for both schedulers.
CPU_SETTINGS: dict[str, object] = {
    "SPIDER_MODULES": "bench.spiders",
    "ITEM_PIPELINES": "{}",
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
}
#: Scrapy's own in-memory scheduler and dupefilter (the baseline of figure a).
IN_MEMORY: dict[str, object] = {
    "SCHEDULER": "scrapy.core.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
}


def steady_rate(hits: list[ServedHit]) -> float:
    """Pages per second between the 10th and 90th percentile of finish times:
    the least-squares slope of pages finished against time.

    A slope rather than pages over elapsed time: on a latency-bound site one
    worker's pages finish in waves (16 at a time, one wave per response
    time), and a count between the first page of one wave and the last of
    another counts one wave more than the time between them holds,
    overstating one worker by up to 1/8 against several, whose waves
    interleave.
    """
    times = sorted(h.finished for h in hits)
    if len(times) < 10:
        return 0.0
    window = times[len(times) // 10 : len(times) - len(times) // 10]
    return float(statistics.linear_regression(window, range(len(window))).slope)


def in_turn(variants: Sequence[T], repeat: int) -> Iterator[tuple[int, T]]:
    """``(repeat index, variant)`` for ``repeat`` rounds of ``variants``, the
    order reversed every other round: ``A B, B A, A B, ...`` (an ABBA design,
    so that a drift of the machine's speed or a carry-over from the previous
    run weighs on every variant alike).
    """
    for r in range(repeat):
        for variant in variants if r % 2 == 0 else reversed(variants):
            yield r, variant


def _wait_distinct(site: FastSite, count: int, timeout: float) -> None:
    """Wait until ``count`` distinct pages (robots.txt aside) were served.

    On timeout the crawl is measured as far as it got, with a warning.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len({h.path for h in site.hits()} - {"/robots.txt"}) >= count:
            return
        time.sleep(0.1)
    logger.warning("crawl reached fewer than %d pages within %ss", count, timeout)


def _crawl_once(
    site: FastSite,
    redis_url: str,
    *,
    log_dir: Path,
    tag: str,
    workers: int,
    settings: dict[str, object],
    expected: int,
    timeout: float,
) -> list[ServedHit]:
    """Start ``workers`` idle workers, push the seed, return the hits."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    procs = [
        start_worker("bench_links", redis_url, log_dir / f"{tag}-{i}.log", settings)
        for i in range(workers)
    ]
    try:
        wait_blocked(client, workers, procs)
        site.clear_hits()
        client.lpush("bench_links:start_urls", site.url + "/")
        _wait_distinct(site, expected, timeout)
        return [h for h in site.hits() if h.path != "/robots.txt"]
    finally:
        stop_workers(procs)
        client.close()


def crawl_throughput(
    redis_url: str, log_dir: Path, *, pages: int, repeat: int, warmup: bool = True
) -> dict[str, object]:
    """Figure a: one worker, our frontier vs Scrapy's in-memory scheduler.

    The site is :func:`devtools.replay.generated_site` (a tree of ``pages``
    pages, 5 links each plus a link home and one off-site link) on
    :class:`~bench.sites.FastSite`; runs alternate ours / in-memory
    (:func:`in_turn`).

    :param warmup: first run one in-memory crawl that is not counted.
    :returns: ``{"ours": [pages/s, ...], "baseline": [...], "pages": pages}``.
    """
    ours: list[float] = []
    base: list[float] = []
    variants = [("ours", {}, ours), ("memory", IN_MEMORY, base)]
    timeout = 60 if pages < 1000 else 300
    with FastSite(generated_site(pages)) as site:
        if warmup:
            _crawl_once(site, redis_url, log_dir=log_dir, tag="a-warmup", workers=1,
                        settings={**CPU_SETTINGS, **IN_MEMORY}, expected=pages + 1,
                        timeout=timeout)
        for r, (name, extra, out) in in_turn(variants, repeat):
            hits = _crawl_once(
                site, redis_url, log_dir=log_dir, tag=f"a-{name}-{r}", workers=1,
                settings={**CPU_SETTINGS, **extra}, expected=pages + 1, timeout=timeout,
            )
            out.append(steady_rate(hits))
    return {"ours": ours, "baseline": base, "pages": pages}


def cpu_scaling(
    redis_url: str, log_dir: Path, *, pages: int, repeat: int, warmup: bool = True
) -> dict[str, object]:
    """Figure g: two workers against one on the CPU-bound site of figure a.

    The same tree of ``pages`` pages (:func:`devtools.replay.generated_site`
    on :class:`~bench.sites.FastSite`, no delay) and the same settings as
    figure a, with our frontier; ``FRONTIER_CONCURRENCY`` 32, so two workers'
    fair shares (16 each) are what one worker runs alone. The site is one
    host, so the frontier's per-site bookkeeping is shared by both workers:
    what limits two workers is the workers' CPU, the site server's and
    Redis's, all on the same cores. Runs alternate one and two workers
    (:func:`in_turn`), after one uncounted one-worker crawl if ``warmup``.

    :returns: ``{"rates": {1: [pages/s, ...], 2: [...]}, "pages": pages}``.
    """
    rates: dict[int, list[float]] = {1: [], 2: []}
    settings = {**CPU_SETTINGS, "FRONTIER_CONCURRENCY": 32}
    timeout = 60 if pages < 1000 else 300
    with FastSite(generated_site(pages)) as site:
        if warmup:
            _crawl_once(site, redis_url, log_dir=log_dir, tag="g-warmup", workers=1,
                        settings=settings, expected=pages + 1, timeout=timeout)
        for r, workers in in_turn(list(rates), repeat):
            hits = _crawl_once(
                site, redis_url, log_dir=log_dir, tag=f"g-{workers}-{r}",
                workers=workers, settings=settings, expected=pages + 1, timeout=timeout,
            )
            rates[workers].append(steady_rate(hits))
    return {"rates": rates, "pages": pages}


def scaling_throughput(
    redis_url: str, log_dir: Path, *, pages_per_worker: int, delay: float, repeat: int
) -> dict[str, object]:
    """Figure b: 1, 2 and 4 workers on a site that holds each response ``delay`` s.

    The site is a hub linking to ``pages_per_worker * workers`` leaf pages,
    so every page is known after the first fetch. Each worker runs 16
    requests at once (``CONCURRENT_REQUESTS`` and ``_PER_DOMAIN``); the
    cluster-wide ``FRONTIER_CONCURRENCY`` is 64, so each of four workers'
    fair share is still 16 and politeness is not the limit. Runs go
    1, 2, 4 workers, then 4, 2, 1 (:func:`in_turn`).
    """
    rates: dict[int, list[float]] = {1: [], 2: [], 4: []}
    settings = {
        **CPU_SETTINGS,
        "FRONTIER_CONCURRENCY": 64,
    }
    for r, workers in in_turn(list(rates), repeat):
        n = pages_per_worker * workers
        with FastSite(flat_site(n), delay=delay) as site:
            hits = _crawl_once(
                site, redis_url, log_dir=log_dir, tag=f"b-{workers}-{r}",
                workers=workers, settings=settings, expected=n + 1, timeout=300,
            )
        rates[workers].append(steady_rate([h for h in hits if h.path != "/"]))
    return {"rates": rates, "delay": delay, "pages_per_worker": pages_per_worker}


def seed_pickup(
    redis_url: str, log_dir: Path, *, tries: int, idle: float, stock: bool
) -> dict[str, object]:
    """Figure f: ms from ``LPUSH`` of a seed to its request reaching the site.

    One worker is started and left idle for ``idle`` seconds; then ``tries``
    seeds are pushed one at a time, each after the previous one was fetched
    and a random pause of 0.2-1.0 s (so pushes fall at random points of any
    polling cycle).

    :param stock: a stock scrapy-redis ``RedisSpider`` worker instead of ours.
    """
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    spider = "bench_stock" if stock else "bench_links"
    settings: dict[str, object] = {} if stock else {"SPIDER_MODULES": "bench.spiders"}
    latencies: list[float] = []
    rng = random.Random(5)  # noqa: S311 - pauses, not secrets
    with FastSite({}, default_ok=True) as site:
        proc = start_worker(
            spider, redis_url, log_dir / f"f-{spider}.log", settings, stock=stock
        )
        try:
            if stock:
                _wait_registered(client, proc)
            else:
                wait_blocked(client, 1, [proc])
            time.sleep(idle)
            for i in range(tries):
                site.clear_hits()
                pushed = time.monotonic()
                client.lpush(f"{spider}:start_urls", f"{site.url}/seed/{i}")
                if not site.wait_for_hits(1, timeout=30):
                    raise RuntimeError(f"seed {i} was not fetched within 30s")
                latencies.append((site.hits()[0].started - pushed) * 1000)
                time.sleep(rng.uniform(0.2, 1.0))
        finally:
            stop_workers([proc])
            client.close()
    return {"latencies_ms": latencies, "median_ms": statistics.median(latencies)}


def _wait_registered(client: redis.Redis, proc: object, timeout: float = 90.0) -> None:
    """Wait until the stock worker has connected to Redis (its first LPOP)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.get("cmd") in ("lpop", "spop", "zrange", "multi", "exec")
               for c in client.client_list()):
            return
        time.sleep(0.05)
    raise RuntimeError("the stock worker did not reach Redis")
