"""The scheduler's revisits: a fetched request queued again, conditionally.

Job: with ``FRONTIER_REVISIT_AFTER`` > 0, turn a leased request reported
fetched (the signal :data:`~crawler.frontier.signals.request_fetched`, sent
by :class:`crawler.middlewares.RevisitMiddleware`) into a
:class:`~crawler.frontier.store.Revisit` queued in the
:class:`~crawler.frontier.outbox.Outbox`, so that it is committed with the
request's ack: due that many seconds later (or its site's ``{s}:revisit``
override), one per fingerprint, its response's validators in its meta
(:data:`~crawler.frontier.leasebook.REVISIT_META`), sent then as
``If-None-Match`` / ``If-Modified-Since``. The revisit is built from the
entry as it was queued, not from the request as the downloader
middlewares left it: their meta and headers are this download's
(:meth:`Revisits.headers`). Counted in ``frontier/revisits/scheduled``.

Collaborators: the :class:`~crawler.frontier.leasebook.LeaseBook` (the
entries leased), the outbox, the dupefilter (fingerprints), the crawl's
:class:`~crawler.frontier.queue.LeasedPriorityQueue` (decoding, encoding,
shards, the revisit interval; set at open as :attr:`Revisits.queue`), the
crawl's stats and Scrapy's settings ``USER_AGENT`` and
``DEFAULT_REQUEST_HEADERS``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.utils.python import to_bytes

from crawler.frontier.leasebook import REVISIT_META
from crawler.frontier.signals import RETRY_DELAY_META, request_fetched
from crawler.frontier.sites import slot_of
from crawler.frontier.store import Revisit

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http.headers import Headers
    from scrapy.settings import BaseSettings
    from scrapy.signalmanager import SignalManager

    from crawler.frontier.leasebook import LeaseBook
    from crawler.frontier.outbox import Outbox
    from crawler.frontier.queue import LeasedPriorityQueue

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["Revisits"]

#: Meta keys of one download that a revisit does not carry over.
_NOT_REVISITED = frozenset({
    "download_latency", "download_slot", "retry_times", RETRY_DELAY_META,
    "redirect_times", "redirect_ttl",
})
#: Conditional headers of the last revisit: the next one sends its own.
_CONDITIONAL = (b"If-None-Match", b"If-Modified-Since")


class Revisits:
    """The revisits of the requests one worker leased.

    :param book: the worker's lease book (:attr:`LeaseBook.entries`: the
        entries leased, kept while revisits are on).
    :param outbox: where the ``revisits`` writes are queued.
    :param dupefilter: gives a request's fingerprint
        (``request_fingerprint(request) -> bytes``).
    :param stats: the crawl's stats.
    :param settings: the crawl's settings.
    :ivar queue: the crawl's queue, set at open.
    """

    queue: LeasedPriorityQueue
    spider: Any = None

    def __init__(self, book: LeaseBook, outbox: Outbox, dupefilter: Any, stats: Any,
                 settings: BaseSettings) -> None:
        self.book = book
        self.outbox = outbox
        self.dupefilter = dupefilter
        self.stats = stats
        self.settings = settings

    def connect(self, signal_manager: SignalManager) -> None:
        """Schedule revisits of the requests reported fetched."""
        signal_manager.connect(self.on_request_fetched, signal=request_fetched)

    def on_request_fetched(
        self, request: Request, validators: dict[str, str], **kwargs: Any
    ) -> None:
        """Queue a revisit of ``request`` (committed with its ack), if this
        worker leased it and revisits are on (a request fetched outside the
        frontier, robots.txt say, is not revisited).

        :param validators: ``etag`` and/or ``modified`` (str), kept in the
            revisit's meta.
        """
        entry = self.book.entries.get(request)
        if entry is None or not self.queue.frontier.revisit_after_ms:
            return
        try:
            # The request as it was queued: the headers and meta the
            # downloader middlewares add are this download's, not the next.
            queued = self.queue.decode(*entry)
            meta = {k: v for k, v in queued.meta.items() if k not in _NOT_REVISITED}
            meta[REVISIT_META] = dict(validators)
            data = self.queue.encode(queued.replace(meta=meta, headers=self.headers(queued)))
        except ValueError as exc:  # cannot happen for an entry that was decoded
            logger.error("Revisit not scheduled: %s", exc, extra={"spider": self.spider})
            return
        fingerprint = self.dupefilter.request_fingerprint(request)
        site = slot_of(request)
        self.outbox.write(
            "revisits", item=Revisit(data, site, request.priority, fingerprint),
            shard=self.queue.shards.index_of(site),
        )
        self.stats.inc_value("frontier/revisits/scheduled")

    def headers(self, queued: Request) -> Headers:
        """``queued``'s headers less those the downloader middlewares add to
        each download (a redirect target is queued with them): the last
        conditional headers, ``Accept-Encoding`` and ``Cookie`` always,
        ``User-Agent`` and ``DEFAULT_REQUEST_HEADERS`` when they are the
        settings' values. So a revisit gets the settings of the worker that
        fetches it, and its entry stays small."""
        headers = queued.headers.copy()
        for name in (*_CONDITIONAL, b"Accept-Encoding", b"Cookie"):
            headers.pop(name, None)
        defaults = {
            "User-Agent": self.settings.get("USER_AGENT"),
            **self.settings.getdict("DEFAULT_REQUEST_HEADERS"),
        }
        for name, value in defaults.items():
            if value is not None and headers.get(name) == to_bytes(str(value)):
                headers.pop(name, None)
        return headers
