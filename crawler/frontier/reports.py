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
  ``frontier/problems``, one WARNING per value, once per worker);
* queue values the frontier never writes, which the scripts left as they
  are and named in their reply (:meth:`Reports.damaged`): each is repaired
  off the reactor thread by :func:`crawler.frontier.audit.repair_damage`,
  the repair ``scrapy frontier audit --repair`` makes of it, on that shard
  and key only (``frontier/repaired``; one WARNING per key and worker,
  naming the key, what was wrong and the command).

Collaborators: the crawler (stats, signals), the dupefilter (its ``log``),
and the crawl's shards (the dead-letter key named; set at open as
:attr:`Reports.shards`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from twisted.internet.threads import deferToThread

from crawler.frontier.audit import REPAIR_COMMAND, repair_damage
from crawler.frontier.store import BAD_VALUE_HINT

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

    from crawler.frontier.audit import Finding
    from crawler.frontier.outbox import Op
    from crawler.frontier.protocol import Damage
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
        #: (shard, damage) whose repair runs now: not started again meanwhile
        self._repairing: set[tuple[int, Damage]] = set()
        #: keys whose repair was logged (once per worker)
        self._logged: set[str] = set()
        #: Runs a repair off the reactor thread: ``run(function, *args)`` ->
        #: a Deferred of its result.
        self.run_off_reactor: Callable[..., Deferred[Any]] = deferToThread

    @property
    def stats(self) -> Any:
        return self.crawler.stats

    def committed(self, ops: Sequence[Op], reply: Committed | None, shard: int = 0) -> None:
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
        self.damaged(reply.damaged, shard)

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
        self.damaged(result.damaged, shard)

    def problems(self, problems: Sequence[str]) -> None:
        """Log each bad value the scripts met, once per worker."""
        for text in problems:
            if text not in self._problems:
                self._problems.add(text)
                self.stats.inc_value("frontier/problems")
                logger.warning("Bad value in Redis: %s%s", text, BAD_VALUE_HINT,
                               extra={"spider": self.spider})

    def damaged(self, damaged: Sequence[Damage], shard: int) -> None:
        """Repair each value a call to ``shard`` left as it is (a script
        repairs none): :func:`~crawler.frontier.audit.repair_damage` runs
        off the reactor thread, one at a time per value (a report that
        comes while its repair runs starts none; a later one, after a
        repair given up, tries again). Each key repaired is logged once
        per worker, as a WARNING naming the key, what was wrong and the
        command that finds and repairs all such values."""
        for damage in damaged:
            job = (shard, damage)
            if job in self._repairing:
                continue
            self._repairing.add(job)
            frontier = self.shards[shard]
            d = self.run_off_reactor(repair_damage, frontier, damage)
            d.addCallback(self._repaired, frontier.key(damage.kind), damage)
            d.addErrback(self._repair_failed, frontier.key(damage.kind), damage)
            d.addBoth(self._done, job)

    def _done(self, _: Any, job: tuple[int, Damage]) -> None:
        self._repairing.discard(job)

    def _repaired(self, found: list[Finding], key: str, damage: Damage) -> None:
        done = [x for x in found if x.repaired]
        if done:
            self.stats.inc_value("frontier/repaired", len(done))
        name = f"{key} {damage.field}".rstrip()
        if name in self._logged or not found:
            return
        self._logged.add(name)
        logger.warning(
            "Damaged frontier value %s, one the frontier never writes (its site or queue was "
            "passed over meanwhile, no request lost): %s; %s; `%s` finds and repairs every "
            "such value", name, "; ".join(x.detail.removeprefix(name + " ") for x in found),
            "repaired by this worker" if len(done) == len(found) else "not all repaired yet",
            REPAIR_COMMAND.format(spider=self.shards.spider), extra={"spider": self.spider},
        )

    def _repair_failed(self, failure: Any, key: str, damage: Damage) -> None:
        name = f"{key} {damage.field}".rstrip()
        logger.warning(
            "Damaged frontier value %s (a value the frontier never writes) could not be "
            "repaired by this worker: %s; run `%s`", name, failure.getErrorMessage(),
            REPAIR_COMMAND.format(spider=self.shards.spider), extra={"spider": self.spider},
        )
