"""The shared request queue: per-site, priority-ordered, leased."""

from __future__ import annotations

import inspect
import logging
import os
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy_redis.queue import Base

from crawler.frontier import serializer as json_serializer
from crawler.frontier.shards import FrontierShards
from crawler.frontier.sites import SLOT_META
from crawler.frontier.slots import SitePolicy
from crawler.frontier.store import Frontier, Lease, NotDue

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis import Redis
    from scrapy import Spider

    from crawler.frontier.bloom import BloomFilter

logger = logging.getLogger(__name__)

__all__ = ["LeasedPriorityQueue"]


class LeasedPriorityQueue(Base):  # type: ignore[misc]
    """A scrapy-redis queue over :class:`~crawler.frontier.store.Frontier`.

    It keeps scrapy-redis's queue interface (``push``, ``pop``, ``len``,
    ``clear``; requests encoded by the ``serializer``, JSON by default) and
    replaces the single sorted set of
    :class:`scrapy_redis.queue.PriorityQueue` with:

    * one FIFO list per site and priority, so a higher ``Request.priority``
      pops first and equal priorities pop in the order they were pushed
      (scrapy-redis pops equal scores in the byte order of the encoding);
    * sites (a request's download slot: :attr:`policy`) served in order of
      when they are due, each at most ``FRONTIER_CONCURRENCY`` at once and
      ``FRONTIER_DELAY`` seconds apart across all workers (defaults:
      ``CONCURRENT_REQUESTS_PER_DOMAIN`` and ``DOWNLOAD_DELAY``; per slot,
      ``DOWNLOAD_SLOTS``);
    * leases: :meth:`lease` hands out a request with a deadline
      (``FRONTIER_LEASE_TIMEOUT`` seconds) that the worker extends while it
      works and ends with :meth:`ack`; expired leases go back to the queue.

    :param server: a redis-py client returning bytes.
    :param spider: the spider; its name gives the key prefix ``{<name>}:``.
    :param key: ignored beyond scrapy-redis's interface (the prefix comes
        from the spider's name).
    :param serializer: module with ``dumps``/``loads``; default JSON.
    :param dupefilter_key: the set that ``push`` records fingerprints in.
    :param bloom: a Bloom filter to record fingerprints in instead (set by
        the scheduler when the dupefilter is a
        :class:`~crawler.frontier.bloom.BloomDupeFilter`).
    """

    def __init__(
        self,
        server: Redis,
        spider: Spider,
        key: str,
        serializer: Any = None,
        dupefilter_key: str | None = None,
        *,
        bloom: BloomFilter | None = None,
    ) -> None:
        super().__init__(server, spider, key, serializer or json_serializer)
        settings = spider.crawler.settings
        #: Each site's delay and concurrency, from Scrapy's settings.
        self.policy = SitePolicy.from_settings(settings)
        if self.policy.jitter and (self.policy.delay or self.policy.slot_delays):
            logger.info(
                "DOWNLOAD_DELAY_JITTER %s: each gap between two requests to a site is "
                "drawn in [1, %s) x its delay for the whole cluster (Scrapy: [%s, %s) "
                "per worker), so the delay is the floor", self.policy.jitter,
                1 + self.policy.jitter, max(0.0, 1 - self.policy.jitter), 1 + self.policy.jitter,
            )
        #: The frontier's shards (``FRONTIER_SHARDS``, default 1).
        self.shards = FrontierShards.from_crawler_settings(
            server, spider.crawler, spider.name, bloom=bloom
        )
        self.dupefilter_key = dupefilter_key or self.frontier.key("dupefilter")
        self._method_names: dict[Callable[..., Any], str] = {}

    @property
    def frontier(self) -> Frontier:
        """Shard 0: the whole frontier unless ``FRONTIER_SHARDS`` > 1 (then
        use :attr:`shards`)."""
        return self.shards[0]

    def __len__(self) -> int:
        """Requests queued, waiting for a retry, or leased, in every shard."""
        return self.shards.pending()

    def encode(self, request: Request, *, compact: bool = True) -> bytes:
        """Encode ``request`` for the queue.

        :param compact: store the URL relative to its site, its download
            slot (:meth:`SitePolicy.slot_of`; the entry lives under the
            site's key, so ``meta["download_slot"]`` is left out when it
            names that site); False for a self-contained entry (dead
            letters). Only the JSON serializer compacts.
        :raises crawler.frontier.serializer.EncodeError: a value in meta,
            cb_kwargs, cookies or an attribute a Request subclass declares
            cannot be stored (the message says which).
        :raises ValueError: the callback is not a method of the spider, or
            ``meta["download_slot"]`` is not a slot name the frontier can
            keep (:func:`~crawler.frontier.sites.check_slot`).
        """
        if self.serializer is not json_serializer:
            data: bytes = self._encode_request(request)
            return data
        d = self._to_dict(request)
        if not compact:
            return json_serializer.dumps(d, None)
        site = self.policy.slot_of(request)
        meta = d.get("meta")
        if isinstance(meta, dict) and meta.get(SLOT_META) == site:
            # The entry lives under its slot: decode() puts it back.
            d["meta"] = {k: v for k, v in meta.items() if k != SLOT_META}
        return json_serializer.dumps(d, site)

    def _to_dict(self, request: Request) -> dict[str, Any]:
        """:meth:`scrapy.Request.to_dict` with ``spider=self.spider``, built
        the same way (Scrapy 2.19) but with the callback and errback names
        cached: Scrapy looks them up with ``inspect.getmembers`` on the
        spider for every request, which costs more than the rest of the
        encoding together. Every name in ``request.attributes`` is read, so
        a subclass's own attributes are encoded too."""
        d: dict[str, Any] = {
            "url": request.url,
            "callback": self._method_name(request.callback),
            "errback": self._method_name(request.errback),
            "headers": dict(request.headers),
        }
        for attr in request.attributes:
            d.setdefault(attr, getattr(request, attr))
        if type(request) is not Request:
            d["_class"] = type(request).__module__ + "." + type(request).__name__
        return d

    def _method_name(self, func: Any) -> Any:
        if not callable(func):
            return func
        function = getattr(func, "__func__", None)
        if function is None or getattr(func, "__self__", None) is not self.spider:
            return self._find_method(func)
        name = self._method_names.get(function)
        if name is None:
            name = self._method_names[function] = self._find_method(func)
        return name

    def _find_method(self, func: Any) -> str:
        """The name of the spider's method ``func`` (the first in ``dir``
        order, as Scrapy's ``Request.to_dict`` finds it).

        :raises ValueError: ``func`` is not a method of the spider.
        """
        function = getattr(func, "__func__", None)
        if function is not None:
            for name, method in inspect.getmembers(self.spider, inspect.ismethod):
                if method.__func__ is function:
                    return name
        raise ValueError(f"Function {func} is not an instance method in: {self.spider}")

    def decode(self, data: bytes, site: str | None = None) -> Request:
        """Decode an entry stored under ``site``; its
        ``meta["download_slot"]`` is ``site`` unless it names another.

        :raises ValueError: (or a subclass) the entry is not a request.
        """
        if self.serializer is not json_serializer:
            request: Request = self._decode_request(data)
            return request
        request = json_serializer.rebuild(json_serializer.loads(data, site), self.spider)
        if site is not None:
            request.meta.setdefault(SLOT_META, site)
        return request

    def push(self, request: Request, fingerprint: bytes | None = None) -> bool:
        """Queue ``request``; with a fingerprint, only if it was not seen.

        :returns: False when filtered as a duplicate.
        """
        site = self.policy.slot_of(request)
        return self.shards.for_site(site).push(
            self.encode(request),
            site=site,
            priority=request.priority,
            fingerprint=fingerprint,
            dont_filter=request.dont_filter,
        )

    def lease(self, lease_id: str) -> Lease | NotDue:
        """Lease the best due request of the first shard that has one under
        ``lease_id``."""
        return self.shards.lease(lease_id)

    def pop(self, timeout: int = 0) -> Request | None:
        """scrapy-redis's interface: lease and acknowledge at once (no lease kept)."""
        lease_id = f"pop#{os.urandom(4).hex()}:0"
        result = self.shards.lease(lease_id)
        if isinstance(result, NotDue):
            return None
        self.shards.for_site(result.site).ack([lease_id])
        return self.decode(result.data, result.site)

    def clear(self) -> None:
        """Delete the frontier, every shard (not the dupefilters)."""
        self.shards.clear()
