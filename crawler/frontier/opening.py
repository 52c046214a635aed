"""The scheduler's opening: what a worker checks and sets up once.

Job: when the scheduler opens, before any request is leased,

* tell about a configuration that works but not as one may think
  (``ROBOTSTXT_OBEY`` without the shared robots.txt middleware:
  :meth:`Opening.warn_robots`; a spider whose name puts every shard on one
  Redis Cluster slot: :meth:`Opening.warn_slots`);
* give a scrapy-redis spider the client and settings it read too early
  (:meth:`Opening.adopt_redis_spider`);
* make the first Redis calls, which check the configuration
  (:meth:`Opening.check`): the eviction policy
  (:class:`~crawler.frontier.eviction.EvictionWatch`), the crawl's shard
  count, the per-site settings stored as overrides
  (:meth:`Opening.site_settings`), ``SCRIPT LOAD``, the worker's ``alive``
  call, and whether this worker queues the spider's ``start_urls``
  (:meth:`Opening.claim_start_urls`). A wrong password, a database the
  server lacks, an ACL that forbids what the crawler needs, a Redis that
  may evict, a shard count other than the crawl's, or a scrapy-redis
  setting refused is logged in one line and the spider is closed with
  the reason ``config_error`` as soon as it is open
  (:meth:`Opening.stop_at_open`); Redis being down is an outage, handed
  to the session and waited out later;
* log scrapy-redis's ``Resuming crawl`` line (:meth:`Opening.log_resuming`).

Collaborators: the crawler (settings, signals), the crawl's Redis client,
the :class:`~crawler.frontier.session.Session` (told of an outage, stopped
on a configuration error), the eviction watch, and the crawl's
:class:`~crawler.frontier.queue.LeasedPriorityQueue` and its shards.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError
from scrapy import Spider, signals
from scrapy_redis import defaults as redis_defaults

from crawler.config import FrontierConfig, close_at_open
from crawler.frontier.backoff import UNREACHABLE
from crawler.frontier.connection import cluster_enabled, config_error_message, get_redis
from crawler.frontier.intake import IntakeKeys
from crawler.frontier.overrides import parse_site_settings
from crawler.frontier.shards import ShardCountError
from crawler.keys import slot_warning

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.exceptions import CloseSpider

    from crawler.frontier.eviction import EvictionWatch
    from crawler.frontier.queue import LeasedPriorityQueue
    from crawler.frontier.session import Session

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["Opening"]


class Opening:
    """The opening of one worker's scheduler.

    :param crawler: the crawl's crawler.
    :param server: the crawl's Redis client.
    :param session: the worker's session.
    :param eviction: the worker's eviction watch (started here).
    :param holder: the worker's holder id (its ``alive`` call).
    """

    def __init__(self, crawler: Crawler, server: Any, session: Session,
                 eviction: EvictionWatch, holder: str) -> None:
        self.crawler = crawler
        self.server = server
        self.session = session
        self.eviction = eviction
        self.holder = holder
        #: The error raised once the spider is open (:meth:`stop_at_open`).
        self.close_spider: CloseSpider | None = None

    def warn_robots(self, spider: Spider, queue: LeasedPriorityQueue) -> None:
        """Log (INFO) ``ROBOTSTXT_OBEY`` without
        :class:`crawler.politeness.SharedRobotsTxtMiddleware`: it works, but
        not as one may think."""
        if self.crawler.settings.getbool("ROBOTSTXT_OBEY") and not queue.policy.robots_gate:
            logger.info(
                "ROBOTSTXT_OBEY without crawler.politeness.SharedRobotsTxtMiddleware: each "
                "worker fetches robots.txt itself and sites get their full concurrency at "
                "once (that middleware fetches it once for the cluster and keeps its "
                "Crawl-delay)", extra={"spider": spider},
            )

    def warn_slots(self, spider: Spider, queue: LeasedPriorityQueue) -> None:
        """Log (WARNING), on a Redis Cluster, a spider name whose shards
        share one slot (:func:`crawler.keys.slot_warning`)."""
        if cluster_enabled(self.crawler.settings) and (
            warning := slot_warning(spider.name, len(queue.shards))
        ):
            logger.warning("%s", warning, extra={"spider": spider})

    def adopt_redis_spider(self, spider: Spider) -> None:
        """Give a scrapy-redis spider the settings it read too early.

        Scrapy builds the spider before it runs the add-ons, so
        scrapy-redis's ``setup_redis`` read ``REDIS_URL`` and
        ``MAX_IDLE_TIME_BEFORE_CLOSE`` before
        :class:`crawler.addon.FrontierAddon` took them from the
        environment, and made a client of its own (no I/O yet) with
        scrapy-redis's options only. The spider now reads its seeds through
        one of ours (the settings as the crawl has them, ``REDIS_PARAMS``
        merged over our timeouts, no retries; on a cluster, one that follows
        its slots): ``server`` and the client's methods it bound
        (``fetch_data``, ``count_size``: ``SPOP``/``SCARD``/``LLEN``) are
        replaced, so that no call goes to the first client's server. A
        ``max_idle_time`` the spider's class leaves unset is read again
        from the settings.
        """
        old, new = getattr(spider, "server", None), get_redis(self.crawler.settings)
        setattr(spider, "server", new)  # noqa: B010 (not every spider has it)
        for name in ("fetch_data", "count_size"):
            bound: Any = getattr(spider, name, None)
            if old is not None and getattr(bound, "__self__", None) is old:
                setattr(spider, name, getattr(new, bound.__name__))
        if hasattr(spider, "max_idle_time") and getattr(type(spider), "max_idle_time", 0) is None:
            spider.max_idle_time = self.crawler.settings.getint("MAX_IDLE_TIME_BEFORE_CLOSE")

    def check(
        self, spider: Spider, queue: LeasedPriorityQueue, refused: str,
        overrides: dict[str, dict[str, int]],
    ) -> bool | None:
        """The first Redis calls, which check the configuration; a
        configuration error stops the crawl at open (:meth:`stop_at_open`).

        :param refused: the scrapy-redis settings refused, one line (empty:
            none): a configuration error before any call.
        :param overrides: the per-site settings to store
            (:meth:`site_settings`).
        :returns: None after a configuration error; else whether this worker
            queues the spider's ``start_urls`` (:meth:`claim_start_urls`;
            True when Redis could not be asked: the outage is the
            session's).
        """
        shards = queue.shards
        if refused:
            self.stop_at_open(refused)
            return None
        try:
            refusal = self.eviction.start()
            if refusal is not None:
                self.stop_at_open(refusal)
                return None
            shards.check_count()
            for key, mapping in overrides.items():
                by_shard: dict[int, dict[str, int]] = {}
                for site, value in mapping.items():
                    by_shard.setdefault(shards.index_of(site), {})[site] = value
                for i, part in by_shard.items():
                    self.server.hset(shards[i].key(key), mapping=part)
            shards.load_scripts()
            shards.alive(self.holder, check=True)
            return self.claim_start_urls(spider)
        except (RedisError, ShardCountError) as exc:
            message = (
                self.shard_count_message(exc, len(shards.frontiers))
                if isinstance(exc, ShardCountError)
                else config_error_message(exc, self.crawler.settings)
            )
            if message is not None:
                self.stop_at_open(message)
                return None
            self.session.outage(exc)
            return True

    def claim_start_urls(self, spider: Spider) -> bool:
        """Whether this worker queues the requests of the spider's
        ``start_urls``: the first worker of the crawl does, the others drop
        theirs (the scheduler's ``enqueue_request``), so that a spider whose
        ``start()`` is Scrapy's own (a plain ``Spider`` or ``CrawlSpider``
        with ``start_urls``) has them crawled once per crawl, not once per
        worker. The first is the one that sets the marker of its seed list,
        ``{<name>:start_urls}:start_urls_seeded`` (``SET NX``), the marker
        :class:`~crawler.frontier.spider.FrontierSpider` sets when it pushes
        its ``start_urls``; delete it to have them queued again.

        A spider with a ``start()`` of its own (``FrontierSpider``, or one
        that yields requests other than ``start_urls``) or without
        ``start_urls`` is left alone: True.

        :raises redis.exceptions.RedisError: Redis failed (the worker then
            queues them: crawled twice rather than not at all).
        """
        urls = getattr(spider, "start_urls", None)
        if type(spider).start is not Spider.start or not urls:
            return True
        seed_list = getattr(spider, "redis_key", None) or (
            self.crawler.settings.get("REDIS_START_URLS_KEY") or redis_defaults.START_URLS_KEY
        ) % {"name": spider.name}
        marker = IntakeKeys.for_seed_list(seed_list).seeded
        mine = bool(self.server.set(marker, str(int(time.time() * 1000)), nx=True))
        if mine:
            logger.info(
                "Queueing the spider's %d start_urls for the whole crawl (marker %s; "
                "the other workers drop theirs)", len(urls), marker, extra={"spider": spider},
            )
        else:
            logger.info(
                "start_urls were queued for this crawl already (%s; delete it to queue them "
                "again): this worker drops its own", marker, extra={"spider": spider},
            )
        return mine

    def shard_count_message(self, exc: ShardCountError, count: int) -> str:
        """The error's message, saying where this worker's count came from
        when ``FRONTIER_SHARDS`` is not set (its default)."""
        config = FrontierConfig.of(self.crawler)
        if config.shards is not None:
            return str(exc)
        where = "on a Redis Cluster" if config.redis_cluster else "on one Redis server"
        return f"{exc} (FRONTIER_SHARDS is not set: {count} is its default {where})"

    def site_settings(self, queue: LeasedPriorityQueue) -> dict[str, dict[str, int]]:
        """``DOWNLOAD_SLOTS``' delays and concurrency, then
        ``FRONTIER_SITE_DELAYS`` / ``FRONTIER_SITE_CONCURRENCY`` (which win
        for a site both name) and ``FRONTIER_SITE_REVISITS``, as the
        overrides ``scrapy frontier delay|concurrency|revisit`` would store,
        by key (``delay``: ms, ``conc``, ``revisit``: ms); keys without a
        site left out.

        :raises ValueError: a site or a value is not valid (the message says
            which setting, site and value).
        """
        config = FrontierConfig.of(self.crawler)
        policy = queue.policy
        out = {
            "delay": {**policy.slot_delays, **parse_site_settings(
                "delay", config.site_delays, "FRONTIER_SITE_DELAYS"
            )},
            "conc": {**policy.slot_concurrency, **parse_site_settings(
                "conc", config.site_concurrency, "FRONTIER_SITE_CONCURRENCY"
            )},
            "revisit": parse_site_settings(
                "revisit", config.site_revisits, "FRONTIER_SITE_REVISITS"
            ),
        }
        return {key: mapping for key, mapping in out.items() if mapping}

    def log_resuming(self, spider: Spider, queue: LeasedPriorityQueue) -> None:
        """Log scrapy-redis's ``Resuming crawl (N requests scheduled)`` (at
        INFO) when the frontier already holds requests: queued, waiting for
        a retry or leased, in every shard. Nothing when Redis cannot be read
        now (the outage is met, and waited out, by the next call), nor when
        a counter holds a malformed value (the frontier's calls report it)."""
        try:
            scheduled = len(queue)
        except UNREACHABLE:
            return
        except (ValueError, ResponseError) as exc:
            logger.debug("Not counting the requests scheduled: %s", exc,
                         extra={"spider": spider})
            return
        if scheduled:
            logger.info("Resuming crawl (%d requests scheduled)", scheduled,
                        extra={"spider": spider})

    def stop_at_open(self, message: str) -> None:
        """Report the configuration error ``message`` (one log line) and
        close the spider once it is open, with no Redis call meanwhile.

        Raised now, CloseSpider would skip the rest of Scrapy's start-up
        (the item pipelines), whose close then fails: it is raised once the
        spider is open instead (:meth:`close_at_open`)."""
        self.close_spider = close_at_open(self.crawler, message)
        self.crawler.signals.connect(self.close_at_open, signal=signals.spider_opened)
        self.session.stop()

    def close_at_open(self) -> None:
        """``spider_opened`` handler after a configuration error at open.

        :raises scrapy.exceptions.CloseSpider: with the reason ``config_error``.
        """
        if self.close_spider is not None:
            raise self.close_spider
