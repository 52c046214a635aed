"""The scripts' batched writes, on a real redis-server: one ``commit.lua``
call appends many pushes to a queue's last chunk in Lua and writes it back
once, frees the slots of many acks with one ``HMGET``/``HDEL`` and one
counter update per site; one ``lease.lua`` call writes its leases and
counters once after its loop. Each must leave the frontier as the one-by-one
writes did: same order, same counters (``Frontier.audit``), an id given
twice counted once."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from crawler.frontier.store import Commit, Frontier, Lease, NotDue, Push

if TYPE_CHECKING:
    import redis


def _frontier(rds: redis.Redis, **kwargs: object) -> Frontier:
    frontier = Frontier(rds, "t", **{"default_concurrency": 1000, **kwargs})  # type: ignore[arg-type]
    frontier.load_scripts()
    return frontier


def _push(url: str, priority: int = 0) -> Push:
    return Push(url.encode(), url.split("/")[2], priority, url.encode(), False)


def _lease(frontier: Frontier, ids: list[str]) -> list[str]:
    leases = frontier.lease_many(ids)
    assert not isinstance(leases, NotDue), leases
    return [lease.lease_id for lease in leases]


def _drain(frontier: Frontier, batch: int = 16) -> list[str]:
    """Lease everything, ``batch`` per call, acking each call's leases in
    the next commit; the URLs in the order served."""
    served: list[str] = []
    n = 0
    while True:
        ids = [f"w:{n + i}" for i in range(batch)]
        n += batch
        leases = frontier.lease_many(ids)
        if isinstance(leases, NotDue):
            return served
        served += [lease.data.decode() for lease in leases]
        frontier.commit(Commit(acks=[lease.lease_id for lease in leases]))


def test_many_pushes_to_one_queue_in_one_commit_keep_their_order_across_chunks(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    rng = random.Random(7)
    urls = [f"https://a.example/{i:04d}/" + "p" * rng.randint(0, 200) for i in range(400)]
    # Some queued before, then one commit of 300 (about 40 chunks' worth)
    # with another site's pushes between them, then one more.
    frontier.commit(Commit(pushes=[_push(u) for u in urls[:50]]))
    mixed: list[Push] = []
    for i, u in enumerate(urls[50:350]):
        mixed.append(_push(u))
        if i % 7 == 0:
            mixed.append(_push(f"https://b.example/{i}"))
    committed = frontier.commit(Commit(pushes=mixed))
    assert committed is not None and all(committed.pushed)
    frontier.commit(Commit(pushes=[_push(u) for u in urls[350:]]))
    assert int(rds.get("{t}:count") or 0) == 400 + 43
    chunks = rds.hvals("{t}:qc")
    assert max(len(c) for c in chunks) <= 2048 + 300  # one entry past the limit at most
    served = _drain(frontier)
    assert [u for u in served if "a.example" in u] == urls
    assert [u for u in served if "b.example" in u] == [
        f"https://b.example/{i}" for i in range(0, 300, 7)
    ]
    assert frontier.audit() == {}


def test_a_commit_of_pushes_and_a_giveback_on_one_queue(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    frontier.commit(Commit(pushes=[_push(f"https://a.example/{i}") for i in range(3)]))
    [first] = _lease(frontier, ["w:0"])
    # The pushes go to the back, the request given back to the front.
    frontier.commit(Commit(
        pushes=[_push(f"https://a.example/new{i}") for i in range(3)], givebacks=[first]
    ))
    assert _drain(frontier) == [
        "https://a.example/0", "https://a.example/1", "https://a.example/2",
        "https://a.example/new0", "https://a.example/new1", "https://a.example/new2",
    ]
    assert frontier.audit() == {}


def test_an_id_given_twice_frees_its_slot_once(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    frontier.commit(Commit(pushes=[_push(f"https://a.example/{i}") for i in range(4)]))
    a, b, c, _ = _lease(frontier, ["w:0", "w:1", "w:2", "w:3"])
    assert rds.hget("{t}:active", "a.example") == b"4"
    committed = frontier.commit(Commit(slots=[a, a, b], acks=[c, c]))
    assert committed is not None
    assert (committed.freed, committed.acked) == (2, 1)
    assert rds.hget("{t}:active", "a.example") == b"1"
    assert rds.hget("{t}:wactive", "w\ta.example") == b"1"
    # a and b still hold their leases (their slots are free).
    assert rds.zcard("{t}:leases") == 3
    frontier.commit(Commit(acks=[a, b, "w:3", "w:3", "w:99"]))
    assert frontier.audit() == {}


def test_one_lease_call_counts_each_site_worker_and_priority(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    pushes = [
        _push(f"https://{site}.example/{p}/{i}", p)
        for site in ("a", "b", "c") for p in (0, 3) for i in range(4)
    ]
    frontier.commit(Commit(pushes=pushes))
    frontier.lease_many(["other:0"])  # another worker holds one
    ids = _lease(frontier, [f"w:{n}" for n in range(15)])
    assert len(ids) == 15
    held = {
        site: int(rds.hget("{t}:active", site) or 0)
        for site in ("a.example", "b.example", "c.example")
    }
    assert sum(held.values()) == 16
    mine = {
        site: int(rds.hget("{t}:wactive", f"w\t{site}") or 0)
        for site in ("a.example", "b.example", "c.example")
    }
    assert sum(mine.values()) == 15
    assert int(rds.get("{t}:count") or 0) == 24 - 16
    # The 12 priority-3 requests went first.
    assert rds.hget("{t}:prio", "3") is None
    assert rds.hget("{t}:prio", "0") == b"8"
    assert rds.zcard("{t}:leases") == 16
    assert rds.hlen("{t}:lslot") == rds.hlen("{t}:ldata") == 16
    frontier.commit(Commit(acks=[*ids, "other:0"]))
    _drain(frontier)
    assert frontier.audit() == {}


def test_a_malformed_slot_counter_under_batched_acks(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    frontier.commit(Commit(pushes=[_push(f"https://a.example/{i}") for i in range(3)]))
    ids = _lease(frontier, ["w:0", "w:1", "w:2"])
    rds.hset("{t}:active", "a.example", "lots")
    committed = frontier.commit(Commit(acks=ids))
    assert committed is not None and committed.acked == 3
    assert any("{t}:active a.example is not an integer" in p for p in committed.problems)
    assert frontier.audit() == {}


def test_a_commit_of_acks_run_twice_changes_nothing_the_second_time(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    frontier.commit(Commit(pushes=[_push(f"https://a.example/{i}") for i in range(6)]))
    ids = _lease(frontier, [f"w:{n}" for n in range(4)])
    batch = Commit(slots=ids[:2], acks=ids[1:])
    first = frontier.commit(batch)
    assert first is not None and (first.freed, first.acked) == (2, 3)
    state = {key: rds.dump(key) for key in rds.keys("{t}:*") if not key.startswith(b"{t}:sent")}
    again = frontier.commit(batch)
    assert again is not None and (again.freed, again.acked) == (0, 0)
    assert {key: rds.dump(key) for key in state} == state
    frontier.commit(Commit(acks=ids[:1]))
    _drain(frontier)
    assert frontier.audit() == {}


def test_malformed_counters_under_a_batched_lease(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    frontier.commit(Commit(pushes=[_push(f"https://a.example/{i}", 2) for i in range(5)]))
    rds.hset("{t}:prio", "2", "many")
    rds.hset("{t}:wactive", "w\ta.example", "some")
    leases = frontier.lease_many([f"w:{n}" for n in range(3)])
    assert isinstance(leases, list) and len(leases) == 3
    # (the lease call's problems are logged by the scheduler; here: the counters)
    assert rds.hget("{t}:wactive", "w\ta.example") == b"3"
    assert rds.hget("{t}:active", "a.example") == b"3"
    assert rds.hget("{t}:prio", "2") is None  # "many" counted as 0, then -3: dropped
    assert int(rds.get("{t}:count") or 0) == 2
    frontier.commit(Commit(acks=[lease.lease_id for lease in leases]))
    _drain(frontier)
    # (the 2 left were taken off a counter that was gone: it stays gone)
    assert frontier.audit() == {}


@pytest.mark.parametrize(("key", "value", "conc", "leased", "after"), [
    # below 0: the first lease's write sets it to 0, the next counts from there
    ("{t}:active", "-3", 2, 2, b"1"),
    # not an integer to HINCRBY (a leading zero): set to 1 at the first lease
    ("{t}:active", "01", 2, 2, b"2"),
    # too long for the scripts' reads, an integer to HINCRBY: the site is full
    ("{t}:active", "1234567890123456", 2, 1, b"1234567890123457"),
    # this worker's share (2 of 4, with another worker live): from 0 on
    ("{t}:wactive", "-3", 4, 3, b"2"),
])
def test_odd_slot_counters_under_a_batched_lease_as_one_write_per_lease(
    rds: redis.Redis, key: str, value: str, conc: int, leased: int, after: bytes
) -> None:
    frontier = _frontier(rds)
    frontier.commit(Commit(pushes=[_push(f"https://a.example/{i}") for i in range(8)]))
    rds.hset("{t}:conc", "a.example", conc)
    field = "a.example"
    if key == "{t}:wactive":
        field = "w\ta.example"
        frontier.alive("other")
    rds.hset(key, field, value)
    leases = frontier.lease_many([f"w:{n}" for n in range(6)])
    assert isinstance(leases, list)
    assert len(leases) == leased
    assert rds.hget(key, field) == after


def test_a_batched_lease_reports_its_problems_in_the_order_met(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    frontier.commit(Commit(pushes=[_push(f"https://a.example/{i}", 2) for i in range(2)]))
    rds.hset("{t}:prio", "2", "many")
    rds.hset("{t}:delay", "a.example", "soon")
    [lease] = _lease_all(frontier, ["w:0"])
    assert [p.split()[0] for p in lease.problems] == ["{t}:prio", "{t}:delay"]


def _lease_all(frontier: Frontier, ids: list[str]) -> list[Lease]:
    leases = frontier.lease_many(ids)
    assert not isinstance(leases, NotDue), leases
    return leases


def test_a_priority_counter_below_zero_under_batched_pushes(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    rds.hset("{t}:prio", "0", "-3")
    frontier.commit(Commit(pushes=[_push(f"https://a.example/{i}") for i in range(3)]))
    # one write per push: -2 (dropped), then 1 and 2
    assert rds.hget("{t}:prio", "0") == b"2"


def test_batched_pushes_report_their_problems_in_the_order_met(rds: redis.Redis) -> None:
    frontier = _frontier(rds)
    rds.hset("{t}:prio", "3", "many")
    rds.hset("{t}:due", "a.example", "soon")
    committed = frontier.commit(Commit(pushes=[_push("https://a.example/1", 3)]))
    assert committed is not None
    assert [p.split()[0] for p in committed.problems] == ["{t}:prio", "{t}:due"]


def test_freed_slots_wake_their_sites_in_the_order_the_slots_freed_them(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    rds.hset("{t}:conc", mapping={"a.example": 2, "b.example": 1})
    frontier.commit(Commit(pushes=[
        *(_push(f"https://a.example/{i}") for i in range(4)),
        *(_push(f"https://b.example/{i}") for i in range(3)),
    ]))
    leases = _lease_all(frontier, ["w:0", "w:1", "w:2"])
    assert [lease.site for lease in leases] == ["a.example", "b.example", "a.example"]
    a1, b1, a2 = (lease.lease_id for lease in leases)
    rds.hset("{t}:conc", "a.example", 1)
    # a.example is a candidate again only after its second slot: behind b.example
    frontier.commit(Commit(slots=[a1, b1, a2]))
    assert [lease.site for lease in _lease_all(frontier, ["w:3", "w:4"])] == [
        "b.example", "a.example",
    ]
