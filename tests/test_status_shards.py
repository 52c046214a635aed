"""``scrapy frontier status`` and the metrics exporter over a sharded frontier.

The frontier is written through :class:`crawler.frontier.shards.FrontierShards`
(each site in its shard, as workers write it) on a real redis-server, with
one and three shards, and on the real three-master cluster of
``tests/cluster.py``; every figure of the status must be the sum over the
shards of what Redis holds, and the shard count the crawl recorded in
``{<spider>}:shards``.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

import pytest
from redis.cluster import RedisCluster
from rich.console import Console
from scrapy.settings import Settings

from crawler.commands.frontier import render
from crawler.frontier.bloom import BloomFilter
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Commit, Lease, Revisit, chunk_entries
from crawler.keys import CrawlKeys, shard_prefixes
from crawler.metrics import StatusCollector
from crawler.status import StatusReader

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

SITES = [f"s{i}.example" for i in range(12)]


def body(url: str) -> bytes:
    return f'{{"u":"{url}"}}'.encode()


def fill(client: Any, spider: str, shards: int) -> dict[str, Any]:
    """Queue requests on 12 sites (priority = site number % 4, 2 each), lease
    three, retry one, bury one dead letter per shard, schedule one revisit,
    record the shard count as the first worker does; return what was written
    by shard."""
    frontier = FrontierShards.build(client, spider, shards, revisit_after=3600)
    frontier.check_count()
    fingerprints = 0
    for i, site in enumerate(SITES):
        for j in range(2):
            assert frontier.for_site(site).push(
                body(f"https://{site}/{j}"), site=site, priority=i % 4,
                fingerprint=os.urandom(20), dont_filter=False,
            )
            fingerprints += 1
    leased = 0
    for n, site in enumerate(SITES[:3]):
        lease = frontier.for_site(site).lease(f"w{n % 2}#x:{n}")
        assert isinstance(lease, Lease)
        leased += 1
    retry_site = SITES[5]
    frontier.for_site(retry_site).push_retry(
        body(f"https://{retry_site}/later"), site=retry_site, priority=0, delay=60
    )
    for shard in frontier:
        shard.dead_letter({"url": "https://x.example/", "reason": "r", "attempts": 3})
    revisit_site = SITES[7]
    frontier.for_site(revisit_site).commit(Commit(revisits=[
        Revisit(body(f"https://{revisit_site}/0"), revisit_site, 0, os.urandom(20)),
    ]))
    return {
        "frontier": frontier, "queued": 2 * len(SITES) - leased, "leased": leased,
        "seen": fingerprints,
    }


def keep_prio(client: Any, frontier: FrontierShards, *, skip: int | None = None) -> None:
    """The frontier's scripts keep each shard's ``prio`` hash; with ``skip``,
    that shard's is deleted: a frontier written by a version before it."""
    if skip is not None:
        client.delete(frontier[skip].key("prio"))


def queued_by_priority(client: Any, frontier: FrontierShards) -> dict[int, int]:
    """Requests queued per priority, counted from the queues' chunks."""
    out: dict[int, int] = {}
    for shard in frontier:
        for name, chunk in client.hgetall(shard.key("qc")).items():
            priority = int(name.split(b"\t")[1])
            out[priority] = out.get(priority, 0) + len(chunk_entries(chunk))
    return dict(sorted(out.items(), reverse=True))


def samples(reader: StatusReader, name: str) -> dict[str, float]:
    return {
        s.labels["spider"]: s.value
        for family in StatusCollector(reader).collect()
        for s in family.samples
        if s.name == name
    }


@pytest.mark.parametrize("shards", [1, 3])
def test_status_sums_every_shard(rds: redis.Redis, shards: int) -> None:
    wrote = fill(rds, "t", shards)
    frontier: FrontierShards = wrote["frontier"]
    keep_prio(rds, frontier)
    # The reader's settings say one shard: the count the crawl recorded wins.
    reader = StatusReader(rds, None, "unused", ["t"], settings=Settings({"FRONTIER_SHARDS": 1}))
    try:
        spider = reader.read().spiders["t"]
        assert spider.shards == shards
        assert (spider.queued, spider.leases, spider.retries) == (
            wrote["queued"], wrote["leased"], 1
        )
        assert spider.queued == sum(int(rds.get(f.key("count")) or 0) for f in frontier)
        assert (spider.dead_letters, spider.revisits, spider.seen) == (shards, 1, wrote["seen"])
        assert spider.queued_by_priority == queued_by_priority(rds, frontier)
        assert spider.leases_by_worker == {"w0": 2, "w1": 1}
        if shards > 1:  # the sites really are spread over the shards
            assert sum(1 for f in frontier if rds.exists(f.key("count"))) > 1
        as_json = reader.read().as_dict()["spiders"]["t"]
        assert as_json["shards"] == shards
        assert as_json["keys"]["shards"] == "{t}:shards"
        # Every shard's keys, in shard order; shard 0's are the flat ones.
        prefixes = shard_prefixes("t", shards)
        assert [k["prefix"] for k in as_json["shard_keys"]] == prefixes
        for prefix, named in zip(prefixes, as_json["shard_keys"], strict=True):
            assert named["count"] == prefix + "count" and named["leases"] == prefix + "leases"
            assert named["dead_trimmed"] == prefix + "dead:trimmed"
            assert rds.exists(named["count"]) == rds.exists(prefix + "count")
        assert sum(int(rds.get(k["count"]) or 0) for k in as_json["shard_keys"]) == (
            wrote["queued"]
        )
        assert sum(rds.zcard(k["leases"]) for k in as_json["shard_keys"]) == wrote["leased"]
        first = as_json["shard_keys"][0]
        for role in ("count", "wait", "queues", "dupefilter", "bloom", "dead", "leases",
                     "retries", "prio"):
            assert as_json["keys"][role] == first[role], role
        if shards == 1:  # the keys of a crawl of the time before shards
            assert first["count"] == "{t}:count" and first["dupefilter"] == "{t}:dupefilter"
        console = Console(width=160, record=True, file=io.StringIO())
        console.print(render(reader.read()))
        row = next(x for x in console.export_text().splitlines() if "frontier shards" in x)
        assert row.split("│")[2].strip() == str(shards), row
        assert samples(reader, "crawler_frontier_shards") == {"t": shards}
        assert samples(reader, "crawler_requests_queued") == {"t": wrote["queued"]}
        assert samples(reader, "crawler_revisits_scheduled") == {"t": 1}
        assert samples(reader, "crawler_dead_letters") == {"t": shards}
    finally:
        reader.close()


@pytest.mark.parametrize("shards", [1, 3])
def test_priorities_are_unknown_while_a_shard_with_work_has_no_prio(
    rds: redis.Redis, shards: int
) -> None:
    frontier = fill(rds, "t", shards)["frontier"]
    busy = next(i for i, f in enumerate(frontier) if int(rds.get(f.key("count")) or 0))
    keep_prio(rds, frontier, skip=busy)
    reader = StatusReader(rds, None, "unused", ["t"])
    try:
        spider = reader.read().spiders["t"]
        assert spider.queued > 0 and spider.queued_by_priority is None
        assert reader.read().as_dict()["spiders"]["t"]["queued_by_priority"] is None
        assert "crawler_requests_queued_by_priority" not in {
            s.name for family in StatusCollector(reader).collect() for s in family.samples
        }
    finally:
        reader.close()


def test_shard_count_defaults_to_one_when_none_is_recorded(rds: redis.Redis) -> None:
    """A crawl of the time before shards: no ``{t}:shards``; the reader's
    settings say 3 shards, yet the crawl's keys are the unsharded ones."""
    frontier = FrontierShards.build(rds, "t", 1)
    frontier[0].push(body("https://a.example/"), site="a.example", priority=0,
                     fingerprint=None, dont_filter=True)
    assert not rds.exists("{t}:shards")
    reader = StatusReader(rds, None, "unused", ["t", "never"],
                          settings=Settings({"FRONTIER_SHARDS": 3}))
    try:
        spiders = reader.read().spiders
        assert (spiders["t"].shards, spiders["t"].queued, spiders["t"].started) == (1, 1, True)
        assert (spiders["never"].shards, spiders["never"].started) == (1, False)
        assert spiders["t"].keys["count"] == "{t}:count"
        assert [k["count"] for k in spiders["t"].shard_keys] == ["{t}:count"]
    finally:
        reader.close()


def test_a_sharded_bloom_dupefilter_leaves_urls_seen_unknown(rds: redis.Redis) -> None:
    bloom = BloomFilter.for_capacity("{b}:bloom", 3000, 0.01)
    frontier = FrontierShards.build(rds, "b", 3, bloom=bloom)
    frontier.check_count()
    for site in SITES:
        assert frontier.for_site(site).push(
            body(f"https://{site}/"), site=site, priority=0, fingerprint=os.urandom(20),
            dont_filter=False,
        )
    assert not rds.exists("{b}:bloom") and all(rds.exists(f.key("bloom")) for f in frontier)
    reader = StatusReader(rds, None, "unused", ["b"])
    try:
        spider = reader.read().spiders["b"]
        assert (spider.shards, spider.queued, spider.seen) == (3, len(SITES), None)
    finally:
        reader.close()


@pytest.fixture
def cluster(redis_cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_cluster_url)
    yield client
    client.close()


def test_status_of_a_sharded_crawl_on_a_cluster(cluster: RedisCluster) -> None:
    wrote = fill(cluster, "t", 3)
    frontier: FrontierShards = wrote["frontier"]
    masters = {cluster.get_node_from_key(p + "count").name for p in shard_prefixes("t", 3)}
    assert len(masters) == 3  # each shard on a master of its own
    reader = StatusReader(cluster, None, "unused", ["t", "never"])
    try:
        status = reader.read()
        assert "redis" not in status.errors
        spider = status.spiders["t"]
        assert spider.shards == 3
        assert (spider.queued, spider.leases, spider.retries, spider.dead_letters) == (
            wrote["queued"], wrote["leased"], 1, 3
        )
        assert (spider.revisits, spider.seen) == (1, wrote["seen"])
        assert spider.leases_by_worker == {"w0": 2, "w1": 1}
        assert spider.keys["count"] == CrawlKeys.for_spider("t", shards=3).shards[0].count
        assert [k["prefix"] for k in spider.shard_keys] == shard_prefixes("t", 3)
        assert status.spiders["never"].started is False
        keep_prio(cluster, frontier)
        assert reader.read().spiders["t"].queued_by_priority == queued_by_priority(
            cluster, frontier
        )
    finally:
        reader.close()


def test_leases_by_worker_counts_every_shard_past_one_scan_page(rds: redis.Redis) -> None:
    """2,500 leases over three shards: the sets are scanned together, page
    after page (``ZSCAN`` of 1,000), none counted twice or left out."""
    frontier = FrontierShards.build(rds, "t", 3)
    frontier.check_count()
    for index, shard in enumerate(frontier):
        n = 1500 if index == 0 else 500
        rds.zadd(shard.key("leases"), {f"w{i % 3}#x:{index}.{i}": 1 for i in range(n)})
    reader = StatusReader(rds, None, "unused", ["t"])
    try:
        spider = reader.read().spiders["t"]
        assert spider.leases == 2500
        assert spider.leases_by_worker == {"w0": 834, "w1": 834, "w2": 832}
    finally:
        reader.close()
