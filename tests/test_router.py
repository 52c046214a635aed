"""The scheduler's shard router on its own (:mod:`crawler.frontier.router`),
over three shards of a real Redis: peeks learn each shard's best priority
and head, the next lease call goes to the best priority first, then first
in, first out, then in turn; this worker's own pushes count before they are
committed; a shard that said "wait" does not cut batches elsewhere."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import pytest

from crawler.frontier.router import EMPTY_SHARD_RECHECK, ShardRouter
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Committed, Lease, NotDue, Push
from crawler.keys import shard_of
from tests.faultproxy import FaultProxy
from tests.test_session import _Host, _session

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from crawler.frontier.outbox import Outbox
    from crawler.frontier.session import Session

SHARDS = 3
HOLDER = "router-worker#0001"


class _Peeked(_Host):
    def __init__(self) -> None:
        super().__init__()
        self.housekept: list[int] = []

    def housekeeping(self, result: Lease | NotDue, shard: int) -> None:
        self.housekept.append(shard)


def _router(url: str) -> tuple[ShardRouter, Session, _Peeked]:
    session, _, _ = _session(url)
    host = _Peeked()
    session.host = host
    session.shards = FrontierShards.build(session.server, "sess", SHARDS)
    session.shards.load_scripts()
    router = ShardRouter(HOLDER, session, session.outbox, host.housekeeping)
    router.open(session.shards)
    return router, session, host


def _site_on(shard: int, n: int = 0) -> str:
    sites = (f"r{i}.example" for i in range(10_000))
    return [s for s in sites if shard_of(s, SHARDS) == shard][n]


def _push(router: ShardRouter, shard: int, priority: int, n: int = 0) -> None:
    site = _site_on(shard, n)
    push = Push(f"https://{site}/".encode(), site, priority, site.encode(), False)
    router.shards[shard].push_many([push])


@pytest.fixture
def proxy(redis_url: str, rds: redis.Redis) -> Iterator[FaultProxy]:
    rds.script_flush()
    with FaultProxy(redis_url) as fault_proxy:
        yield fault_proxy


def test_the_shard_with_the_best_priority_due_is_asked_first(redis_url: str) -> None:
    router, _, host = _router(redis_url)
    for shard, priority in ((0, 1), (1, 9), (2, 5)):
        _push(router, shard, priority)
    router.peek_stale()
    assert sorted(host.housekept) == [0, 1, 2]
    assert [view.best for view in router.views] == [1, 9, 5]
    assert router.next_shard(set()) == 1
    assert router.next_shard({1}) == 2
    least, head = router.best_elsewhere(1)
    assert least == 5 and isinstance(head, int)
    router.peek_stale()  # heard from within the second: no peek
    assert len(host.housekept) == 3


def test_equal_priorities_go_first_in_first_out_across_shards_then_in_turn(
    redis_url: str,
) -> None:
    router, _, _ = _router(redis_url)
    _push(router, 2, 0)
    _push(router, 0, 0)  # joined its ready index after shard 2's
    router.peek_stale()
    assert router.views[2].head < router.views[0].head
    assert router.next_shard(set()) == 2
    for view in router.views:  # heads not known: in turn
        view.head = math.inf
    router.turn = 1
    assert router.next_shard(set()) == 2  # (shard 1 was found empty)
    router.views[1].best, router.views[1].due = 0, 0.0  # (a push of priority 0 there)
    assert router.next_shard(set()) == 1


def test_a_push_not_committed_makes_its_shard_due_and_its_head_comes_with_the_commit(
    redis_url: str,
) -> None:
    router, _, _ = _router(redis_url)
    now = router.not_due(0, NotDue(wait=None, expired=0, retried=0))
    assert router.views[0].due is None and router.views[0].empty_at == now
    router.not_due(1, NotDue(wait=None, expired=0, retried=0))
    router.not_due(2, NotDue(wait=None, expired=0, retried=0))
    assert router.next_shard({1, 2}) is None  # found empty less than a second ago
    assert router.earliest_due() is None
    router.note_push(0, 7)
    view = router.views[0]
    assert view.due == 0.0 and view.best == 7 and view.head == math.inf
    assert router.next_shard(set()) == 0
    router.committed(0, Committed([True], 0, 0, 0, [], True, joined=123))
    assert view.head == 123
    router.committed(0, Committed([True], 0, 0, 0, [], True, joined=456))
    assert view.head == 123  # (known: a later commit does not move it)


def test_a_shard_that_said_wait_counts_elsewhere_only_once_its_wait_is_over(
    redis_url: str,
) -> None:
    router, _, _ = _router(redis_url)
    router.not_due(0, NotDue(wait=30.0, expired=0, retried=0, best=9, head=5))
    router.learn_best(1, 2, 7)
    router.views[1].due = 0.0
    assert router.best_elsewhere(2) == (2, 7)  # shard 0's 9 is not this worker's yet
    router.slot_freed(0, time.monotonic())  # a download there ended: ask it now
    assert router.best_elsewhere(2) == (9, 5)
    assert router.earliest_due() == 0.0


def test_a_peek_learns_the_pushes_still_in_the_outbox(redis_url: str) -> None:
    router, session, _ = _router(redis_url)
    site = _site_on(2)
    outbox: Outbox = session.outbox
    outbox.write("pushes", item=Push(b"x", site, 9, b"fx", False), shard=2)
    router.peek_stale()  # (Redis holds nothing yet)
    assert router.views[2].best == 9 and router.views[2].due == 0.0
    assert router.next_shard(set()) == 2
    outbox.cancel()


def test_a_peek_that_meets_an_outage_is_one_and_peeks_again_after_it(
    proxy: FaultProxy,
) -> None:
    router, session, _ = _router(proxy.url)
    _push(router, 1, 4)
    with proxy.outage():
        router.peek_stale()
    assert session.unreachable and session.backoff == 0.5
    assert all(view.best_at == -math.inf for view in router.views)
    router.peek_stale()  # the backoff runs: no peek
    assert router.views[1].best == math.inf
    session.down_until = 0.0
    router.peek_stale()
    assert router.views[1].best == 4


def test_peeks_that_met_scripts_redis_forgot_are_sent_once_more(
    redis_url: str, rds: redis.Redis
) -> None:
    router, _, host = _router(redis_url)
    _push(router, 0, 3)
    rds.script_flush()
    router.peek_stale()
    assert router.views[0].best == 3 and host.seen_forgotten == 1


def test_a_shard_found_empty_is_asked_again_after_the_recheck(redis_url: str) -> None:
    router, _, _ = _router(redis_url)
    for shard in range(SHARDS):
        router.not_due(shard, NotDue(wait=None, expired=0, retried=0))
    assert router.next_shard({0}) is None
    router.views[2].empty_at -= EMPTY_SHARD_RECHECK  # (found empty a second ago)
    assert router.next_shard({0}) == 2
    # The first call of a next_request asks the shard that waited longest.
    assert router.next_shard(set()) == 2
