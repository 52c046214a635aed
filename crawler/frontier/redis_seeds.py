"""Durable seeds for scrapy-redis's own spiders on the frontier.

scrapy-redis 0.9.1's ``RedisSpider`` and ``RedisCrawlSpider`` read seeds
with ``SPOP`` (``REDIS_START_URLS_AS_SET``) or ``LRANGE``+``LTRIM`` (a
list): a worker killed between that read and its requests reaching the
frontier loses those seeds. :class:`DurableSeeds` takes them as
:class:`~crawler.frontier.spider.FrontierSpider` does, through the seed
intake (:class:`~crawler.frontier.intake.SeedIntake`):

* the spider's ``fetch_data`` moves up to ``redis_batch_size`` seeds into a
  registered intake batch, in one Lua script;
* its ``next_requests`` is wrapped: once every request made from the batch
  has been handed to the engine (the generator is resumed after its last
  request), the batch is deleted after the scheduler's next commit
  (``after_commit``), i.e. once those requests are in the frontier;
* every ``FRONTIER_LEASE_TIMEOUT / 3`` seconds (and at open) the worker
  refreshes the batches it holds and returns to the seed list or set the
  seeds of batches no worker refreshed for ``FRONTIER_LEASE_TIMEOUT``
  seconds (a killed worker's);
* its ``make_request_from_data`` is guarded per seed (:meth:`DurableSeeds.requests`):
  a seed it raises on, or that gives something other than requests, is
  logged in one line (``Skipped bad seed ...``, as ``FrontierSpider`` logs
  it), counted in ``frontier/seeds/bad`` and skipped, as is one whose
  request's URL is not an absolute http(s) URL; the seeds read with
  it are crawled and its batch is deleted like any other. Where the spider
  keeps scrapy-redis's own ``make_request_from_data``, seeds are read as
  ``FrontierSpider`` reads them (:func:`~crawler.frontier.spider.request_from_seed`):
  numbers in form data are sent as their JSON text, where scrapy-redis's
  ``FormRequest`` raises ``TypeError``, and a bare URL logs no
  "String request is deprecated" warning.

Delivery is at least once, as for ``FrontierSpider``'s seeds.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import Request, signals
from scrapy_redis.spiders import RedisMixin
from twisted.internet import task

from crawler.config import FrontierConfig, worker_id
from crawler.frontier.intake import SeedIntake
from crawler.frontier.seeds import BadSeed, check_url

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy import Spider

logger = logging.getLogger(__name__)

__all__ = ["DurableSeeds"]


class DurableSeeds:
    """The seed intake of one scrapy-redis spider (not a ``FrontierSpider``).

    :param spider: a scrapy-redis ``RedisMixin`` spider whose ``server`` is
        the frontier's client.
    :param after_commit: the scheduler's ``after_commit``.
    :param lease_timeout: seconds after which another worker's batch is
        abandoned (``FRONTIER_LEASE_TIMEOUT``).
    """

    def __init__(
        self, spider: Spider, after_commit: Callable[[Callable[[], object]], None],
        lease_timeout: float,
    ) -> None:
        settings = spider.crawler.settings
        self.spider = spider
        self.after_commit = after_commit
        self.lease_timeout = lease_timeout
        self.intake = SeedIntake(
            spider.server, spider.redis_key,  # type: ignore[attr-defined]
            f"{worker_id(settings)}#{os.urandom(4).hex()}",
            as_set=settings.getbool("REDIS_START_URLS_AS_SET"),
        )
        #: Batches taken whose requests are not all handed to the engine.
        self._taken: list[str] = []
        #: Batches handed over, not deleted yet.
        self._held: set[str] = set()
        self._upkeep = task.LoopingCall(self.upkeep)

    @classmethod
    def install(cls, scheduler: Any, spider: Spider) -> DurableSeeds | None:
        """Put the intake in the place of ``spider``'s own seed reads, when
        ``spider`` is a scrapy-redis spider other than a ``FrontierSpider``
        (which has its own), and start the upkeep; else None."""
        from crawler.frontier.spider import (  # noqa: PLC0415 (a cycle)
            FrontierSpider,
            request_from_seed,
        )

        if isinstance(spider, FrontierSpider) or not all(
            hasattr(spider, name) for name in ("fetch_data", "next_requests", "redis_key")
        ):
            return None
        seeds = cls(spider, scheduler.after_commit, FrontierConfig.of(spider.crawler).lease_timeout)
        own_next = spider.next_requests  # type: ignore[attr-defined]
        own_make = spider.make_request_from_data  # type: ignore[attr-defined]
        ours = type(spider).make_request_from_data is RedisMixin.make_request_from_data  # type: ignore[attr-defined]
        if ours:
            own_make = functools.partial(request_from_seed, spider)
        spider.make_request_from_data = functools.partial(  # type: ignore[attr-defined]
            seeds.requests, own_make)
        spider.fetch_data = seeds.fetch  # type: ignore[attr-defined]
        spider.next_requests = functools.partial(seeds.next_requests, own_next)  # type: ignore[attr-defined]
        seeds._upkeep.start(max(1.0, seeds.lease_timeout / 3), now=True)
        spider.crawler.signals.connect(seeds.stop, signal=signals.spider_closed)
        logger.info(
            "%s reads seeds from %s through the frontier's intake (kept in Redis until "
            "their requests are in the frontier), not scrapy-redis's %s; a bad seed is "
            "logged and skipped%s",
            type(spider).__name__, spider.redis_key,  # type: ignore[attr-defined]
            "SPOP" if seeds.intake.as_set else "LRANGE/LTRIM",
            "; seeds are read as FrontierSpider reads them, not by scrapy-redis's "
            "make_request_from_data (docs/workers.md: Seeding with redis-cli)" if ours else "",
            extra={"spider": spider},
        )
        return seeds

    def fetch(self, key: str, most: int) -> list[bytes]:
        """scrapy-redis's ``fetch_data(key, batch_size)``: up to ``most``
        seeds, moved into a new registered batch.

        :raises redis.exceptions.RedisError: the take failed (as scrapy-redis's
            own read would).
        """
        batch = self.intake.new_batch()
        taken = self.intake.take(batch, most)
        if taken.seeds:
            self._taken.append(batch)
        return list(taken.seeds)

    def next_requests(self, own: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """scrapy-redis's ``next_requests``; once the engine has taken every
        request of it (the generator resumed after the last one), the batches
        it read are let go of after the scheduler's next commit."""
        yield from own()
        batches, self._taken = self._taken, []
        if batches:
            self._held.update(batches)
            self.after_commit(functools.partial(self._done, batches))

    def requests(self, make: Callable[[bytes], Any], data: bytes) -> Request | list[Request] | None:
        """The spider's ``make_request_from_data(data)``, guarded: what
        ``make`` returns (a request, None, or any iterable of requests, read
        here), or None when ``make`` raised, gave anything else (an item, a
        dict) or a request whose URL is not an absolute http(s) URL (as
        :func:`~crawler.frontier.seeds.check_url` requires of seeds): the
        seed is skipped with one ``Skipped bad seed`` line."""
        try:
            made: Any = make(data)
            if made is None:
                return None
            if isinstance(made, Request):
                made = [made]
            elif isinstance(made, Iterable) and not isinstance(made, str | bytes | dict):
                made = list(made)
            else:
                made = [made]
            others = sorted({type(r).__name__ for r in made if not isinstance(r, Request)})
            if others:
                raise BadSeed(f"make_request_from_data gave {', '.join(others)}, not requests")
            for request in made:
                check_url(request.url)
        except Exception as exc:  # any error is this one seed's
            self.spider.crawler.stats.inc_value("frontier/seeds/bad")
            logger.error(
                "Skipped bad seed %r from %s: %s",
                data[:200], self.intake.keys.seeds,
                exc if isinstance(exc, BadSeed) else f"{type(exc).__name__}: {exc}",
                extra={"spider": self.spider},
            )
            return None
        requests: list[Request] = made
        return requests[0] if len(requests) == 1 else requests

    def _done(self, batches: list[str]) -> None:
        try:
            self.intake.done(batches)
        except RedisError as exc:
            logger.debug("Intake batches not deleted yet (%s)", exc, extra={"spider": self.spider})
            return  # refreshed by the upkeep until the next try
        self._held.difference_update(batches)

    def upkeep(self) -> None:
        """Refresh this worker's batches; return abandoned ones' seeds."""
        try:
            self.intake.refresh([*self._taken, *self._held])
            for reclaimed in self.intake.reclaim_stale(self.lease_timeout):
                if reclaimed.seeds:
                    self.spider.crawler.stats.inc_value(
                        "frontier/seeds/reclaimed", reclaimed.seeds)
                    logger.info(
                        "Returned %d seeds of abandoned intake batch %s to %s",
                        reclaimed.seeds, reclaimed.batch, self.intake.keys.seeds,
                        extra={"spider": self.spider},
                    )
        except RedisError as exc:
            logger.debug("Seed intake upkeep failed (%s)", exc, extra={"spider": self.spider})

    def stop(self, *args: Any, **kwargs: Any) -> None:
        """Stop the upkeep (at close). Batches still held are returned by
        another worker's upkeep once abandoned."""
        if self._upkeep.running:
            self._upkeep.stop()
