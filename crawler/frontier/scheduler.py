"""The shared scheduler: scrapy-redis's Scheduler, brought up to Scrapy 2.19."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import build_from_crawler, load_object
from scrapy_redis.connection import get_redis_from_settings
from scrapy_redis.scheduler import Scheduler

from crawler.frontier import serializer as json_serializer

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = ["FrontierScheduler"]


class FrontierScheduler(Scheduler):  # type: ignore[misc]
    """One Redis frontier shared by every worker of a crawl.

    Settings are scrapy-redis's own: ``SCHEDULER_QUEUE_CLASS``,
    ``SCHEDULER_QUEUE_KEY``, ``SCHEDULER_DUPEFILTER_KEY``, ``DUPEFILTER_CLASS``,
    ``SCHEDULER_PERSIST``, ``SCHEDULER_FLUSH_ON_START``,
    ``SCHEDULER_SERIALIZER`` (default here: JSON, :mod:`crawler.frontier.serializer`;
    never pickle unless named).

    Changes from :class:`scrapy_redis.scheduler.Scheduler`:

    * Built from the crawler (``from_crawler``) with no I/O: scrapy-redis
      goes through ``from_settings``, which Scrapy no longer calls, and pings
      Redis in it. The dupefilter is built with ``build_from_crawler`` so it
      gets Scrapy's request fingerprinter.
    * Stats calls carry no ``spider`` argument (deprecated since Scrapy 2.14)
      and logging goes through this module's logger, not ``Spider.log``.
    * A request with ``dont_filter`` (a seed, a retry) is still recorded in
      the dupefilter, so a page that links back to a seed does not fetch it
      again.

    Stats: ``scheduler/enqueued/redis``, ``scheduler/dequeued/redis``,
    ``dupefilter/filtered``.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the scheduler and its dupefilter; connect to Redis lazily."""
        settings = crawler.settings
        kwargs: dict[str, Any] = {
            "persist": settings.getbool("SCHEDULER_PERSIST"),
            "flush_on_start": settings.getbool("SCHEDULER_FLUSH_ON_START"),
            "idle_before_close": settings.getint("SCHEDULER_IDLE_BEFORE_CLOSE"),
        }
        for name, setting in (
            ("queue_key", "SCHEDULER_QUEUE_KEY"),
            ("queue_cls", "SCHEDULER_QUEUE_CLASS"),
            ("dupefilter_key", "SCHEDULER_DUPEFILTER_KEY"),
            ("dupefilter_cls", "DUPEFILTER_CLASS"),
        ):
            if value := settings.get(setting):
                kwargs[name] = value
        serializer = settings.get("SCHEDULER_SERIALIZER")
        if isinstance(serializer, str):
            serializer = importlib.import_module(serializer)
        kwargs["serializer"] = serializer or json_serializer
        kwargs["dupefilter"] = build_from_crawler(
            load_object(kwargs.get("dupefilter_cls", settings["DUPEFILTER_CLASS"])),
            crawler,
        )
        scheduler = cls(server=get_redis_from_settings(settings), **kwargs)
        scheduler.stats = crawler.stats
        scheduler.crawler = crawler
        return scheduler

    def open(self, spider: Spider) -> None:
        """Create the queue for ``spider`` and report a crawl being resumed."""
        self.spider = spider
        self.queue = load_object(self.queue_cls)(
            server=self.server,
            spider=spider,
            key=self.queue_key % {"spider": spider.name},
            serializer=self.serializer,
        )
        if self.flush_on_start:
            self.flush()
        queued = len(self.queue)
        if queued:
            logger.info(
                "Resuming crawl (%d requests queued in %s)",
                queued,
                self.queue.key,
                extra={"spider": spider},
            )

    def enqueue_request(self, request: Request) -> bool:
        """Push ``request`` unless its fingerprint was seen before.

        The request is encoded before its fingerprint is recorded, so a
        request that cannot be stored is not marked as seen: it is logged as
        an error naming the URL and the key that JSON cannot carry, counted
        in ``scheduler/unencodable``, and dropped.

        :returns: ``False`` when the request was filtered or could not be
            stored.
        """
        try:
            data = self.queue.encode(request)
        except ValueError as exc:  # EncodeError, or a callback not on the spider
            logger.error("%s", exc, extra={"spider": self.spider})
            self.stats.inc_value("scheduler/unencodable")
            return False
        seen = self.df.request_seen(request)
        if seen and not request.dont_filter:
            self.df.log(request, self.spider)
            self.stats.inc_value("dupefilter/filtered")
            return False
        self.queue.push_encoded(data, request.priority)
        self.stats.inc_value("scheduler/enqueued/redis")
        return True

    def next_request(self) -> Request | None:
        """Pop the next request from the shared queue, or ``None``."""
        request: Request | None = self.queue.pop(self.idle_before_close)
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request
