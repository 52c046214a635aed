"""A Bloom-filter dupefilter: about 1.8 bytes of Redis per URL at 0.1% error.

Switch it on with one setting::

    DUPEFILTER_CLASS = "crawler.frontier.bloom.BloomDupeFilter"

It replaces the exact set ``{<spider>}:dupefilter`` (20 bytes of fingerprint
plus about 70 bytes of Redis overhead per URL) with one Redis bitmap,
``{<spider>}:bloom``, sized once from ``FRONTIER_BLOOM_CAPACITY`` (URLs
expected, default 10,000,000) and ``FRONTIER_BLOOM_ERROR_RATE`` (wanted
false-positive rate, default 0.001)::

    m = ceil(-n ln p / (ln 2)^2) bits        k = round(m / n * ln 2) hashes

At p = 0.001 that is 14.4 bits (1.8 bytes) per URL and k = 10. The price: a
URL never seen is taken for a duplicate, and not crawled, with probability
about p while the filter holds at most n URLs (more beyond). A filter
cannot forget one URL; deleting the key forgets them all.

The k bit offsets of a request come from Scrapy's fingerprint
(``crawler.request_fingerprinter``, 20 bytes of SHA1) by double hashing
(Kirsch and Mitzenmacher): ``h1 + i * h2 mod m`` for ``i < k``, with ``h1``
and ``h2`` the fingerprint's first two 64-bit words. Python computes them;
the frontier's ``push.lua`` sets them and queues the request in one atomic
script call, one round trip per request, as with the exact set.

Redis strings hold at most 2^32 bits (512 MB). A filter that needs more is
split into ``s`` shards ``{<spider>}:bloom:0`` ... ``:<s-1>`` (same hash tag,
so one Redis Cluster slot), each a filter of ``m / s`` bits; the
fingerprint's last 32 bits pick a request's shard. The bitmap is created
zeroed at its full size by the first request (``SETRANGE``), so Redis
allocates it once, exactly; workers configured with another size get an
error naming the settings. The RedisBloom module (``BF.ADD``) is not used.

With ``FRONTIER_SHARDS`` = N > 1 each frontier shard has a filter of its
own, ``<shard prefix>bloom`` (``{<spider>:<i>}:bloom``, see
:mod:`crawler.keys`), sized for ``FRONTIER_BLOOM_CAPACITY / N`` URLs
(:func:`shard_bloom`), and a request's bits are in
its site's shard's filter. :class:`BloomDupeFilter` then needs the site of
each fingerprint (``sites=`` of :meth:`~BloomDupeFilter.add`,
:meth:`~BloomDupeFilter.contains`, :meth:`~BloomDupeFilter.load`);
:meth:`~BloomDupeFilter.request_seen` takes it from the request.
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
import uuid
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from crawler.config import FrontierConfig
from crawler.frontier.connection import get_redis
from crawler.frontier.dupefilter import FrontierDupeFilter
from crawler.frontier.sites import slot_of
from crawler.keys import frontier_prefix, shard_count, shard_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Self

    from redis import Redis
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.utils.request import RequestFingerprinterProtocol

logger = logging.getLogger(__name__)

__all__ = ["MAX_BITS_PER_KEY", "BloomDupeFilter", "BloomFilter", "shard_bloom"]

#: Most bits one Redis string holds (``SETBIT`` offsets are below 2^32).
MAX_BITS_PER_KEY = 2**32
#: Requests per script call in :meth:`BloomDupeFilter.add` / ``contains``:
#: about 5 ms of Redis time at k = 10, so other clients are not held up.
BATCH = 10_000


@dataclass(frozen=True)
class BloomFilter:
    """The shape of a Bloom filter and where a fingerprint's bits are.

    Pure arithmetic, no I/O: build it with :meth:`for_capacity`.

    :ivar key: the bitmap's key, e.g. ``{quotes}:bloom``; with several shards
        the keys are ``<key>:0``, ``<key>:1``, ...
    :ivar capacity: URLs expected (n).
    :ivar error_rate: false-positive rate wanted at ``capacity`` (p).
    :ivar bits: bits per shard (m / shards), at most :data:`MAX_BITS_PER_KEY`.
    :ivar hashes: bits set per URL (k).
    :ivar shards: number of bitmaps.
    """

    key: str
    capacity: int
    error_rate: float
    bits: int
    hashes: int
    shards: int = 1
    @classmethod
    def for_capacity(
        cls,
        key: str,
        capacity: int,
        error_rate: float,
        *,
        max_bits: int = MAX_BITS_PER_KEY,
    ) -> Self:
        """Size a filter for ``capacity`` URLs at ``error_rate``.

        :param key: the bitmap's key (the shards' prefix when sharded).
        :param capacity: URLs expected, at least 1.
        :param error_rate: wanted false-positive rate, in (0, 1).
        :param max_bits: most bits per key; above it the filter is sharded.
        :raises ValueError: ``capacity`` or ``error_rate`` out of range (the
            message names ``FRONTIER_BLOOM_CAPACITY`` / ``..._ERROR_RATE``).
        """
        if capacity < 1:
            raise ValueError(f"FRONTIER_BLOOM_CAPACITY must be at least 1, not {capacity}")
        if not 0 < error_rate < 1:
            raise ValueError(
                f"FRONTIER_BLOOM_ERROR_RATE must be between 0 and 1 (exclusive), "
                f"not {error_rate}"
            )
        total = math.ceil(-capacity * math.log(error_rate) / math.log(2) ** 2)
        hashes = max(1, round(total / capacity * math.log(2)))
        shards = math.ceil(total / max_bits)
        return cls(key, capacity, error_rate, math.ceil(total / shards), hashes, shards)

    @property
    def size(self) -> int:
        """Bytes of one shard's bitmap."""
        return (self.bits + 7) // 8

    @property
    def keys(self) -> list[str]:
        """Every bitmap key: ``[key]``, or ``[key:0, key:1, ...]`` when sharded."""
        if self.shards == 1:
            return [self.key]
        return [f"{self.key}:{i}" for i in range(self.shards)]

    def shard(self, fingerprint: bytes) -> int:
        """Index of the shard that holds ``fingerprint``'s bits."""
        return int.from_bytes(_digest(fingerprint)[16:20], "little") % self.shards

    def offsets(self, fingerprint: bytes) -> list[int]:
        """The ``hashes`` bit offsets (``0 <= offset < bits``) of a fingerprint.

        ``(h1 + i * h2) mod m`` for ``i < hashes``, with ``h1``, ``h2`` the
        fingerprint's first two little-endian 64-bit words (``h2`` made odd,
        and not a multiple of ``m``).

        :param fingerprint: Scrapy's request fingerprint; one shorter than
            20 bytes (a custom fingerprinter) is hashed with SHA1 first.
        """
        h1, h2 = _WORDS.unpack_from(_digest(fingerprint))
        m = self.bits
        a, b = h1 % m, (h2 | 1) % m or 1
        return [x % m for x in range(a, a + self.hashes * b, b)]

    def locate(self, fingerprint: bytes) -> tuple[str, bytes]:
        """The key and the offsets of a fingerprint, as ``push.lua`` and
        ``bloom.lua`` take them: decimal, separated by spaces."""
        key = self.keys[self.shard(fingerprint)] if self.shards > 1 else self.key
        return key, " ".join(map(str, self.offsets(fingerprint))).encode()

    def theoretical_error_rate(self, count: int | None = None) -> float:
        """Expected false-positive rate with ``count`` URLs (default: capacity)."""
        n = (self.capacity if count is None else count) / self.shards
        return float((1 - math.exp(-self.hashes * n / self.bits)) ** self.hashes)


_WORDS = struct.Struct("<QQ")


def _digest(fingerprint: bytes) -> bytes:
    if len(fingerprint) >= 20:
        return fingerprint
    return hashlib.sha1(fingerprint, usedforsecurity=False).digest()


class BloomDupeFilter(FrontierDupeFilter):
    """Scrapy's dupefilter interface over a Redis Bloom filter.

    With this class as ``DUPEFILTER_CLASS`` the scheduler's frontier records
    and checks fingerprints in the bitmap (``push.lua``'s Bloom mode);
    :meth:`request_seen` does the same for use without the frontier.

    With ``shards`` > 1 the filter is split as the frontier splits it (see
    the module): :attr:`blooms` holds each shard's filter, and the methods
    that take fingerprints need their sites (``sites=``, one per
    fingerprint, e.g. :func:`crawler.frontier.sites.slot_of` of the request).

    :param server: a redis-py client (standalone or cluster).
    :param bloom: the filter's shape and key, for all shards together
        (``FRONTIER_BLOOM_*``; the frontier divides it, as :attr:`blooms` does).
    :param fingerprinter: Scrapy's request fingerprinter.
    :param debug: log every filtered request (``DUPEFILTER_DEBUG``).
    :param spider: the spider's name (needed with ``shards`` > 1).
    :param shards: the crawl's ``FRONTIER_SHARDS`` (default 1).
    """

    def __init__(
        self,
        server: Redis,
        bloom: BloomFilter,
        debug: bool = False,
        *,
        fingerprinter: RequestFingerprinterProtocol,
        spider: str | None = None,
        shards: int = 1,
    ) -> None:
        super().__init__(
            server, bloom.key, debug, fingerprinter=fingerprinter, spider=spider, shards=shards
        )
        self.bloom = bloom
        #: Each frontier shard's filter, in shard order (``[bloom]`` unsharded).
        self.blooms = [
            shard_bloom(bloom, self.shard_prefix(i), self.shards) if self.shards > 1 else bloom
            for i in range(self.shards)
        ]
        source = resources.files("crawler.frontier").joinpath("lua", "bloom.lua").read_text()
        self._script = server.register_script(source)

    @classmethod
    def _for_name(cls, crawler: Crawler, name: str) -> Self:
        """Build the filter of the spider ``name`` from ``FRONTIER_BLOOM_*``,
        without Redis I/O (:meth:`FrontierDupeFilter.from_crawler` and
        :meth:`~FrontierDupeFilter.open` call it).

        :raises ValueError: a ``FRONTIER_BLOOM_*`` setting is out of range.
        """
        settings = crawler.settings
        config = FrontierConfig.of(crawler)
        bloom = BloomFilter.for_capacity(
            frontier_prefix(name) + "bloom",
            config.bloom_capacity,
            config.bloom_error_rate,
        )
        logger.debug(
            "Bloom filter %s: %d shard(s) of %d bits, %d hashes, %.2f bytes per URL",
            bloom.key, bloom.shards, bloom.bits, bloom.hashes,
            bloom.size * bloom.shards / bloom.capacity,
        )
        assert crawler.request_fingerprinter is not None
        return cls(
            get_redis(settings),
            bloom,
            debug=settings.getbool("DUPEFILTER_DEBUG"),
            fingerprinter=crawler.request_fingerprinter,
            spider=name,
            shards=shard_count(settings),
        )

    def bloom_for(self, site: str | None) -> BloomFilter:
        """The filter of ``site``'s shard (the only one when unsharded).

        :raises ValueError: sharded, and ``site`` is None.
        """
        if self.shards == 1:
            return self.bloom
        if site is None:
            raise ValueError(
                f"with FRONTIER_SHARDS = {self.shards} a fingerprint's bits are in its "
                "request's site's shard: pass sites= (one site per fingerprint)"
            )
        return self.blooms[shard_of(site, self.shards)]

    def request_seen(self, request: Request) -> bool:
        """Record ``request``; return whether it was (probably) seen before.

        One script call (``bloom.lua``), one round trip, on the filter of
        the request's site's shard (the bits ``commit.lua`` sets in a crawl).
        """
        fingerprint = self.request_fingerprint(request)
        if self.shards == 1:
            return self.add([fingerprint])[0]
        return self.add([fingerprint], sites=[slot_of(request)])[0]

    def add(
        self, fingerprints: Sequence[bytes], sites: Sequence[str] | None = None
    ) -> list[bool]:
        """Set the bits of many fingerprints; one pipelined round trip.

        :param sites: the site of each fingerprint's request (needed when
            sharded; ignored otherwise).
        :returns: for each fingerprint, whether all its bits were already set
            (seen before, or a false positive).
        :raises ValueError: sharded without ``sites``, or not one per fingerprint.
        """
        return self._run("add", fingerprints, sites)

    def load(self, fingerprints: Iterable[bytes], sites: Iterable[str] | None = None) -> None:
        """Bulk-add fingerprints: to preload known URLs, or to move an exact
        ``{s}:dupefilter`` set into the filter (``SMEMBERS`` in batches).

        The bits are set in a local bitmap of the filter's size (1.8 MB per
        million URLs at 0.1%), sent once to a temporary key with the same
        hash tag and ORed into the filter (``BITOP``) in one transaction,
        about ten times faster than :meth:`add`, which reports on each URL.

        :param sites: the site of each fingerprint's request, in the same
            order (needed when sharded: the bits go to its shard's filter).
        :raises ValueError: sharded without ``sites``.
        """
        bitmaps: dict[str, tuple[BloomFilter, bytearray]] = {}
        pairs: Iterable[tuple[bytes, str | None]] = (
            ((fp, None) for fp in fingerprints) if sites is None
            else zip(fingerprints, sites, strict=True)
        )
        for fingerprint, site in pairs:
            bloom = self.bloom_for(site)
            key = bloom.keys[bloom.shard(fingerprint)] if bloom.shards > 1 else bloom.key
            found = bitmaps.get(key)
            if found is None:
                found = bitmaps[key] = (bloom, bytearray(bloom.size))
            bitmap = found[1]
            for offset in bloom.offsets(fingerprint):
                bitmap[offset >> 3] |= 0x80 >> (offset & 7)
        for key, (bloom, bitmap) in bitmaps.items():
            temporary = f"{key}:load:{uuid.uuid4().hex}"
            with self.server.pipeline(transaction=True) as pipe:
                pipe.set(temporary, bytes(bitmap))
                self._script(
                    keys=[key, temporary], args=["or", bloom.size, bloom.hashes, ""],
                    client=pipe,
                )
                pipe.execute()

    def contains(
        self, fingerprints: Sequence[bytes], sites: Sequence[str] | None = None
    ) -> list[bool]:
        """Whether each fingerprint is (probably) in the filter; sets nothing.

        :param sites: as :meth:`add`'s.
        """
        return self._run("check", fingerprints, sites)

    def _run(
        self, mode: str, fingerprints: Sequence[bytes], sites: Sequence[str] | None
    ) -> list[bool]:
        if sites is not None and len(sites) != len(fingerprints):
            raise ValueError(f"{len(fingerprints)} fingerprints but {len(sites)} sites")
        by_key: dict[str, tuple[BloomFilter, list[int], list[bytes]]] = {}
        for i, fingerprint in enumerate(fingerprints):
            bloom = self.bloom_for(None if sites is None else sites[i])
            key, packed = bloom.locate(fingerprint)
            _, index, offsets = by_key.setdefault(key, (bloom, [], []))
            index.append(i)
            offsets.append(packed)
        calls: list[list[int]] = []
        with self.server.pipeline(transaction=False) as pipe:
            for key, (bloom, index, offsets) in by_key.items():
                for start in range(0, len(index), BATCH):
                    self._script(
                        keys=[key],
                        args=[mode, bloom.size, bloom.hashes,
                              b" ".join(offsets[start : start + BATCH])],
                        client=pipe,
                    )
                    calls.append(index[start : start + BATCH])
            replies = pipe.execute()
        seen = [False] * len(fingerprints)
        for index, reply in zip(calls, replies, strict=True):
            for i, flag in zip(index, bytes(reply), strict=True):
                seen[i] = flag == ord("1")
        return seen

    @property
    def keys(self) -> list[str]:
        """Every bitmap key of every shard, in shard order."""
        return [key for bloom in self.blooms for key in bloom.keys]

    def clear(self) -> None:
        """Delete the bitmap(s) of every shard: every URL is forgotten."""
        for key in self.keys:
            self.server.delete(key)  # one key per call: shards are in other slots


def shard_bloom(bloom: BloomFilter, prefix: str, shards: int) -> BloomFilter:
    """The Bloom filter of one shard: ``<prefix>bloom``, sized for
    ``capacity / shards`` URLs (rounded up) at the same error rate, so the
    shards together hold ``FRONTIER_BLOOM_CAPACITY`` URLs in about the bytes
    one filter would (the sites, and so the URLs, spread evenly over the
    shards). With one shard, ``bloom`` itself."""
    if shards <= 1:
        return bloom
    return type(bloom).for_capacity(
        prefix + "bloom", math.ceil(bloom.capacity / shards), bloom.error_rate
    )
