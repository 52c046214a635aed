"""The scheduler's dead letters: the requests a crawl gives up on.

Job: turn what is given up into one dead-letter record, queued in the
:class:`~crawler.frontier.outbox.Outbox` for the shard of its site (a
``dead`` write, which ``commit.lua`` adds to ``{s}:dead``) and counted in
``frontier/dead``:

* a request given up by a middleware (the signal
  :data:`~crawler.frontier.signals.request_dead`) or whose callback raised
  (Scrapy's ``spider_error``): :meth:`DeadLetters.record`;
* a leased entry that is no request here (a pickled payload, a Request
  class that cannot be imported): :meth:`DeadLetters.entry`, which also
  acknowledges its lease.

A record is JSON: ``url``, ``reason``, ``attempts``, ``last_error``,
``time`` (Unix seconds), ``request`` (the encoded request, or None) and
``first_priority`` (:func:`first_priority`: what ``scrapy deadletters
requeue`` restores); an undecodable entry's record has ``url`` None, the
``entry`` as stored (latin-1 text) and its ``site``.

Collaborators: the outbox (the writes), the crawl's
:class:`~crawler.frontier.queue.LeasedPriorityQueue` (encoding and shards;
set at open as :attr:`DeadLetters.queue`), the lease book's map of lease ids
to shards (:attr:`DeadLetters.lease_shards`), the crawl's stats and its
settings (``RETRY_PRIORITY_ADJUST``, Scrapy's).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals

from crawler.frontier.signals import request_dead
from crawler.frontier.sites import slot_of

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response
    from scrapy.settings import BaseSettings
    from scrapy.signalmanager import SignalManager
    from twisted.python.failure import Failure

    from crawler.frontier.outbox import Outbox
    from crawler.frontier.queue import LeasedPriorityQueue

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["DEFAULT_PRIORITY_ADJUST", "DeadLetters", "first_priority", "whole_number"]

#: Scrapy's default ``RETRY_PRIORITY_ADJUST``.
DEFAULT_PRIORITY_ADJUST = -1


def whole_number(value: Any) -> int | None:
    """``value`` when it is a whole number (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def first_priority(
    priority: int, meta: dict[str, Any], priority_adjust: int = DEFAULT_PRIORITY_ADJUST
) -> int:
    """The priority a request had when it was first scheduled, before
    Scrapy's retries changed it.

    Each retry (:func:`scrapy.downloadermiddlewares.retry.get_retry_request`)
    adds the request's ``meta["priority_adjust"]``, else
    ``RETRY_PRIORITY_ADJUST`` (default -1), to its priority and counts itself
    in ``meta["retry_times"]``; this takes those retries off again, assuming
    the adjustment did not change between them.

    :param priority: the priority the request has now.
    :param meta: its meta (``retry_times``, ``priority_adjust``; other types
        than whole numbers count as absent).
    :param priority_adjust: ``RETRY_PRIORITY_ADJUST``.
    """
    retries = whole_number(meta.get("retry_times")) or 0
    adjust = whole_number(meta.get("priority_adjust"))
    return priority - retries * (priority_adjust if adjust is None else adjust)


class DeadLetters:
    """The dead letters of one worker, queued in ``outbox``.

    :param outbox: where the ``dead`` writes (and an undecodable entry's
        ack) are queued.
    :param stats: the crawl's stats (``frontier/dead``).
    :param settings: the crawl's settings (``RETRY_PRIORITY_ADJUST``).
    :ivar queue: the crawl's queue, set at open.
    :ivar lease_shards: lease id -> the shard it was taken from (the lease
        book's own map: an undecodable entry's ack and record go to its
        shard, and it leaves the map).
    """

    queue: LeasedPriorityQueue
    spider: Any = None

    def __init__(self, outbox: Outbox, stats: Any, settings: BaseSettings) -> None:
        self.outbox = outbox
        self.stats = stats
        self.settings = settings
        self.lease_shards: dict[str, int] = {}

    def connect(self, signal_manager: SignalManager) -> None:
        """Record the requests given up (``request_dead``) and those whose
        callback raised (``spider_error``)."""
        signal_manager.connect(self._on_request_dead, signal=request_dead)
        signal_manager.connect(self._on_spider_error, signal=signals.spider_error)

    def _on_request_dead(
        self, request: Request, reason: str, error: str | None = None, **kwargs: Any
    ) -> None:
        self.record(request, reason, error)

    def _on_spider_error(self, failure: Failure, response: Response, **kwargs: Any) -> None:
        request = getattr(response, "request", None)
        if request is not None:
            self.record(request, "callback raised", repr(failure.value))

    def record(self, request: Request, reason: str, error: str | None = None) -> None:
        """Queue the dead letter of ``request`` for the shard of its site:
        url, reason, attempts (``retry_times`` + 1), last error, time, the
        encoded request (None when it cannot be encoded) and the priority it
        was first scheduled with, by this crawl's ``RETRY_PRIORITY_ADJUST``
        (what ``scrapy deadletters requeue`` restores)."""
        try:
            encoded: str | None = self.queue.encode(request, compact=False).decode()
        except ValueError:
            encoded = None
        record = {
            "url": request.url,
            "reason": reason,
            "attempts": request.meta.get("retry_times", 0) + 1,
            "last_error": error,
            "time": time.time(),
            "request": encoded,
            "first_priority": first_priority(
                request.priority, request.meta, self.settings.getint("RETRY_PRIORITY_ADJUST"),
            ),
        }
        self._queue(record, slot_of(request))
        logger.warning("Dead letter for %s: %s", request.url, reason)

    def entry(self, data: bytes, lease_id: str, exc: Exception, site: str | None = None) -> None:
        """A leased entry that is no request here (``exc`` says why): a dead
        letter with the entry and its site (so ``scrapy deadletters
        requeue`` can send it back once the cause is fixed, e.g. its
        Request class made importable), and its lease acknowledged, both on
        the shard it was leased from (shard 0 when unknown)."""
        reason = f"undecodable frontier entry: {type(exc).__name__}: {exc}"
        logger.error("%s", reason, extra={"spider": self.spider})
        record = {"url": None, "reason": reason, "attempts": 0, "last_error": repr(exc),
                  "time": time.time(), "request": None, "entry": data.decode("latin-1")}
        if site is not None:
            record["site"] = site
        shard = self.lease_shards.pop(lease_id, 0)
        self._queue(record, site, shard)
        self.outbox.write("acks", item=lease_id, shard=shard)

    def _queue(self, record: dict[str, Any], site: str | None, shard: int | None = None) -> None:
        """Queue ``record`` for the shard of ``site`` (or ``shard``; 0
        without either)."""
        if shard is None:
            shard = 0 if site is None else self.queue.shards.index_of(site)
        self.outbox.write("dead", item=json.dumps(record, default=str).encode(), shard=shard)
        self.stats.inc_value("frontier/dead")
