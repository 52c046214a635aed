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

# --- Our own settings (FRONTIER_*, MONGO_*) ---------------------------------

#: Seconds an idle worker blocks on the seed list before it looks again at
#: the shared frontier (requests other workers discovered). Default: 1.0.
FRONTIER_IDLE_WAIT = 1.0
#: Seconds between two requests to one site, across all workers together;
#: None means DOWNLOAD_DELAY. Per-site overrides: FRONTIER_SITE_DELAYS, or
#: the Redis hash {<spider>}:delay (site -> ms) while the crawl runs.
FRONTIER_DELAY = None
#: Requests to one site at once, across all workers; None means
#: CONCURRENT_REQUESTS_PER_DOMAIN. Live overrides: hash {<spider>}:conc.
FRONTIER_CONCURRENCY = None
#: A site's delay is stretched by this fraction so that the jitter between
#: leasing a request and its reaching the site never brings two requests
#: closer than the delay. Default: 0.1.
FRONTIER_DELAY_MARGIN = 0.1
#: Seconds a robots.txt stored in Redis is used before one worker fetches it
#: again (with ROBOTSTXT_OBEY). Default: 86400.
FRONTIER_ROBOTS_TTL = 86400.0
#: One worker fetches a site's robots.txt for all, under a lock in Redis that
#: expires after this many seconds unless renewed; the worker renews it every
#: third of that while the fetch runs, so a worker killed mid-fetch delays
#: the others at most this long. Default: 10.0.
FRONTIER_ROBOTS_LOCK_SECONDS = 10.0
#: While a site's robots.txt is unreachable (5xx or a network error; RFC
#: 9309 section 2.3.1.4) the site is fully disallowed and its requests wait
#: in the frontier; robots.txt is fetched again after
#: FRONTIER_ROBOTS_RETRY_BASE seconds, doubling after each failure up to
#: FRONTIER_ROBOTS_RETRY_MAX seconds (stretched by FRONTIER_RETRY_JITTER).
#: A stored robots.txt past its TTL keeps applying meanwhile. Defaults: 2.0,
#: 300.0.
FRONTIER_ROBOTS_RETRY_BASE = 2.0
FRONTIER_ROBOTS_RETRY_MAX = 300.0
#: Slow a site down for all workers on 429/503 and slow responses (see
#: crawler/politeness.py): on/off, first extra delay, largest extra delay
#: and the latency (seconds) that counts as slow. Defaults: True, 1.0,
#: 60.0, 5.0.
FRONTIER_ADAPTIVE_ENABLED = True
FRONTIER_ADAPTIVE_START = 1.0
FRONTIER_ADAPTIVE_MAX = 60.0
FRONTIER_ADAPTIVE_LATENCY = 5.0
#: Per-site delays in seconds, e.g. {"example.com": 2.0}, written to the
#: Redis hash {<spider>}:delay when a worker opens. Default: {}.
FRONTIER_SITE_DELAYS: dict[str, float] = {}
#: Per-site concurrency, e.g. {"example.com": 1}, written to the Redis hash
#: {<spider>}:conc when a worker opens. Default: {}.
FRONTIER_SITE_CONCURRENCY: dict[str, int] = {}
#: Seconds a leased request stays leased without a heartbeat (workers extend
#: their leases every third of it). A killed worker's requests are crawled
#: again this long after it died. Also: an intake batch of seeds not
#: refreshed for this long (its worker died) is returned to the seed list
#: by any worker; use the same value on every worker. Keep it well above the
#: Redis socket timeout: a worker blocked on Redis for a whole lease looks
#: dead. Default: 60.0.
FRONTIER_LEASE_TIMEOUT = 60.0
#: Deliveries of a request without an acknowledgement (its worker died or
#: was killed each time it handled it: a poison request) after which the
#: frontier moves it to the dead-letter list {<spider>}:dead, with its count,
#: instead of handing it out again. Leases given back at a graceful stop do
#: not count. 0: no limit. Default: 5.
FRONTIER_MAX_DELIVERIES = 5
#: Shards of the frontier (crawler/frontier/shards.py), 1 to 256: shard i
#: keeps its keys under {<spider>:i}: or {<spider>:i.<salt>}: (the salt aims
#: the tag at the i-th slice of the hash slots; one shard: {<spider>}:), so on a Redis Cluster
#: one crawl spreads over the masters; a site belongs to shard
#: BLAKE2b-64(site) % FRONTIER_SHARDS. Every worker of a crawl must use the same
#: count (recorded in {<spider>}:shards; another one stops a worker with a
#: configuration error). On one Redis server shards cost nothing and give
#: nothing; on a cluster use about 4 per master (the default 16 suits up to
#: four masters; more shards for more masters). The
#: scrapy frontier and deadletters commands read the recorded count.
#: Default: None, which is 16 with FRONTIER_REDIS_CLUSTER (one crawl spreads
#: over the masters without being told; a crawl on a cluster started with 1
#: shard, the default before, needs FRONTIER_SHARDS = 1) and 1 on one Redis
#: (-s FRONTIER_SHARDS=None asks for it too).
FRONTIER_SHARDS = None
#: Most seeds a worker moves from <spider>:start_urls into the frontier at
#: once, in one transaction (only while it has free download slots).
#: Default: 1000.
FRONTIER_SEED_BATCH = 1000
#: Most requests one lease call takes from the frontier into the worker's
#: buffer; never more than the downloader has free slots for, and each one
#: within its site's delay, concurrency and this worker's fair share.
#: Default: 16.
FRONTIER_LEASE_BATCH = 16
#: Seconds of slack in first in, first out across shards (FRONTIER_SHARDS >
#: 1): a lease call's batch goes on through its shard's sites that joined
#: the due index up to this long after another shard's first site of the
#: same priority. 0: exact, but when sites of different shards join
#: interleaved (new work from many workers), a batch stops after about one
#: request (one lease round trip per request); e.g. 1.0 keeps batches whole
#: while equal priorities are served in order to within a second.
#: Default: 0.0.
FRONTIER_FIFO_SLACK = 0.0
#: Fingerprints a worker remembers having recorded in the shared dupefilter,
#: to drop their repeats without asking Redis (most recent kept; about 100
#: bytes each). The shared dupefilter only grows while a crawl runs; delete it
#: only with the workers stopped. 0 turns this off. Default: 100000.
FRONTIER_LOCAL_SEEN = 100_000
#: Seconds a worker's frontier writes (new requests, acks, freed download
#: slots) wait for its next lease call to carry them in the same round trip
#: before they are sent on their own. A worker killed meanwhile loses them
#: together with the acks behind them, so its leases are crawled again.
#: Default: 0.05.
FRONTIER_OUTBOX_DELAY = 0.05
#: Replicas that must acknowledge a worker's frontier writes (WAIT N, in
#: the same round trip as the writes) before it counts them done, so that a
#: failover to such a replica loses none (crawler/frontier/replicas.py).
#: Fewer within FRONTIER_MIN_REPLICAS_TIMEOUT seconds: the writes are in
#: doubt, kept, and found out once enough replicas answer. 0: writes count
#: done once the master has them (a master that dies may take its last
#: writes with it: see README). Defaults: 0, 1.0.
FRONTIER_MIN_REPLICAS = 0
FRONTIER_MIN_REPLICAS_TIMEOUT = 1.0
#: Retry backoff: seconds before the first retry, doubling for each next
#: one, up to FRONTIER_RETRY_BACKOFF_MAX, stretched by up to
#: FRONTIER_RETRY_JITTER (a fraction) at random. Defaults: 1.0, 60.0, 0.1.
#: Which failures are retried, and how often, are Scrapy's RETRY_* settings.
FRONTIER_RETRY_BACKOFF_BASE = 1.0
FRONTIER_RETRY_BACKOFF_MAX = 60.0
FRONTIER_RETRY_JITTER = 0.1
#: Longest Retry-After (seconds) a response can impose. Default: 600.0.
FRONTIER_RETRY_AFTER_MAX = 600.0
#: Follow only links to the hosts of the seed a request descends from (and
#: their subdomains), as Scrapy's ``allowed_domains`` would. Default: True.
FRONTIER_STAY_ON_SEED_HOSTS = True

#: Documents per MongoDB bulk write (items with the same key in one batch are
#: merged into one). Default: 500.
MONGO_BATCH_SIZE = 500
#: Seconds between flushes of a batch that has not filled up (skipped while
#: a write is under way: the batch may still fill up). Default: 0.25.
MONGO_FLUSH_INTERVAL = 0.25
#: Items without a natural key get an _id derived from the response that
#: yielded them (crawler.middlewares.ItemIdMiddleware), so a response
#: delivered twice stores them once. Default: True.
MONGO_ITEM_IDS_ENABLED = True

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

#: Keep cluster-wide stats and the worker registry in Redis. Default: True.
FRONTIER_STATS_ENABLED = True
#: Seconds between a worker's heartbeats (and stats increments). Default: 5.0.
FRONTIER_HEARTBEAT_INTERVAL = 5.0
#: Seconds by which this worker's clock may differ from Redis's (or
#: MongoDB's) before a WARNING is logged; times stored and heartbeats are
#: corrected by the offset either way (docs/clocks.md). Default: 2.0.
FRONTIER_CLOCK_SKEW_WARN = 2.0
#: Seconds after its last heartbeat a worker stops counting as live.
#: Default: 30.0.
FRONTIER_WORKER_TIMEOUT = 30.0
#: Id of this worker in {<spider>}:workers and in JSON logs; empty means
#: ``<hostname>:<pid>``. Default: "".
FRONTIER_WORKER_ID = os.environ.get("FRONTIER_WORKER_ID", "")
#: Seconds between two reads of the crawl's state ({<spider>}:control, one
#: GET) by a worker: it pauses, resumes or stops this long after
#: ``scrapy frontier pause|resume|stop`` at most. Default: 1.0.
FRONTIER_CONTROL_INTERVAL = 1.0
#: Most distinct priorities ``scrapy frontier status`` and the metrics report
#: per spider. Default: 100.
FRONTIER_STATUS_MAX_PRIORITIES = 100
#: Seconds between two housekeeping runs of a worker (dead workers, dead
#: letters, idle sites; 0: none). Default: 30.0.
FRONTIER_HOUSEKEEPING_INTERVAL = 30.0
#: Sites of {<spider>}:due looked at per housekeeping run (over all shards:
#: each shard's share). Default: 200.
FRONTIER_HOUSEKEEPING_BATCH = 200
#: Seconds after its last heartbeat that a worker's record is removed from
#: {<spider>}:workers (it died without closing). Default: 86400.0 (a day).
FRONTIER_WORKER_FORGET_AFTER = 86400.0
#: Newest dead letters kept in {<spider>}:dead (with N shards, an N-th in
#: each shard's); older ones are trimmed and counted in the shard's
#: {<spider>}:dead:trimmed (0: no cap). Default: 100,000.
FRONTIER_DEAD_LETTERS_MAX = 100_000
#: Seconds without work (nothing queued, leased or due) after which a site's
#: state is deleted: due time, slow and Crawl-delay marks, robots.txt; its
#: overrides stay. A worker reads a site's robots.txt from Redis again after
#: half this time, so a forgotten site's rules are fetched again (with 0:
#: for every request, one Redis read and a parse each). Default: 3600.0
#: (an hour).
FRONTIER_SITE_FORGET_AFTER = 3600.0

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

#: URLs the Bloom filter is sized for; past it the false-positive rate climbs
#: above FRONTIER_BLOOM_ERROR_RATE. Changing it (or the rate) needs a new
#: filter: delete {<spider>}:bloom. With FRONTIER_SHARDS = N each shard has
#: a filter {<spider>:i}:bloom for CAPACITY / N URLs (the sites spread
#: evenly over the shards). Default: 10,000,000 (about 18 MB).
FRONTIER_BLOOM_CAPACITY = 10_000_000
#: Chance that a URL never seen is taken for a duplicate (and not crawled)
#: while the filter holds at most FRONTIER_BLOOM_CAPACITY URLs; 0.001 costs
#: 14.4 bits (1.8 bytes) per URL. Default: 0.001.
FRONTIER_BLOOM_ERROR_RATE = 0.001
#: REDIS_URL names one node of a Redis Cluster (database 0); every client is
#: then a cluster client (crawler/frontier/connection.py). From the
#: environment variable of the same name ("1" or "true"). Default: False.
FRONTIER_REDIS_CLUSTER = os.environ.get("FRONTIER_REDIS_CLUSTER", "") in ("1", "true", "True")
#: Accept a Redis whose maxmemory-policy is not noeviction (allkeys-lru, ...),
#: which may evict the crawl's queues, leases and dupefilter: work is lost.
#: Off, such a Redis is a configuration error at start, and a policy changed
#: or keys evicted during the crawl stop it (crawler/frontier/eviction.py,
#: docs/eviction.md). On, a WARNING at start and when keys are evicted.
#: Default: False.
FRONTIER_ALLOW_EVICTION = False

# --- WARC archive (issue 14) -------------------------------------------------
# crawler.warc.WarcWriterMiddleware writes every response a worker downloads
# (robots.txt and redirects included) and its request as WARC 1.1 records,
# one gzip member each, to <spider>-<worker>-<start>-<serial>.warc.gz files
# (written as NAME.warc.gz.open, renamed when closed). At 950, past
# HttpCacheMiddleware (900), right after the download handler: it records
# bodies still content-encoded, as they came over the wire.
DOWNLOADER_MIDDLEWARES["crawler.warc.WarcWriterMiddleware"] = 950

#: Directory of this worker's WARC files; "" (the default) writes none.
WARC_DIR = ""
#: Bytes after which a WARC file is closed and the next one started (a file
#: exceeds it by one record at most). Default: 1,000,000,000 (1 GB).
WARC_MAX_SIZE = 1_000_000_000

# --- Revisits with conditional GETs (issue 14) -------------------------------
#: Seconds after its fetch that every page fetched successfully is due again,
#: without being seeded again; it is then requested with If-None-Match /
#: If-Modified-Since from the ETag / Last-Modified its last response carried.
#: A 304 raises the stored documents' last_seen (and fetched_at) without
#: running the callback. Per site: scrapy frontier revisit SPIDER SITE SECONDS.
#: Revisits not yet due do not keep a worker from closing on
#: MAX_IDLE_TIME_BEFORE_CLOSE. Default: 0 (never revisit; costs nothing).
FRONTIER_REVISIT_AFTER = 0
#: Per-site revisit intervals, {site or URL: seconds} (0: never revisit the
#: site), stored in {<spider>}:revisit when a worker starts, as scrapy
#: frontier revisit would. Default: {}.
FRONTIER_SITE_REVISITS: dict[str, float] = {}
