"""Redis bytes per queued request of the ``pages`` spider's own requests.

Figure c (:func:`bench.frontier_figs.redis_memory`) queues synthetic
requests (a URL, a callback, ``meta={"depth": 2}``). A real crawl queues
more per request: the ``Referer`` header Scrapy's RefererMiddleware sets,
the ``seed_hosts`` the project's SeedHostsMiddleware sets, the depth, and
for a redirect the redirect middleware's meta. :func:`pages_request_memory`
measures those:

1. a ``scrapy crawl pages`` runs in this process (project settings, no item
   pipeline, its own frontier on ``redis_url``) on a WARC capture replayed
   by :class:`devtools.replay.ReplayServer` (by default the
   quotes.toscrape.com capture in ``shared/sites``); every request the
   engine hands to the scheduler (Scrapy's ``request_scheduled`` signal:
   after the spider middlewares, before the dupefilter) is copied;
2. the database is flushed and the distinct requests (first of each
   fingerprint, as the dupefilter lets through) are queued again through the
   project's queue (:class:`crawler.frontier.queue.LeasedPriorityQueue`:
   its ``push``, its encoding, the frontier's scripts), without a
   dupefilter;
3. ``MEMORY USAGE`` (exact, ``SAMPLES 0``) of the queue's chunk hash
   ``{pages}:qc`` and of every key, and the ``used_memory`` growth, are
   divided by the number of requests queued.

``python -m bench.compare m CHECKOUT...`` runs this file's source in each
checkout, so it uses only what every version has (``LeasedPriorityQueue``
and its ``push``, the ``pages`` spider, the project's settings). A reactor
runs once per process: call it in a process of its own (``python -m
bench`` and ``bench.compare`` do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request, signals
from scrapy.crawler import CrawlerProcess
from scrapy.utils.project import get_project_settings
from scrapy.utils.test import get_crawler

from crawler.frontier.queue import LeasedPriorityQueue
from crawler.spiders.pages import PagesSpider
from devtools.replay import ReplayServer

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["crawl_requests", "pages_request_memory", "queue_memory"]


def crawl_requests(redis_url: str, warc: str | Path | None = None) -> list[Request]:
    """The requests a ``pages`` crawl of ``warc`` hands to the scheduler,
    copied as the engine schedules them (after the spider middlewares: depth,
    Referer, seed hosts; redirects included), duplicates included, in order.

    Runs the crawl in this process (a Twisted reactor runs once per
    process); flushes ``redis_url``'s database first.
    """
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    seen: list[Request] = []
    with ReplayServer(warc) as site:
        client.lpush("pages:start_urls", site.url_for("/"))
        settings = get_project_settings()
        settings.setdict({
            "REDIS_URL": redis_url, "ITEM_PIPELINES": {}, "LOG_LEVEL": "ERROR",
            "MAX_IDLE_TIME_BEFORE_CLOSE": 2, "FRONTIER_IDLE_WAIT": 0.2,
            "TELNETCONSOLE_ENABLED": False, "DOWNLOAD_DELAY": 0, "FRONTIER_DELAY": 0.0,
            "AUTOTHROTTLE_ENABLED": False, "HTTPCACHE_ENABLED": False,
        }, priority="cmdline")
        process = CrawlerProcess(settings)
        crawler = process.create_crawler(PagesSpider)

        def scheduled(request: Request, spider: Any) -> None:
            seen.append(request.copy())

        crawler.signals.connect(scheduled, signal=signals.request_scheduled)
        process.crawl(crawler)
        process.start()
    client.flushdb()
    client.close()
    return seen


def queue_memory(redis_url: str, requests: list[Request], copies: int = 20) -> dict[str, Any]:
    """Queue the distinct ``requests`` (first of each fingerprint) through the
    project's ``LeasedPriorityQueue`` for the ``pages`` spider on a flushed
    database; Redis bytes per request queued.

    The requests are queued ``copies`` times over (no dupefilter: each copy
    is one more entry in the site's queue), so that the growth of
    ``used_memory`` is over enough requests to mean something; the
    ``MEMORY USAGE`` figures are about the same for one copy.

    :returns: ``{"requests", "queued", "queue_hash", "all_keys",
        "used_memory", "entry_mean"}``: the requests given and the requests
        queued (all copies), then bytes per request queued: ``MEMORY USAGE``
        (exact) of the chunk hashes ``{...}:qc``, of every key, the growth
        of ``used_memory``; and the mean length of an encoded entry.
    """
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    crawler = get_crawler(PagesSpider, {**get_project_settings().copy_to_dict(),
                                        "REDIS_URL": redis_url})
    spider = PagesSpider()
    spider._set_crawler(crawler)
    crawler.spider = spider
    fingerprint = crawler.request_fingerprinter.fingerprint
    distinct = list({fingerprint(r): r for r in reversed(requests)}.values())[::-1]
    queue = LeasedPriorityQueue(client, spider, "{pages}")
    queue.frontier.load_scripts()
    # Warm-up: the scripts' and the keyspace's first allocations.
    queue.push(distinct[0])
    client.flushdb()
    before = int(client.info("memory")["used_memory"])
    for _ in range(copies):
        for request in distinct:
            queue.push(request)
    after = int(client.info("memory")["used_memory"])
    n = len(distinct) * copies
    sizes = {key: int(client.memory_usage(key, samples=0) or 0) for key in client.scan_iter()}
    out = {
        "requests": len(requests),
        "queued": int(client.get(queue.frontier.key("count")) or 0),
        "queue_hash": sum(v for k, v in sizes.items() if k.endswith(b":qc")) / n,
        "all_keys": sum(sizes.values()) / n,
        "used_memory": (after - before) / n,
        "entry_mean": sum(len(queue.encode(r)) for r in distinct) / len(distinct),
    }
    client.flushdb()
    client.close()
    return out


def pages_request_memory(redis_url: str, warc: str | Path | None = None) -> dict[str, Any]:
    """:func:`crawl_requests`, then :func:`queue_memory` of them.

    :returns: ``{"own": ..., "all": ...}``: :func:`queue_memory` of the
        requests the spider yields (every scheduled request but the
        redirects, whose meta has ``redirect_urls``), and of every
        scheduled request, redirects included (they carry the headers the
        downloader middlewares set and the redirect middleware's meta).
    """
    requests = crawl_requests(redis_url, warc)
    own = [r for r in requests if "redirect_urls" not in r.meta]
    return {"own": queue_memory(redis_url, own), "all": queue_memory(redis_url, requests)}
