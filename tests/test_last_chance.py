"""A request's last delivery is made alone (``lease.lua``, ARGV[16]).

A worker that dies takes every request it holds with it, and each counts a
delivery: before this, a healthy request leased beside a poison one reached
``FRONTIER_MAX_DELIVERIES`` with it and was dead-lettered too. Now a
request one death short of the limit is leased only to a worker holding
nothing, as its only lease, and that worker leases nothing more until it is
done: the death that dead-letters a request is one it died alone.
(The whole crawl with a worker killed by a poison download:
``tests/test_review_faults.py``.)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider

from crawler.frontier.store import Frontier, Lease, NotDue
from tests import scheduler_harness as harness
from tests.test_frontier_faults import _lose_replies, _until_expired
from tests.waiting import wait_for

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "t"


def _frontier(rds: redis.Redis, **kwargs: Any) -> Frontier:
    frontier = Frontier(rds, "t", **{"default_concurrency": 8, "lease_timeout": 0.05,
                                     "max_deliveries": 3, **kwargs})
    frontier.load_scripts()
    return frontier


def _push(frontier: Frontier, url: str) -> None:
    assert frontier.push(url.encode(), site=url.split("/")[2], priority=0,
                         fingerprint=url.encode(), dont_filter=False)


def _leased(result: list[Lease] | NotDue) -> list[Lease]:
    assert isinstance(result, list), result
    return result


def _die_twice_together(rds: redis.Redis, frontier: Frontier, urls: list[str]) -> None:
    """Lease ``urls`` in one call twice, the worker dying each time: each
    is then one death short of max_deliveries=3."""
    for n in (1, 2):
        leases = _leased(frontier.lease_many([f"dies#{n}:{j}" for j in range(len(urls))]))
        assert sorted(lease.data.decode() for lease in leases) == sorted(urls)
        assert {lease.deliveries for lease in leases} == {n}
        _until_expired(rds)


def _until_past(rds: redis.Redis, lease_id: str) -> None:
    """Wait until the deadline of ``lease_id`` has passed on Redis's clock."""

    def past() -> bool:
        seconds, micros = rds.time()
        deadline = rds.zscore("{t}:leases", lease_id)
        return deadline is None or deadline < seconds * 1000 + micros // 1000

    wait_for(past, 5, f"lease {lease_id} to expire", 0.005)


def _dead(rds: redis.Redis) -> list[tuple[str, int]]:
    return [(d["url"], d["deliveries"])
            for d in (json.loads(x) for x in rds.lrange("{t}:dead", 0, -1))]


def test_a_last_chance_goes_alone_to_a_worker_holding_nothing_and_only_its_death_counts(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    poison, healthy = "https://a.example/poison", "https://b.example/fine"
    _push(frontier, poison)
    _push(frontier, healthy)
    _die_twice_together(rds, frontier, [poison, healthy])
    _push(frontier, "https://c.example/new")

    # A worker holding a lease gets the new request only: both last chances
    # are put back where they were, and the reply says so.
    [new] = _leased(frontier.lease_many(["busy#1:0", "busy#1:1", "busy#1:2"], held_all=1))
    assert new.data == b"https://c.example/new" and new.last_passed
    assert rds.get("{t}:count") == b"2"
    again = frontier.lease_many(["busy#1:3"], held_all=2)
    assert isinstance(again, NotDue) and again.last_passed
    frontier.ack([new.lease_id])

    # A worker holding nothing gets one of them, alone, though it asks for two.
    [first] = _leased(frontier.lease_many(["empty#1:0", "empty#1:1"], held_all=0))
    assert first.deliveries == 3 and not first.last_passed
    if first.data.decode() == healthy:
        frontier.ack([first.lease_id])
        [first] = _leased(frontier.lease_many(["empty#2:0", "empty#2:1"], held_all=0))
    assert first.data.decode() == poison
    _until_expired(rds)  # the poison killed its worker, alone this time

    # Only the poison is dead-lettered; the other one is served, alone.
    rest = _leased(frontier.lease_many(["empty#3:0", "empty#3:1"], held_all=0))
    assert _dead(rds) == [(poison, 3)]
    if rest[0].data.decode() == healthy:  # (not served before the poison)
        assert [lease.deliveries for lease in rest] == [3]
        frontier.ack([rest[0].lease_id])
    assert frontier.pending() == 0
    assert frontier.audit() == {}


def test_a_last_chance_put_back_keeps_its_place_in_its_sites_queue(rds: redis.Redis) -> None:
    """Put back at the front of its queue, a last chance is still the next
    request of its site; the site's other requests wait behind it."""
    frontier = _frontier(rds, default_concurrency=1)
    _push(frontier, "https://a.example/1")
    _die_twice_together(rds, frontier, ["https://a.example/1"])
    _push(frontier, "https://a.example/2")
    assert isinstance(frontier.lease_many(["busy#1:0"], held_all=3), NotDue)
    assert frontier.pending() == 2
    [lease] = _leased(frontier.lease_many(["empty#1:0", "empty#1:1"], held_all=0))
    assert (lease.data, lease.deliveries) == (b"https://a.example/1", 3)
    frontier.ack([lease.lease_id])
    [lease] = _leased(frontier.lease_many(["empty#2:0"], held_all=0))
    assert (lease.data, lease.deliveries) == (b"https://a.example/2", 1)
    frontier.ack([lease.lease_id])
    assert frontier.audit() == {}


def test_the_site_drained_for_is_looked_at_first_only_for_its_last_chance(
    rds: redis.Redis,
) -> None:
    """The reply names the site of the last chance it put back; a lease call
    holding nothing that names it (drained_for) takes it first, ahead of
    better priorities. When another worker took it meanwhile, the site's
    next request keeps its turn: the better work goes first."""
    frontier = _frontier(rds, default_concurrency=1)
    _push(frontier, "https://a.example/1")
    _die_twice_together(rds, frontier, ["https://a.example/1"])
    assert frontier.push(b"https://h.example/1", site="h.example", priority=10,
                         fingerprint=None, dont_filter=True)
    [h1] = _leased(frontier.lease_many(["busy#1:0", "busy#1:1"], held_all=0))
    assert h1.data == b"https://h.example/1" and h1.last_passed == "a.example"
    frontier.ack([h1.lease_id])
    for i in (2, 3):
        assert frontier.push(f"https://h.example/{i}".encode(), site="h.example", priority=10,
                             fingerprint=None, dont_filter=True)
    rds.hset("{t}:due", "h.example", 0)  # (h.example due again at once)
    [last] = _leased(frontier.lease_many(["busy#2:0", "busy#2:1"], held_all=0,
                                         drained_for="a.example"))
    assert (last.data, last.deliveries, last.last_passed) == (b"https://a.example/1", 3, None)
    frontier.ack([last.lease_id])
    # a.example's next request is no last chance: named again, it waits its turn
    _push(frontier, "https://a.example/2")
    rds.hset("{t}:due", "a.example", 0)
    [first] = _leased(frontier.lease_many(["busy#3:0"], held_all=0, drained_for="a.example"))
    assert first.data == b"https://h.example/2"
    frontier.ack([first.lease_id])
    # (named by a worker that holds leases, the site is not looked at first)
    rds.hset("{t}:due", "h.example", 0)
    [third] = _leased(frontier.lease_many(["busy#4:0"], held_all=1, drained_for="a.example"))
    assert third.data == b"https://h.example/3"
    frontier.ack([third.lease_id])
    assert frontier.pending() == 1
    assert frontier.audit() == {}


@pytest.mark.parametrize("limit", [0, 1])
def test_without_redeliveries_nothing_is_held_back(rds: redis.Redis, limit: int) -> None:
    """max_deliveries 0 (no limit) or 1 (no second delivery): no request is
    ever on a last chance, so a busy worker leases as before."""
    frontier = _frontier(rds, max_deliveries=limit)
    _push(frontier, "https://a.example/1")
    _push(frontier, "https://b.example/1")
    for n in (1, 2):
        leases = _leased(frontier.lease_many([f"w#{n}:0", f"w#{n}:1"], held_all=5))
        if limit == 1:
            assert len(leases) == 2 and not leases[0].last_passed
            frontier.ack([lease.lease_id for lease in leases])
            break
        assert [lease.deliveries for lease in leases] == [n, n]
        _until_expired(rds)
    assert _dead(rds) == []


def test_the_scheduler_drains_for_a_last_chance_then_leases_nothing_beside_it(
    redis_url: str, rds: redis.Redis,
) -> None:
    """A worker holding a request when a last chance is put back leases
    nothing more until it holds nothing; then it takes the last chance,
    and nothing else until that one is done."""
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3)
    frontier.load_scripts()
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3)
    scheduler.enqueue_request(Request("https://c.example/held"))
    assert scheduler.flush_outbox()
    [held] = harness.lease_all(scheduler)

    scheduler.enqueue_request(Request("https://a.example/last"))
    assert scheduler.flush_outbox()
    for n in (1, 2):  # another worker dies twice with it
        [lease] = _leased(frontier.lease_many([f"dies#{n}:0"]))
        _until_past(rds, lease.lease_id)
    scheduler.enqueue_request(Request("https://b.example/fresh"))
    assert scheduler.flush_outbox()

    # The lease call takes the fresh request and puts the last chance back;
    # from then on the worker drains.
    [fresh] = harness.lease_all(scheduler)
    assert fresh.url == "https://b.example/fresh"
    scheduler.enqueue_request(Request("https://d.example/later"))
    assert scheduler.flush_outbox()
    assert scheduler.next_request() is None
    harness.finish(scheduler, held)
    assert scheduler.next_request() is None  # (it still holds one)
    harness.finish(scheduler, fresh)

    # Holding nothing: the last chance, alone; nothing beside it.
    last = scheduler.next_request()
    assert last is not None and last.url == "https://a.example/last"
    assert scheduler.next_request() is None
    assert scheduler.stats.get_value("frontier/last_chance/leased") == 1
    assert scheduler.stats.get_value("frontier/last_chance/drains") == 1
    harness.finish(scheduler, last)
    later = scheduler.next_request()
    assert later is not None and later.url == "https://d.example/later"
    harness.finish(scheduler, later)
    assert frontier.audit() == {}


def test_a_last_chance_whose_lease_reply_was_lost_is_found_out_and_still_held_alone(
    redis_url: str, rds: redis.Redis,
) -> None:
    """The reply of the lease call that took a last chance is lost: the
    lease is found out (not leased twice), and the worker still leases
    nothing beside it until it is done."""
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3)
    frontier.load_scripts()
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3)
    scheduler.enqueue_request(Request("https://a.example/last"))
    assert scheduler.flush_outbox()
    for n in (1, 2):  # another worker dies twice with it
        [lease] = _leased(frontier.lease_many([f"dies#{n}:0"]))
        _until_past(rds, lease.lease_id)
    # (a call that holds leases requeues it and leaves it: first in line)
    assert frontier.lease_many(["busy#1:0"], held_all=1).last_passed
    scheduler.enqueue_request(Request("https://b.example/fresh"))
    assert scheduler.flush_outbox()

    _lose_replies(scheduler)
    assert scheduler.next_request() is None  # the reply was lost; the call ran
    scheduler._down_until = 0.0  # Redis answers again
    last = scheduler.next_request()
    assert last is not None and last.url == "https://a.example/last"
    assert [e.split(b"#")[1] for e in rds.hvals("{t}:ldata")] == [b"3"]  # leased once
    assert scheduler.next_request() is None  # nothing beside it
    harness.finish(scheduler, last)
    fresh = scheduler.next_request()
    assert fresh is not None and fresh.url == "https://b.example/fresh"
    harness.finish(scheduler, fresh)
    assert frontier.audit() == {}


def rounds_until(scheduler: Any, url: str, most: int) -> list[list[str]]:
    """Lease all the scheduler gives, finish it, and again, until ``url``
    was served or ``most`` rounds: the URLs of each round."""
    rounds: list[list[str]] = []
    for _ in range(most):
        got = harness.lease_all(scheduler)
        rounds.append([r.url for r in got])
        for request in got:
            harness.finish(scheduler, request)
        if url in rounds[-1]:
            break
    return rounds


def behind_better_work(redis_url: str, rds: redis.Redis) -> tuple[Frontier, Any]:
    """A frontier and a scheduler (16 requests at once, 4 per site) on a frontier where
    ``https://a.example/last`` is one death short of max_deliveries=3 and
    ``h.example`` has 40 requests of better priority (10) queued."""
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3)
    frontier.load_scripts()
    scheduler, _ = harness.open_scheduler(
        redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3, CONCURRENT_REQUESTS=16,
        FRONTIER_CONCURRENCY=4,
    )
    scheduler.enqueue_request(Request("https://a.example/last", priority=0))
    assert scheduler.flush_outbox()
    _make_last_chance(rds, frontier, 2)
    for i in range(40):
        scheduler.enqueue_request(Request(f"https://h.example/{i}", priority=10))
    assert scheduler.flush_outbox()
    return frontier, scheduler


def _make_last_chance(rds: redis.Redis, frontier: Frontier, deaths: int) -> None:
    """Another worker leases the (only due) request ``deaths`` times and
    dies each time."""
    for n in range(1, deaths + 1):
        [lease] = _leased(frontier.lease_many([f"dies#{n}:0"]))
        _until_past(rds, lease.lease_id)


def test_after_draining_for_a_last_chance_the_worker_takes_it_despite_higher_priority_work(
    redis_url: str, rds: redis.Redis,
) -> None:
    """(A reviewer's case.) The worker meets the last chance after the 4
    requests of a site of better priority it may take (its concurrency),
    and drains. Drained, it asks with the site it drained for (lease.lua's
    ARGV[17]) and takes the last chance alone, though better work is still
    queued: else it would lease that first, meet the last chance beside it
    and drain again, for as long as better work is queued."""
    _, scheduler = behind_better_work(redis_url, rds)
    rounds = rounds_until(scheduler, "https://a.example/last", 4)
    drains = scheduler.stats.get_value("frontier/last_chance/drains")
    # round 1: 4 of h.example (its concurrency), the last chance put back:
    # a drain. Drained, the worker holds nothing: the last chance, alone.
    assert rounds[1] == ["https://a.example/last"], (rounds, drains)


def test_two_workers_draining_for_one_last_chance_both_go_on(
    redis_url: str, rds: redis.Redis,
) -> None:
    """Two workers each hold a request when they meet the same last chance:
    both drain. The first to hold nothing takes it alone; the other, once
    drained, goes on leasing the rest (neither starves)."""
    frontier = Frontier(rds, "t", lease_timeout=0.05, max_deliveries=3)
    frontier.load_scripts()
    a, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3,
                                  CONCURRENT_REQUESTS=1)
    b, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_MAX_DELIVERIES=3,
                                  CONCURRENT_REQUESTS=1)
    a.enqueue_request(Request("https://c.example/a"))
    a.enqueue_request(Request("https://d.example/b"))
    assert a.flush_outbox()
    held_a, held_b = a.next_request(), b.next_request()
    assert held_a is not None and held_b is not None
    a.enqueue_request(Request("https://a.example/last"))
    assert a.flush_outbox()
    _make_last_chance(rds, frontier, 2)
    for i in range(8):
        a.enqueue_request(Request(f"https://e.example/{i}"))
    assert a.flush_outbox()
    more_a, more_b = harness.lease_all(a), harness.lease_all(b)
    assert a.stats.get_value("frontier/last_chance/drains") == 1
    assert b.stats.get_value("frontier/last_chance/drains") == 1
    for r in [held_a, *more_a]:
        harness.finish(a, r)
    last = a.next_request()
    assert last is not None and last.url == "https://a.example/last"
    assert a.next_request() is None
    for r in [held_b, *more_b]:
        harness.finish(b, r)
    rest = harness.lease_all(b)
    assert rest, "b leases nothing after its drain"
    for r in rest:
        harness.finish(b, r)
    harness.finish(a, last)
    while (r := a.next_request()) is not None:
        harness.finish(a, r)
    while (r := b.next_request()) is not None:
        harness.finish(b, r)
    assert frontier.pending() == 0
    assert frontier.audit() == {}
