"""The shared dupefilter: scrapy-redis's Redis set of request fingerprints."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.utils.request import referer_str
from scrapy_redis.dupefilter import RFPDupeFilter

from crawler.frontier.compat import dupefilter_key
from crawler.frontier.connection import get_redis
from crawler.frontier.sites import slot_of
from crawler.keys import shard_count, shard_of, shard_prefix, spider_name_of

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
      the key is ``{<spider>}:dupefilter`` (``SCHEDULER_DUPEFILTER_KEY``
      unset, or at ours or scrapy-redis's default; any other value is refused,
      :mod:`crawler.frontier.compat`) with the spider instance's name, chosen
      by :meth:`open` (the scheduler calls it when it opens).
    * :meth:`close` keeps the set: it is shared with other workers. Clearing
      it is :meth:`clear`'s job, called by the scheduler only when
      ``SCHEDULER_PERSIST`` is off.
    * With ``FRONTIER_SHARDS`` = N > 1 there is one set per frontier shard,
      ``<shard prefix>dupefilter`` (:func:`crawler.keys.shard_prefix`), and a
      request's fingerprint goes to its site's shard
      (:func:`crawler.keys.shard_of`), the set ``commit.lua`` records it in
      during a crawl: :meth:`request_seen` outside the scheduler agrees with
      the crawl, and :meth:`clear` empties every shard's set. With one shard
      the set is ``key``.
    * :meth:`log` is Scrapy's (:meth:`scrapy.dupefilters.RFPDupeFilter.log`):
      the same message, the referer with ``DUPEFILTER_DEBUG``, and it counts
      ``dupefilter/filtered`` (scrapy-redis's counts nothing).

    :param server: a redis-py client.
    :param key: the set's key, e.g. ``{quotes}:dupefilter``.
    :param fingerprinter: Scrapy's request fingerprinter.
    :param debug: log every filtered request (``DUPEFILTER_DEBUG``).
    :param spider: the spider's name (needed with ``shards`` > 1: it names
        the shards' keys).
    :param shards: the crawl's ``FRONTIER_SHARDS`` (default 1).
    """

    logger = logger
    #: Whether the next duplicate is logged without ``DUPEFILTER_DEBUG``
    #: (the first one only; set by scrapy-redis's constructor).
    logdupes: bool
    debug: bool
    #: The crawler it was built for (:meth:`from_crawler`), whose spider
    #: names the keys at :meth:`open`.
    crawler: Crawler | None = None

    def __init__(
        self,
        server: Redis,
        key: str,
        debug: bool = False,
        *,
        fingerprinter: RequestFingerprinterProtocol,
        spider: str | None = None,
        shards: int = 1,
    ) -> None:
        super().__init__(server, key, debug)
        self.fingerprinter = fingerprinter
        if shards > 1 and spider is None:
            raise ValueError("a sharded dupefilter (FRONTIER_SHARDS > 1) needs the spider's name")
        self.spider_name = spider
        self.shards = max(1, shards)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the filter for ``crawler`` without any Redis I/O.

        Its keys are chosen by :meth:`open`, from the spider instance's name
        (``crawler.spider.name``: a class attribute, set in ``__init__``, or
        ``-a name=...``); until then they use the name known now, if any.
        The set is ``{<spider>}:dupefilter``
        (:func:`crawler.frontier.compat.dupefilter_key`), ``FRONTIER_SHARDS``
        gives the shards.
        """
        df = cls._for_name(crawler, spider_name_of(crawler))
        df.crawler = crawler
        return df

    @classmethod
    def _for_name(cls, crawler: Crawler, name: str) -> Self:
        settings = crawler.settings
        template = dupefilter_key(settings)
        assert crawler.request_fingerprinter is not None
        return cls(
            get_redis(settings),
            template % {"spider": name},
            debug=settings.getbool("DUPEFILTER_DEBUG"),
            fingerprinter=crawler.request_fingerprinter,
            spider=name,
            shards=shard_count(settings),
        )

    def open(self) -> None:
        """Choose the keys from the spider's name, now that the spider
        exists (called by the scheduler when it opens). No Redis I/O."""
        crawler = getattr(self, "crawler", None)
        spider = getattr(crawler, "spider", None)
        if crawler is None or spider is None or spider.name == self.spider_name:
            return
        fresh = self._for_name(crawler, spider.name)
        fresh.crawler = crawler
        self.__dict__.update(fresh.__dict__)  # a fresh client too: none is connected yet

    def shard_prefix(self, index: int) -> str:
        """The key prefix of frontier shard ``index`` (``{<spider>:<i>}:``)."""
        assert self.spider_name is not None
        return shard_prefix(self.spider_name, index, self.shards)

    def key_for(self, site: str) -> str:
        """The set that holds the fingerprints of ``site``'s requests:
        ``key`` with one shard, else ``<prefix of the site's shard>dupefilter``."""
        if self.shards == 1:
            return str(self.key)
        return self.shard_prefix(shard_of(site, self.shards)) + "dupefilter"

    @property
    def keys(self) -> list[str]:
        """Every shard's set, in shard order (``[key]`` with one shard)."""
        if self.shards == 1:
            return [str(self.key)]
        return [self.shard_prefix(i) + "dupefilter" for i in range(self.shards)]

    def request_fingerprint(self, request: Request) -> bytes:
        """Return Scrapy's fingerprint of ``request`` (20 bytes for SHA1)."""
        return self.fingerprinter.fingerprint(request)

    def request_seen(self, request: Request) -> bool:
        """Record ``request`` as seen; return whether it had been seen before.

        One ``SADD`` round trip, to the set of the request's site's shard
        (:meth:`key_for`).
        """
        key = self.key_for(slot_of(request)) if self.shards > 1 else self.key
        return int(self.server.sadd(key, self.request_fingerprint(request))) == 0

    def clear(self) -> None:
        """Delete every shard's set: every request is forgotten."""
        for key in self.keys:
            self.server.delete(key)  # one key per call: shards are in other slots

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
