"""Lost replies, refusals and restarts on a sharded frontier
(``FRONTIER_SHARDS`` > 1), in process, through the fault proxy in front of
a real Redis: one round trip carries commits to several shards and a lease,
and whatever of it ran is found out, shard by shard. (Whole sharded crawls
of ``scrapy crawl`` workers under faults: ``tests/test_sharded_crawl_faults.py``.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request, Spider

from crawler.commands.deadletters import MOVING, dead_letters, requeue
from crawler.frontier.connection import no_retries
from crawler.frontier.luasource import script_source
from crawler.frontier.serializer import entry_fields
from crawler.frontier.shards import FrontierShards
from crawler.keys import shard_of, shard_prefixes
from tests import scheduler_harness as harness
from tests.faultproxy import FaultProxy
from tests.test_shards import _Sites, served_sites
from tests.test_shards_ops import _sites
from tests.waiting import wait_for
from tests.workers import start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator

    from crawler.frontier.scheduler import FrontierScheduler

pytestmark = [pytest.mark.usefixtures("stop_heartbeats"), pytest.mark.faults]

LUA = Path(__file__).resolve().parent.parent / "crawler" / "frontier" / "lua"
SHARDS = 3


class _Spider(Spider):
    name = "sf"


@pytest.fixture
def proxy(redis_url: str, rds: redis.Redis) -> Iterator[FaultProxy]:
    rds.script_flush()
    with FaultProxy(redis_url) as fault_proxy:
        yield fault_proxy


def _sum(rds: redis.Redis, read: Any) -> int:
    return sum(int(read(p) or 0) for p in shard_prefixes("sf", SHARDS))


def _open(url: str, **settings: Any) -> FrontierScheduler:
    scheduler, _ = harness.open_scheduler(
        url, _Spider, FRONTIER_SHARDS=SHARDS, CONCURRENT_REQUESTS=4,
        REDIS_PARAMS={"socket_timeout": 0.5, "socket_connect_timeout": 2}, **settings,
    )
    return scheduler


def _drain(scheduler: FrontierScheduler, n: int) -> list[Request]:
    """Lease ``n`` requests (a shard found empty is asked again within a second)."""
    out: list[Request] = []
    while len(out) < n:
        out.append(harness.wait_for_request(scheduler, 3.0))
    assert scheduler.next_request() is None
    return out


def _remove(scheduler: FrontierScheduler, request: Request) -> None:
    """What the engine does once done with ``request``, without sending the outbox."""
    scheduler._download_ended(request)
    scheduler.crawler.engine._slot.remove_request(request)


def _writes_for_every_shard(scheduler: Any) -> tuple[list[Request], list[str]]:
    """Queue two requests on sites of every shard and lease them all, finish
    half of them, and queue one more request per site: the outbox then has
    acks and pushes for every shard. Returns the leased requests and the
    later URLs."""
    sites = _sites(SHARDS)
    first = [f"https://{s}/a{i}" for s in sites for i in range(2)]
    for url in first:
        assert scheduler.enqueue_request(Request(url))
    assert scheduler.flush_outbox()
    leased = harness.lease_all(scheduler)
    assert len(leased) == len(first)
    for request in leased[: len(leased) // 2]:
        _remove(scheduler, request)
    later = [f"https://{s}/b" for s in sites]
    for url in later:
        assert scheduler.enqueue_request(Request(url))
    return leased, later


@pytest.mark.parametrize("mode", ["drop", "hold"])
def test_a_round_trip_of_commits_to_every_shard_and_a_lease_whose_reply_is_lost(
    proxy: FaultProxy, rds: redis.Redis, mode: str
) -> None:
    scheduler = _open(proxy.url)
    # Acks in every shard and new requests for every shard, in one outbox.
    leased, later = _writes_for_every_shard(scheduler)
    shards_written = {op.shard for op in scheduler.outbox.ops}
    assert shards_written == set(range(SHARDS))
    rule = proxy.lose_replies(script=(LUA / "lease.lua").read_text(), mode=mode, hold=5)
    assert scheduler.next_request() is None  # lost
    assert rule.acted == 1
    assert scheduler.session.in_doubt is not None
    assert len(scheduler.session.in_doubt.commits) == SHARDS
    scheduler.session.down_until = 0.0
    got = harness.lease_all(scheduler)
    rest = leased[len(leased) // 2:]
    # nothing queued twice, nothing acked twice; the leases found out
    urls = sorted(r.url for r in got)
    assert len(urls) == len(set(urls))
    assert set(urls) <= set(later)
    for request in [*rest, *got]:
        harness.finish(scheduler, request)
    got2 = _drain(scheduler, len(later) - len(got))
    assert sorted([*urls, *(r.url for r in got2)]) == sorted(later)
    for request in got2:
        harness.finish(scheduler, request)
    assert scheduler.queue.shards.audit() == {}
    assert _sum(rds, lambda p: rds.zcard(p + "leases")) == 0
    assert _sum(rds, lambda p: rds.get(p + "count")) == 0


def test_a_lost_round_trip_where_one_shards_commit_was_refused(
    proxy: FaultProxy, rds: redis.Redis
) -> None:
    scheduler = _open(proxy.url)
    leased, later = _writes_for_every_shard(scheduler)
    broken = shard_prefixes("sf", SHARDS)[2] + "count"
    saved = rds.get(broken)
    rds.set(broken, "x")
    scheduler.router.turn = 0
    rule = proxy.lose_replies(script=(LUA / "lease.lua").read_text())
    assert scheduler.next_request() is None
    assert rule.acted == 1
    doubt = scheduler.session.in_doubt
    assert doubt is not None and doubt.lease_shard != 2
    scheduler.session.down_until = 0.0
    got = harness.lease_all(scheduler)  # found out; shard 2's commit refused again
    assert scheduler.session.in_doubt is None
    assert {op.shard for op in scheduler.outbox.ops} == {2}
    if saved is None:
        rds.delete(broken)
    else:
        rds.set(broken, saved)
    scheduler.session.down_until = 0.0
    assert scheduler.flush_outbox()
    for request in [*leased[len(leased) // 2:], *got]:
        harness.finish(scheduler, request)
    more = _drain(scheduler, len(later) - len(got))
    urls = sorted([*(r.url for r in got), *(r.url for r in more)])
    assert urls == sorted(later)
    for request in more:
        harness.finish(scheduler, request)
    assert scheduler.queue.shards.audit() == {}


@pytest.mark.parametrize("kept", [None, "commit.lua", "lease.lua"])
def test_scripts_forgotten_before_a_round_trip_of_every_shard_each_call_runs_once(
    proxy: FaultProxy, rds: redis.Redis, kept: str | None
) -> None:
    """Redis forgot the scripts (all, or all but one: a call of the round
    trip ran, the others met NOSCRIPT): the calls that did not run are sent
    once more, the others are not."""
    scheduler = _open(proxy.url)
    leased, later = _writes_for_every_shard(scheduler)
    rds.script_flush()
    if kept is not None:
        rds.script_load(script_source(kept))
    commit = (LUA / "commit.lua").read_text()
    before = len(proxy.commands(script=commit))
    got = harness.lease_all(scheduler)
    assert scheduler.session.in_doubt is None and not scheduler.outbox.ops
    sent = proxy.commands(script=commit)[before:]
    # each shard's commit once, plus once more for the ones that met NOSCRIPT
    assert len(sent) == SHARDS * (1 if kept == "commit.lua" else 2)
    for request in [*leased[len(leased) // 2:], *got]:
        harness.finish(scheduler, request)
    more = _drain(scheduler, len(later) - len(got))
    assert sorted([*(r.url for r in got), *(r.url for r in more)]) == sorted(later)
    for request in more:
        harness.finish(scheduler, request)
    assert scheduler.queue.shards.audit() == {}
    assert _sum(rds, lambda p: rds.zcard(p + "leases")) == 0


@pytest.mark.parametrize("shards", [1, SHARDS])
def test_a_lease_that_ran_before_a_resent_commit_is_sent_again(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """Redis forgot every script but the lease: in one round trip the
    commit carrying a new request met NOSCRIPT and the lease after it ran on
    a frontier without that request ("nothing queued"). The commit is sent
    again, and so is the lease, after it: the request is handed out by that
    same next_request, not a second or more later (the shard was taken as
    empty)."""
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4
    )
    assert scheduler.next_request() is None  # every shard found empty
    assert scheduler.enqueue_request(Request("https://late.example/a"))
    rds.script_flush()
    rds.script_load(script_source("lease.lua"))
    request = scheduler.next_request()
    assert request is not None and request.url == "https://late.example/a"
    assert not scheduler.outbox.ops and scheduler.session.in_doubt is None
    harness.finish(scheduler, request)
    assert scheduler.queue.shards.audit() == {}


# -- real workers ------------------------------------------------------------------------

PAGES = 5


@pytest.fixture
def slow_sites() -> Iterator[_Sites]:
    """Many sites on one port, each page linking to ``/p1`` ... ``/p4``,
    served in 0.2 s."""
    with served_sites(pages=PAGES, delay=0.2) as server:
        yield server


def _held(rds: redis.Redis, shards: int, holder: str) -> dict[int, list[str]]:
    """The URLs leased by ``holder`` (a worker id), by shard."""
    out: dict[int, list[str]] = {}
    for i, p in enumerate(shard_prefixes("pages", shards)):
        for lease_id, entry in rds.hgetall(p + "ldata").items():
            if lease_id.decode().startswith(holder + "#"):
                _, site, data = entry.split(b"\t", 2)
                if data[:1] == b"#":
                    data = data[1:].partition(b"#")[2]
                url = entry_fields(data)["u"]
                out.setdefault(i, []).append(
                    url if "://" in url else f"http://{site.decode()}{url}"
                )
    return out


@pytest.mark.workers
def test_a_worker_killed_with_leases_in_several_shards_and_restarted_under_its_id(
    proxy: FaultProxy, rds: redis.Redis, mongo_uri: str, mongo_db: str, db: Any,
    slow_sites: _Sites, tmp_path: Path,
) -> None:
    """3 shards, 12 sites: w1 is SIGKILLed while it holds leases in at
    least two shards and restarted at once under its id, with a second
    worker. Every page is stored once; only what w1 held when killed is
    fetched twice; every shard's audit is clean, nothing dead-lettered."""
    shards, n = 3, 12
    rds.lpush("pages:start_urls", *slow_sites.urls(n))
    env = worker_env(proxy.url, mongo_uri, mongo_db)
    settings = {"FRONTIER_SHARDS": shards, "FRONTIER_LEASE_TIMEOUT": 4,
                "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 6,
                "REDIS_PARAMS": '{"socket_timeout": 1.5, "socket_connect_timeout": 1.5}'}
    logs: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []

    def start(worker: str) -> subprocess.Popen[bytes]:
        logs.append(tmp_path / f"{worker}-{len(logs)}.log")
        proc = start_worker("pages", env, logs[-1], {**settings, "FRONTIER_WORKER_ID": worker})
        procs.append(proc)
        return proc

    first = start("w1")  # alone: w2 starts with the new w1
    held: dict[int, list[str]] = {}

    def in_two_shards() -> bool:
        # (after its seed batch was deleted, and robots.txt of every site
        # stored: a kill before returns the seeds, crawled again then, or
        # leaves a robots.txt lock that holds its site for 60 s)
        nonlocal held
        held = _held(rds, shards, "w1")
        robots = sum(rds.hlen(p + "robots") for p in shard_prefixes("pages", shards))
        return (len(held) >= 2 and robots == n
                and not rds.keys("{pages:start_urls}:intake:*"))

    wait_for(in_two_shards, 30, "w1 to hold leases in two shards", 0.01)
    first.kill()
    first.wait(10)
    # (what it held when the kill landed: read again, it may have leased more)
    held = _held(rds, shards, "w1")
    start("w1")
    start("w2")
    finished = wait_workers(procs[1:], logs[1:], 60)

    assert [w.returncode for w in finished] == [0, 0], [w.log[-3000:] for w in finished]
    assert db.pages.count_documents({}) == n * PAGES
    assert len(db.pages.distinct("url")) == n * PAGES
    pages = {k: v for k, v in slow_sites.hits.items() if k[1] != "/robots.txt"}
    assert len(pages) == n * PAGES
    twice = sorted(f"http://{h}{p}" for (h, p), v in pages.items() if v > 1)
    assert set(twice) <= {u for urls in held.values() for u in urls}, (twice, held)
    frontier = FrontierShards.build(rds, "pages", shards)
    assert frontier.audit() == {}
    assert [rds.llen(p + "dead") for p in shard_prefixes("pages", shards)] == [0] * shards


# -- dead letters moved between shards ---------------------------------------------------


@pytest.mark.parametrize("step", [1, 2, 3, 4])
def test_a_requeue_whose_reply_is_lost_at_any_step_of_a_move_queues_the_request_once(
    proxy: FaultProxy, rds: redis.Redis, redis_url: str, step: int
) -> None:
    """A dead letter kept in shard 0 whose site is in another shard: the
    reply of each step of its move (claim and mark, copy, claim and push,
    claim the mark) lost in turn; the next requeue finishes it, once."""
    scheduler = _open(redis_url)
    site = next(s for s in _sites(SHARDS) if shard_of(s, SHARDS) != 0)
    target = shard_of(site, SHARDS)
    scheduler.dead_letter(Request(f"https://{site}/moved", priority=3), "gave up")
    assert scheduler.flush_outbox()
    prefixes = shard_prefixes("sf", SHARDS)
    [raw] = rds.lrange(prefixes[target] + "dead", 0, -1)
    rds.delete(prefixes[target] + "dead")
    rds.rpush(prefixes[0] + "dead", raw)  # as one written with no site
    through = redis.Redis.from_url(proxy.url, retry=no_retries(), socket_timeout=2)
    lossy = FrontierShards.build(through, "sf", SHARDS)
    lossy.load_scripts()
    commit = (LUA / "commit.lua").read_text()
    if step == 2:
        rule = proxy.lose_replies(command="RPUSH")  # (the EXEC of its transaction)
    else:
        rule = proxy.lose_replies(script=commit, skip={1: 0, 3: 1, 4: 2}[step])
    if step == 2:
        # redis-py runs a WATCH transaction whose reply was lost again (it
        # raises WatchError for it): the copy is found there, not made twice.
        assert requeue(lossy) == (1, 0)
    else:
        with pytest.raises(redis.ConnectionError):
            requeue(lossy)
    assert rule.acted == 1
    requeue(FrontierShards.build(rds, "sf", SHARDS))
    assert [rds.llen(p + "dead") for p in prefixes] == [0] * SHARDS
    queued = [int(rds.get(p + "count") or 0) for p in prefixes]
    assert queued[target] == 1 and sum(queued) == 1
    assert requeue(FrontierShards.build(rds, "sf", SHARDS)) == (0, 0)


def test_a_move_cut_off_into_a_lower_shard_is_finished_and_its_first_copy_claimed(
    rds: redis.Redis,
) -> None:
    """A dead letter of a site of shard 0 on its way from shard 2, cut off
    after its copy reached shard 0 (step 2): the next requeue pushes it and
    claims the marked copy left in shard 2 too, so nothing is listed after
    it, and a requeue after the marker's day queues nothing again."""
    shards = FrontierShards.build(rds, "sf", SHARDS)
    shards.load_scripts()
    site = next(s for s in _sites(SHARDS) if shard_of(s, SHARDS) == 0)
    record = {"url": f"https://{site}/x", "reason": "gave up",
              "request": json.dumps({"u": f"https://{site}/x"})}
    marked = json.dumps({**record, MOVING: "t0ken"}).encode()
    rds.rpush(shards[2].key("dead"), marked)  # step 1 ran there
    rds.rpush(shards[0].key("dead"), marked)  # step 2 ran
    assert requeue(shards) == (1, 0)
    prefixes = shard_prefixes("sf", SHARDS)
    assert [rds.llen(p + "dead") for p in prefixes] == [0] * SHARDS
    assert list(dead_letters(shards)) == []
    rds.delete(shards[0].marker_key("requeue#t0ken"))  # a day later
    assert requeue(shards) == (0, 0)
    assert [int(rds.get(p + "count") or 0) for p in prefixes] == [1, 0, 0]


def _page_with_a_child_elsewhere(scheduler: FrontierScheduler, shards: int) -> tuple[str, str]:
    """Lease a page of a shard-0 site, then do what the engine does with
    it: its download ends, its callback yields a request for a site of the
    last shard, the page is finished (its ack queued). Nothing is sent.
    Returns the page's URL and its child's."""
    sites = _sites(shards, per_shard=1)
    page, child = f"https://{sites[0]}/page", f"https://{sites[-1]}/child"
    assert scheduler.enqueue_request(Request(page))
    assert scheduler.flush_outbox()
    leased = harness.wait_for_request(scheduler, 3.0)
    assert leased.url == page
    scheduler._download_ended(leased)
    assert scheduler.enqueue_request(Request(child))
    scheduler.crawler.engine._slot.remove_request(leased)
    assert [(op.kind, op.shard) for op in scheduler.outbox.ops] == [
        ("slots", 0), ("pushes", shards - 1), ("acks", 0)]
    return page, child


def test_an_ack_is_never_committed_while_its_pages_request_for_another_shard_is_refused(
    redis_url: str, rds: redis.Redis
) -> None:
    """Two shards on one Redis: the commit for the shard of a page's child
    is refused while the page's own shard answers; the worker then stops
    without sending more (a SIGKILL). A new worker gets the page again
    once its lease expires (its ack was held back): the child is not lost."""
    settings = {"FRONTIER_SHARDS": 2, "FRONTIER_LEASE_TIMEOUT": 1}
    first, _ = harness.open_scheduler(redis_url, _Spider, **settings)
    page, child = _page_with_a_child_elsewhere(first, 2)
    broken = shard_prefixes("sf", 2)[1] + "count"
    saved = rds.get(broken)
    rds.set(broken, "x")  # commit.lua on shard 1 refuses before it writes
    assert not first.flush_outbox()
    assert [op.kind for op in first.outbox.ops] == ["pushes", "acks"]
    assert first.stats.get_value("frontier/redis/refused") == 1
    # (the worker is killed: its outbox is never sent)
    if saved is None:
        rds.delete(broken)
    else:
        rds.set(broken, saved)
    second, _ = harness.open_scheduler(redis_url, _Spider, **settings)
    again = harness.wait_for_request(second, 5.0)  # once the lease expired
    assert again.url == page
    harness.finish(second, again)
    assert second.next_request() is None
    del child  # (its commit was refused: the page yields it again when crawled)


@pytest.mark.parametrize("shards", [1, 2])
def test_an_ack_goes_one_round_trip_after_its_pages_requests_for_another_shard(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    """Every call answered: with two shards one flush sends the child's
    commit and the slot, then the ack in a second round trip; with one
    shard all in one. The outbox is then empty and the child queued."""
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=shards)
    _, child = _page_with_a_child_elsewhere(scheduler, shards)
    seq = scheduler.session.seq
    assert scheduler.flush_outbox()
    assert not scheduler.outbox.ops and scheduler.outbox.acks_held == 0
    assert scheduler.session.seq == seq + shards  # round trips of commits
    assert scheduler.stats.get_value("frontier/leases/acked") == 1
    got = harness.wait_for_request(scheduler, 3.0)
    assert got.url == child
    harness.finish(scheduler, got)
    assert scheduler.queue.shards.audit() == {}
    assert _sum_of(rds, shards, lambda p: rds.zcard(p + "leases")) == 0


def _sum_of(rds: redis.Redis, shards: int, read: Any) -> int:
    return sum(int(read(p) or 0) for p in shard_prefixes("sf", shards))
