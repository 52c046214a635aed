"""Scrapy settings for the distributed crawler.

The project's choices among Scrapy's and scrapy-redis's settings, each with a
comment; scrapy-redis's keep their names (they are what its users know). The
project's own settings (``FRONTIER_*``, ``MONGO_*``, ...) take their defaults
from ``crawler.config.SETTINGS``, documented in docs/reference/settings.md
(generated from it); only those read from the environment are set here. Connection settings
come from the environment so that credentials never live in code:

=================  =============================  ==========================
environment        setting                        default
=================  =============================  ==========================
``REDIS_URL``      ``REDIS_URL``                  ``redis://localhost:6379/0``
``MONGO_URI``      ``MONGO_URI``                  ``mongodb://localhost:27017``
``MONGO_DATABASE`` ``MONGO_DATABASE``             ``crawler``
=================  =============================  ==========================

Redis keys: every key of a crawl but the seed list ``<spider>:start_urls``
carries the hash tag ``{<spider>}``, so that keys touched together live in one
Redis Cluster slot. The tables are in ``crawler/keys.py`` (every key) and
``crawler/frontier/store.py`` (the frontier).
"""

from __future__ import annotations

import os

BOT_NAME = "crawler"

SPIDER_MODULES = ["crawler.spiders"]
NEWSPIDER_MODULE = "crawler.spiders"

ADDONS = {
    # Scrapy's politeness settings (DOWNLOAD_DELAY, CONCURRENT_REQUESTS_PER_DOMAIN,
    # DOWNLOAD_SLOTS, meta["download_slot"]) held across all workers; each
    # worker's downloader waits no delay of its own (docs/politeness.md).
    "crawler.addon.FrontierAddon": 0,
}

USER_AGENT = "crawler (+https://docs.scrapy.org/en/latest/topics/practices.html)"
# robots.txt is fetched once per site for the whole cluster, and its
# Crawl-delay holds for all workers (crawler.politeness).
ROBOTSTXT_OBEY = True

CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 8
DOWNLOAD_DELAY = 0

# Scrapy's defaults, spelled out because the frontier depends on them.
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
FEED_EXPORT_ENCODING = "utf-8"

# --- Connections ------------------------------------------------------------

#: Redis server shared by all workers of a crawl (scrapy-redis reads it).
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
#: scrapy-redis's redis-py client options (a dict, or JSON with -s), merged
#: over the project's fail-fast timeouts, socket_connect_timeout 2 s and
#: socket_timeout 10 s (crawler.frontier.connection.FAIL_FAST_PARAMS): its
#: keys win, those fill the rest, so a worker fails fast when Redis is down
#: (the scheduler then waits with backoff) instead of blocking for
#: scrapy-redis's 30 seconds. Default: {}.
REDIS_PARAMS: dict[str, object] = {}
#: MongoDB server that stores the items.
MONGO_URI = os.environ.get("MONGO_URI", "mongodb://localhost:27017")
#: MongoDB database that holds one collection per item type.
MONGO_DATABASE = os.environ.get("MONGO_DATABASE", "crawler")

# --- scrapy-redis components (its own setting names) ------------------------

# The shared Redis scheduler, our subclass of scrapy_redis.scheduler.Scheduler.
SCHEDULER = "crawler.frontier.scheduler.FrontierScheduler"
# Our subclass of scrapy_redis.queue.Base: per-site FIFO queues by priority,
# cluster-wide politeness and leases (crawler/frontier/store.py has its keys).
SCHEDULER_QUEUE_CLASS = "crawler.frontier.queue.LeasedPriorityQueue"
# Our subclass of scrapy_redis.dupefilter.RFPDupeFilter, using Scrapy's
# request fingerprinter.
DUPEFILTER_CLASS = "crawler.frontier.dupefilter.FrontierDupeFilter"
# Keep the frontier and the dupefilter when a worker closes: other workers are
# still using them, and a restarted crawl resumes where it stopped.
SCHEDULER_PERSIST = True
# Frontier keys carry the hash tag {<spider>} (see the key table above).
SCHEDULER_QUEUE_KEY = "{%(spider)s}"
SCHEDULER_DUPEFILTER_KEY = "{%(spider)s}:dupefilter"
# Seconds a worker waits with nothing to do before it closes; 0 waits for work
# forever. Counted from the worker's last request or response.
# From the environment as text: a bad value is reported by the settings
# check (crawler/config.py) with the others, not as a traceback here.
MAX_IDLE_TIME_BEFORE_CLOSE = os.environ.get("MAX_IDLE_TIME_BEFORE_CLOSE", "0")

# --- Our own settings (FRONTIER_*, MONGO_*, METRICS_*, LOG_JSON_*, WARC_*) ---
# Their defaults are written once, in crawler.config.SETTINGS (with their
# types and ranges), and listed with what they mean in docs/reference/settings.md
# (generated from that table); every component reads them through
# crawler.config.FrontierConfig. Set one here (or with -s) to change it. Set
# below are only those this project takes from the environment.

SPIDER_MIDDLEWARES = {
    "crawler.middlewares.SeedHostsMiddleware": 550,
    # Items without a natural key get an _id derived from their response
    # (request fingerprint, collection, class, rank), so a redelivered
    # response updates them instead of storing them twice. Near the engine
    # (after HttpErrorMiddleware's 50 on the way out): it sees what the
    # middlewares closer to the spider let through. MONGO_ITEM_IDS_ENABLED
    # (default True) switches it off.
    "crawler.middlewares.ItemIdMiddleware": 40,
}

DOWNLOADER_MIDDLEWARES = {
    # Retries wait in Redis with exponential backoff; give-ups are dead
    # letters. Replaces Scrapy's RetryMiddleware at its place.
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "crawler.middlewares.BackoffRetryMiddleware": 550,
    # robots.txt once per cluster, replacing Scrapy's at its place.
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "crawler.politeness.SharedRobotsTxtMiddleware": 100,
    # 429/503 and slow responses slow the site down for every worker.
    "crawler.politeness.AdaptiveSlowdownMiddleware": 560,
    # After RedirectMiddleware (600) in process_request order, before the
    # download handler: drops redirects off the seed's hosts.
    "crawler.middlewares.SeedHostsMiddleware": 650,
    # Revisits with conditional GETs (FRONTIER_REVISIT_AFTER > 0): sees the
    # final response of a redirect chain, before the retry middleware.
    "crawler.middlewares.RevisitMiddleware": 570,
}

ITEM_PIPELINES = {
    "crawler.pipelines.MongoPipeline": 300,
}

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")

# --- Operations: commands, cluster stats, metrics, JSON logs (issue 6) -------
# Redis key names live in crawler/keys.py (CrawlKeys), with their table.

#: Project commands: ``scrapy seed`` and ``scrapy frontier status``.
COMMANDS_MODULE = "crawler.commands"

EXTENSIONS = {
    # Cluster-wide stats ({<spider>}:stats) and worker heartbeats
    # ({<spider>}:workers) in Redis.
    "crawler.extensions.ClusterStats": 500,
    # JSON-lines log records when LOG_JSON_ENABLED is on.
    "crawler.jsonlog.JsonLogging": 0,
    # Pause, resume and stop every worker of a crawl ({<spider>}:control,
    # scrapy frontier pause|resume|stop; crawler/control.py).
    "crawler.control.CrawlControl": 510,
    # Bounded state: forget dead workers, trim dead letters, forget idle
    # sites (crawler/frontier/housekeeping.py).
    "crawler.frontier.housekeeping.FrontierHousekeeping": 520,
}

#: Id of this worker in {<spider>}:workers and in JSON logs; empty means
#: ``<hostname>:<pid>``. Default: "".
FRONTIER_WORKER_ID = os.environ.get("FRONTIER_WORKER_ID", "")

#: Address the Prometheus exporter (``python -m crawler.metrics``) binds.
#: Default: "127.0.0.1" (loopback only).
METRICS_HOST = os.environ.get("METRICS_HOST", "127.0.0.1")
#: Port of the Prometheus exporter. Default: 9410.
# Kept as text: a bad value is reported by the settings check, not a traceback.
METRICS_PORT = os.environ.get("METRICS_PORT", "9410")

#: Write log records as JSON lines (time, level, logger, message, worker,
#: spider, job) instead of Scrapy's text format. Default: False.
LOG_JSON_ENABLED = os.environ.get("LOG_JSON_ENABLED", "") in ("1", "true", "True")
# With LOG_JSON_ENABLED=1 in the environment, Scrapy's start-up lines are JSON
# too (the JsonLogging extension takes over once the crawler exists).
if LOG_JSON_ENABLED:
    from crawler.jsonlog import install_from_environment

    install_from_environment()

# --- Scale: Bloom-filter dupefilter and Redis Cluster (issue 5) -------------
# The Bloom filter is one setting away:
#   DUPEFILTER_CLASS = "crawler.frontier.bloom.BloomDupeFilter"
# It keeps the bitmap {<spider>}:bloom (sharded as {<spider>}:bloom:<i> past
# 2^32 bits) instead of the set {<spider>}:dupefilter; see
# crawler/frontier/bloom.py.

#: REDIS_URL names one node of a Redis Cluster (database 0); every client is
#: then a cluster client (crawler/frontier/connection.py). From the
#: environment variable of the same name ("1" or "true"). Default: False.
FRONTIER_REDIS_CLUSTER = os.environ.get("FRONTIER_REDIS_CLUSTER", "") in ("1", "true", "True")

# --- WARC archive (issue 14) -------------------------------------------------
# crawler.warc.WarcWriterMiddleware writes every response a worker downloads
# (robots.txt and redirects included) and its request as WARC 1.1 records,
# one gzip member each, to <spider>-<worker>-<start>-<serial>.warc.gz files
# (written as NAME.warc.gz.open, renamed when closed). At 950, past
# HttpCacheMiddleware (900), right after the download handler: it records
# bodies still content-encoded, as they came over the wire.
DOWNLOADER_MIDDLEWARES["crawler.warc.WarcWriterMiddleware"] = 950
