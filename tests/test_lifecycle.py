"""One request walked through every transition of its life cycle
(:mod:`crawler.frontier.lifecycle`) on a real redis-server, the shard's keys
checked against the module's table at each step."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from crawler.commands.deadletters import requeue
from crawler.frontier.deadletters import RECORD_FIELDS
from crawler.frontier.lifecycle import (
    ACKNOWLEDGED,
    DEAD,
    FETCHED,
    LEASED,
    RETURNED,
    STATES,
    SUSPECT,
    TRANSITIONS,
)
from crawler.frontier.store import Commit, Frontier, Lease, NotDue

if TYPE_CHECKING:
    import redis

SITE = "a.example"
URL = b'{"u": "/one"}'  # (an entry in the JSON form)


@pytest.fixture
def frontier(rds: redis.Redis) -> Frontier:
    f = Frontier(rds, "t", default_concurrency=8, lease_timeout=30.0, max_deliveries=3)
    f.load_scripts()
    return f


def _queued(rds: redis.Redis, deliveries: int = 0, data: bytes = URL) -> None:
    """queued (or returned): in its site's queue, counted; no lease keys."""
    assert rds.get("{t}:count") == b"1"
    assert rds.hlen("{t}:qm") == 1 and rds.hlen("{t}:ldata") == 0
    assert rds.zcard("{t}:leases") == 0 and rds.hlen("{t}:lslot") == 0
    assert rds.zscore("{t}:ready", SITE) is not None or rds.zscore("{t}:wait", SITE) is not None
    queued = b"\n".join(rds.hvals("{t}:qc")) + b"\n" + b"\n".join(rds.hvals("{t}:lv"))
    entry = f"#{deliveries}#".encode() + data if deliveries else data
    assert entry in queued and (deliveries or b"#" + data not in queued), queued


def _leased(rds: redis.Redis, lease_id: str, deliveries: int) -> None:
    """leased: its id in {s}:leases, {s}:ldata and {s}:lslot, its slot counted."""
    assert int(rds.get("{t}:count") or 0) == 0
    assert rds.zscore("{t}:leases", lease_id) is not None
    assert rds.hget("{t}:ldata", lease_id) == f"0\t{SITE}\t#{deliveries}#".encode() + URL
    assert rds.hget("{t}:lslot", lease_id) == SITE.encode()
    assert rds.hget("{t}:active", SITE) == b"1"
    holder = lease_id.rsplit(":", 1)[0]
    assert rds.hget("{t}:wactive", f"{holder}\t{SITE}") == b"1"


def _fetched(rds: redis.Redis, lease_id: str) -> None:
    """fetched: the lease stays, its slot is freed."""
    assert rds.zscore("{t}:leases", lease_id) is not None
    assert rds.hget("{t}:ldata", lease_id) is not None
    assert rds.hget("{t}:lslot", lease_id) is None
    assert int(rds.hget("{t}:active", SITE) or 0) == 0


def _gone(rds: redis.Redis, lease_id: str) -> None:
    """acknowledged (and the lease keys of returned and dead): no lease keys."""
    assert rds.zscore("{t}:leases", lease_id) is None
    assert rds.hget("{t}:ldata", lease_id) is None and rds.hget("{t}:lslot", lease_id) is None
    assert int(rds.hget("{t}:active", SITE) or 0) == 0


def _lease(result: list[Lease] | NotDue) -> Lease:
    assert isinstance(result, list) and len(result) == 1, result
    return result[0]


def _expire(rds: redis.Redis, lease_id: str, *, holder_alive: bool) -> None:
    """Its lease's deadline passed; its holder seen at it (alive) or not since."""
    seconds, micros = rds.time()
    now_ms = seconds * 1000 + micros // 1000
    rds.zadd("{t}:leases", {lease_id: now_ms - 1000}, xx=True)
    holder = lease_id.rsplit(":", 1)[0]
    if holder_alive:
        rds.zadd("{t}:alive", {holder: now_ms - 500})
    else:
        rds.zrem("{t}:alive", holder)


def _housekeep(frontier: Frontier) -> None:
    """A lease call that leases nothing: its housekeeping runs."""
    with frontier.redis.pipeline(transaction=False) as pipe:
        frontier.peek("keeper#1", pipe)
        [reply] = pipe.execute()
    assert isinstance(frontier.leases_of(reply, []), NotDue)


def test_the_table_reaches_every_state_and_only_acknowledged_is_an_end() -> None:
    assert len(set(STATES)) == 7
    for t in TRANSITIONS:
        assert set(t.sources) <= set(STATES) and t.target in STATES, t
    assert {t.target for t in TRANSITIONS} == set(STATES)
    left = {s for t in TRANSITIONS for s in t.sources}
    assert set(STATES) - left == {ACKNOWLEDGED}  # the only end with no way on


def test_queued_leased_fetched_acknowledged(rds: redis.Redis, frontier: Frontier) -> None:
    assert frontier.push(URL, site=SITE, priority=0, fingerprint=b"f", dont_filter=False)
    _queued(rds)  # QUEUED
    lease = _lease(frontier.lease_many(["w#1:0"], held_all=0))
    assert lease.state == LEASED and lease.deliveries == 1
    _leased(rds, lease.lease_id, 1)
    committed = frontier.commit(Commit(slots=[lease.lease_id]))  # FETCHED
    assert committed is not None and committed.freed == 1
    _fetched(rds, lease.lease_id)
    committed = frontier.commit(Commit(acks=[lease.lease_id]))  # ACKNOWLEDGED
    assert committed is not None and committed.acked == 1
    _gone(rds, lease.lease_id)
    assert frontier.pending() == 0 and rds.llen("{t}:dead") == 0
    assert frontier.audit() == {}
    assert {LEASED, FETCHED, ACKNOWLEDGED} <= {t.target for t in TRANSITIONS}


@pytest.mark.parametrize("how", ["given back", "expired, holder alive"])
def test_leased_returned_without_counting_its_delivery(
    rds: redis.Redis, frontier: Frontier, how: str
) -> None:
    assert frontier.push(URL, site=SITE, priority=0, fingerprint=b"f", dont_filter=False)
    lease = _lease(frontier.lease_many(["w#1:0"], held_all=0))
    _leased(rds, lease.lease_id, 1)
    if how == "given back":
        committed = frontier.commit(Commit(givebacks=[lease.lease_id]))
        assert committed is not None and committed.given == 1
    else:
        _expire(rds, lease.lease_id, holder_alive=True)
        _housekeep(frontier)
    _gone(rds, lease.lease_id)
    _queued(rds, deliveries=0)  # RETURNED: that delivery is not counted
    again = _lease(frontier.lease_many(["w#2:0"], held_all=0))
    assert again.deliveries == 1 and again.state == LEASED
    assert any(t.target == RETURNED and t.event.startswith(how.split(",", maxsplit=1)[0])
               for t in TRANSITIONS)


def test_leased_then_suspect_on_its_last_delivery_made_alone_then_dead_then_requeued(
    rds: redis.Redis, frontier: Frontier
) -> None:
    assert frontier.push(URL, site=SITE, priority=0, fingerprint=b"f", dont_filter=False)
    for n in (1, 2):  # its holder dies with it twice: back in its queue, counted
        lease = _lease(frontier.lease_many([f"dies#{n}:0"], held_all=0))
        assert lease.state == LEASED and lease.deliveries == n
        _leased(rds, lease.lease_id, n)
        _expire(rds, lease.lease_id, holder_alive=False)
        _housekeep(frontier)
        _gone(rds, lease.lease_id)
        _queued(rds, deliveries=n)  # QUEUED, its deliveries counted

    # Its last chance: a worker holding leases does not get it (it stays queued) ...
    passed = frontier.lease_many(["busy#1:0"], held_all=1)
    assert isinstance(passed, NotDue) and passed.last_passed == SITE
    _queued(rds, deliveries=2)
    # ... one holding nothing gets it alone: SUSPECT, as lease.lua says.
    suspect = _lease(frontier.lease_many(["alone#1:0", "alone#1:1"], held_all=0))
    assert suspect.state == SUSPECT and suspect.deliveries == 3
    _leased(rds, suspect.lease_id, 3)

    # Its holder dies with it: DEAD, one record of the one shape.
    _expire(rds, suspect.lease_id, holder_alive=False)
    _housekeep(frontier)
    _gone(rds, suspect.lease_id)
    assert frontier.pending() == 0
    [raw] = rds.lrange("{t}:dead", 0, -1)
    record: dict[str, Any] = json.loads(raw)
    assert set(record) == set(RECORD_FIELDS)
    assert record["deliveries"] == 3 and record["url"] == "https://a.example/one"
    assert record["worker"] == "alone#1"
    assert SUSPECT in {s for t in TRANSITIONS if t.target == DEAD for s in t.sources}

    # Requeued: QUEUED again, its deliveries reset, the dead letter gone.
    assert requeue(frontier) == (1, 0)
    assert rds.llen("{t}:dead") == 0
    _queued(rds, deliveries=0, data=b"/one")  # (packed anew: the framed form)
    again = _lease(frontier.lease_many(["w#1:0"], held_all=0))
    assert again.state == LEASED and again.deliveries == 1
