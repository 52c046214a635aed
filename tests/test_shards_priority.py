"""Priority on a sharded crawl, held-back variants of issue 13's acceptance (a review):

* Priority across shards, through a worker: a priority-9 request pushed by
  this worker is leased first whatever shard it lands in, also when a peek
  at the shards (:meth:`ShardRouter.peek_stale`) runs before the
  round trip that commits it (the first round trip of a worker fed its
  seeds, or a callback's push between two peeks); and through ``scrapy
  crawl`` with seeds pushed as the README says.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest
from scrapy import Request, Spider

from crawler.frontier import router as router_module
from crawler.keys import shard_of
from tests import scheduler_harness as harness
from tests.test_shards import served_sites
from tests.workers import crawl, worker_env

if TYPE_CHECKING:
    from pathlib import Path

    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "t"


def _site_in(shard: int, shards: int, stem: str = "p") -> str:
    return next(
        f"{stem}{j}.example" for j in range(1000) if shard_of(f"{stem}{j}.example", shards) == shard
    )


# -- priority across shards: what a peek learns before this worker's pushes are in ------


@pytest.mark.parametrize("shards", [3, 5])
def test_a_priority_9_request_queued_with_the_first_round_trip_is_leased_first(
    redis_url: str, shards: int
) -> None:
    """A fresh worker queues 199 priority-0 requests and one priority-9
    request (the last), then leases: its first round trip peeks at every
    shard before the commit that carries them; the priority-9 one comes
    first all the same (it came 75th: a whole shard of priority 0 first)."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=2
    )
    for i in range(199):
        scheduler.enqueue_request(Request(f"https://s{i}.example/", dont_filter=True))
    scheduler.enqueue_request(Request("https://s199.example/", priority=9, dont_filter=True))
    got = []
    while (request := scheduler.next_request()) is not None:
        got.append(request.url)
        harness.finish(scheduler, request)
    assert len(got) == 200
    assert got.index("https://s199.example/") == 0


@pytest.mark.parametrize("shards", [3, 5])
def test_a_priority_9_request_pushed_mid_crawl_on_any_shard_is_leased_next(
    redis_url: str, shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-crawl, a callback's priority-9 request on each shard in turn:
    a peek at the shards (every lease call here: the recheck is 0) between
    its push and the commit carrying it must not make the worker forget it."""
    monkeypatch.setattr(router_module, "EMPTY_SHARD_RECHECK", 0.0)
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=1
    )
    for i in range(60):
        scheduler.enqueue_request(Request(f"https://s{i}.example/", dont_filter=True))
    assert scheduler.flush_outbox()
    first = scheduler.next_request()
    assert first is not None
    harness.finish(scheduler, first)
    for k in range(shards):
        url = f"https://{_site_in(k, shards)}/"
        scheduler.enqueue_request(Request(url, priority=9, dont_filter=True))
        request = scheduler.next_request()
        assert request is not None and request.url == url, (k, request)
        harness.finish(scheduler, request)


_CRAWLED = re.compile(r"Crawled \(\d+\) <GET (\S+)>")


@pytest.mark.workers
@pytest.mark.parametrize("shards", [3, 5])
def test_a_priority_9_seed_pushed_last_of_200_is_fetched_among_the_first(
    redis_url: str, rds: redis.Redis, mongo_uri: str, mongo_db: str, tmp_path: Path,
    shards: int,
) -> None:
    """``scrapy crawl pages`` fed 200 seeds with ``lpush``, the 200th a JSON
    seed of priority 9: it is fetched with the first batch (responses of
    the two downloads at once may come in either order)."""
    with served_sites(pages=1) as sites:
        urls = sites.urls(200)
        rds.lpush("pages:start_urls", *urls[:199])
        rds.lpush("pages:start_urls", json.dumps({"url": urls[199], "priority": 9}))
        [worker] = crawl(
            "pages", worker_env(redis_url, mongo_uri, mongo_db), tmp_path,
            settings={"FRONTIER_SHARDS": shards, "CONCURRENT_REQUESTS": 2,
                      "LOG_LEVEL": "DEBUG", "ROBOTSTXT_OBEY": False},
        )
    assert worker.returncode == 0, worker.log[-3000:]
    crawled = _CRAWLED.findall(worker.log)
    assert len(crawled) == 200
    assert urls[199] in crawled[:3], crawled.index(urls[199])
