"""The scheduler's outbox on its own (:mod:`crawler.frontier.outbox`): writes
kept in order, cut into one commit per shard that a real Redis runs, acks
held back behind other shards' requests, ``after_commit`` callbacks, and
the timer that sends it."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import pytest

from crawler.frontier.outbox import Outbox
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Push
from crawler.keys import shard_of
from tests.scheduler_harness import reactor_loop

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

SHARDS = 3


@pytest.fixture
def outbox() -> Iterator[Outbox]:
    reactor_loop()
    box = Outbox(60.0, flush=lambda: True, resume_at=lambda: 0.0)
    yield box
    box.cancel()


def _site_on(shard: int) -> str:
    """A site that lands on ``shard`` of :data:`SHARDS`."""
    return next(
        site for n in range(1000)
        if shard_of(site := f"s{n}.example", SHARDS) == shard
    )


def _push(site: str, fingerprint: bytes, priority: int = 0) -> Push:
    return Push(f"https://{site}/".encode(), site, priority, fingerprint, False)


def test_writes_for_one_shard_go_in_one_commit_that_flags_each_push_in_order(
    outbox: Outbox, rds: redis.Redis
) -> None:
    shards = FrontierShards.build(rds, "ob", SHARDS)
    site = _site_on(1)
    for fingerprint in (b"a", b"b", b"a"):  # the third a duplicate
        outbox.write("pushes", item=_push(site, fingerprint), shard=1)
    groups, batches = outbox.batches()
    assert list(batches) == [1] and [op.item.fingerprint for op in groups[1]] == [b"a", b"b", b"a"]
    committed = shards[1].commit(batches[1])
    assert committed is not None and committed.pushed == [True, True, False]
    assert shards[1].pending() == 2 and shards[0].pending() == shards[2].pending() == 0
    outbox.remove(groups[1])
    assert not outbox and outbox.batches() == ({}, {})


def test_an_ack_waits_while_an_earlier_write_for_another_shard_carries_a_request(
    outbox: Outbox,
) -> None:
    outbox.write("pushes", item=_push(_site_on(1), b"p"), shard=1)
    outbox.write("slots", item="w:1", shard=2)
    outbox.write("acks", item="w:0", shard=0)
    groups, batches = outbox.batches()
    assert outbox.acks_held == 1
    assert sorted(batches) == [1, 2] and batches[2].slots == ["w:1"]
    assert list(outbox.acks()) == [(0, "w:0")]  # (still waiting: extended)
    outbox.remove(groups[1] + groups[2])  # that round trip is in Redis
    groups, batches = outbox.batches()
    assert outbox.acks_held == 0 and list(batches) == [0] and batches[0].acks == ["w:0"]
    assert outbox.only_acks()


def test_an_ack_goes_with_the_requests_before_it_on_its_own_shard_and_past_slots(
    outbox: Outbox,
) -> None:
    outbox.write("pushes", item=_push(_site_on(0), b"p"), shard=0)
    outbox.write("slots", item="w:1", shard=1)  # (a freed slot carries no request)
    outbox.write("acks", item="w:1", shard=1)
    outbox.write("acks", item="w:0", shard=0)
    _, batches = outbox.batches()
    assert outbox.acks_held == 1  # the ack of shard 1 only: a push of shard 0 is before it
    assert batches[0].acks == ["w:0"] and len(batches[0].pushes) == 1
    assert batches[1].slots == ["w:1"] and batches[1].acks == []


def test_a_freed_slot_of_a_lease_acked_in_the_same_commit_is_left_out(outbox: Outbox) -> None:
    outbox.write("slots", item="w:5", shard=0)
    outbox.write("slots", item="w:6", shard=0)
    outbox.write("acks", item="w:5", shard=0)
    _, batches = outbox.batches()
    assert batches[0].slots == ["w:6"] and batches[0].acks == ["w:5"]


def test_after_commit_callbacks_run_once_every_write_before_them_is_in(
    outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def fails() -> None:
        ran.append("fails")
        raise RuntimeError("the callback's own")

    first = _push(_site_on(0), b"1")
    outbox.write("pushes", item=first, shard=0)
    outbox.write("after_commit", done=lambda: ran.append("first"))
    outbox.write("after_commit", done=fails)
    outbox.write("pushes", item=_push(_site_on(0), b"2"), shard=0)
    outbox.write("after_commit", done=lambda: ran.append("second"))
    assert outbox.writes() == 2
    outbox.settle()
    assert ran == []
    outbox.remove([op for op in outbox.ops if op.item is first])
    with caplog.at_level(logging.ERROR):
        outbox.settle()
    assert ran == ["first", "fails"]
    assert "after_commit callback failed" in caplog.text
    assert outbox.writes() == 1 and outbox.give_up() == 1 and not outbox
    outbox.settle()
    assert ran == ["first", "fails"]  # given up: never run


def test_the_timer_sends_the_outbox_after_its_delay_and_again_until_it_is_sent() -> None:
    loop = reactor_loop()
    sent = loop.create_future()
    calls: list[float] = []

    def flush() -> bool:
        calls.append(time.monotonic())
        if len(calls) < 2:
            return False  # (Redis unreachable: tried again at resume_at)
        sent.set_result(True)
        box.ops.clear()
        return True

    box = Outbox(0.01, flush=flush, resume_at=lambda: time.monotonic() + 0.05)
    started = time.monotonic()
    box.write("acks", item="w:0", shard=0)
    box.write("acks", item="w:1", shard=0)  # (one timer for both)
    loop.run_until_complete(asyncio.wait_for(sent, 5))
    assert len(calls) == 2
    assert calls[0] - started >= 0.01 and calls[1] - calls[0] >= 0.045
    assert box.flush_call is None
