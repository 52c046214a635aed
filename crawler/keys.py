"""Names of the Redis keys of one crawl, in one place.

``<spider>`` is the spider's name. The keys that scripts touch together
carry the hash tag ``{<spider>}`` so they live in one Redis Cluster slot; the
seed list keeps scrapy-redis's name, which users type into ``redis-cli``.

==============================  ======  =========================================
key                             type    what it holds
==============================  ======  =========================================
``<spider>:start_urls``         list    seeds (bare URL or JSON), ``LPUSH``-ed
``{<spider>}:requests``         zset    the first frontier, JSON requests scored
                                        by ``-priority`` (read if present)
``{<spider>}:count``            string  requests queued in the leased frontier
``{<spider>}:q:<site>:<prio>``  list    the leased frontier's queue of one site
                                        and priority (crawler/frontier/store.py)
``{<spider>}:dupefilter``       set     fingerprints of every request scheduled
``{<spider>}:requests:dead``    list    undecodable frontier entries (JSON)
``{<spider>}:dead``             list    dead letters (requests given up on)
``{<spider>}:leases``           zset    lease id (``<worker>:<n>``) -> deadline
``{<spider>}:retries``          zset    requests waiting to be retried (optional)
``{<spider>}:stats``            hash    cluster-wide stats, stat name -> integer,
                                        kept with ``HINCRBY``
``{<spider>}:workers``          hash    worker id -> JSON heartbeat record
==============================  ======  =========================================

Use :meth:`CrawlKeys.for_spider` to get the keys a crawl with given settings
uses (it honours ``SCHEDULER_DUPEFILTER_KEY`` and ``REDIS_START_URLS_KEY``),
or the module functions for the defaults. The frontier's own keys are fixed
by :mod:`crawler.frontier.store` (prefix ``{<spider>}:``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "CrawlKeys",
    "dead_key",
    "dupefilter_key",
    "leases_key",
    "requests_dead_key",
    "requests_key",
    "retries_key",
    "seeds_key",
    "stats_key",
    "workers_key",
]

#: Default patterns (``%(spider)s``/``%(name)s`` is the spider's name).
SEEDS = "%(name)s:start_urls"
REQUESTS = "{%(spider)s}:requests"
DUPEFILTER = "{%(spider)s}:dupefilter"


def seeds_key(spider: str) -> str:
    """``<spider>:start_urls``: the seed list."""
    return SEEDS % {"name": spider}


def requests_key(spider: str) -> str:
    """``{<spider>}:requests``: the frontier sorted set."""
    return REQUESTS % {"spider": spider}


def dupefilter_key(spider: str) -> str:
    """``{<spider>}:dupefilter``: the set of fingerprints seen."""
    return DUPEFILTER % {"spider": spider}


def requests_dead_key(spider: str) -> str:
    """``{<spider>}:requests:dead``: frontier entries that could not be decoded."""
    return f"{requests_key(spider)}:dead"


def dead_key(spider: str) -> str:
    """``{<spider>}:dead``: requests given up on (dead letters)."""
    return f"{{{spider}}}:dead"


def leases_key(spider: str) -> str:
    """``{<spider>}:leases``: requests leased by workers."""
    return f"{{{spider}}}:leases"


def retries_key(spider: str) -> str:
    """``{<spider>}:retries``: requests waiting for their retry time."""
    return f"{{{spider}}}:retries"


def stats_key(spider: str) -> str:
    """``{<spider>}:stats``: cluster-wide stats (hash of integers)."""
    return f"{{{spider}}}:stats"


def workers_key(spider: str) -> str:
    """``{<spider>}:workers``: worker id -> JSON heartbeat record."""
    return f"{{{spider}}}:workers"


@dataclass(frozen=True)
class CrawlKeys:
    """Every Redis key of one spider's crawl (see the module table)."""

    spider: str
    seeds: str
    requests: str
    count: str
    queues: str
    dupefilter: str
    requests_dead: str
    dead: str
    leases: str
    retries: str
    stats: str
    workers: str

    @classmethod
    def for_spider(cls, spider: str, settings: BaseSettings | None = None) -> CrawlKeys:
        """The keys of ``spider``, with the key settings of ``settings`` if given.

        :param spider: the spider's name, e.g. ``"quotes"``.
        :param settings: project settings; ``SCHEDULER_DUPEFILTER_KEY`` and
            ``REDIS_START_URLS_KEY`` override the default patterns when set.
        """
        seeds, dupefilter = SEEDS, DUPEFILTER
        if settings is not None:
            seeds = settings.get("REDIS_START_URLS_KEY") or seeds
            dupefilter = settings.get("SCHEDULER_DUPEFILTER_KEY") or dupefilter
        return cls(
            spider=spider,
            seeds=seeds % {"name": spider},
            requests=requests_key(spider),
            count=f"{{{spider}}}:count",
            queues=f"{{{spider}}}:q:",
            dupefilter=dupefilter % {"spider": spider},
            requests_dead=requests_dead_key(spider),
            dead=dead_key(spider),
            leases=leases_key(spider),
            retries=retries_key(spider),
            stats=stats_key(spider),
            workers=workers_key(spider),
        )

    def as_dict(self) -> dict[str, str]:
        """The key names by role, e.g. ``{"seeds": "quotes:start_urls", ...}``."""
        return {k: v for k, v in asdict(self).items() if k != "spider"}
