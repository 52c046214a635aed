"""The scheduler's wake-ups: Scrapy's engine asked again when work is due.

Job: Scrapy's engine asks the scheduler for a request when a download
ends, or every 5 seconds; a frontier whose next site or retry is due
sooner would leave the engine idle until then. Keep when the next lease
call may find work (:attr:`WakeUp.due_at`), as lease replies, freed slots
and acks tell it; tell the spider how long that is (:attr:`WakeUp.next_due`);
and, when the scheduler has nothing to hand out, schedule the engine's next
call for then (:meth:`WakeUp.when_due`), one wake-up at a time.

Collaborators: the crawler's engine (its slot's ``nextcall``) and Scrapy's
``call_later`` (the reactor).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["WakeUp"]


class WakeUp:
    """The wake-ups of one crawler's engine.

    :ivar due_at: ``time.monotonic()`` when the next lease call may find
        work; None: nothing was queued when last asked.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.due_at: float | None = None
        self._call: Any = None
        self._at: float | None = None

    @property
    def next_due(self) -> float | None:
        """Seconds until :attr:`due_at` (at least 0), or None."""
        if self.due_at is None:
            return None
        return max(0.0, self.due_at - time.monotonic())

    def sooner(self, at: float) -> None:
        """Work may be found at ``at`` (``time.monotonic()``), if sooner
        than :attr:`due_at` (a slot freed)."""
        if self.due_at is not None and self.due_at > at:
            self.due_at = at

    def when_due(self) -> None:
        """Wake the engine at :attr:`due_at`, unless a wake-up is already
        set for then or sooner (nothing when None)."""
        if self.due_at is None:
            return
        at = self.due_at
        if self._at is not None and self._at <= at:
            return
        if self._call is not None:
            self._call.cancel()
        self._at = at
        self._call = call_later(max(0.0, at - time.monotonic()), self.now)

    def now(self) -> None:
        """Wake the engine now: its next call is scheduled."""
        self._at = self._call = None
        slot = getattr(getattr(self.crawler, "engine", None), "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    def cancel(self) -> None:
        """Cancel the wake-up set (the scheduler closes)."""
        if self._call is not None:
            self._call.cancel()
            self._at = self._call = None
