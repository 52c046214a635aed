"""The frontier's scripts and scheduler when Redis is not well behaved, in
process against a real Redis: ids reused, bad values and wrong types, poison
requests, lost replies, dead letters raced. (Whole crawls under the same
faults, through a proxy that loses replies: tests/test_faults.py.)"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from scrapy import Request, Spider

from crawler.commands.deadletters import purge, requeue
from crawler.frontier import serializer
from crawler.frontier.audit import repair_damage
from crawler.frontier.protocol import Damage
from crawler.frontier.store import Commit, Frontier, Lease, NotDue, Push
from crawler.keys import shard_prefixes
from tests import scheduler_harness as harness
from tests.scheduler_harness import finish, lease_all
from tests.waiting import wait_for

if TYPE_CHECKING:

    from crawler.frontier.scheduler import FrontierScheduler

pytestmark = [pytest.mark.usefixtures("stop_heartbeats"), pytest.mark.faults]


class _Spider(Spider):
    name = "t"


class _AckSpider(Spider):
    name = "ack"


def _frontier(rds: redis.Redis, **kwargs: Any) -> Frontier:
    frontier = Frontier(rds, "t", **{"default_concurrency": 8, **kwargs})
    frontier.load_scripts()
    return frontier


def _push(frontier: Frontier, url: str, priority: int = 0) -> None:
    site = url.split("/")[2]
    assert frontier.push(url.encode(), site=site, priority=priority,
                         fingerprint=url.encode(), dont_filter=False)


def _leased(result: list[Lease] | NotDue) -> list[Lease]:
    assert isinstance(result, list), result
    return result


def _until_expired(rds: redis.Redis, key: str = "{t}:leases") -> None:
    """Wait until every lease's deadline has passed on Redis's clock."""

    def expired() -> bool:
        seconds, micros = rds.time()
        last = rds.zrange(key, -1, -1, withscores=True)
        return not last or last[0][1] < seconds * 1000 + micros // 1000

    wait_for(expired, 5, "the leases to expire", 0.005)


def _ack_all(frontier: Frontier) -> None:
    """Lease and acknowledge everything due, until nothing is."""
    n = 0
    while isinstance(result := frontier.lease_many([f"drain#x:{n}"]), list):
        frontier.ack([lease.lease_id for lease in result])
        n += 1


# -- lease ids ----------------------------------------------------------------------


def test_a_lease_id_that_exists_is_refused_before_anything_is_written(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    for i in range(4):
        _push(frontier, f"https://a.example/{i}")
    first = _leased(frontier.lease_many(["w1#a:0", "w1#a:1"]))
    with pytest.raises(ResponseError, match="w1#a:0 exists already"):
        frontier.lease_many(["w1#a:0", "w1#a:1"])
    # The first leases are intact; the queue kept the two others.
    assert rds.zcard("{t}:leases") == 2
    assert int(rds.get("{t}:count") or 0) == 2
    assert {e.decode().rsplit("#", 1)[-1] for e in rds.hvals("{t}:ldata")} == {
        lease.data.decode() for lease in first
    }


def test_a_worker_restarted_under_the_same_id_gets_lease_ids_of_its_own(
    redis_url: str, rds: redis.Redis
) -> None:
    settings = {"FRONTIER_WORKER_ID": "w1", "FRONTIER_CONCURRENCY": 20}
    first, _ = harness.open_scheduler(redis_url, _Spider, **settings)
    for i in range(10):
        first.enqueue_request(Request(f"https://a.example/{i}"))
    assert first.flush_outbox()
    held = lease_all(first)
    # The process dies (no close); a new "w1" starts at once.
    second, _ = harness.open_scheduler(redis_url, _Spider, **settings)
    assert first.holder != second.holder
    assert first.holder.startswith("w1#") and second.holder.startswith("w1#")
    for i in range(10, 20):
        second.enqueue_request(Request(f"https://a.example/{i}"))
    assert second.flush_outbox()
    again = lease_all(second)
    assert (len(held), len(again)) == (10, 10)
    assert rds.zcard("{t}:leases") == len(held) + len(again)
    urls = {r.url for r in held} | {r.url for r in again}
    assert len(urls) == len(held) + len(again)  # no lease overwritten


# -- bad values ---------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [
    ("{t}:delay", "2s"), ("{t}:conc", "1O"), ("{t}:conc", "-1"), ("{t}:conc", ""),
    ("{t}:conc", "0"), ("{t}:delay", "-5"), ("{t}:delay", "nan"), ("{t}:slow", "x"),
    ("{t}:rdelay", "1e3"),
])
def test_a_bad_override_falls_back_to_the_default_and_is_reported(
    rds: redis.Redis, key: str, value: str
) -> None:
    frontier = _frontier(rds, default_concurrency=2)
    rds.hset(key, "a.example", value)
    for i in range(5):
        _push(frontier, f"https://a.example/{i}")
    leases = _leased(frontier.lease_many([f"w#a:{i}" for i in range(5)]))
    # The default concurrency (2) holds; nothing was taken off and lost.
    assert len(leases) == 2
    assert any(key in p and json.dumps(value) in p for p in leases[0].problems), leases[0]
    assert int(rds.get("{t}:count") or 0) == 3
    frontier.ack([lease.lease_id for lease in leases])
    # A push meets the same value and queues once.
    assert frontier.push_many([Push(b"https://a.example/new", "a.example", 0, b"n", False)]) == [
        True
    ]
    assert int(rds.get("{t}:count") or 0) == 4
    rds.hdel(key, "a.example")
    _ack_all(frontier)
    assert frontier.audit() == {}


@pytest.mark.parametrize("key", ["{t}:delay", "{t}:conc", "{t}:robots", "{t}:slow"])
def test_an_override_key_of_the_wrong_type_is_reported_and_ignored(
    rds: redis.Redis, key: str
) -> None:
    frontier = _frontier(rds, robots_gate=key == "{t}:robots")
    rds.set(key, "2000")
    _push(frontier, "https://a.example/0")
    [lease] = _leased(frontier.lease_many(["w#a:0"]))
    assert any(key in p and "not a hash" in p for p in lease.problems)
    frontier.ack([lease.lease_id])
    assert frontier.audit() == {}


@pytest.mark.parametrize(("key", "value"), [
    ("{t}:active", "a list"), ("{t}:leases", "a string"), ("{t}:count", "12x"),
])
def test_a_frontier_key_of_the_wrong_type_refuses_the_call_and_writes_nothing(
    rds: redis.Redis, key: str, value: str
) -> None:
    frontier = _frontier(rds)
    _push(frontier, "https://a.example/0")
    before = {k: rds.dump(k) for k in rds.keys("{t}:*")}
    if value == "a list":
        rds.delete(key)
        rds.rpush(key, "x")
    else:
        rds.delete(key)
        rds.set(key, value)
    bad = rds.dump(key)
    with pytest.raises(ResponseError, match=r"frontier key \{t\}:"):
        frontier.lease_many(["w#a:0"])
    # A commit that would write the key refuses too (acks write the slot
    # counters and the leases; every push writes the count).
    with pytest.raises(ResponseError, match=r"frontier key \{t\}:"):
        frontier.commit(Commit(
            pushes=[Push(b"https://a.example/1", "a.example", 0, b"1", False)] * (
                key == "{t}:count"),
            acks=["w#a:9"],
        ))
    after = {k: rds.dump(k) for k in rds.keys("{t}:*")}
    assert after == {**before, key.encode(): bad}


def test_a_malformed_queue_index_is_left_reported_and_the_push_waits_for_the_repair(
    rds: redis.Redis,
) -> None:
    """A queue's bounds in ``{s}:qm`` that the frontier never writes: the
    scripts leave them as they are and name them in the reply (``damaged``);
    a push meant for that queue waits in the retry set meanwhile (pending,
    not dead-lettered). The worker's repair (the audit's) rebuilds them, and
    every request is leased: none is stranded."""
    frontier = _frontier(rds)
    ids = iter(range(1000))

    def leased() -> list[Lease] | None:
        result = frontier.lease_many([f"w#a:{next(ids)}"])
        return result if isinstance(result, list) else None

    rds.hset("{t}:qm", "a.example\t0", "not chunk numbers")  # and no chunk of it
    done = frontier.commit(Commit(pushes=[Push(b'{"u":"/x"}', "a.example", 0, b"1", False)]))
    assert done is not None and done.pushed == [True]
    assert done.damaged == (Damage("qm", "a.example\t0"),)
    assert rds.hget("{t}:qm", "a.example\t0") == b"not chunk numbers"
    assert rds.llen("{t}:dead") == 0
    assert frontier.pending() == 1
    assert all(x.repaired for x in repair_damage(frontier, done.damaged[0]))
    [lease] = wait_for(leased, 5, "the push, queued again once repaired", 0.05)
    assert lease.data == b'{"u":"/x"}'
    # Chunks under a malformed index are found again, not stranded.
    frontier.push_many([Push(b"/y", "b.example", 0, b"2", False)])
    rds.hset("{t}:qm", "b.example\t0", "7 3")
    result = frontier.lease_many([f"w#a:{next(ids)}"])
    assert isinstance(result, NotDue) and result.damaged == (Damage("qm", "b.example\t0"),)
    assert all(x.repaired for x in repair_damage(frontier, result.damaged[0]))
    [lease] = _leased(frontier.lease_many([f"w#a:{next(ids)}"]))
    assert lease.data == b"/y"
    assert rds.hlen("{t}:qc") == 0


@pytest.mark.parametrize("key", ["{t}:qm", "{t}:qc", "{t}:lv", "{t}:retries"])
def test_a_queue_hash_of_the_wrong_type_refuses_the_call_before_any_write(
    rds: redis.Redis, key: str
) -> None:
    frontier = _frontier(rds)
    rds.set(key, "not a hash")
    with pytest.raises(redis.ResponseError, match=f"frontier key {re.escape(key)} holds a string"):
        frontier.push_many([Push(b"/x", "a.example", 0, b"1", False)])
    with pytest.raises(redis.ResponseError, match="nothing was written"):
        frontier.lease_many(["w#1:1"])
    assert rds.exists("{t}:count", "{t}:dupefilter", "{t}:leases") == 0


def test_queued_entries_survive_an_unreadable_chunk_and_it_is_dead_lettered(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    entries = [f"/page/{i:04d}".encode() + b"x" * 200 for i in range(30)]
    frontier.push_many([Push(e, "a.example", 0, str(i).encode(), False)
                        for i, e in enumerate(entries)])
    assert rds.hlen("{t}:qc") > 2
    rds.hset("{t}:qc", "a.example\t0\t0", "garbage, not entries")
    got = []
    for n in range(40):
        result = frontier.lease_many([f"w#1:{n}"])
        if isinstance(result, NotDue):
            break
        got += [lease.data for lease in result]
        frontier.ack([lease.lease_id for lease in result])
    # (the count, left as it is by the scripts once every queue is empty,
    # is reported; the worker's repair, the audit's, resets it)
    assert isinstance(result, NotDue) and result.damaged == (Damage("count", ""),), result
    assert all(x.repaired for x in repair_damage(frontier, result.damaged[0]))
    [dead] = [json.loads(d) for d in rds.lrange("{t}:dead", 0, -1)]
    assert "holds an entry that cannot be read" in dead["reason"]
    assert dead["entry"] == "garbage, not entries"
    assert got and got == entries[len(entries) - len(got):]  # the rest, in order
    # The entries of the unreadable chunk were counted: the counters are
    # reset once every queue is empty (the repair above), so idle workers
    # see the crawl done.
    assert frontier.pending() == 0
    assert not rds.exists("{t}:prio")


def _poisoned(rds: redis.Redis, entry: bytes, site: str) -> list[dict[str, Any]]:
    """Queue ``entry`` on ``site`` and let its one lease expire past
    max_deliveries=1: the lease call after it dead-letters the entry (the
    frontier's own dead letter, with ``site`` and ``entry``). The dead
    letters."""
    frontier = _frontier(rds, lease_timeout=0.05, max_deliveries=1)
    assert frontier.push_many([Push(entry, site, 0, b"1", False)]) == [True]
    _leased(frontier.lease_many(["w#a:0"]))
    _until_expired(rds)
    result = frontier.lease_many(["v#b:0"])
    assert isinstance(result, NotDue) and result.dead == 1
    return [json.loads(d) for d in rds.lrange("{t}:dead", 0, -1)]


@pytest.mark.parametrize(
    ("entry", "url"),
    [
        (b"/x?y=1\tparse\t2", "https://a.example/x?y=1"),
        (b'!/x\t\t\t{"p":1}', "http://a.example/x"),
        (b"!/x", "http://a.example/x"),
        (b"https://b.example/y\tparse", "https://b.example/y"),
        (b'{"u":"/x","w":1,"c":"parse"}', "http://a.example/x"),  # written before the upgrade
        (b'{"u":"https://b.example/y"}', "https://b.example/y"),
        (b"!x", None),
        (b"no scheme\t\t1", None),
        (b"{not json", None),
    ],
)
def test_a_dead_letter_names_the_url_of_its_entry(
    rds: redis.Redis, entry: bytes, url: str | None
) -> None:
    [dead] = _poisoned(rds, entry, "a.example")
    assert dead.get("url") == url  # none when it cannot be read
    assert dead["entry"] == entry.decode()


def test_a_dead_letter_of_an_encoded_request_names_its_url(rds: redis.Redis) -> None:
    spider = _Spider()
    request = Request("http://a.example:8080/p?q=1", callback=spider.parse, meta={"depth": 1})
    entry = serializer.dumps(request.to_dict(spider=spider), "a.example:8080")
    assert entry == b"!/p?q=1\tparse\t1"
    [dead] = _poisoned(rds, entry, "a.example:8080")
    assert dead["url"] == request.url


def test_malformed_lease_data_is_dead_lettered_when_it_expires(rds: redis.Redis) -> None:
    frontier = _frontier(rds, lease_timeout=0.05)
    _push(frontier, "https://a.example/0")
    _leased(frontier.lease_many(["w#a:0"]))
    rds.hset("{t}:ldata", "w#a:0", "garbage without tabs")
    _until_expired(rds)  # the lease's 50 ms run out
    result = frontier.lease_many(["v#b:0"])
    assert isinstance(result, NotDue) and result.dead == 1
    assert "malformed lease data" in json.loads(rds.lindex("{t}:dead", 0) or b"{}")["reason"]
    assert frontier.audit() == {}


# -- poison requests ------------------------------------------------------------------


def test_a_request_whose_worker_dies_every_time_is_dead_lettered_after_its_deliveries(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds, lease_timeout=0.05, max_deliveries=3, default_concurrency=1)
    _push(frontier, "https://a.example/poison")
    _push(frontier, "https://a.example/fine")
    for n in range(1, 4):
        [lease] = _leased(frontier.lease_many([f"dies#{n}:0"]))
        assert lease.data == b"https://a.example/poison"
        assert lease.deliveries == n
        _until_expired(rds)  # the worker died; its 50 ms lease runs out
    # The third expiry dead-letters it and frees its slot: the rest goes on.
    [lease] = _leased(frontier.lease_many(["lives#1:0"]))
    assert lease.dead == 1
    assert lease.data == b"https://a.example/fine"
    frontier.ack([lease.lease_id])
    [dead] = [json.loads(d) for d in rds.lrange("{t}:dead", 0, -1)]
    assert dead["deliveries"] == 3
    assert "delivered 3 times without acknowledgement" in dead["reason"]
    assert dead["site"] == "a.example"
    assert frontier.audit() == {}


def test_leases_given_back_do_not_count_as_failed_deliveries(rds: redis.Redis) -> None:
    frontier = _frontier(rds, max_deliveries=2)
    _push(frontier, "https://a.example/0")
    for n in range(5):
        [lease] = _leased(frontier.lease_many([f"w#{n}:0"]))
        assert lease.deliveries == 1
        frontier.release([lease.lease_id])
    assert rds.llen("{t}:dead") == 0
    assert frontier.audit() == {}


# -- lost replies -----------------------------------------------------------------------


def _lose_replies(scheduler: FrontierScheduler, times: int = 1) -> list[int]:
    """Make the next ``times`` round trips run in Redis and then lose their
    reply, as a connection dropped after the call was sent would."""
    send = scheduler.session.send
    lost = [0]

    def send_and_lose(*args: Any) -> Any:
        result = send(*args)
        if lost[0] < times:
            lost[0] += 1
            raise RedisConnectionError("reply lost (test)")
        return result

    scheduler.session.send = send_and_lose  # type: ignore[method-assign]
    return lost


def _total(rds: redis.Redis, shards: int, read: Any) -> int:
    """``read(prefix)`` summed over the shards of the spider ``t``."""
    return sum(int(read(prefix) or 0) for prefix in shard_prefixes("t", shards))


@pytest.mark.parametrize("shards", [1, 3])
def test_leases_whose_reply_was_lost_are_found_out_not_leased_again(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=shards)
    sites = "abcdef" if shards > 1 else "a"
    urls = sorted(f"https://{s}.example/{i}" for s in sites for i in range(5))
    for url in urls:
        scheduler.enqueue_request(Request(url))
    assert scheduler.flush_outbox()
    _lose_replies(scheduler)
    assert scheduler.next_request() is None  # the reply was lost
    leased = _total(rds, shards, lambda p: rds.zcard(p + "leases"))
    assert leased > 0  # but the call ran
    scheduler.session.down_until = 0.0  # Redis answers again
    got = lease_all(scheduler)
    assert sorted(r.url for r in got) == urls
    # found out, not leased twice
    assert _total(rds, shards, lambda p: rds.zcard(p + "leases")) == len(urls)
    for request in got:
        finish(scheduler, request)
    assert scheduler.queue.shards.audit() == {}


@pytest.mark.parametrize("shards", [1, 3])
def test_a_commit_whose_reply_was_lost_is_not_sent_again(
    redis_url: str, rds: redis.Redis, shards: int
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_SHARDS=shards)
    seeds = [Request(f"https://{s}.example/seed", dont_filter=True) for s in "abcdef"]
    done: list[int] = []
    for seed in seeds:
        scheduler.enqueue_request(seed)
    scheduler.after_commit(lambda: done.append(1))
    _lose_replies(scheduler)
    assert not scheduler.flush_outbox()
    assert done == []  # not known to be in Redis yet
    scheduler.session.down_until = 0.0
    assert scheduler.flush_outbox()  # found out: it ran
    assert done == [1]
    # queued once, not twice
    assert _total(rds, shards, lambda p: rds.get(p + "count")) == len(seeds)
    assert scheduler.queue.shards.audit() == {}


def test_a_commit_lost_before_it_reached_redis_is_sent_once_found_out(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Spider)
    scheduler.enqueue_request(Request("https://a.example/x", dont_filter=True))
    send = scheduler.session.send

    def fail_before_sending(*args: Any) -> Any:
        scheduler.session.send = send  # type: ignore[method-assign]
        raise RedisConnectionError("connection refused (test)")

    scheduler.session.send = fail_before_sending  # type: ignore[method-assign]
    assert not scheduler.flush_outbox()
    scheduler.session.down_until = 0.0
    assert scheduler.flush_outbox()
    assert int(rds.get("{t}:count") or 0) == 1


# -- dead letters -------------------------------------------------------------------------


def test_requeue_and_purge_never_both_act_on_one_dead_letter(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    request = json.dumps({"u": "https://a.example/x"})
    rds.rpush("{t}:dead", json.dumps({"url": "https://a.example/x", "request": request}))
    raw = rds.lindex("{t}:dead", 0)
    assert raw is not None
    # A purge lands between the requeue's read and its write: nothing is queued.
    assert purge(frontier) == 1
    done = frontier.commit(
        Commit(pushes=[Push(request.encode(), "a.example", 0, None, True)], claim=raw)
    )
    assert done is not None and not done.claimed
    assert int(rds.get("{t}:count") or 0) == 0
    # Requeued while it is there: queued once and taken out.
    rds.rpush("{t}:dead", raw)
    assert requeue(frontier) == (1, 0)
    assert requeue(frontier) == (0, 0)
    assert int(rds.get("{t}:count") or 0) == 1


def test_a_poison_dead_letter_can_be_requeued(rds: redis.Redis) -> None:
    frontier = _frontier(rds, lease_timeout=0.05, max_deliveries=1)
    data = json.dumps({"u": "/p", "w": 1}).encode()
    frontier.push(data, site="a.example", priority=3, fingerprint=b"p", dont_filter=False)
    _leased(frontier.lease_many(["dies#1:0"]))
    _until_expired(rds)
    assert isinstance(frontier.lease_many(["v#1:0"]), NotDue)
    [dead] = [json.loads(d) for d in rds.lrange("{t}:dead", 0, -1)]
    assert dead["url"] == "http://a.example/p"
    assert requeue(frontier) == (1, 0)
    [lease] = _leased(frontier.lease_many(["v#2:0"]))
    assert lease.data == b'!/p\t\t\t{"p":3}'  # requeued in the current form
    assert lease.deliveries == 1


def test_values_too_long_to_be_numbers_are_malformed_not_infinite(rds: redis.Redis) -> None:
    frontier = Frontier(rds, "long", lease_timeout=0.05)  # a crawl of its own
    frontier.load_scripts()
    _push(frontier, "https://a.example/0")
    rds.hset("{long}:delay", "a.example", "1" + "0" * 400)
    [lease] = _leased(frontier.lease_many(["w#a:0"]))
    assert any("{long}:delay" in p for p in lease.problems)  # the default delay held
    rds.hset("{long}:ldata", "w#a:0", "9" * 400 + '\ta.example\t#5#{"u":"/p"}')
    _until_expired(rds, "{long}:leases")  # the lease runs out
    result = frontier.lease_many(["v#b:0"])  # no error after a write
    assert isinstance(result, NotDue) and result.dead == 1
    assert "malformed lease data" in json.loads(rds.lindex("{long}:dead", 0) or b"{}")["reason"]
    rds.delete("{long}:delay")
    assert frontier.audit() == {}


def test_a_lease_whose_ack_is_refused_stays_extended_until_the_ack_is_in(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _AckSpider, FRONTIER_LEASE_TIMEOUT=2)
    scheduler.enqueue_request(Request("https://a.example/page"))
    assert scheduler.flush_outbox()
    [request] = [r for r in lease_all(scheduler) if r.url == "https://a.example/page"]
    rds.set("{ack}:dupefilter", "not a set")  # the next commit with a push is refused
    scheduler.enqueue_request(Request("https://a.example/link"))
    scheduler.crawler.engine._slot.remove_request(request)  # handled: ack queued
    assert not scheduler.flush_outbox()  # refused
    seconds, micros = rds.time()
    until = seconds * 1000 + micros // 1000 + 3000  # a lease and a half

    def beaten() -> bool:  # a heartbeat every quarter of a lease
        scheduler.session.down_until = 0.0
        scheduler.heartbeats.beat()
        seconds, micros = rds.time()
        return seconds * 1000 + micros // 1000 > until

    wait_for(beaten, 10, "a lease and a half to pass", 0.5)
    other = Frontier(rds, "ack", lease_timeout=2)
    assert isinstance(other.lease_many(["other#x:0"]), NotDue)  # not handed out again
    rds.delete("{ack}:dupefilter")
    scheduler.session.down_until = 0.0
    assert scheduler.flush_outbox()
    assert rds.zcard("{ack}:leases") == 0


_BUSY = """
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1
"""


def _stall(client: Any, key: str, micros: int) -> threading.Thread:
    """Keep Redis busy with a script for ``micros`` µs, from another thread.

    Redis answers nobody while the script runs, so its start cannot be
    awaited through Redis: the call is given 0.1 s to get there.
    """
    started = threading.Event()

    def run() -> None:
        started.set()
        client.eval(_BUSY, 1, key, micros)

    thread = threading.Thread(target=run)
    thread.start()
    started.wait()
    time.sleep(0.1)
    return thread


@pytest.mark.parametrize("cluster", [
    pytest.param(False, id="standalone"),
    pytest.param(True, id="cluster", marks=pytest.mark.cluster),
])
def test_a_call_that_outlives_the_socket_timeout_is_found_out_never_resent(
    cluster: bool, request: pytest.FixtureRequest
) -> None:
    """Redis runs the commit after the client gave up on it (a stall longer
    than the socket timeout): the scheduler finds that out and never sends
    it again. On a cluster the calls go through a pipeline of the slot's
    node, whose client never resends (redis-py's cluster pipeline resends a
    command whose reply timed out, one by one, whatever its retry policy)."""
    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    settings = {"REDIS_PARAMS": {"socket_timeout": 0.5, "socket_connect_timeout": 2}}
    if cluster:  # (one shard: the {t} keys; sharded crawls are tests/test_shards_faults.py's)
        settings.update(FRONTIER_REDIS_CLUSTER=True, FRONTIER_SHARDS=1)
    scheduler, _ = harness.open_scheduler(url, _Spider, **settings)
    client = scheduler.queue.frontier.redis
    stall = (redis.RedisCluster if cluster else redis.Redis).from_url(url, socket_timeout=10)
    scheduler.enqueue_request(Request("https://a.example/seed", dont_filter=True))
    busy = _stall(stall, "{t}:busy", 900_000)
    assert not scheduler.flush_outbox()  # timed out: in doubt
    busy.join()
    assert scheduler.session.in_doubt is not None
    scheduler.session.down_until = 0.0
    assert scheduler.flush_outbox()  # found out: it ran
    assert int(client.get("{t}:count") or 0) == 1  # queued once
    assert scheduler.queue.frontier.audit() == {}
    with scheduler.queue.frontier.pipeline() as pipe:
        assert isinstance(pipe, redis.client.Pipeline)  # not a ClusterPipeline
        assert pipe.connection_pool.connection_kwargs["retry"].get_retries() == 0


@pytest.mark.parametrize("key", ["{t}:count", "{t}:seq"])
def test_a_counter_past_what_incr_and_lua_hold_refuses_the_call_before_any_write(
    rds: redis.Redis, key: str
) -> None:
    """A 20-digit counter passed the integer check, then INCR (or Lua's
    numbers) failed after the entry was written: the call said refused, the
    entry was queued uncounted, and a resend queued it twice."""
    frontier = _frontier(rds)
    rds.set(key, "99999999999999999999")
    for _ in range(2):
        with pytest.raises(ResponseError, match="nothing was written"):
            frontier.push(b"/a", site="a.example", priority=0, fingerprint=None,
                          dont_filter=True)
    assert rds.exists("{t}:qc", "{t}:qm", "{t}:lv", "{t}:ready", "{t}:wait") == 0
    with pytest.raises(ResponseError, match="nothing was written"):
        frontier.lease_many(["w#1:1"])


class _BeatSpider(Spider):
    name = "beat"


def test_the_heartbeat_during_an_outages_backoff_keeps_the_leases_and_ends_it(
    redis_url: str, rds: redis.Redis
) -> None:
    """An outage's backoff outlasts the outage (it doubles to 30 s): the
    heartbeat still goes, and when Redis answers it extends the leases and
    ends the backoff. While Redis is down it changes nothing: no second
    outage counted, the backoff as it was."""
    from tests.faultproxy import FaultProxy

    rds.script_flush()  # (loaded again through the proxy)
    with FaultProxy(redis_url) as proxy:
        scheduler, crawler = harness.open_scheduler(
            proxy.url, _BeatSpider, FRONTIER_LEASE_TIMEOUT=30
        )
        scheduler.enqueue_request(Request("https://a.example/page"))
        assert scheduler.flush_outbox()
        [request] = lease_all(scheduler)
        [lease_id] = [m.decode() for m in rds.zrange("{beat}:leases", 0, -1)]
        with proxy.outage():
            scheduler.session.outage(RedisConnectionError("gone"))
            scheduler.session.backoff = 16.0  # (a long outage's, doubled since)
            scheduler.session.outage(RedisConnectionError("gone"))
            down_until = scheduler.session.down_until
            assert down_until > time.monotonic() + 25
            scheduler.heartbeats.beat()  # Redis still down: nothing changes
            assert scheduler.session.down_until == down_until
            assert crawler.stats.get_value("frontier/redis/outages") == 1
        seconds, micros = rds.time()
        now_ms = seconds * 1000 + micros // 1000
        rds.zadd("{beat}:leases", {lease_id: now_ms + 1000}, xx=True)  # about to expire
        scheduler.heartbeats.beat()  # Redis is back, the backoff not over
        assert scheduler.session.down_until == 0.0
        assert rds.zscore("{beat}:leases", lease_id) >= now_ms + 25_000  # extended
        assert crawler.stats.get_value("frontier/redis/outages") == 1
        finish(scheduler, request)
        assert rds.zcard("{beat}:leases") == 0


def test_a_heartbeat_that_meets_noscript_is_an_outage_not_a_refusal(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """``NOSCRIPT`` says the call did not run (a server restarted between a
    pipeline's script check and its call, as a reviewer's snapshot restore
    met once): it is waited out as an outage, not a refusal (counted or
    logged as one, at ERROR). A heartbeat that meets it loads the scripts
    and sends once more."""
    from redis.exceptions import NoScriptError

    scheduler, crawler = harness.open_scheduler(redis_url, _BeatSpider)
    with caplog.at_level("WARNING", logger="crawler.frontier.scheduler"):
        scheduler.session.failed(NoScriptError("No matching script. Please use EVAL."))
    assert crawler.stats.get_value("frontier/redis/refused") is None
    assert crawler.stats.get_value("frontier/redis/outages") == 1
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    rds.script_flush()  # (as a restart: Redis keeps no scripts)
    rds.zrem("{beat}:alive", scheduler.holder)
    scheduler.heartbeats.beat()  # the backoff runs: a probe; it loads the scripts again
    assert scheduler.session.down_until == 0.0
    assert rds.zscore("{beat}:alive", scheduler.holder) is not None
    assert crawler.stats.get_value("frontier/redis/outages") == 1


def test_a_protocol_record_of_the_wrong_type_refuses_a_lease_call_before_any_write(
    rds: redis.Redis,
) -> None:
    """``{s}:speaks`` is written after ``{s}:alive`` by a holder's first
    lease call: its type is checked first, so nothing is half written."""
    frontier = _frontier(rds)
    frontier.push_many([Push(b"/x", "a.example", 0, b"1", False)])
    rds.set("{t}:speaks", "not a hash")
    with pytest.raises(ResponseError, match=r"frontier key \{t\}:speaks holds a string"):
        frontier.lease_many(["w#1:1"])
    assert rds.exists("{t}:alive", "{t}:leases") == 0
    with pytest.raises(ResponseError, match="nothing was written"):
        frontier.alive("w#1")
    assert rds.exists("{t}:alive") == 0
