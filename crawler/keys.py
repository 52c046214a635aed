"""Names of the Redis keys of one crawl, in one place.

``<spider>`` is the spider's name. The keys that scripts touch together
carry the hash tag ``{<spider>}`` so they live in one Redis Cluster slot; the
seed list keeps scrapy-redis's name, which users type into ``redis-cli``.

==================================  ======  ==========================================
key                                 type    what it holds
==================================  ======  ==========================================
``<spider>:start_urls``             list    seeds (bare URL or JSON), ``LPUSH``-ed
``{<spider>:start_urls}:intake``    zset    intake batch key -> ms registered or
                                            last refreshed (the seed list's slot)
``{<spider>:start_urls}:intake:*``  list    one batch of seeds taken, until their
                                            requests are in the frontier
``{<spider>}:q:<site>:<priority>``  list    queued requests of one site and priority
                                            (JSON), oldest at the right
``{<spider>}:count``                string  requests queued, all sites
``{<spider>}:wait``                 zset    sites with work and a free slot, scored
                                            by the time (ms) they may be served next
``{<spider>}:leases``               zset    lease id (``<worker>#<nonce>:<n>``) -> deadline
                                            (ms)
``{<spider>}:retries``              zset    requests waiting for their retry time
``{<spider>}:dead``                 list    dead letters, JSON objects (requests given
                                            up on, undecodable frontier entries)
``{<spider>}:dupefilter``           set     fingerprints of every request scheduled
``{<spider>}:bloom``                string  with the Bloom dupefilter
                                            (:mod:`crawler.frontier.bloom`) instead of
                                            ``{<spider>}:dupefilter``: its bitmap
                                            (``{<spider>}:bloom:<n>`` when sharded)
``{<spider>}:stats``                hash    cluster-wide stats, stat name -> integer,
                                            kept with ``HINCRBY``
``{<spider>}:workers``              hash    worker id -> JSON heartbeat record
``{<spider>}:control``              string  the crawl's state: ``paused`` or ``stopped``;
                                            absent: running (``scrapy frontier
                                            pause|resume|stop``, :mod:`crawler.control`)
==================================  ======  ==========================================

The frontier keeps more keys (per-site state, lease data, robots.txt); its
full table is in :mod:`crawler.frontier.store` (``crawler/frontier/store.py``),
which fixes their names (prefix ``{<spider>}:``). Use
:meth:`CrawlKeys.for_spider` to get the keys a crawl with given settings uses
(it honours ``SCHEDULER_DUPEFILTER_KEY`` and ``REDIS_START_URLS_KEY``), or the
module functions for the defaults.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "CrawlKeys",
    "bloom_key",
    "control_key",
    "count_key",
    "dead_key",
    "dupefilter_key",
    "leases_key",
    "retries_key",
    "seeds_key",
    "stats_key",
    "workers_key",
]

#: Default patterns (``%(spider)s``/``%(name)s`` is the spider's name).
SEEDS = "%(name)s:start_urls"
DUPEFILTER = "{%(spider)s}:dupefilter"


def seeds_key(spider: str) -> str:
    """``<spider>:start_urls``: the seed list."""
    return SEEDS % {"name": spider}


def dupefilter_key(spider: str) -> str:
    """``{<spider>}:dupefilter``: the set of fingerprints seen."""
    return DUPEFILTER % {"spider": spider}


def bloom_key(spider: str) -> str:
    """``{<spider>}:bloom``: the Bloom dupefilter's bitmap (``:<n>`` shards)."""
    return f"{{{spider}}}:bloom"


def count_key(spider: str) -> str:
    """``{<spider>}:count``: requests queued in the frontier, all sites."""
    return f"{{{spider}}}:count"


def dead_key(spider: str) -> str:
    """``{<spider>}:dead``: dead letters (requests given up on, undecodable entries)."""
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


def control_key(spider: str) -> str:
    """``{<spider>}:control``: the crawl's state, ``paused`` or ``stopped``
    (absent: running); see :mod:`crawler.control`."""
    return f"{{{spider}}}:control"


@dataclass(frozen=True)
class CrawlKeys:
    """The Redis keys of one spider's crawl (see the module table).

    ``queues`` is the prefix of the per-site queues, ``{<spider>}:q:``;
    ``bloom`` the Bloom dupefilter's bitmap, which exists only when that
    dupefilter is used (``dupefilter`` is then absent).
    """

    spider: str
    seeds: str
    count: str
    wait: str
    queues: str
    dupefilter: str
    bloom: str
    dead: str
    leases: str
    retries: str
    stats: str
    workers: str
    control: str

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
            count=count_key(spider),
            wait=f"{{{spider}}}:wait",
            queues=f"{{{spider}}}:q:",
            dupefilter=dupefilter % {"spider": spider},
            bloom=bloom_key(spider),
            dead=dead_key(spider),
            leases=leases_key(spider),
            retries=retries_key(spider),
            stats=stats_key(spider),
            workers=workers_key(spider),
            control=control_key(spider),
        )

    def as_dict(self) -> dict[str, str]:
        """The key names by role, e.g. ``{"seeds": "quotes:start_urls", ...}``."""
        return {k: v for k, v in asdict(self).items() if k != "spider"}
