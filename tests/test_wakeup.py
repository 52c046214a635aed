"""The scheduler's wake-ups on their own (:mod:`crawler.frontier.wakeup`):
when work is due, how long the spider sleeps, and the engine's next call
scheduled once, then run on the reactor's loop."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from crawler.frontier.wakeup import WakeUp
from tests.scheduler_harness import reactor_loop


class _Engine:
    """A crawler whose engine records each call it is woken for; ``woken``
    is done at the first."""

    def __init__(self) -> None:
        self.loop = reactor_loop()
        self.calls: list[float] = []
        self.woken: asyncio.Future[None] = self.loop.create_future()
        nextcall = SimpleNamespace(schedule=self._schedule)
        self.crawler: Any = SimpleNamespace(engine=SimpleNamespace(
            _slot=SimpleNamespace(nextcall=nextcall)))

    def _schedule(self) -> None:
        self.calls.append(time.monotonic())
        if not self.woken.done():
            self.woken.set_result(None)

    def run_until_woken(self) -> None:
        self.loop.run_until_complete(asyncio.wait_for(self.woken, 5))
        self.loop.run_until_complete(asyncio.sleep(0))  # (any other call due as well)


def test_nothing_due_sets_no_wake_up_and_a_freed_slot_only_brings_work_sooner() -> None:
    engine = _Engine()
    wake = WakeUp(engine.crawler)
    assert wake.next_due is None
    wake.when_due()
    wake.sooner(time.monotonic())  # nothing queued: stays None
    assert wake.due_at is None and engine.calls == []
    wake.due_at = time.monotonic() + 60
    assert 59 < (wake.next_due or 0) <= 60
    wake.sooner(time.monotonic() + 120)  # not sooner: unchanged
    assert 59 < (wake.next_due or 0) <= 60
    wake.sooner(time.monotonic())
    assert wake.next_due == 0.0


def test_the_engine_is_woken_once_when_due_and_a_later_ask_keeps_the_sooner_call() -> None:
    engine = _Engine()
    wake = WakeUp(engine.crawler)
    start = time.monotonic()
    wake.due_at = start + 0.05
    wake.when_due()
    wake.due_at += 60  # a later time: the sooner wake-up stays
    wake.when_due()
    engine.run_until_woken()
    assert len(engine.calls) == 1 and engine.calls[0] - start < 30


def test_a_cancelled_wake_up_does_not_wake_the_engine() -> None:
    engine = _Engine()
    wake = WakeUp(engine.crawler)
    wake.due_at = time.monotonic()
    wake.when_due()
    wake.cancel()
    wake.due_at = time.monotonic()
    wake.when_due()  # set again: only this one wakes the engine
    engine.run_until_woken()
    assert len(engine.calls) == 1
