"""The shared request queue: scrapy-redis's priority queue, JSON-encoded."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy_redis.queue import PriorityQueue

from crawler.frontier import serializer as json_serializer

if TYPE_CHECKING:
    from redis import Redis
    from scrapy import Request, Spider

logger = logging.getLogger(__name__)

__all__ = ["JsonPriorityQueue"]


class JsonPriorityQueue(PriorityQueue):  # type: ignore[misc]
    """scrapy-redis's sorted-set priority queue with safe decoding.

    Requests are stored with :mod:`crawler.frontier.serializer` (JSON) unless
    ``SCHEDULER_SERIALIZER`` names another serializer. A higher
    ``Request.priority`` pops first (the score is ``-priority``).

    Changes from :class:`scrapy_redis.queue.PriorityQueue`:

    * ``pop`` is one ``ZPOPMIN`` (atomic, one round trip) instead of a
      ``MULTI``/``ZRANGE``/``ZREMRANGEBYRANK`` transaction.
    * An entry that cannot be decoded (not our JSON, a pickled payload, a
      callback the spider lacks) does not crash the worker: it is logged with
      the reason and moved to the dead-letter list ``<queue key>:dead`` as a
      JSON object ``{"entry", "reason", "time"}``; the next entry is popped.

    :param server: a redis-py client (bytes responses).
    :param spider: the spider whose callbacks requests name.
    :param key: the sorted set's key, e.g. ``{quotes}:requests``.
    :param serializer: module or object with ``dumps``/``loads``; default JSON.
    """

    def __init__(
        self, server: Redis, spider: Spider, key: str, serializer: Any = None
    ) -> None:
        super().__init__(server, spider, key, serializer or json_serializer)
        self.dead_key = f"{self.key}:dead"

    def encode(self, request: Request) -> bytes:
        """Encode ``request`` for the queue.

        :raises crawler.frontier.serializer.EncodeError: a value in meta,
            cb_kwargs or cookies cannot be stored (the message says which).
        :raises ValueError: the callback is not a method of the spider.
        """
        data: bytes = self._encode_request(request)
        return data

    def push_encoded(self, data: bytes, priority: int) -> None:
        """Add an entry from :meth:`encode` with score ``-priority``."""
        self.server.zadd(self.key, {data: -priority})

    def push(self, request: Request) -> None:
        """Encode and add ``request`` (scrapy-redis's interface)."""
        self.push_encoded(self.encode(request), request.priority)

    def pop(self, timeout: int = 0) -> Request | None:
        """Pop the highest-priority request, or ``None`` when the queue is empty.

        :param timeout: ignored (a sorted set has no blocking pop here).
        """
        while True:
            popped = self.server.zpopmin(self.key, 1)
            if not popped:
                return None
            data = popped[0][0]
            try:
                request: Request = self._decode_request(data)
            except (ValueError, TypeError, KeyError) as exc:
                self._dead_letter(data, f"{type(exc).__name__}: {exc}")
                continue
            return request

    def _dead_letter(self, data: bytes, reason: str) -> None:
        logger.error(
            "Dropped an undecodable frontier entry from %s to %s: %s",
            self.key,
            self.dead_key,
            reason,
        )
        record = {
            "entry": data.decode("latin-1"),
            "reason": reason,
            "time": time.time(),
        }
        self.server.rpush(self.dead_key, json.dumps(record))
