"""Queue seeds from any Python process: a script, a Celery or Airflow task.

.. code-block:: python

    from crawler.producer import queue_seeds

    result = queue_seeds("redis://redis.internal:6379/0", "quotes", [
        "https://quotes.toscrape.com/",
        {"url": "https://quotes.toscrape.com/login", "method": "POST",
         "username": "u", "password": "p"},               # form data, as scrapy-redis reads it
    ], priority=9, meta={"source": "nightly"})
    result.queued    # 2
    result.invalid   # [] (each bad seed with why it was skipped)

Each seed goes through the same checks as ``scrapy seed``
(:func:`crawler.frontier.seeds.seed_json`): a bad seed is logged and skipped,
never pushed, and the others are queued. The seeds go into the spider's seed
list, ``<spider>:start_urls`` (``REDIS_START_URLS_KEY``), with ``LPUSH`` in
pipelined batches (one round trip for up to 10,000 seeds; workers take them
oldest first), or with ``SADD`` when ``REDIS_START_URLS_AS_SET`` is on.

Not idempotent: when Redis fails mid-call (:class:`redis.exceptions.RedisError`
raised), some seeds may be queued already. The client never resends a call
on its own (:func:`crawler.frontier.connection.get_redis`); queueing the same
seeds again is safe, since the crawl's dupefilter drops requests it has seen.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.settings import BaseSettings, Settings

from crawler.frontier.connection import get_redis
from crawler.frontier.seeds import BadSeed, SeedPusher, seed_json
from crawler.keys import CrawlKeys

if TYPE_CHECKING:
    from redis import Redis

__all__ = ["QueueResult", "queue_seeds"]

logger = logging.getLogger(__name__)


@dataclass
class QueueResult:
    """What :func:`queue_seeds` did.

    :ivar queued: seeds pushed into the seed list.
    :ivar key: the seed list (or set).
    :ivar invalid: each skipped seed (as given) with the reason.
    """

    queued: int = 0
    key: str = ""
    invalid: list[tuple[Any, str]] = field(default_factory=list)


def queue_seeds(
    redis: Redis | str,
    spider: str,
    seeds: Iterable[str | Mapping[str, Any]],
    *,
    priority: int | None = None,
    meta: Mapping[str, Any] | None = None,
    settings: BaseSettings | Mapping[str, Any] | None = None,
    spider_cls: type | None = None,
) -> QueueResult:
    """Check ``seeds`` and queue the good ones for ``spider``'s workers.

    :param redis: a redis-py client, or a Redis URL (``redis://``,
        ``rediss://``, ``unix://``: a client is made for the call and closed).
    :param spider: the spider's name (its seed list is ``<spider>:start_urls``).
    :param seeds: URLs, or seeds as scrapy-redis's JSON objects (``url``,
        ``meta``, ``priority``, ``callback``, ``method``, extra keys as form
        data), as dicts or JSON text.
    :param priority: the priority of seeds that set none.
    :param meta: meta merged under each seed's own.
    :param settings: the project's settings, for ``REDIS_START_URLS_KEY``,
        ``REDIS_START_URLS_AS_SET`` (and ``REDIS_PARAMS`` with a URL).
    :param spider_cls: when given, a seed's ``callback`` must be one of its
        methods.
    :returns: how many were queued, where, and which were skipped and why.
    :raises redis.exceptions.RedisError: Redis failed (see the module's note:
        some seeds may be queued).
    """
    conf = settings if isinstance(settings, BaseSettings) else Settings(dict(settings or {}))
    key = CrawlKeys.for_spider(spider, conf).seeds
    result = QueueResult(key=key)
    good: list[str] = []
    for seed in seeds:
        text = json.dumps(dict(seed)) if isinstance(seed, Mapping) else seed
        try:
            line, _form = seed_json(text, priority, dict(meta or {}), spider_cls)
        except BadSeed as exc:
            logger.warning("Seed skipped: %s: %.200r", exc, seed)
            result.invalid.append((seed, str(exc)))
            continue
        good.append(line)
    if not good:
        return result
    if isinstance(redis, str):
        own = conf.copy()
        own.set("REDIS_URL", redis, priority="cmdline")
        client = get_redis(own)
    else:
        client = redis
    try:
        pusher = SeedPusher(client, key, as_set=conf.getbool("REDIS_START_URLS_AS_SET"))
        for line in good:
            pusher.add(line)
        pusher.flush()
    finally:
        if isinstance(redis, str):
            client.close()
    result.queued = len(good)
    return result
