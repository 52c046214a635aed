"""The scheduler, queue and dupefilter against a real Redis, in process."""

from __future__ import annotations

import json
import pickle
import time
import warnings
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from crawler.frontier.scheduler import RETRY_DELAY_META, FrontierScheduler
from crawler.frontier.store import Frontier, NotDue
from tests import scheduler_harness as harness
from tests.scheduler_harness import SETTINGS, finish, lease_all, wait_for_request

if TYPE_CHECKING:
    import redis


class _Spider(Spider):
    name = "t"

    def parse_page(self, response: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass

    also_parse_page = parse_page  # an alias: Scrapy names the first in dir() order


pytestmark = pytest.mark.usefixtures("stop_heartbeats")


def open_scheduler(redis_url: str, **settings: Any) -> tuple[FrontierScheduler, Any]:
    return harness.open_scheduler(redis_url, _Spider, **settings)


def test_building_the_scheduler_does_no_io() -> None:
    # Nothing listens on port 1: building must not connect (scrapy-redis pings).
    crawler = get_crawler(_Spider, {**SETTINGS, "REDIS_URL": "redis://127.0.0.1:1/0"})
    build_from_crawler(FrontierScheduler, crawler)


def test_scheduling_uses_scrapys_fingerprinter_and_no_deprecated_calls(
    redis_url: str, rds: redis.Redis
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduler, crawler = open_scheduler(redis_url)
        request = Request("https://a.example/x?b=2&a=1", callback=crawler.spider.parse_page)
        scheduler.enqueue_request(request)
        scheduler.enqueue_request(Request("https://a.example/x?a=1&b=2"))
        [popped] = lease_all(scheduler)
        assert popped.callback == crawler.spider.parse_page
        finish(scheduler, popped)
    fingerprint = crawler.request_fingerprinter.fingerprint(request)
    assert rds.smembers("{t}:dupefilter") == {fingerprint}
    assert rds.zcard("{t}:leases") == 0
    stats = crawler.stats
    assert stats.get_value("scheduler/enqueued/redis") == 1
    assert stats.get_value("dupefilter/filtered") == 1
    assert stats.get_value("scheduler/dequeued/redis") == 1
    assert stats.get_value("frontier/leases/acked") == 1


def test_a_dont_filter_request_is_queued_and_still_counts_as_seen(redis_url: str) -> None:
    scheduler, _ = open_scheduler(redis_url)
    scheduler.enqueue_request(Request("https://a.example/", dont_filter=True))
    scheduler.enqueue_request(Request("https://a.example/", dont_filter=True))
    # A page linking back to the seed does not fetch it again.
    scheduler.enqueue_request(Request("https://a.example/"))
    assert len(lease_all(scheduler)) == 2


def test_higher_priority_first_and_equal_priorities_in_push_order(redis_url: str) -> None:
    scheduler, _ = open_scheduler(redis_url, FRONTIER_CONCURRENCY=100)
    for name in "zyxwvu":
        scheduler.enqueue_request(Request(f"https://a.example/{name}"))
    for name in "cba":
        scheduler.enqueue_request(Request(f"https://a.example/{name}", priority=9))
    scheduler.enqueue_request(Request("https://b.example/low", priority=-1))
    order = [r.url.rsplit("/", 1)[1] for r in lease_all(scheduler)]
    assert order == ["c", "b", "a", "z", "y", "x", "w", "v", "u", "low"]


def test_an_unencodable_request_is_refused_and_not_marked_seen(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, crawler = open_scheduler(redis_url)
    assert not scheduler.enqueue_request(Request("https://a.example/", meta={"x": object()}))
    assert "https://a.example/" in caplog.text
    assert "meta['x']" in caplog.text
    assert crawler.stats.get_value("scheduler/unencodable") == 1
    assert rds.scard("{t}:dupefilter") == 0
    assert scheduler.enqueue_request(Request("https://a.example/"))
    assert len(lease_all(scheduler)) == 1


def test_a_pickled_entry_is_dead_lettered_not_unpickled(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = open_scheduler(redis_url)
    evil = pickle.dumps({"url": "https://evil.example/"})
    scheduler.queue.frontier.push(
        evil, site="evil.example", priority=5, fingerprint=None, dont_filter=True
    )
    scheduler.enqueue_request(Request("https://a.example/good"))
    [request] = lease_all(scheduler)
    assert request.url == "https://a.example/good"
    assert scheduler.flush_outbox()
    [dead] = [json.loads(d) for d in rds.lrange("{t}:dead", 0, -1)]
    assert "pickled payload" in dead["reason"]
    # The bad entry's lease was ended; only the good request is leased.
    assert rds.zcard("{t}:leases") == 1


def test_a_killed_workers_lease_expires_and_another_worker_gets_it(
    redis_url: str, rds: redis.Redis
) -> None:
    killed, _ = open_scheduler(redis_url, FRONTIER_LEASE_TIMEOUT=0.3)
    killed.enqueue_request(Request("https://a.example/1"))
    assert len(lease_all(killed)) == 1  # ... and the worker dies holding it.
    other, crawler = open_scheduler(redis_url, FRONTIER_LEASE_TIMEOUT=0.3)
    assert other.has_pending_requests()
    request = wait_for_request(other)
    assert request.url == "https://a.example/1"
    assert crawler.stats.get_value("frontier/leases/returned") == 1
    finish(other, request)
    assert not other.has_pending_requests()


def test_closing_gives_back_unfinished_leases_and_keeps_the_frontier(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, crawler = open_scheduler(redis_url)
    scheduler.enqueue_request(Request("https://a.example/1"))
    scheduler.enqueue_request(Request("https://a.example/2"))
    first = scheduler.next_request()
    assert first is not None
    scheduler.close("shutdown")
    # The one handed out and the one leased with it into the local buffer.
    assert crawler.stats.get_value("frontier/leases/released") == 2
    assert rds.scard("{t}:dupefilter") == 2
    other, _ = open_scheduler(redis_url)
    assert sorted(r.url for r in lease_all(other)) == ["https://a.example/1", "https://a.example/2"]


def test_a_retry_waits_in_redis_for_its_delay(redis_url: str, rds: redis.Redis) -> None:
    scheduler, crawler = open_scheduler(redis_url)
    retry = Request("https://a.example/r", dont_filter=True, meta={RETRY_DELAY_META: 0.3})
    started = time.monotonic()
    scheduler.enqueue_request(retry)
    assert scheduler.next_request() is None
    assert rds.zcard("{t}:retries") == 1
    assert 0 < scheduler.next_due <= 0.3
    request = wait_for_request(scheduler)
    assert time.monotonic() - started >= 0.3
    assert RETRY_DELAY_META not in request.meta
    assert crawler.stats.get_value("frontier/retries/scheduled") == 1


def test_sites_are_served_apart_by_their_delay_and_others_fill_the_gap(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = open_scheduler(redis_url, FRONTIER_DELAY=0.3)
    for i in range(2):
        scheduler.enqueue_request(Request(f"https://slow.example/{i}"))
    for i in range(3):
        scheduler.enqueue_request(Request(f"https://other.example/{i}", priority=-1))
    first = scheduler.next_request()
    # slow.example is not due for 0.3 s: other.example is served meanwhile,
    # though its priority is lower.
    second = scheduler.next_request()
    assert first is not None and second is not None
    assert (first.url, second.url) == ("https://slow.example/0", "https://other.example/0")
    started = time.monotonic()
    nxt = wait_for_request(scheduler)
    assert nxt.url == "https://slow.example/1"
    assert time.monotonic() - started >= 0.25


def test_a_site_gets_at_most_its_concurrency_across_workers(redis_url: str) -> None:
    a, _ = open_scheduler(redis_url, FRONTIER_CONCURRENCY=2)
    b, _ = open_scheduler(redis_url, FRONTIER_CONCURRENCY=2)
    for i in range(5):
        a.enqueue_request(Request(f"https://a.example/{i}"))
    held = [a.next_request(), b.next_request()]
    assert all(held)
    assert a.next_request() is None and b.next_request() is None
    finish(a, held[0])  # type: ignore[arg-type]
    # b holds its fair share (2 slots, 2 live workers): the free slot is a's.
    assert b.next_request() is None
    assert a.next_request() is not None


def test_the_outbox_reloads_scripts_that_redis_forgot(redis_url: str, rds: redis.Redis) -> None:
    scheduler, _ = open_scheduler(redis_url)
    rds.script_flush()  # as after a restart without persistence of scripts
    scheduler.enqueue_request(Request("https://a.example/1"))
    assert scheduler.flush_outbox()
    assert [r.url for r in lease_all(scheduler)] == ["https://a.example/1"]


# -- batches ----------------------------------------------------------------------


def _frontier(rds: redis.Redis, **kwargs: Any) -> Frontier:
    return Frontier(rds, "t", **{"default_concurrency": 8, **kwargs})


def _push(frontier: Frontier, url: str, priority: int = 0) -> None:
    site = url.split("/")[2]
    assert frontier.push(url.encode(), site=site, priority=priority,
                         fingerprint=url.encode(), dont_filter=False)


def test_one_lease_call_keeps_each_sites_delay_and_concurrency(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    frontier.load_scripts()
    rds.hset("{t}:conc", "a.example", 3)
    rds.hset("{t}:delay", "slow.example", 10_000)
    for i in range(5):
        _push(frontier, f"https://a.example/{i}")
        _push(frontier, f"https://slow.example/{i}")
    ids = [f"w:{n}" for n in range(10)]
    leases = frontier.lease_many(ids)
    assert isinstance(leases, list)
    # 3 of a.example (its concurrency), 1 of slow.example (then not due).
    assert sorted(lease.data.decode() for lease in leases) == [
        "https://a.example/0", "https://a.example/1", "https://a.example/2",
        "https://slow.example/0",
    ]
    assert [lease.lease_id for lease in leases] == ids[:4]  # the first ids, in order
    assert rds.zcard("{t}:leases") == 4
    assert int(rds.get("{t}:count") or 0) == 6
    assert isinstance(frontier.lease_many(["w:10"]), NotDue)


def test_one_lease_call_serves_higher_priorities_first_across_sites(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    for site in ("a", "b", "c"):
        for priority in (0, 5):
            _push(frontier, f"https://{site}.example/{priority}", priority)
    leases = frontier.lease_many([f"w:{n}" for n in range(6)])
    assert isinstance(leases, list)
    assert [lease.data.decode().rsplit("/", 1)[1] for lease in leases] == ["5"] * 3 + ["0"] * 3


def test_a_worker_takes_only_its_share_even_in_one_call(rds: redis.Redis) -> None:
    frontier = _frontier(rds, default_concurrency=4)
    for i in range(8):
        _push(frontier, f"https://a.example/{i}")
    frontier.alive("other")  # a worker that has opened but not leased yet
    leases = frontier.lease_many([f"w:{n}" for n in range(8)])
    assert isinstance(leases, list) and len(leases) == 2  # 4 slots, 2 live workers
    other = frontier.lease_many([f"other:{n}" for n in range(8)])
    assert isinstance(other, list) and len(other) == 2


def test_the_scheduler_leases_as_many_as_the_downloader_has_room_for(redis_url: str) -> None:
    scheduler, crawler = open_scheduler(redis_url)
    for i in range(10):
        scheduler.enqueue_request(Request(f"https://a.example/{i}"))
    crawler.engine.downloader.active = {object() for _ in range(13)}  # 16 - 13 free
    first = scheduler.next_request()
    assert first is not None and first.url == "https://a.example/0"
    assert scheduler.server.zcard("{t}:leases") == 3
    assert scheduler.has_pending_requests()
    assert [r.url for r in (scheduler.next_request(), scheduler.next_request())] == [
        "https://a.example/1", "https://a.example/2"
    ]
    assert crawler.stats.get_value("frontier/lease_calls") == 1
    assert crawler.stats.get_value("scheduler/dequeued/redis") == 3


def test_a_repeat_of_what_this_worker_recorded_is_dropped_without_redis(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, crawler = open_scheduler(redis_url)
    assert scheduler.enqueue_request(Request("https://a.example/x?a=1&b=2"))
    assert not scheduler.enqueue_request(Request("https://a.example/x?b=2&a=1"))
    assert len(scheduler.outbox.ops) == 1  # the repeat never reached the outbox
    assert scheduler.enqueue_request(Request("https://a.example/x?a=1&b=2", dont_filter=True))
    assert scheduler.flush_outbox()
    assert crawler.stats.get_value("dupefilter/filtered") == 1
    assert int(rds.get("{t}:count") or 0) == 2
    # Without the local memory, Redis's dupefilter filters the repeat.
    plain, plain_crawler = open_scheduler(redis_url, FRONTIER_LOCAL_SEEN=0)
    assert plain.enqueue_request(Request("https://a.example/x?b=2&a=1"))
    assert plain.flush_outbox()
    assert plain_crawler.stats.get_value("dupefilter/filtered") == 1


def test_the_local_memory_of_fingerprints_is_bounded(redis_url: str) -> None:
    scheduler, _ = open_scheduler(redis_url, FRONTIER_LOCAL_SEEN=3)
    for i in range(5):
        scheduler.enqueue_request(Request(f"https://a.example/{i}"))
    assert len(scheduler.enqueuer.seen) == 3
    # The oldest were forgotten: Redis filters their repeats instead.
    assert scheduler.enqueue_request(Request("https://a.example/0"))
    assert not scheduler.enqueue_request(Request("https://a.example/4"))


def test_the_queue_encodes_what_scrapys_to_dict_gives(redis_url: str) -> None:
    from scrapy.http import FormRequest, JsonRequest

    scheduler, crawler = open_scheduler(redis_url)
    spider, queue = crawler.spider, scheduler.queue
    requests = [
        Request("https://a.example/"),
        Request("https://a.example/p", callback=spider.parse_page, errback=spider.on_error,
                meta={"depth": 2}, cb_kwargs={"k": 1}, priority=3, headers={"X-A": "b"}),
        Request("https://a.example/alias", callback=spider.also_parse_page),
        JsonRequest("https://a.example/api", data={"q": 1}, callback=spider.parse_page),
        FormRequest("https://a.example/f", formdata={"a": "b"}),
        # Another instance's method: found by its function, as Scrapy does.
        Request("https://a.example/o", callback=_Spider().parse_page),
    ]
    for request in requests * 2:  # the second time from the cache of names
        assert queue._to_dict(request) == request.to_dict(spider=spider)
    with pytest.raises(ValueError, match="not an instance method"):
        queue.encode(Request("https://a.example/", callback=print))


def test_a_site_at_its_concurrency_is_not_leased_when_it_is_lowered_live(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds, default_concurrency=4)
    for i in range(6):
        _push(frontier, f"https://a.example/{i}")
    first = frontier.lease_many(["w:0", "w:1"])
    assert isinstance(first, list) and len(first) == 2
    rds.hset("{t}:conc", "a.example", 1)  # an operator lowers it mid-crawl
    assert isinstance(frontier.lease_many(["v:0"]), NotDue)
    frontier.ack(["w:0", "w:1"])
    again = frontier.lease_many(["v:1", "v:2"])
    assert isinstance(again, list) and len(again) == 1


def test_a_site_waits_for_its_robots_txt_one_request_at_a_time(rds: redis.Redis) -> None:
    frontier = _frontier(rds, robots_gate=True)
    _push(frontier, "https://a.example/0")
    held = frontier.lease_many(["w:0", "w:1"])
    assert isinstance(held, list) and len(held) == 1
    # A push (another worker's seed) marks the site as waiting again: still
    # one request at a time until the robots.txt is known.
    _push(frontier, "https://a.example/1")
    assert isinstance(frontier.lease_many(["v:0"]), NotDue)
    rds.hset("{t}:robots", "a.example", "0\n")
    frontier.release_slots(["w:0"])
    assert isinstance(frontier.lease_many(["v:1"]), list)


def test_a_closing_worker_leaves_the_fair_share_at_once(redis_url: str) -> None:
    a, _ = open_scheduler(redis_url, FRONTIER_CONCURRENCY=4)
    b, _ = open_scheduler(redis_url, FRONTIER_CONCURRENCY=4)
    for i in range(8):
        a.enqueue_request(Request(f"https://a.example/{i}"))
    assert a.flush_outbox()
    assert len(lease_all(b)) == 2  # two live workers: half of 4 slots each
    a.close("finished")
    assert len(lease_all(b)) == 2  # now alone: all 4


def test_a_closing_worker_deletes_its_commit_markers_in_every_shard(
    redis_url: str, rds: redis.Redis
) -> None:
    """A marker serves only its own process (a holder is one process): a
    closed worker leaves none behind, a killed one's expire within a day."""
    a, _ = open_scheduler(redis_url, FRONTIER_SHARDS=3)
    b, _ = open_scheduler(redis_url, FRONTIER_SHARDS=3)
    for s in (a, b):
        for i in range(30):
            s.enqueue_request(Request(f"https://h{i}.example/"))
        assert s.flush_outbox()
    markers = {k for k in rds.scan_iter("{*}:sent:*")}
    mine = {k for k in markers if k.decode().endswith(a.holder)}
    assert len(mine) == 3  # the 30 sites fall in every shard
    ttl = {rds.pttl(k) for k in markers}
    assert all(0 < t <= 86_400_000 for t in ttl)
    a.close("finished")
    assert {k for k in rds.scan_iter("{*}:sent:*")} == markers - mine
    a.queue.shards.leave(a.holder)  # sent again (a lost reply): nothing changes
    assert {k for k in rds.scan_iter("{*}:sent:*")} == markers - mine


def test_the_local_memory_is_dropped_when_redis_may_have_rolled_back(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = open_scheduler(redis_url)
    assert scheduler.enqueue_request(Request("https://a.example/child"))
    assert scheduler.flush_outbox()
    # Redis restarts from an older snapshot: the fingerprint and the scripts
    # are gone.
    rds.flushall()
    rds.script_flush()
    scheduler.enqueue_request(Request("https://a.example/other"))
    assert scheduler.flush_outbox()  # meets NOSCRIPT, reloads the scripts
    assert scheduler.enqueue_request(Request("https://a.example/child"))
    assert scheduler.flush_outbox()
    assert sorted(r.url for r in lease_all(scheduler)) == [
        "https://a.example/child", "https://a.example/other"
    ]


def test_the_local_memory_is_dropped_on_an_outage(redis_url: str) -> None:
    scheduler, _ = open_scheduler(redis_url)
    scheduler.enqueue_request(Request("https://a.example/x"))
    assert scheduler.enqueuer.seen
    scheduler.session.outage(ConnectionError("gone"))
    assert not scheduler.enqueuer.seen
