"""Scrapy settings for a stock scrapy-redis worker (the seed-pickup baseline).

Only scrapy-redis's own components, as its README configures them: its
scheduler, its pickle-serialized priority queue and its dupefilter. No
project add-on, extension, middleware or pipeline.
"""

from __future__ import annotations

import os

BOT_NAME = "bench_stock"
SPIDER_MODULES = ["bench.spiders"]
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
SCHEDULER = "scrapy_redis.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
SCHEDULER_QUEUE_CLASS = "scrapy_redis.queue.PriorityQueue"
SCHEDULER_PERSIST = True
# Never close for idleness: the benchmark stops the worker.
MAX_IDLE_TIME_BEFORE_CLOSE = 0
