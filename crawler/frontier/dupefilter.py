"""The shared dupefilter: scrapy-redis's Redis set of request fingerprints."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.utils.request import referer_str
from scrapy_redis.dupefilter import RFPDupeFilter

from crawler.frontier.connection import get_redis

if TYPE_CHECKING:
    from typing import Self

    from redis import Redis
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.utils.request import RequestFingerprinterProtocol

logger = logging.getLogger(__name__)

__all__ = ["FrontierDupeFilter"]


class FrontierDupeFilter(RFPDupeFilter):  # type: ignore[misc]
    """A Redis set of the fingerprints of every request scheduled.

    Changes from :class:`scrapy_redis.dupefilter.RFPDupeFilter`:

    * Fingerprints come from Scrapy's request fingerprinter
      (``crawler.request_fingerprinter``, set by ``REQUEST_FINGERPRINTER_CLASS``),
      so the shared filter agrees with Scrapy's own components and honours a
      custom fingerprinter; scrapy-redis computes a SHA1 of its own.
    * The set holds the 20 raw fingerprint bytes, not 40 hex characters.
    * Built with ``from_crawler`` (Scrapy no longer calls ``from_settings``);
      the key is ``SCHEDULER_DUPEFILTER_KEY`` with the spider's name, which is
      known only at ``open``, so the key is set by the scheduler then.
    * :meth:`close` keeps the set: it is shared with other workers. Clearing
      it is :meth:`clear`'s job, called by the scheduler only when
      ``SCHEDULER_PERSIST`` is off.
    * :meth:`log` is Scrapy's (:meth:`scrapy.dupefilters.RFPDupeFilter.log`):
      the same message, the referer with ``DUPEFILTER_DEBUG``, and it counts
      ``dupefilter/filtered`` (scrapy-redis's counts nothing).

    :param server: a redis-py client.
    :param key: the set's key, e.g. ``{quotes}:dupefilter``.
    :param fingerprinter: Scrapy's request fingerprinter.
    :param debug: log every filtered request (``DUPEFILTER_DEBUG``).
    """

    logger = logger
    #: Whether the next duplicate is logged without ``DUPEFILTER_DEBUG``
    #: (the first one only; set by scrapy-redis's constructor).
    logdupes: bool
    debug: bool

    def __init__(
        self,
        server: Redis,
        key: str,
        debug: bool = False,
        *,
        fingerprinter: RequestFingerprinterProtocol,
    ) -> None:
        super().__init__(server, key, debug)
        self.fingerprinter = fingerprinter

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the filter for ``crawler`` without any Redis I/O.

        The key starts as ``SCHEDULER_DUPEFILTER_KEY`` with ``%(spider)s``
        filled from ``crawler.spidercls.name``.
        """
        settings = crawler.settings
        key = settings.get("SCHEDULER_DUPEFILTER_KEY") % {
            "spider": crawler.spidercls.name
        }
        assert crawler.request_fingerprinter is not None
        return cls(
            get_redis(settings),
            key,
            debug=settings.getbool("DUPEFILTER_DEBUG"),
            fingerprinter=crawler.request_fingerprinter,
        )

    def request_fingerprint(self, request: Request) -> bytes:
        """Return Scrapy's fingerprint of ``request`` (20 bytes for SHA1)."""
        return self.fingerprinter.fingerprint(request)

    def request_seen(self, request: Request) -> bool:
        """Record ``request`` as seen; return whether it had been seen before.

        One ``SADD`` round trip.
        """
        return int(self.server.sadd(self.key, self.request_fingerprint(request))) == 0

    def log(self, request: Request, spider: Spider) -> None:
        """Log that ``request`` was filtered as a duplicate, and count it.

        As Scrapy's :meth:`scrapy.dupefilters.RFPDupeFilter.log`: at DEBUG
        level, every filtered request with its referer when ``DUPEFILTER_DEBUG``
        is on, else only the first one ("Filtered duplicate request: <GET
        url> - no more duplicates will be shown (see DUPEFILTER_DEBUG to show
        all duplicates)"); each one counts in the stat ``dupefilter/filtered``.
        The scheduler calls it for every duplicate it drops, whether this
        worker's memory of fingerprints or the shared set in Redis found it.
        """
        if self.debug:
            msg = "Filtered duplicate request: %(request)s (referer: %(referer)s)"
            args = {"request": request, "referer": referer_str(request)}
            self.logger.debug(msg, args, extra={"spider": spider})
        elif self.logdupes:
            msg = (
                "Filtered duplicate request: %(request)s"
                " - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)"
            )
            self.logger.debug(msg, {"request": request}, extra={"spider": spider})
            self.logdupes = False
        spider.crawler.stats.inc_value("dupefilter/filtered")

    def close(self, reason: str = "") -> None:
        """Keep the shared set (scrapy-redis deletes it here)."""
