"""Scrapy settings for the distributed crawler.

Every setting the project adds is documented here with its default. Settings
that belong to scrapy-redis keep scrapy-redis's names (they are what its users
know) and are only set in this file, each with a comment. Connection settings
come from the environment so that credentials never live in code:

=================  =============================  ==========================
environment        setting                        default
=================  =============================  ==========================
``REDIS_URL``      ``REDIS_URL``                  ``redis://localhost:6379/0``
``MONGO_URI``      ``MONGO_URI``                  ``mongodb://localhost:27017``
``MONGO_DATABASE`` ``MONGO_DATABASE``             ``crawler``
=================  =============================  ==========================

Redis keys of one crawl (``<spider>`` is the spider's name):

=============================  ======  ==========================================
key                            type    what it holds
=============================  ======  ==========================================
``<spider>:start_urls``        list    seeds, pushed with ``LPUSH`` (bare URL or
                                       JSON); workers take them from the right,
                                       so seeds are read in the order pushed
``{<spider>}:requests``        zset    the frontier: encoded requests (JSON),
                                       scored by ``-priority``
``{<spider>}:dupefilter``      set     request fingerprints (20 raw bytes each)
                                       of every request ever scheduled
=============================  ======  ==========================================

The frontier keys share the hash tag ``{<spider>}`` so that keys touched
together live in one slot on Redis Cluster; the seed list keeps scrapy-redis's
name, which users type into ``redis-cli``.
"""

from __future__ import annotations

import os

BOT_NAME = "crawler"

SPIDER_MODULES = ["crawler.spiders"]
NEWSPIDER_MODULE = "crawler.spiders"

ADDONS: dict[str, int] = {}

USER_AGENT = "crawler (+https://docs.scrapy.org/en/latest/topics/practices.html)"
# Scrapy's RobotsTxtMiddleware fetches robots.txt once per host in every
# worker, outside the shared frontier, so N workers fetch it N times. Off until
# robots.txt is fetched once for the whole cluster; turn it on per crawl with
# -s ROBOTSTXT_OBEY=True.
ROBOTSTXT_OBEY = False

CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 8
DOWNLOAD_DELAY = 0

# Scrapy's defaults, spelled out because the frontier depends on them.
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
FEED_EXPORT_ENCODING = "utf-8"

# --- Connections ------------------------------------------------------------

#: Redis server shared by all workers of a crawl (scrapy-redis reads it).
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
#: MongoDB server that stores the items.
MONGO_URI = os.environ.get("MONGO_URI", "mongodb://localhost:27017")
#: MongoDB database that holds one collection per item type.
MONGO_DATABASE = os.environ.get("MONGO_DATABASE", "crawler")

# --- scrapy-redis components (its own setting names) ------------------------

# The shared Redis scheduler, our subclass of scrapy_redis.scheduler.Scheduler.
SCHEDULER = "crawler.frontier.scheduler.FrontierScheduler"
# scrapy-redis's sorted-set priority queue, with our JSON encoding.
SCHEDULER_QUEUE_CLASS = "crawler.frontier.queue.JsonPriorityQueue"
# Our subclass of scrapy_redis.dupefilter.RFPDupeFilter, using Scrapy's
# request fingerprinter.
DUPEFILTER_CLASS = "crawler.frontier.dupefilter.FrontierDupeFilter"
# Keep the frontier and the dupefilter when a worker closes: other workers are
# still using them, and a restarted crawl resumes where it stopped.
SCHEDULER_PERSIST = True
# Frontier keys carry the hash tag {<spider>} (see the key table above).
SCHEDULER_QUEUE_KEY = "{%(spider)s}:requests"
SCHEDULER_DUPEFILTER_KEY = "{%(spider)s}:dupefilter"
# Seconds a worker waits with nothing to do before it closes; 0 waits for work
# forever. Counted from the worker's last request or response.
MAX_IDLE_TIME_BEFORE_CLOSE = int(os.environ.get("MAX_IDLE_TIME_BEFORE_CLOSE", "0"))

# --- Our own settings (FRONTIER_*, MONGO_*) ---------------------------------

#: Seconds an idle worker blocks on the seed list before it looks again at
#: the shared frontier (requests other workers discovered). Default: 1.0.
FRONTIER_IDLE_WAIT = 1.0
#: Follow only links to the hosts of the seed a request descends from (and
#: their subdomains), as Scrapy's ``allowed_domains`` would. Default: True.
FRONTIER_STAY_ON_SEED_HOSTS = True

#: Items per MongoDB bulk write. Default: 500.
MONGO_BATCH_SIZE = 500
#: Seconds between flushes of a batch that has not filled up. Default: 1.0.
MONGO_FLUSH_INTERVAL = 1.0

SPIDER_MIDDLEWARES = {
    "crawler.middlewares.SeedHostsMiddleware": 550,
}

DOWNLOADER_MIDDLEWARES = {
    # After RedirectMiddleware (600) in process_request order, before the
    # download handler: drops redirects off the seed's hosts.
    "crawler.middlewares.SeedHostsMiddleware": 650,
}

ITEM_PIPELINES = {
    "crawler.pipelines.MongoPipeline": 300,
}

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
