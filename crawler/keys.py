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
``{<spider>}:qc``                   hash    queued requests, in chunks per site and
                                            priority (``{<spider>}:qm`` and ``:lv``
                                            index them; see crawler.frontier.store)
``{<spider>}:count``                string  requests queued, all sites
``{<spider>}:wait``                 zset    sites with work and a free slot, scored
                                            by the time (ms) they may be served next
``{<spider>}:leases``               zset    lease id (``<worker>#<nonce>:<n>``) -> deadline
                                            (ms)
``{<spider>}:retries``              zset    requests waiting for their retry time
``{<spider>}:dead``                 list    dead letters, JSON objects (requests given
                                            up on, undecodable frontier entries)
``{<spider>}:dead:trimmed``         string  dead letters trimmed off ``dead`` past
                                            ``FRONTIER_DEAD_LETTERS_MAX``
``{<spider>}:prio``                 hash    priority -> requests queued at it
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
``{<spider>}:shards``               string  ``FRONTIER_SHARDS`` of the crawl, set by
                                            its first worker
``{<spider>}:created``              string  ms (worker's clock) when the crawl's frontier
                                            was created: set with ``shards``, in one
                                            transaction, by its first worker; its absence
                                            while the frontier has keys, or ``shards``'
                                            absence while it exists, says keys vanished
                                            (evicted or flushed:
                                            :mod:`crawler.frontier.eviction`)
==================================  ======  ==========================================

**Shards.** With ``FRONTIER_SHARDS`` = N > 1 the frontier is split into N
shards, each with its own hash tag, so that on a Redis Cluster they spread
over the masters: shard ``i`` keeps under the prefix ``{<spider>:<i>}:``
or ``{<spider>:<i>.<salt>}:`` (:func:`shard_prefix`) every key the
frontier's scripts touch (queues, ``count``, ``wait``,
``due``, ``leases``, ``retries``, ``dead``, the dupefilter set or Bloom
bitmap, robots.txt and the other per-site hashes, ...: the table of
:mod:`crawler.frontier.store`). A site belongs to shard
``BLAKE2b-64(site) % N`` (:func:`shard_of`), its requests, leases, retries,
dead letters, fingerprints and per-site settings with it. With one shard
(the default) the prefix is ``{<spider>}:`` as before. The crawl-wide keys
(seeds, intake, ``stats``, ``workers``, ``control``, ``shards``) stay
``{<spider>}:``. (A spider named ``<name>:<i>`` would share its keys with
shard ``i`` of the spider ``<name>``; spider names hold no ``:``.)

The frontier keeps more keys (per-site state, lease data, robots.txt); its
full table is in :mod:`crawler.frontier.store` (``crawler/frontier/store.py``),
which fixes their names (prefix ``{<spider>}:``). Use
:meth:`CrawlKeys.for_spider` to get the keys a crawl with given settings uses
(it honours ``SCHEDULER_DUPEFILTER_KEY`` and ``REDIS_START_URLS_KEY``), or the
module functions for the defaults.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from binascii import crc_hqx
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from crawler.config import setting_value

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = [
    "MAX_SHARDS",
    "CrawlKeys",
    "ShardKeys",
    "bloom_key",
    "control_key",
    "count_key",
    "created_key",
    "dead_key",
    "dupefilter_key",
    "frontier_prefix",
    "leases_key",
    "recorded_shards",
    "retries_key",
    "seeds_key",
    "shard_of",
    "shard_prefix",
    "shard_prefixes",
    "shards_key",
    "site_prefix",
    "slot_warning",
    "spider_name_of",
    "stats_key",
    "workers_key",
]

#: Hash slots of a Redis Cluster.
SLOTS = 16384

#: Default patterns (``%(spider)s``/``%(name)s`` is the spider's name).
SEEDS = "%(name)s:start_urls"
DUPEFILTER = "{%(spider)s}:dupefilter"


#: The name keys are derived from before the spider exists and its class
#: names none (its ``__init__`` will): replaced at open.
UNNAMED = "unnamed-spider"


def spider_name_of(crawler: Crawler) -> str:
    """The crawl's name: the spider instance's (``crawler.spider.name``)
    once it exists, else its class's, else :data:`UNNAMED`.

    Components that derive Redis keys from it choose them when the spider
    opens, when the instance (and so ``-a name=...`` or a name set in
    ``__init__``) is known.
    """
    spider = getattr(crawler, "spider", None)
    name = getattr(spider, "name", None) or getattr(crawler.spidercls, "name", None)
    return str(name) if name else UNNAMED


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


#: Most shards a crawl may have (``FRONTIER_SHARDS``): 64 slots a shard's
#: slice, enough for 64 masters at 4 shards each; finding the tags of the
#: shards (:func:`shard_prefix`) takes well under a second at this count.
MAX_SHARDS = 256


#: Shards of a crawl on a Redis Cluster when ``FRONTIER_SHARDS`` is not set
#: (None): about 4 per master up to four masters, and a spread of at most
#: 3 shards in 16 between two masters beyond.
CLUSTER_SHARDS = 16


def shard_count(settings: BaseSettings) -> int:
    """The crawl's shard count by its settings: ``FRONTIER_SHARDS``, or when
    it is None (the default; or the text ``None``, :func:`crawler.config.is_unset`),
    :data:`CLUSTER_SHARDS` with
    ``FRONTIER_REDIS_CLUSTER`` and 1 on one Redis server.

    :raises ValueError: ``FRONTIER_SHARDS`` is no whole number (the settings
        check, :mod:`crawler.config`, names it first).
    """
    shards: int | None = setting_value(settings, "FRONTIER_SHARDS")
    if shards is None:
        return CLUSTER_SHARDS if setting_value(settings, "FRONTIER_REDIS_CLUSTER") else 1
    return max(1, shards)


def recorded_shards(redis: Any, spider: str, configured: int = 1) -> int:
    """The shard count the crawl recorded in ``{<spider>}:shards`` (by its
    first worker), or ``configured`` when none is recorded (or the value is
    not a count up to :data:`MAX_SHARDS`): what commands that act on a
    crawl's keys use, so that they need no ``-s FRONTIER_SHARDS``.

    :raises redis.exceptions.RedisError: Redis failed.
    """
    raw = redis.get(shards_key(spider))
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw or "")
    if text.isdigit() and 1 <= int(text) <= MAX_SHARDS:
        return int(text)
    return max(1, configured)


def created_key(spider: str) -> str:
    """``{<spider>}:created``: the crawl's marker, written with
    ``{<spider>}:shards`` when its frontier is created."""
    return f"{{{spider}}}:created"


def shards_key(spider: str) -> str:
    """``{<spider>}:shards``: the crawl's ``FRONTIER_SHARDS``, set by its first worker."""
    return f"{{{spider}}}:shards"


def shard_of(site: str, shards: int) -> int:
    """The shard (``0 <= i < shards``) that holds ``site``:
    ``BLAKE2b-64(site) % shards``.

    The first 8 bytes of the BLAKE2b digest (:func:`hashlib.blake2b`,
    ``digest_size=8``) of the site's UTF-8 bytes, read big-endian: the same
    in every process and Python version (``hash()`` is salted per process).
    A CRC-32 would be cheaper, but it is linear: names that differ in one
    character (``shop0.example`` ... ``shop9.example``) share most of its low
    bits, and ten such sites fell into 2 of 8 shards.

    :param site: a site, ``host`` or ``host:port`` (:func:`crawler.frontier.sites.site_of`).
    :param shards: the crawl's shard count, at least 1.
    """
    if shards <= 1:
        return 0
    return _site_hash(site) % shards


@functools.lru_cache(maxsize=65_536)
def _site_hash(site: str) -> int:
    digest = hashlib.blake2b(site.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@functools.lru_cache(maxsize=1024)
def shard_prefix(spider: str, index: int, shards: int) -> str:
    """The key prefix of shard ``index`` of ``shards``: ``{<spider>}:`` with one
    shard, else ``{<spider>:<index>}:`` or ``{<spider>:<index>.<salt>}:``.

    The tag is aimed at a hash slot: ``<salt>`` is the smallest whole number
    (none for 0) that puts the tag's slot (CRC16 mod 16384, as Redis Cluster
    computes it) in the middle half of the ``index``-th of ``shards`` equal
    slices of the 16,384 slots. A cluster made by ``redis-cli --cluster create`` gives
    each master an equal run of slots, so with ``shards`` a multiple of the
    masters each master gets as many shards; plain ``{<spider>:<i>}`` tags
    fall where CRC16 puts them (12 shards of ``pages`` would put 6 on one of
    three masters). A pure function of its arguments: the same in every
    process.
    """
    if shards <= 1:
        return f"{{{spider}}}:"
    if shards > MAX_SHARDS:
        raise ValueError(f"{shards} shards: at most {MAX_SHARDS} (MAX_SHARDS)")
    # The middle half of the slice: a master's run may end a slot off a
    # slice's edge.
    low, high = SLOTS * (4 * index + 1) // (4 * shards), SLOTS * (4 * index + 3) // (4 * shards)
    if high <= low:
        low, high = SLOTS * index // shards, SLOTS * (index + 1) // shards
    for salt in itertools.count():
        tag = f"{spider}:{index}" if salt == 0 else f"{spider}:{index}.{salt}"
        if low <= crc_hqx(tag.encode(), 0) % SLOTS < high:  # Redis Cluster's CRC16
            return f"{{{tag}}}:"
    raise AssertionError("unreachable")  # pragma: no cover


def slot_warning(spider: str, shards: int) -> str | None:
    """Why the keys of ``spider``'s crawl would not spread over a Redis
    Cluster as :func:`shard_prefix` means them to (None: they would).

    Redis Cluster hashes a key by the text between its first ``{`` and the
    first ``}`` after it (Redis Cluster specification, "Hash tags"). A ``}``
    in the spider's name ends every tag there: with ``shards`` > 1 all of the
    crawl's shards share one slot, one master; a name that starts with
    ``}`` leaves the tag empty, so Redis hashes whole keys and each script's
    keys fall in different slots (``CROSSSLOT``).
    """
    if spider.startswith("}"):
        return (f"the spider's name {spider!r} starts with '}}': on a Redis Cluster "
                "its keys carry no hash tag and every frontier call fails with "
                "CROSSSLOT; rename the spider")
    if "}" in spider and shards > 1:
        return (f"the spider's name {spider!r} holds '}}': on a Redis Cluster all "
                f"{shards} shards of its crawl hash to one slot (the tag ends at "
                "the '}'), so they share one master; rename the spider")
    return None


def shard_prefixes(spider: str, shards: int) -> list[str]:
    """The key prefixes of every shard, in shard order (one: ``["{<spider>}:"]``)."""
    return [shard_prefix(spider, i, shards) for i in range(max(1, shards))]


def site_prefix(spider: str, site: str, shards: int) -> str:
    """The key prefix of the shard that holds ``site`` (its per-site hashes:
    ``delay``, ``conc``, ``revisit``, ``robots``, ``slow``, ... are
    ``<prefix><name>``)."""
    return shard_prefix(spider, shard_of(site, shards), shards)


@dataclass(frozen=True)
class ShardKeys:
    """The keys of one frontier shard (see the table of
    :mod:`crawler.frontier.store` for all of them; these are the ones
    readers of a crawl's state need).

    :ivar index: the shard's number, ``0 <= index < shards``.
    :ivar prefix: ``{<spider>}:`` (one shard) or ``{<spider>:<index>}:``.
    :ivar queues: the queues' chunks, ``<prefix>qc`` (a hash; see
        :mod:`crawler.frontier.store`).
    :ivar dupefilter: the exact dupefilter's set (``SCHEDULER_DUPEFILTER_KEY``
        for one shard; ``<prefix>dupefilter`` when sharded).
    :ivar bloom: the Bloom dupefilter's bitmap (``<prefix>bloom``).
    :ivar prio: hash priority -> requests queued at it in the shard
        (``<prefix>prio``).
    :ivar dead_trimmed: string, dead letters trimmed off the shard's ``dead``
        past ``FRONTIER_DEAD_LETTERS_MAX`` (``<prefix>dead:trimmed``, kept by
        :mod:`crawler.frontier.housekeeping` in the shard's own slot).
    """

    index: int
    prefix: str
    count: str
    wait: str
    due: str
    active: str
    queues: str
    leases: str
    ldata: str
    retries: str
    dead: str
    revisits: str
    rdata: str
    alive: str
    dupefilter: str
    bloom: str
    prio: str
    dead_trimmed: str

    @classmethod
    def of(cls, prefix: str, index: int = 0, dupefilter: str | None = None) -> ShardKeys:
        """The keys of the shard with key prefix ``prefix``."""
        names = {
            name: prefix + name
            for name in ("count", "wait", "due", "active", "leases", "ldata", "retries",
                         "dead", "revisits", "rdata", "alive", "bloom", "prio")
        }
        return cls(
            index=index, prefix=prefix, queues=prefix + "qc",
            dupefilter=dupefilter or prefix + "dupefilter",
            dead_trimmed=prefix + "dead:trimmed", **names,
        )

    def key(self, name: str) -> str:
        """Any key of the shard by its name in the frontier's table, e.g.
        ``key("robots")``."""
        return self.prefix + name

    def as_dict(self) -> dict[str, str]:
        """The key names by role, e.g. ``{"prefix": "{quotes:1}:", "count":
        "{quotes:1}:count", ...}`` (without :attr:`index`: a shard's place
        in :attr:`CrawlKeys.shards`)."""
        return {k: v for k, v in asdict(self).items() if k != "index"}


@dataclass(frozen=True)
class CrawlKeys:
    """The Redis keys of one spider's crawl (see the module table).

    ``queues`` is the hash of the queues' chunks, ``{<spider>}:qc``;
    ``bloom`` the Bloom dupefilter's bitmap, which exists only when that
    dupefilter is used (``dupefilter`` is then absent). The frontier keys
    among these (``count``, ``wait``, ``queues``, ``dupefilter``, ``bloom``,
    ``dead``, ``leases``, ``retries``) are shard 0's; with
    ``FRONTIER_SHARDS`` > 1, :attr:`shards` has every shard's, and totals
    (requests queued, leased, dead letters) are sums over them.

    :ivar shards: the keys of each shard, in shard order (one entry, the
        keys above, unless sharded).
    :ivar shard_count: ``FRONTIER_SHARDS`` (``len(shards)``).
    :ivar shards_key: ``{<spider>}:shards``, the crawl's recorded shard count.
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
    shards: tuple[ShardKeys, ...] = field(default=(), compare=False)
    shards_key: str = ""

    @property
    def shard_count(self) -> int:
        """How many shards the frontier has (``FRONTIER_SHARDS``)."""
        return len(self.shards) or 1

    def shard_for(self, site: str) -> ShardKeys:
        """The keys of the shard that holds ``site``."""
        return self.shards[shard_of(site, self.shard_count)]

    @classmethod
    def for_spider(
        cls, spider: str, settings: BaseSettings | None = None, *, shards: int | None = None
    ) -> CrawlKeys:
        """The keys of ``spider``, with the key settings of ``settings`` if given.

        :param spider: the spider's name, e.g. ``"quotes"``.
        :param settings: project settings; ``SCHEDULER_DUPEFILTER_KEY`` and
            ``REDIS_START_URLS_KEY`` override the default patterns when set,
            ``FRONTIER_SHARDS`` gives the shards (:func:`shard_count`).
        :param shards: the shard count, instead of ``FRONTIER_SHARDS`` (e.g.
            the one a crawl recorded in ``{<spider>}:shards``).
        """
        seeds, dupefilter, count = SEEDS, DUPEFILTER, 1
        if settings is not None:
            seeds = settings.get("REDIS_START_URLS_KEY") or seeds
            dupefilter = settings.get("SCHEDULER_DUPEFILTER_KEY") or dupefilter
            count = shard_count(settings)
        if shards is not None:
            count = max(1, shards)
        dupefilter = dupefilter % {"spider": spider}
        each = tuple(
            ShardKeys.of(prefix, i, dupefilter if count == 1 else None)
            for i, prefix in enumerate(shard_prefixes(spider, count))
        )
        first = each[0]
        return cls(
            spider=spider,
            seeds=seeds % {"name": spider},
            count=first.count,
            wait=first.wait,
            queues=first.queues,
            dupefilter=first.dupefilter,
            bloom=first.bloom,
            dead=first.dead,
            leases=first.leases,
            retries=first.retries,
            stats=stats_key(spider),
            workers=workers_key(spider),
            control=control_key(spider),
            shards=each,
            shards_key=shards_key(spider),
        )

    def as_dict(self) -> dict[str, str]:
        """The key names by role, e.g. ``{"seeds": "quotes:start_urls", ...}``
        (shard 0's frontier keys; without :attr:`shards`)."""
        return {
            k: v for k, v in asdict(self).items() if k not in ("spider", "shards", "shards_key")
        }


def frontier_prefix(spider_name: str) -> str:
    """The key prefix of a spider's frontier: ``{<name>}:``."""
    return f"{{{spider_name}}}:"
