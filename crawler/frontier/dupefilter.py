"""The shared dupefilter: scrapy-redis's Redis set of request fingerprints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_redis.dupefilter import RFPDupeFilter

from crawler.frontier.connection import get_redis

if TYPE_CHECKING:
    from typing import Self

    from redis import Redis
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.utils.request import RequestFingerprinterProtocol

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

    :param server: a redis-py client.
    :param key: the set's key, e.g. ``{quotes}:dupefilter``.
    :param fingerprinter: Scrapy's request fingerprinter.
    :param debug: log every filtered request (``DUPEFILTER_DEBUG``).
    """

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

    def close(self, reason: str = "") -> None:
        """Keep the shared set (scrapy-redis deletes it here)."""
