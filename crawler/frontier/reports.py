"""The scheduler's reports: what the frontier's calls did, counted and logged.

Job: tell, in the crawl's stats and log, what a commit and a lease call did
besides their answer (:class:`Reports`):

* a commit (:meth:`Reports.committed`): new requests queued
  (``scheduler/enqueued/redis``) or found duplicates by the shared
  dupefilter (each handed to the dupefilter's ``log``, which counts
  ``dupefilter/filtered``, and Scrapy's ``request_dropped`` signal sent, as
  the engine sends it for a request a scheduler refuses), leases
  acknowledged (``frontier/leases/acked``);
* a lease call (:meth:`Reports.lease_result`): expired leases it returned to
  the queues (``frontier/leases/returned``), requests it moved to the
  dead-letter list (``frontier/dead``, one WARNING);
* bad values the scripts met and worked around (:meth:`Reports.problems`:
  ``frontier/problems``, one WARNING per value, once per worker).

Collaborators: the crawler (stats, signals), the dupefilter (its ``log``),
and the crawl's shards (the dead-letter key named; set at open as
:attr:`Reports.shards`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals

from crawler.frontier.store import BAD_VALUE_HINT

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy.crawler import Crawler

    from crawler.frontier.outbox import Op
    from crawler.frontier.shards import FrontierShards
    from crawler.frontier.store import Committed, Lease, NotDue

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["Reports"]


class Reports:
    """The reports of one worker's frontier calls.

    :param crawler: the crawl's crawler (stats, signals).
    :param dupefilter: the scheduler's dupefilter (``log(request, spider)``).
    """

    shards: FrontierShards
    spider: Any = None

    def __init__(self, crawler: Crawler, dupefilter: Any) -> None:
        self.crawler = crawler
        self.dupefilter = dupefilter
        self._problems: set[str] = set()

    @property
    def stats(self) -> Any:
        return self.crawler.stats

    def committed(self, ops: Sequence[Op], reply: Committed | None) -> None:
        """A commit of ``ops`` is in Redis; ``reply`` is its reply, None when
        the reply was lost and Redis only told that it ran (then which
        pushes were duplicates is not known, and one INFO line says so)."""
        pushes = [op for op in ops if op.kind == "pushes"]
        if reply is None:
            if pushes:
                logger.info(
                    "The reply to a frontier commit was lost; it ran, but which of its %d "
                    "new requests were queued and which were filtered as duplicates is not "
                    "known: they are not counted in scheduler/enqueued/redis or "
                    "dupefilter/filtered, nor logged as duplicates",
                    len(pushes), extra={"spider": self.spider},
                )
            return
        # One flag per push, in the order of the ops (Outbox.commit_of keeps it).
        for op, queued in zip(pushes, reply.pushed, strict=False):
            if queued:
                continue
            if op.request is None:
                self.stats.inc_value("dupefilter/filtered")
                continue
            self.dupefilter.log(op.request, self.spider)
            self.crawler.signals.send_catch_log(
                signals.request_dropped, request=op.request, spider=self.spider
            )
        for key, n in (
            ("scheduler/enqueued/redis", sum(reply.pushed)),
            ("frontier/leases/acked", reply.acked),
        ):
            if n:
                self.stats.inc_value(key, n)
        self.problems(reply.problems)

    def lease_result(self, result: Lease | NotDue, shard: int) -> None:
        """Count what a lease call to ``shard`` did besides leasing; log what it met."""
        if result.expired:
            self.stats.inc_value("frontier/leases/returned", result.expired)
        if result.dead:
            self.stats.inc_value("frontier/dead", result.dead)
            logger.warning(
                "%d requests moved to the dead-letter list %s by the frontier "
                "(past FRONTIER_MAX_DELIVERIES, or unreadable)",
                result.dead, self.shards[shard].key("dead"), extra={"spider": self.spider},
            )
        self.problems(result.problems)

    def problems(self, problems: Sequence[str]) -> None:
        """Log each bad value the scripts met, once per worker."""
        for text in problems:
            if text not in self._problems:
                self._problems.add(text)
                self.stats.inc_value("frontier/problems")
                logger.warning("Bad value in Redis: %s%s", text, BAD_VALUE_HINT,
                               extra={"spider": self.spider})
