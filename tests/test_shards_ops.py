"""Operating a sharded frontier (``FRONTIER_SHARDS``): dead letters of every
shard, dupefilters outside the scheduler, ``SCHEDULER_PERSIST`` off, and
what an idle worker says about a dead worker's leases in several shards.

Everything runs against the real servers of ``tests/conftest.py``; the
commands run as subprocesses, as an operator runs them.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from scrapy import Request, Spider
from scrapy.utils.misc import build_from_crawler

from crawler.commands.deadletters import MOVING, dead_letters, load_record, requeue, requeue_push
from crawler.config import config_error_of
from crawler.frontier.bloom import BloomDupeFilter
from crawler.frontier.dupefilter import FrontierDupeFilter
from crawler.frontier.serializer import entry_fields
from crawler.frontier.shards import FrontierShards
from crawler.frontier.sites import site_of
from crawler.frontier.store import Commit
from crawler.keys import shard_of, shard_prefixes
from tests import scheduler_harness as harness

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")

ROOT = Path(__file__).resolve().parent.parent
SET = "crawler.frontier.dupefilter.FrontierDupeFilter"
BLOOM = "crawler.frontier.bloom.BloomDupeFilter"


class _Quotes(Spider):
    """Named as a spider of the project, so the commands accept it."""

    name = "quotes"


def _sites(shards: int, per_shard: int = 2) -> list[str]:
    """Sites that cover every shard, ``per_shard`` in each."""
    found: dict[int, list[str]] = {}
    i = 0
    while any(len(found.get(s, [])) < per_shard for s in range(shards)):
        site = f"s{i}.example"
        found.setdefault(shard_of(site, shards), []).append(site)
        i += 1
    return [site for s in range(shards) for site in found[s][:per_shard]]


def _scrapy(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scrapy", *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )


def _queued(rds: redis.Redis, spider: str, shards: int) -> list[int]:
    return [int(cast("bytes | None", rds.get(p + "count")) or 0)
            for p in shard_prefixes(spider, shards)]


def _dead(rds: redis.Redis, spider: str, shards: int) -> list[int]:
    return [int(rds.llen(p + "dead")) for p in shard_prefixes(spider, shards)]


# -- dead letters ---------------------------------------------------------------------


@pytest.mark.workers
@pytest.mark.parametrize("shards", [1, 3])
def test_deadletters_list_requeue_and_purge_act_on_every_shard(
    redis_url: str, rds: redis.Redis, env: dict[str, str], shards: int
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Quotes, FRONTIER_SHARDS=shards)
    sites = _sites(shards)
    for site in sites:
        scheduler.dead_letter(Request(f"https://{site}/gone", priority=2), "gave up")
    assert scheduler.flush_outbox()
    per_shard = _dead(rds, "quotes", shards)
    assert per_shard == [2] * shards  # each in its site's shard
    # No -s FRONTIER_SHARDS: the commands read the count the crawl recorded.
    option: tuple[str, ...] = ()

    listed = _scrapy(env, "deadletters", "list", "quotes", "--json", *option)
    assert listed.returncode == 0, listed.stderr
    urls = sorted(record["url"] for record in json.loads(listed.stdout))
    assert urls == sorted(f"https://{site}/gone" for site in sites)
    limited = _scrapy(env, "deadletters", "list", "quotes", "--limit", "3", *option)
    assert len(limited.stdout.splitlines()) == min(3, len(sites))

    done = _scrapy(env, "deadletters", "requeue", "quotes", *option)
    assert done.returncode == 0, done.stderr
    assert f"requeued {len(sites)} dead letters of quotes" in done.stdout
    assert _dead(rds, "quotes", shards) == [0] * shards
    assert _queued(rds, "quotes", shards) == [2] * shards  # back in their sites' shards
    got = harness.lease_all(scheduler)
    assert sorted(r.url for r in got) == sorted(f"https://{site}/gone" for site in sites)
    assert {r.priority for r in got} == {2}

    for request in got:
        scheduler.dead_letter(request, "gave up again")
        harness.finish(scheduler, request)
    purged = _scrapy(env, "deadletters", "purge", "quotes", *option)
    assert purged.returncode == 0, purged.stderr
    assert f"purged {len(sites)} dead letters of quotes" in purged.stdout
    assert _dead(rds, "quotes", shards) == [0] * shards


def _letter_in_the_wrong_shard(
    redis_url: str, rds: redis.Redis
) -> tuple[FrontierShards, bytes, int, int]:
    """A dead letter of a site of shard 1 or 2, kept in shard 0's list (as
    one written with no site is): the shards, its entry, its list's shard
    and its site's."""
    scheduler, _ = harness.open_scheduler(redis_url, _Quotes, FRONTIER_SHARDS=3)
    site = next(s for s in _sites(3) if shard_of(s, 3) != 0)
    scheduler.dead_letter(Request(f"https://{site}/moved", priority=4), "gave up")
    assert scheduler.flush_outbox()
    shards = FrontierShards.build(rds, "quotes", 3)
    target = shard_of(site, 3)
    [raw] = cast("list[bytes]", rds.lrange(shards[target].key("dead"), 0, -1))
    rds.delete(shards[target].key("dead"))
    rds.rpush(shards[0].key("dead"), raw)
    return shards, raw, 0, target


def _assert_requeued_once(rds: redis.Redis, shards: FrontierShards, target: int) -> None:
    assert _dead(rds, "quotes", 3) == [0, 0, 0]
    queued = _queued(rds, "quotes", 3)
    assert queued[target] == 1 and sum(queued) == 1
    [lease] = cast("list[Any]", shards[target].lease_many(["check#1:0"]))
    assert entry_fields(lease.data)["u"].endswith("/moved")
    assert requeue(shards) == (0, 0)


def test_a_dead_letter_kept_in_another_shard_is_requeued_into_its_sites_shard_once(
    redis_url: str, rds: redis.Redis
) -> None:
    shards, _, _, target = _letter_in_the_wrong_shard(redis_url, rds)
    assert requeue(shards) == (1, 0)
    _assert_requeued_once(rds, shards, target)


@pytest.mark.parametrize("cut_after", ["claimed", "copied", "pushed"])
def test_a_requeue_cut_off_between_shards_is_finished_by_the_next_one_exactly_once(
    redis_url: str, rds: redis.Redis, cut_after: str
) -> None:
    """The states a crash (or a lost reply) can leave a move in: the next
    requeue neither loses the request nor queues it twice."""
    shards, raw, source, target = _letter_in_the_wrong_shard(redis_url, rds)
    record = load_record(raw)
    marked = json.dumps({**record, MOVING: "t0ken"}, ensure_ascii=False).encode()
    # Step 1: claimed in its list, the marked copy appended in one call.
    done = shards[source].commit(Commit(claim=raw, dead=[marked]))
    assert done is not None and done.claimed
    if cut_after in ("copied", "pushed"):  # step 2: the copy in its site's shard
        rds.rpush(shards[target].key("dead"), marked)
    if cut_after == "pushed":  # step 3: claimed there, pushed, marker set
        push = requeue_push(record)
        assert push is not None
        done = shards[target].commit(
            Commit(pushes=[push], claim=marked, marker=("requeue#t0ken", 1))
        )
        assert done is not None and done.claimed
    # Listed once, wherever its copies are.
    assert len(list(dead_letters(shards))) == 1
    requeued, kept = requeue(shards)
    assert (requeued, kept) == ((0, 0) if cut_after == "pushed" else (1, 0))
    _assert_requeued_once(rds, shards, target)


# -- dupefilters outside the scheduler, and SCHEDULER_PERSIST off ----------------------


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("dupefilter", [SET, BLOOM])
def test_request_seen_outside_a_crawl_agrees_with_the_crawl(
    redis_url: str, rds: redis.Redis, shards: int, dupefilter: str
) -> None:
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Quotes, FRONTIER_SHARDS=shards, DUPEFILTER_CLASS=dupefilter,
        FRONTIER_BLOOM_CAPACITY=10_000,
    )
    sites = _sites(shards)
    crawled = [Request(f"https://{site}/a") for site in sites]
    for request in crawled:
        assert scheduler.enqueue_request(request)
    assert scheduler.flush_outbox()
    assert sum(_queued(rds, "quotes", shards)) == len(sites)

    df = build_from_crawler(scheduler.df.__class__, crawler)
    assert all(df.request_seen(Request(r.url)) for r in crawled)  # the crawl's records
    fresh = [Request(f"https://{site}/b") for site in sites]
    assert not any(df.request_seen(r) for r in fresh)
    # ... recorded where the crawl looks: the scheduler drops them now.
    for request in fresh:
        scheduler.enqueue_request(request)
    scheduler.enqueuer.seen.clear()
    assert scheduler.flush_outbox()
    assert sum(_queued(rds, "quotes", shards)) == len(sites)

    prefixes = shard_prefixes("quotes", shards)
    fingerprint = crawler.request_fingerprinter.fingerprint
    if isinstance(df, BloomDupeFilter):
        fps = [fingerprint(r) for r in fresh]
        assert df.contains(fps, sites=[site_of(r) for r in fresh]) == [True] * len(fresh)
        if shards > 1:
            with pytest.raises(ValueError, match="pass sites="):
                df.contains(fps)
            assert all(rds.exists(p + "bloom") for p in prefixes)
        loaded = [fingerprint(Request(f"https://{site}/c")) for site in sites]
        df.load(loaded, sites=sites)
        assert df.contains(loaded, sites=sites) == [True] * len(sites)
    else:
        assert isinstance(df, FrontierDupeFilter)
        for request in fresh:
            key = prefixes[shard_of(site_of(request), shards)] + "dupefilter"
            assert rds.sismember(key, fingerprint(request))
        assert sum(int(rds.scard(p + "dupefilter")) for p in prefixes) == 2 * len(sites)


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("dupefilter", [SET, BLOOM])
def test_without_scheduler_persist_a_closing_worker_clears_every_shards_dupefilter(
    redis_url: str, rds: redis.Redis, shards: int, dupefilter: str
) -> None:
    scheduler, _ = harness.open_scheduler(
        redis_url, _Quotes, FRONTIER_SHARDS=shards, DUPEFILTER_CLASS=dupefilter,
        FRONTIER_BLOOM_CAPACITY=10_000, SCHEDULER_PERSIST=False,
    )
    for site in _sites(shards):
        scheduler.enqueue_request(Request(f"https://{site}/a"))
    assert scheduler.flush_outbox()
    kind = "bloom" if dupefilter == BLOOM else "dupefilter"
    prefixes = shard_prefixes("quotes", shards)
    assert all(rds.exists(p + kind) for p in prefixes)
    scheduler.close("finished")
    assert [k for k in rds.scan_iter(match="*quotes*") if b"bloom" in k or b"dupefilter" in k] == []
    assert sum(_queued(rds, "quotes", shards)) == 0


# -- an idle worker waiting for a dead worker's leases ----------------------------------


def test_an_idle_worker_counts_a_dead_workers_leases_in_every_shard(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    ghost = FrontierShards.build(rds, "quotes", 3, lease_timeout=30.0)
    sites = _sites(3, per_shard=1)
    ids = []
    for n, site in enumerate(sites):
        frontier = ghost.for_site(site)
        frontier.push(json.dumps({"u": f"https://{site}/x"}).encode(), site=site, priority=0,
                      fingerprint=None, dont_filter=True)
        ids.append(f"ghost-w#dead0001:{n}")
        assert isinstance(frontier.lease_many([ids[-1]]), list)
    seconds, micros = cast("tuple[int, int]", rds.time())
    now_ms = seconds * 1000 + micros // 1000
    for frontier in ghost:
        rds.zadd(frontier.key("alive"), {"ghost-w#dead0001": now_ms - 12_000})

    scheduler, _ = harness.open_scheduler(
        redis_url, _Quotes, FRONTIER_SHARDS=3, FRONTIER_LEASE_TIMEOUT=20.0
    )
    assert harness.lease_all(scheduler) == []
    caplog.set_level(logging.INFO, logger="crawler.frontier.waiting")
    for _ in range(2):
        assert scheduler.has_pending_requests()
    told = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Waiting")]
    assert len(told) == 1, told
    assert "Waiting for 3 leases held by worker ghost-w (holder ghost-w#dead0001" in told[0]


# -- scrapy frontier clear: starting again with another shard count ----------------------


@pytest.mark.workers
def test_frontier_clear_deletes_every_shard_so_the_crawl_can_start_with_another_count(
    redis_url: str, rds: redis.Redis, env: dict[str, str]
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Quotes, FRONTIER_SHARDS=3)
    for site in _sites(3):
        scheduler.enqueue_request(Request(f"https://{site}/a"))
        scheduler.dead_letter(Request(f"https://{site}/dead"), "gave up")
    assert scheduler.flush_outbox()
    rds.lpush("quotes:start_urls", "https://seed.example/")
    rds.hset("{quotes}:stats", "item_scraped_count", 3)
    rds.set("{quotes}:control", "paused")
    before = {k for k in rds.scan_iter() if b"quotes:" in k}
    assert any(k.startswith(b"{quotes:") and b"}:" in k for k in before)

    refused = _scrapy(env, "frontier", "clear", "quotes")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert {k for k in rds.scan_iter() if b"quotes:" in k} == before

    # Run with the new count: the recorded one (3) is cleared too.
    done = _scrapy(env, "frontier", "clear", "quotes", "--yes", "-s", "FRONTIER_SHARDS=2")
    assert done.returncode == 0, done.stderr
    assert "cleared the frontier of quotes" in done.stdout
    left = sorted(k for k in rds.scan_iter() if b"quotes" in k)
    assert left == [b"quotes:start_urls", b"{quotes}:control", b"{quotes}:stats"]

    _, crawler = harness.open_scheduler(redis_url, _Quotes, FRONTIER_SHARDS=2)
    assert config_error_of(crawler) is None
    assert rds.get("{quotes}:shards") == b"2"


@pytest.mark.workers
def test_clear_is_refused_while_a_worker_of_the_crawl_is_live(
    redis_url: str, rds: redis.Redis, env: dict[str, str]
) -> None:
    """A live worker writes the keys again as they are deleted (and records
    no shard count): clear waits for the crawl to stop."""
    scheduler, _ = harness.open_scheduler(redis_url, _Quotes, FRONTIER_SHARDS=3)
    scheduler.enqueue_request(Request("https://a.example/x"))
    assert scheduler.flush_outbox()
    rds.hset("{quotes}:workers", "host:1", json.dumps({"last_heartbeat": time.time()}))
    refused = _scrapy(env, "frontier", "clear", "quotes", "--yes")
    assert refused.returncode == 2
    assert "1 worker(s) of quotes are live (host:1)" in refused.stderr
    assert rds.get("{quotes}:shards") == b"3"
    rds.hset("{quotes}:workers", "host:1", json.dumps({"last_heartbeat": time.time() - 600}))
    done = _scrapy(env, "frontier", "clear", "quotes", "--yes")
    assert done.returncode == 0, done.stderr
    assert not rds.exists("{quotes}:shards")


@pytest.mark.workers
def test_override_commands_use_the_recorded_shard_count(
    redis_url: str, rds: redis.Redis, env: dict[str, str]
) -> None:
    harness.open_scheduler(redis_url, _Quotes, FRONTIER_SHARDS=3)
    site = next(s for s in _sites(3) if shard_of(s, 3) == 2)
    done = _scrapy(env, "frontier", "delay", "quotes", site, "2")
    assert done.returncode == 0, done.stderr
    key = shard_prefixes("quotes", 3)[2] + "delay"
    assert rds.hget(key, site) == b"2000"
    assert not rds.exists("{quotes}:delay")
    listed = _scrapy(env, "frontier", "overrides", "quotes")
    assert key in listed.stdout and site in listed.stdout


@pytest.mark.workers
@pytest.mark.parametrize("value", ["0", "abc", "1000"])
def test_commands_refuse_a_bad_shard_count_before_touching_redis(
    rds: redis.Redis, env: dict[str, str], value: str
) -> None:
    rds.set("{quotes}:count", 5)
    for args in (("frontier", "clear", "quotes", "--yes"), ("deadletters", "purge", "quotes")):
        done = _scrapy(env, *args, "-s", f"FRONTIER_SHARDS={value}")
        assert done.returncode == 2
        assert f"Bad setting: FRONTIER_SHARDS={value}" in done.stderr
    assert rds.get("{quotes}:count") == b"5"
