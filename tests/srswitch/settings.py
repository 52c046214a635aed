"""scrapy-redis 0.9.1's example settings, with its switch pointed at the frontier."""

import os

BOT_NAME = "srswitch"
SPIDER_MODULES = ["tests.srswitch.spiders"]
# scrapy-redis's switch, pointed at ours; the rest as scrapy-redis's example has it.
SCHEDULER = "crawler.frontier.scheduler.FrontierScheduler"
DUPEFILTER_CLASS = "crawler.frontier.dupefilter.FrontierDupeFilter"
SCHEDULER_QUEUE_CLASS = "scrapy_redis.queue.PriorityQueue"
SCHEDULER_PERSIST = True
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
MAX_IDLE_TIME_BEFORE_CLOSE = 3
