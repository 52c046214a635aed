"""The scheduler's enqueuer: a request Scrapy schedules, made a frontier write.

Job: for each request the engine hands the scheduler
(``enqueue_request``), give it its site (``meta["download_slot"]``: its
slot in Scrapy's downloader and its queue in the frontier); refuse what
cannot be stored, with one ERROR line and a stat each and without marking
it seen (a site that cannot be worked out or a value with no faithful
encoding: ``scheduler/unencodable``; a priority outside
+-:data:`~crawler.frontier.store.PRIORITY_LIMIT`:
``scheduler/priority_out_of_range``; a Request subclass, or an item in
meta or cb_kwargs, that cannot be rebuilt from its stored form); drop a
repeat of a fingerprint this worker recorded (``FRONTIER_LOCAL_SEEN``: the
dupefilter's ``log``, no Redis call); and queue the rest in the
:class:`~crawler.frontier.outbox.Outbox`: a
:class:`~crawler.frontier.store.Retry` for a request whose meta has
``frontier_retry_delay`` (``frontier/retries/scheduled``), else a
:class:`~crawler.frontier.store.Push`.

Collaborators: the crawl's
:class:`~crawler.frontier.queue.LeasedPriorityQueue` (site policy,
encoding, shards; set at open as :attr:`Enqueuer.queue`), the dupefilter
(fingerprints, ``log``), the outbox, the
:class:`~crawler.frontier.router.ShardRouter` (told of each push's
priority) and the crawl's stats.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import Request

from crawler.frontier.signals import RETRY_DELAY_META
from crawler.frontier.sites import SLOT_META, slot_of
from crawler.frontier.store import PRIORITY_LIMIT, Push, Retry

if TYPE_CHECKING:
    from crawler.frontier.outbox import Outbox
    from crawler.frontier.queue import LeasedPriorityQueue
    from crawler.frontier.router import ShardRouter

#: The scheduler's logger: its parts log as it does.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = ["Enqueuer"]


class Enqueuer:
    """The requests one worker schedules.

    :param dupefilter: the scheduler's dupefilter
        (``request_fingerprint(request) -> bytes``, ``log(request, spider)``).
    :param seen_max: ``FRONTIER_LOCAL_SEEN`` (0: no memory).
    :ivar seen: the fingerprints this worker recorded in the shared
        dupefilter, oldest first, at most ``seen_max``.
    :ivar queue: the crawl's queue, set at open.
    """

    queue: LeasedPriorityQueue
    spider: Any = None

    def __init__(self, dupefilter: Any, outbox: Outbox, router: ShardRouter, stats: Any,
                 seen_max: int) -> None:
        self.dupefilter = dupefilter
        self.outbox = outbox
        self.router = router
        self.stats = stats
        self.seen_max = seen_max
        self.seen: dict[bytes, None] = {}

    def enqueue(self, request: Request) -> bool:
        """Queue ``request`` in the outbox (see the module's docstring).

        :returns: False for a request refused or a repeat of a fingerprint
            this worker recorded; other duplicates are filtered when the
            outbox is sent.
        """
        delay = request.meta.pop(RETRY_DELAY_META, None)
        try:
            # Its site in the frontier, and its slot in Scrapy's downloader.
            request.meta[SLOT_META] = self.queue.policy.slot_of(request)
        except ValueError as exc:
            logger.error("Request %s not scheduled: %s", request.url, exc,
                         extra={"spider": self.spider})
            self.stats.inc_value("scheduler/unencodable")
            return False
        fingerprint = None
        if delay is None and not request.dont_filter and self.seen:
            fingerprint = self.dupefilter.request_fingerprint(request)
            if fingerprint in self.seen:
                self.dupefilter.log(request, self.spider)
                return False
        if not -PRIORITY_LIMIT <= request.priority <= PRIORITY_LIMIT:
            logger.error(
                "cannot queue request %s: its priority %d is outside the frontier's "
                "range, -%d to %d (see docs/requests.md)",
                request.url, request.priority, PRIORITY_LIMIT, PRIORITY_LIMIT,
                extra={"spider": self.spider},
            )
            self.stats.inc_value("scheduler/priority_out_of_range")
            return False
        try:
            data = self.queue.encode(request)
            if type(request) is not Request or b'{"!i":' in data:
                self._check_rebuilds(request, data)
        except ValueError as exc:  # EncodeError, or a callback not on the spider
            logger.error("%s", exc, extra={"spider": self.spider})
            self.stats.inc_value("scheduler/unencodable")
            return False
        site, priority = request.meta[SLOT_META], request.priority
        shard = self.queue.shards.index_of(site)
        if delay is not None:
            retry = Retry(data, site, priority, float(delay))
            self.outbox.write("retries", item=retry, shard=shard)
            self.stats.inc_value("frontier/retries/scheduled")
            return True
        if fingerprint is None:
            fingerprint = self.dupefilter.request_fingerprint(request)
        push = Push(data, site, priority, fingerprint, request.dont_filter)
        self.outbox.write("pushes", item=push, request=request, shard=shard)
        self.router.note_push(shard, priority)
        self._remember(fingerprint)
        return True

    def _check_rebuilds(self, request: Request, data: bytes) -> None:
        """Decode ``data`` as a worker will: a Request subclass whose
        ``__init__`` does not take back what ``to_dict`` gave (Scrapy's
        :func:`~scrapy.utils.request.request_from_dict` passes every
        attribute as a keyword), or an item in meta or cb_kwargs whose class
        cannot be built from its fields, is refused now, not lost when
        leased. Only subclasses and requests holding items pay for it.

        :raises ValueError: naming the URL, the class and the cause.
        """
        try:
            self.queue.decode(data, slot_of(request))
        except Exception as exc:
            raise ValueError(
                f"cannot store request {request.url} in Redis: {type(request).__name__} "
                f"cannot be rebuilt from its stored form ({type(exc).__name__}: {exc})"
            ) from exc

    def _remember(self, fingerprint: bytes) -> None:
        if self.seen_max:
            seen = self.seen
            seen[fingerprint] = None
            if len(seen) > self.seen_max:
                del seen[next(iter(seen))]  # the oldest

    def forget_seen(self) -> None:
        """Forget the fingerprints recorded: Redis may hold an older
        dupefilter (it could not be reached, or had forgotten the scripts)."""
        self.seen.clear()
