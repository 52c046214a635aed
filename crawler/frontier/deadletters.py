"""The scheduler's dead letters: the requests a crawl gives up on, and the
one shape of a dead-letter record.

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

The frontier's scripts write dead letters of the same shape themselves
(``bury`` in ``lua/lib.lua``): a request delivered ``FRONTIER_MAX_DELIVERIES``
times without acknowledgement, a queued chunk or retry/revisit entry that
cannot be read, a lease that cannot be given back.

The record (one JSON object per ``{s}:dead`` list entry; every writer writes
every field, ``null`` where it has no value):

=================  =========================================================
``v``              1 (:data:`RECORD_VERSION`)
``url``            the request's URL (str), null when it cannot be read
``site``           the site it is queued under (str), null when unknown
``entry``          the request as the frontier stores it (text; read with
                   :func:`crawler.frontier.serializer.entry_fields` and
                   ``site``): what ``scrapy deadletters requeue`` sends back;
                   for an undecodable entry, its bytes as latin-1 text; null
                   when the request cannot be encoded
``reason``         why it was given up (str)
``last_error``     the last error (str), null when there is none
``attempts``       how many times it was tried: ``retry_times`` + 1 for a
                   request the crawl gave up, its deliveries for one the
                   frontier buried, 0 for an undecodable entry (int)
``deliveries``     deliveries the frontier counted without acknowledgement
                   when it buried it (int; 0 when the crawl gave it up)
``priority``       the priority it was queued at (int), null when unknown
``first_priority`` the priority it was first scheduled at, before Scrapy's
                   retries (int: :func:`first_priority` by the crawl's own
                   ``RETRY_PRIORITY_ADJUST``), null when the writer could not
                   tell (``requeue`` then computes it from ``priority`` and
                   the entry's ``retry_times``)
``time``           when, Unix seconds (float; the Redis server's clock for
                   the scripts' records)
``worker``         the lease holder (``<worker id>#<process>``) that gave it
                   up or whose lease it was, null when none
=================  =========================================================

A requeue moving a record between shards adds one field, ``requeue_move``
(:data:`crawler.commands.deadletters.MOVING`). Records written in earlier
shapes (``request`` instead of ``entry``; no ``v``, ``last_error``,
``worker``...) are read through :func:`upgrade`, the one place that knows
them.

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

from scrapy import Request, signals

from crawler.frontier import serializer as json_serializer
from crawler.frontier.signals import request_dead
from crawler.frontier.sites import site_of, slot_of

if TYPE_CHECKING:
    from scrapy.http import Response
    from scrapy.settings import BaseSettings
    from scrapy.signalmanager import SignalManager
    from twisted.python.failure import Failure

    from crawler.frontier.outbox import Outbox
    from crawler.frontier.queue import LeasedPriorityQueue

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = [
    "DEFAULT_PRIORITY_ADJUST", "RECORD_FIELDS", "RECORD_VERSION", "DeadLetters", "first_priority",
    "new_record", "upgrade", "whole_number",
]

#: The version of the dead-letter record (its field ``v``).
RECORD_VERSION = 1
#: The fields of a dead-letter record, every one present (see the module).
RECORD_FIELDS = (
    "v", "url", "site", "entry", "reason", "last_error", "attempts", "deliveries", "priority",
    "first_priority", "time", "worker",
)

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



def new_record(reason: str, **fields: Any) -> dict[str, Any]:
    """A dead-letter record (the module's table): ``fields`` over the
    defaults (null, 0 for the counts, now for ``time``).

    :raises TypeError: a field the record does not have.
    """
    unknown = set(fields) - set(RECORD_FIELDS)
    if unknown:
        raise TypeError(f"no dead-letter field {sorted(unknown)}")
    record: dict[str, Any] = dict.fromkeys(RECORD_FIELDS)
    record.update(v=RECORD_VERSION, reason=reason, attempts=0, deliveries=0, time=time.time())
    record.update(fields)
    return record


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """A dead letter as read from ``{s}:dead`` in the shape of
    :data:`RECORD_VERSION` (a new dict): a record of this version keeps its
    values (a missing field null); earlier shapes are mapped onto it:

    * the scheduler's (``request``: the self-contained encoded request;
      ``last_error``; ``first_priority``): ``entry`` is the request, ``site``
      the site of its URL;
    * the scripts' (``entry``, ``site``, ``url``, ``priority``,
      ``deliveries``): as they are, no ``last_error``;
    * an undecodable entry's (``entry``, ``site``, ``url`` null).

    Fields it does not know (``requeue_move``) are kept. Never raises.
    """
    out = {k: record.get(k) for k in RECORD_FIELDS}
    out.update({k: v for k, v in record.items() if k not in RECORD_FIELDS and k != "request"})
    if record.get("v") == RECORD_VERSION:
        return out
    out["v"] = RECORD_VERSION
    if out["entry"] is None and isinstance(record.get("request"), str):
        out["entry"] = record["request"]
        if out["site"] is None:
            try:
                out["site"] = site_of(Request(json_serializer.entry_fields(record["request"])["u"]))
            except (ValueError, KeyError, TypeError):
                pass
    out["reason"] = _text(out["reason"]) or "unknown"
    for count in ("attempts", "deliveries"):
        out[count] = whole_number(out[count]) or 0
    if not isinstance(out["time"], (int, float)) or isinstance(out["time"], bool):
        out["time"] = 0
    return out

class DeadLetters:
    """The dead letters of one worker, queued in ``outbox``.

    :param outbox: where the ``dead`` writes (and an undecodable entry's
        ack) are queued.
    :param stats: the crawl's stats (``frontier/dead``).
    :param settings: the crawl's settings (``RETRY_PRIORITY_ADJUST``).
    :param worker: the lease holder its records name (``worker``).
    :ivar queue: the crawl's queue, set at open.
    :ivar lease_shards: lease id -> the shard it was taken from (the lease
        book's own map: an undecodable entry's ack and record go to its
        shard, and it leaves the map).
    """

    queue: LeasedPriorityQueue
    spider: Any = None

    def __init__(
        self, outbox: Outbox, stats: Any, settings: BaseSettings, worker: str | None = None
    ) -> None:
        self.outbox = outbox
        self.worker = worker
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
        """Queue the dead letter of ``request`` for the shard of its site
        (the module's record): its url and site, the request encoded
        self-contained as ``entry`` (null when it cannot be encoded), reason,
        last error, attempts (``retry_times`` + 1), its priority and the one
        it was first scheduled with by this crawl's
        ``RETRY_PRIORITY_ADJUST`` (what ``scrapy deadletters requeue``
        restores), this worker."""
        try:
            encoded: str | None = self.queue.encode(request, compact=False).decode()
        except ValueError:
            encoded = None
        record = new_record(
            reason, url=request.url, site=site_of(request), entry=encoded, last_error=error,
            attempts=request.meta.get("retry_times", 0) + 1, priority=request.priority,
            first_priority=first_priority(
                request.priority, request.meta, self.settings.getint("RETRY_PRIORITY_ADJUST"),
            ),
            worker=self.worker,
        )
        self._queue(record, slot_of(request))
        name = getattr(self.spider, "name", None) or "SPIDER"
        logger.warning(
            "Dead letter for %s: %s (scrapy deadletters list %s: the dead letters; "
            "scrapy deadletters requeue %s: crawl them again once the cause is fixed)",
            request.url, reason, name, name,
        )

    def entry(self, data: bytes, lease_id: str, exc: Exception, site: str | None = None) -> None:
        """A leased entry that is no request here (``exc`` says why): a dead
        letter with the entry (latin-1 text) and its site (so ``scrapy
        deadletters requeue`` can send it back once the cause is fixed, e.g.
        its Request class made importable), and its lease acknowledged, both
        on the shard it was leased from (shard 0 when unknown)."""
        reason = f"undecodable frontier entry: {type(exc).__name__}: {exc}"
        name = getattr(self.spider, "name", None) or "SPIDER"
        logger.error(
            "%s: kept as a dead letter (make its request class importable, then "
            "scrapy deadletters requeue %s)", reason, name, extra={"spider": self.spider},
        )
        record = new_record(reason, site=site, entry=data.decode("latin-1"),
                            last_error=repr(exc), worker=self.worker)
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
