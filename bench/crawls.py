"""Figures measured with real ``scrapy crawl`` workers: a, b and f.

Throughput is measured at the site server: pages served per second over the
middle 80% of the crawl (between the 10th and the 90th percentile of
response times), so worker start-up and the last stragglers of a crawl,
which are the same for every variant, do not dilute the steady rate.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from typing import TYPE_CHECKING

import redis

from bench.sites import FastSite, flat_site
from bench.workers import start_worker, stop_workers, wait_blocked
from devtools.replay import generated_site

if TYPE_CHECKING:
    from pathlib import Path

    from bench.sites import ServedHit

logger = logging.getLogger(__name__)

__all__ = ["cpu_scaling", "crawl_throughput", "scaling_throughput", "seed_pickup"]

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
    redis_url: str, log_dir: Path, *, pages: int, repeat: int
) -> dict[str, object]:
    """Figure a: one worker, our frontier vs Scrapy's in-memory scheduler.

    The site is :func:`devtools.replay.generated_site` (a tree of ``pages``
    pages, 5 links each plus a link home and one off-site link) on
    :class:`~bench.sites.FastSite`; runs alternate ours / in-memory.
    """
    ours: list[float] = []
    base: list[float] = []
    with FastSite(generated_site(pages)) as site:
        for r in range(repeat):
            for name, extra, out in (("ours", {}, ours), ("memory", IN_MEMORY, base)):
                hits = _crawl_once(
                    site, redis_url, log_dir=log_dir, tag=f"a-{name}-{r}", workers=1,
                    settings={**CPU_SETTINGS, **extra}, expected=pages + 1,
                    timeout=60 if pages < 1000 else 300,
                )
                out.append(steady_rate(hits))
    return {"ours": ours, "baseline": base, "pages": pages}


def cpu_scaling(
    redis_url: str, log_dir: Path, *, pages: int, repeat: int
) -> dict[str, object]:
    """Figure g: two workers against one on the CPU-bound site of figure a.

    The same tree of ``pages`` pages (:func:`devtools.replay.generated_site`
    on :class:`~bench.sites.FastSite`, no delay) and the same settings as
    figure a, with our frontier; ``FRONTIER_CONCURRENCY`` 32, so two workers'
    fair shares (16 each) are what one worker runs alone. The site is one
    host, so the frontier's per-site bookkeeping is shared by both workers:
    what limits two workers is the workers' CPU, the site server's and
    Redis's, all on the same cores. Runs alternate one and two workers.

    :returns: ``{"rates": {1: [pages/s, ...], 2: [...]}, "pages": pages}``.
    """
    rates: dict[int, list[float]] = {1: [], 2: []}
    settings = {**CPU_SETTINGS, "FRONTIER_CONCURRENCY": 32}
    with FastSite(generated_site(pages)) as site:
        for r in range(repeat):
            for workers, out in rates.items():
                hits = _crawl_once(
                    site, redis_url, log_dir=log_dir, tag=f"g-{workers}-{r}",
                    workers=workers, settings=settings, expected=pages + 1,
                    timeout=60 if pages < 1000 else 300,
                )
                out.append(steady_rate(hits))
    return {"rates": rates, "pages": pages}


def scaling_throughput(
    redis_url: str, log_dir: Path, *, pages_per_worker: int, delay: float, repeat: int
) -> dict[str, object]:
    """Figure b: 1, 2 and 4 workers on a site that holds each response ``delay`` s.

    The site is a hub linking to ``pages_per_worker * workers`` leaf pages,
    so every page is known after the first fetch. Each worker runs 16
    requests at once (``CONCURRENT_REQUESTS`` and ``_PER_DOMAIN``); the
    cluster-wide ``FRONTIER_CONCURRENCY`` is 64, so each of four workers'
    fair share is still 16 and politeness is not the limit.
    """
    rates: dict[int, list[float]] = {1: [], 2: [], 4: []}
    settings = {
        **CPU_SETTINGS,
        "FRONTIER_CONCURRENCY": 64,
    }
    for r in range(repeat):
        for workers, out in rates.items():
            n = pages_per_worker * workers
            with FastSite(flat_site(n), delay=delay) as site:
                hits = _crawl_once(
                    site, redis_url, log_dir=log_dir, tag=f"b-{workers}-{r}",
                    workers=workers, settings=settings, expected=n + 1, timeout=300,
                )
            out.append(steady_rate([h for h in hits if h.path != "/"]))
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
