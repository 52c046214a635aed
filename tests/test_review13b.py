"""Second review of issue 13: held-back variants of its acceptance (a
cluster crawl with other parameters, status and the metrics exporter of a
sharded crawl beside a million foreign keys, the dead-letter cap with
shards), against real Redis servers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from redis.cluster import RedisCluster

from crawler.frontier.shards import FrontierShards
from crawler.keys import shard_prefixes
from tests.test_shards import _assert_stored_once, _Sites
from tests.workers import crawl, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


@pytest.fixture
def many_sites() -> Iterator[_Sites]:
    import threading

    server = _Sites()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_crawl_of_200_sites_in_9_shards_spreads_over_the_masters_of_a_cluster(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, db: Any,
    many_sites: _Sites, tmp_path: Path,
) -> None:
    n, shards = 200, 9
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        rc.lpush("pages:start_urls", *many_sites.urls(n))
        env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
        workers = crawl("pages", env, tmp_path, workers=2, settings={"FRONTIER_SHARDS": shards})
        _assert_stored_once(db, many_sites, n, workers)
        assert all("MOVED" not in w.log and "CROSSSLOT" not in w.log for w in workers)
        assert FrontierShards.build(rc, "pages", shards).audit() == {}
        prefixes = shard_prefixes("pages", shards)
        assert sum(int(rc.get(p + "count") or 0) for p in prefixes) == 0
        assert [rc.llen(p + "dead") for p in prefixes] == [0] * shards
        assert all(rc.scard(p + "dupefilter") > 0 for p in prefixes)
        per_master = []
        for node in rc.get_primaries():
            client = rc.get_redis_connection(node)
            per_master.append(sum(
                int(client.memory_usage(key) or 0)
                for key in client.scan_iter(match="*pages*", count=1000)
            ))
        assert max(per_master) <= 0.6 * sum(per_master), per_master
    finally:
        rc.close()
