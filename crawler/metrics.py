"""Prometheus exporter of the crawl's cluster-wide figures.

Run it next to Redis and MongoDB, once for the whole cluster::

    python -m crawler.metrics                      # 127.0.0.1:9410
    python -m crawler.metrics --host 0.0.0.0 --port 9410

Each scrape reads the figures afresh through :class:`crawler.status.StatusReader`
(the same code as ``scrapy frontier status``), so the two always agree; it
reads counters and known keys only (no ``SCAN``), so other applications'
keys in the same Redis do not slow it down. The figures of a sharded
frontier (``FRONTIER_SHARDS``) are sums over its shards.
Metrics (all gauges unless said; ``spider``, ``worker``, ``collection``,
``feed``, ``priority``, ``key``, ``stat`` are labels):

====================================================  ==========================================
metric                                                what
====================================================  ==========================================
``crawler_up{server}``                                1 if ``redis``/``mongodb`` could be read
                                                      (no ``mongodb`` sample without ``MONGO_URI``)
``crawler_state{spider,state}``                       1 for the crawl's state (``running``,
                                                      ``paused``, ``stopped``, ``idle``,
                                                      ``finished``; ``crawl_state`` of
                                                      :mod:`crawler.status`), 0 for the others
``crawler_seeds_waiting{spider}``                     seeds in ``<spider>:start_urls``
``crawler_requests_queued{spider}``                   requests queued (``{<spider>}:count``)
``crawler_requests_queued_by_priority{spider,priority}``  the same, per request priority (the
                                                      ``FRONTIER_STATUS_MAX_PRIORITIES``
                                                      highest priorities; no sample when
                                                      unknown: a frontier without
                                                      ``{<spider>}:prio``)
``crawler_requests_leased{spider}``                   requests leased by workers
``crawler_requests_leased_by_worker{spider,worker}``  the same, per worker
``crawler_retries_waiting{spider}``                   requests waiting for a retry
``crawler_spider_started{spider}``                    1 if any key of the spider is in Redis
``crawler_frontier_shards{spider}``                   the frontier's shard count (recorded in
                                                      ``{<spider>}:shards``; 1 when absent)
``crawler_revisits_scheduled{spider}``                revisits scheduled, not yet due
``crawler_dead_letters{spider,key}``                  dead letters; ``key`` is ``{<spider>}:dead``
                                                      (shard 0's: the sample sums the shards)
``crawler_dead_letters_trimmed_total{spider,key}``    counter: dead letters trimmed off the
                                                      lists past ``FRONTIER_DEAD_LETTERS_MAX``
``crawler_urls_seen{spider}``                         fingerprints in the dupefilter sets; no
                                                      sample with the Bloom dupefilter
``crawler_items_stored{collection}``                  documents per MongoDB collection
``crawler_feed_items{spider,feed}``                   items the crawl's workers wrote to feeds
                                                      of that URI (``-O``, ``FEEDS``), summed
                                                      over the workers and every run of the
                                                      crawl (totals), as each feed closed
``crawler_workers_live{spider}``                      workers with a recent heartbeat
``crawler_worker_pages_per_minute{spider,worker}``    per live worker
``crawler_worker_pages{spider,worker}``               responses received, per live worker
``crawler_worker_items{spider,worker}``               items stored (documents added), per live
                                                      worker
``crawler_worker_last_heartbeat_timestamp_seconds``   Unix time, per live worker
``crawler_pages_crawled_total{spider}``               counter: ``response_received_count``
``crawler_items_scraped_total{spider}``               counter: ``item_scraped_count``
``crawler_stats_total{spider,stat}``                  counter: every cluster-wide stat
``crawler_status_read_seconds``                       time the last reading took
====================================================  ==========================================

Settings: ``METRICS_HOST`` (default ``127.0.0.1``), ``METRICS_PORT`` (default
9410), and those of :mod:`crawler.status`; they are checked at start
(:func:`crawler.checks.validate_settings`): a bad one is reported in one line
(``Bad setting: METRICS_PORT='abc': ...``) and the exporter exits with status 2.
A server that cannot be read is logged (a warning naming it, password masked,
and the cause) when it fails and when it can be read again, not per scrape.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from crawler.status import CRAWL_STATES, StatusReader

if TYPE_CHECKING:
    from collections.abc import Iterator

    from crawler.status import ClusterStatus

logger = logging.getLogger(__name__)

#: How the log names each server of ``ClusterStatus.errors``.
_NAMES = {"redis": "Redis", "mongodb": "MongoDB"}

__all__ = ["StatusCollector", "main", "serve"]


class StatusCollector(Collector):
    """A prometheus-client collector that reads :class:`ClusterStatus` per scrape.

    :param reader: the status reader (its connections are reused).
    """

    def __init__(self, reader: StatusReader) -> None:
        self.reader = reader
        #: ``"redis"``/``"mongodb"`` -> the error of the last scrape that
        #: failed to read it (logged once per change).
        self._errors: dict[str, str] = {}

    def collect(self) -> Iterator[Metric]:
        """Read the status and yield the metric families of the module table."""
        began = time.monotonic()
        status = self.reader.read()
        took = time.monotonic() - began
        self._log_errors(status.errors)

        yield _up(status)

        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        state = gauge(
            "crawler_state",
            "1 for the crawl's state (running, paused, stopped, idle, finished), 0 for the others",
            ["spider", "state"],
        )
        seeds = gauge("crawler_seeds_waiting", "Seeds waiting in <spider>:start_urls", ["spider"])
        queued = gauge("crawler_requests_queued", "Requests queued in the frontier", ["spider"])
        by_priority = gauge(
            "crawler_requests_queued_by_priority",
            "Requests queued in the frontier, per request priority",
            ["spider", "priority"],
        )
        leased = gauge("crawler_requests_leased", "Requests leased by workers", ["spider"])
        leased_by = gauge(
            "crawler_requests_leased_by_worker",
            "Requests leased, per worker",
            ["spider", "worker"],
        )
        retries = gauge("crawler_retries_waiting", "Requests waiting for a retry", ["spider"])
        dead = gauge("crawler_dead_letters", "Dead letters in {<spider>}:dead", ["spider", "key"])
        seen = gauge(
            "crawler_urls_seen",
            "Request fingerprints in the dupefilter set (none with the Bloom dupefilter)",
            ["spider"],
        )
        live = gauge("crawler_workers_live", "Workers with a recent heartbeat", ["spider"])
        rate = gauge(
            "crawler_worker_pages_per_minute",
            "Pages per minute over the last heartbeat interval, per live worker",
            ["spider", "worker"],
        )
        pages = gauge(
            "crawler_worker_pages", "Responses received, per live worker", ["spider", "worker"]
        )
        items = gauge(
            "crawler_worker_items", "Items stored (documents added), per live worker",
            ["spider", "worker"],
        )
        beat = gauge(
            "crawler_worker_last_heartbeat_timestamp_seconds",
            "Unix time of the last heartbeat, per live worker",
            ["spider", "worker"],
        )
        crawled = CounterMetricFamily(
            "crawler_pages_crawled", "Responses received by all workers", labels=["spider"]
        )
        scraped = CounterMetricFamily(
            "crawler_items_scraped", "Items scraped by all workers", labels=["spider"]
        )
        stats = CounterMetricFamily(
            "crawler_stats", "Cluster-wide Scrapy stats", labels=["spider", "stat"]
        )
        for name, spider in status.spiders.items():
            for each in CRAWL_STATES:
                state.add_metric([name, each], 1.0 if spider.state == each else 0.0)
            seeds.add_metric([name], spider.seeds)
            queued.add_metric([name], spider.queued)
            for priority, count in (spider.queued_by_priority or {}).items():
                by_priority.add_metric([name, str(priority)], count)
            leased.add_metric([name], spider.leases)
            for worker, count in spider.leases_by_worker.items():
                leased_by.add_metric([name, worker], count)
            retries.add_metric([name], spider.retries)
            dead.add_metric([name, spider.keys["dead"]], spider.dead_letters)
            if spider.seen is not None:  # a Bloom filter cannot count its URLs
                seen.add_metric([name], spider.seen)
            live.add_metric([name], len(spider.live_workers))
            for w in spider.live_workers:
                rate.add_metric([name, w.id], w.pages_per_minute)
                pages.add_metric([name, w.id], w.pages)
                items.add_metric([name, w.id], w.items)
                beat.add_metric([name, w.id], w.last_heartbeat)
            crawled.add_metric([name], spider.stats.get("response_received_count", 0))
            scraped.add_metric([name], spider.stats.get("item_scraped_count", 0))
            for stat, value in sorted(spider.stats.items()):
                stats.add_metric([name, stat], value)
        stored = gauge("crawler_items_stored", "Documents per MongoDB collection", ["collection"])
        for collection, count in status.items.items():
            stored.add_metric([collection], count)
        yield from (state, seeds, queued, by_priority, leased, leased_by, retries, dead, seen)
        yield from _bounds(status)
        yield from (stored, _feeds(status), live, rate, pages, items, beat, crawled, scraped,
                    stats)
        yield GaugeMetricFamily(
            "crawler_status_read_seconds", "Seconds the last status reading took", value=took
        )

    def _log_errors(self, errors: dict[str, str]) -> None:
        """Log a server that cannot be read (its address, password masked,
        and the cause, as ``status.errors`` holds them) when it starts
        failing or fails with another type of error, and when it can be read
        again: not at every scrape."""
        for server in ("redis", "mongodb"):
            error, before = errors.get(server), self._errors.get(server)
            if error is not None and (before is None or _kind(error) != _kind(before)):
                logger.warning(
                    "could not read %s: %s (crawler_up is 0; the exporter tries again at the "
                    "next scrape: check that the server runs)", _NAMES[server], error,
                )
            elif error is None and before is not None:
                logger.info("%s can be read again", _NAMES[server])
        self._errors = dict(errors)


def _kind(error: str) -> list[str]:
    """The server and error type of a ``status.errors`` value (``<address>:
    <Type>: <message>``), without the message, which may vary per attempt."""
    return error.split(": ", 2)[:2]


def _up(status: ClusterStatus) -> Metric:
    """``crawler_up{server}``: 1 per server read, 0 per server that failed
    (MongoDB only when ``MONGO_URI`` is set)."""
    up = GaugeMetricFamily("crawler_up", "Whether the server could be read", labels=["server"])
    for server in ("redis", "mongodb"):
        if server in status.servers or server in status.errors:
            up.add_metric([server], 0.0 if server in status.errors else 1.0)
    return up


def _feeds(status: ClusterStatus) -> Metric:
    """``crawler_feed_items{spider,feed}``: items written to each feed."""
    family = GaugeMetricFamily(
        "crawler_feed_items", "Items the workers wrote to feeds of a URI, all runs (totals)",
        labels=["spider", "feed"]
    )
    for name, spider in status.spiders.items():
        for feed, count in spider.feeds.items():
            family.add_metric([name, feed], count)
    return family


def _bounds(status: ClusterStatus) -> Iterator[Metric]:
    """Whether each spider has keys in Redis, its shards, revisits and dead
    letters trimmed."""
    started = GaugeMetricFamily(
        "crawler_spider_started", "1 if any key of the spider is in Redis", labels=["spider"]
    )
    shards = GaugeMetricFamily(
        "crawler_frontier_shards", "Shards of the crawl's frontier", labels=["spider"]
    )
    revisits = GaugeMetricFamily(
        "crawler_revisits_scheduled", "Revisits scheduled, not yet due", labels=["spider"]
    )
    trimmed = CounterMetricFamily(
        "crawler_dead_letters_trimmed",
        "Dead letters trimmed off the dead-letter lists past FRONTIER_DEAD_LETTERS_MAX",
        labels=["spider", "key"],
    )
    for name, spider in status.spiders.items():
        started.add_metric([name], 1.0 if spider.started else 0.0)
        shards.add_metric([name], spider.shards)
        revisits.add_metric([name], spider.revisits)
        trimmed.add_metric([name, spider.keys["dead"]], spider.dead_trimmed)
    yield from (started, shards, revisits, trimmed)


def serve(reader: StatusReader, host: str, port: int) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` for ``reader`` on ``host:port`` in a daemon thread.

    :returns: ``(server, thread)``; call ``server.shutdown()`` to stop.
    :raises OSError: the address cannot be bound.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(reader))
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread


def main(argv: list[str] | None = None) -> int:
    """Run the exporter until SIGINT or SIGTERM.

    :returns: the exit status: 0; 2 for a bad setting (nothing served).
    """
    from scrapy.utils.project import get_project_settings  # noqa: PLC0415

    from crawler.checks import validate_settings  # noqa: PLC0415
    from crawler.config import FrontierConfig, SettingsError  # noqa: PLC0415

    settings = get_project_settings()
    try:
        validate_settings(settings, warn_unknown=False)
    except SettingsError as exc:
        for line in exc.problems:
            print(f"Bad setting: {line}", file=sys.stderr)
        return 2
    config = FrontierConfig.from_settings(settings)
    parser = argparse.ArgumentParser(
        prog="python -m crawler.metrics", description="Prometheus exporter of the crawl"
    )
    parser.add_argument(
        "--host",
        default=config.metrics_host,
        help="address to bind (default: METRICS_HOST, 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=config.metrics_port,
        help="port to bind (default: METRICS_PORT, 9410)",
    )
    parser.add_argument(
        "--spider",
        action="append",
        default=None,
        help="spider to report (repeatable; default: every spider of the project)",
    )
    parser.add_argument("--log-level", default="INFO", help="log level (default: INFO)")
    opts = parser.parse_args(argv)
    logging.basicConfig(
        level=opts.log_level.upper(), format="%(asctime)s [%(name)s] %(levelname)s: %(message)s"
    )
    reader = StatusReader.from_settings(settings, opts.spider)
    server, _ = serve(reader, opts.host, opts.port)
    logger.info("Serving metrics on http://%s:%d/metrics", opts.host, opts.port)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop.wait()
    server.shutdown()
    reader.close()
    logger.info("Metrics exporter stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
