"""The Bloom-filter dupefilter against a real Redis: sizing, error rate, memory, a crawl."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from crawler.frontier.bloom import MAX_BITS_PER_KEY, BloomDupeFilter, BloomFilter
from crawler.frontier.store import Committed, Frontier, Push
from tests.workers import assert_quotes_crawled, crawl

if TYPE_CHECKING:
    from pathlib import Path

    from devtools.replay import ReplayServer

BLOOM = "crawler.frontier.bloom.BloomDupeFilter"


class _Spider(Spider):
    name = "b"


def bloom_filter(redis_url: str, **settings: Any) -> BloomDupeFilter:
    crawler = get_crawler(_Spider, {"REDIS_URL": redis_url, **settings})
    df: BloomDupeFilter = build_from_crawler(BloomDupeFilter, crawler)
    return df


def fingerprints(prefix: str, n: int) -> list[bytes]:
    """``n`` distinct 20-byte SHA1 fingerprints of synthetic ~70-character URLs.

    SHA1 of the URL is what Scrapy's fingerprinter yields in distribution
    (a SHA1 of the canonical request); hashing directly keeps 2M of them to
    about a second.
    """
    base = f"https://www.example-shop.com/catalogue/{prefix}/item-".encode()
    return [hashlib.sha1(b"%s%d.html" % (base, i)).digest() for i in range(n)]


@pytest.mark.parametrize(
    ("capacity", "rate", "bits", "hashes"),
    [
        (1_000_000, 0.001, 14_377_588, 10),
        (10_000_000, 0.001, 143_775_876, 10),
        (1_000_000, 0.01, 9_585_059, 7),
        (1, 0.5, 2, 1),
    ],
)
def test_the_filter_is_sized_from_capacity_and_error_rate(
    capacity: int, rate: float, bits: int, hashes: int
) -> None:
    bloom = BloomFilter.for_capacity("{s}:bloom", capacity, rate)
    assert (bloom.bits, bloom.hashes, bloom.shards) == (bits, hashes, 1)
    assert bloom.keys == ["{s}:bloom"]
    assert bloom.theoretical_error_rate() <= rate * 1.05


def test_a_filter_above_2_to_the_32_bits_is_sharded_under_one_hash_tag() -> None:
    bloom = BloomFilter.for_capacity("{s}:bloom", 400_000_000, 0.001)
    assert bloom.shards == 2
    assert bloom.bits <= MAX_BITS_PER_KEY
    assert bloom.keys == ["{s}:bloom:0", "{s}:bloom:1"]
    located = Counter(bloom.locate(fp)[0] for fp in fingerprints("s", 2000))
    assert set(located) == set(bloom.keys)
    assert min(located.values()) > 900


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"FRONTIER_BLOOM_CAPACITY": 0}, "FRONTIER_BLOOM_CAPACITY"),
        ({"FRONTIER_BLOOM_ERROR_RATE": 1.5}, "FRONTIER_BLOOM_ERROR_RATE"),
        ({"FRONTIER_BLOOM_ERROR_RATE": 0}, "FRONTIER_BLOOM_ERROR_RATE"),
    ],
)
def test_bad_bloom_settings_are_refused_at_configuration(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bloom_filter("redis://127.0.0.1:1/0", **settings)


def test_building_the_filter_does_no_io() -> None:
    # Nothing listens on port 1.
    df = bloom_filter("redis://127.0.0.1:1/0")
    assert df.key == "{b}:bloom"


def test_request_seen_uses_scrapys_fingerprint_and_one_bitmap(
    redis_url: str, rds: redis.Redis
) -> None:
    df = bloom_filter(redis_url, FRONTIER_BLOOM_CAPACITY=1000)
    first = Request("https://a.example/x?b=2&a=1")
    assert not df.request_seen(first)
    # Same fingerprint for Scrapy (query order is canonicalized).
    assert df.request_seen(Request("https://a.example/x?a=1&b=2"))
    assert not df.request_seen(Request("https://a.example/y"))
    assert rds.keys("*") == [b"{b}:bloom"]
    assert rds.strlen("{b}:bloom") == df.bloom.size
    fingerprint = df.fingerprinter.fingerprint(first)
    _, packed = df.bloom.locate(fingerprint)
    offsets = df.bloom.offsets(fingerprint)
    assert packed.split() == [str(o).encode() for o in offsets]
    assert len(offsets) == df.bloom.hashes
    assert all(rds.getbit("{b}:bloom", o) for o in offsets)
    df.clear()
    assert not df.request_seen(first)


def test_a_worker_with_another_size_gets_an_error_naming_the_settings(redis_url: str) -> None:
    bloom_filter(redis_url, FRONTIER_BLOOM_CAPACITY=1000).request_seen(Request("https://a/"))
    other = bloom_filter(redis_url, FRONTIER_BLOOM_CAPACITY=5000)
    with pytest.raises(redis.ResponseError, match="FRONTIER_BLOOM_CAPACITY"):
        other.request_seen(Request("https://a/"))
    frontier = Frontier(other.server, "b", bloom=other.bloom)
    with pytest.raises(redis.ResponseError, match="FRONTIER_BLOOM_CAPACITY"):
        frontier.push_many(
            [Push(b"{}", "a", 0, None, False), Push(b"{}", "a", 0, b"f" * 20, False)]
        )
    assert not other.server.exists("{b}:count")  # nothing of the call was written


def test_the_frontier_checks_and_sets_the_bits_atomically_with_the_push(
    redis_url: str, rds: redis.Redis
) -> None:
    df = bloom_filter(redis_url, FRONTIER_BLOOM_CAPACITY=1000)
    frontier = Frontier(rds, "b", bloom=df.bloom)
    fp = hashlib.sha1(b"https://a.example/1").digest()
    pushes = [Push(b"{}", "a.example", 0, fp, dont_filter) for dont_filter in (False, False, True)]
    assert frontier.push_many(pushes) == [True, False, True]
    with rds.pipeline(transaction=True) as pipe:
        frontier.push_many(pushes[:2], client=pipe)
        [reply] = pipe.execute()
        assert Committed.of(reply).pushed == [False, False]
    assert int(rds.get("{b}:count") or 0) == 2
    assert not rds.exists("{b}:dupefilter")
    assert df.contains([fp]) == [True]
    # request_seen and the frontier share the bits.
    assert df.add([fp]) == [True]


def test_bulk_load_sets_the_same_bits_as_one_by_one_adds(redis_url: str, rds: redis.Redis) -> None:
    sample = fingerprints("sample", 20_000)
    one_by_one = bloom_filter(redis_url, FRONTIER_BLOOM_CAPACITY=20_000)
    assert one_by_one.add(sample).count(True) <= 40  # false positives only
    loaded = BloomDupeFilter(
        one_by_one.server,
        BloomFilter.for_capacity("{b}:loaded", 20_000, 0.001),
        fingerprinter=one_by_one.fingerprinter,
    )
    loaded.load(sample[:10_000])
    loaded.load(sample[10_000:])  # ORed into the existing bits
    assert rds.get("{b}:loaded") == rds.get("{b}:bloom")
    assert rds.keys("{b}:*load*") == [b"{b}:loaded"]  # the temporary keys are gone
    assert all(one_by_one.contains(sample))


def test_false_positive_rate_and_memory_on_a_million_urls(
    redis_url: str, rds: redis.Redis
) -> None:
    n, rate = 1_000_000, 0.001
    df = bloom_filter(redis_url, FRONTIER_BLOOM_CAPACITY=n, FRONTIER_BLOOM_ERROR_RATE=rate)
    started = time.monotonic()
    inserted = fingerprints("in", n)
    df.load(inserted)
    # Every inserted URL is found again (no false negatives) ...
    step = 100_000
    assert all(df.contains(inserted[:step]))
    # ... and 1M other URLs are taken for seen at most 1.5 times the rate.
    others = fingerprints("out", n)
    false_positives = sum(
        df.contains(others[i : i + step]).count(True) for i in range(0, n, step)
    )
    measured = false_positives / n
    memory = rds.memory_usage("{b}:bloom")
    assert memory is not None
    elapsed = time.monotonic() - started
    print(  # the figures of the closing note; shown with pytest -s
        f"\nBloom n={n} p={rate}: false positives {false_positives}/{n} = {measured:.5f}; "
        f"{memory} bytes = {memory / n:.3f} bytes/URL; {elapsed:.1f} s"
    )
    assert measured <= 1.5 * rate
    assert memory / n <= 2.0
    assert rds.keys("*") == [b"{b}:bloom"]


# -- a whole crawl ---------------------------------------------------------------


@pytest.mark.workers
def test_two_workers_crawl_quotes_with_the_bloom_filter_and_fetch_nothing_twice(
    env: dict[str, str], db: Any, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    replay_server.clear_hits()
    rds.lpush("quotes:start_urls", replay_server.url_for("/"))

    workers = crawl(
        "quotes", env, tmp_path, workers=2,
        settings={"DUPEFILTER_CLASS": BLOOM, "FRONTIER_BLOOM_CAPACITY": 100_000},
    )

    assert len(workers) == 2
    assert_quotes_crawled(workers, db, replay_server)
    assert sum(w.stats.get("dupefilter/filtered", 0) for w in workers) > 0
    # The bitmap replaced the set.
    assert rds.exists("{quotes}:bloom")
    assert not rds.exists("{quotes}:dupefilter")
    assert all("DeprecationWarning" not in w.log for w in workers)
