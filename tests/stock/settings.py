"""Settings of a stock scrapy-redis 0.9.1 worker (as its README configures one)."""

import os

BOT_NAME = "stock"
SPIDER_MODULES = ["tests.stock.spiders"]
SCHEDULER = "scrapy_redis.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
SCHEDULER_QUEUE_CLASS = "scrapy_redis.queue.PriorityQueue"
SCHEDULER_PERSIST = True
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
MAX_IDLE_TIME_BEFORE_CLOSE = 3
