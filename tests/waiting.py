"""Waiting for an event in tests: one polling loop, with a deadline.

Most events the tests wait for (a key appearing in Redis, a page served, a
lease expiring on Redis's clock) cannot be subscribed to, so they are
polled; every wait has a deadline and says what it waited for.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

__all__ = ["wait_for"]


def wait_for(
    condition: Callable[[], T],
    timeout: float = 60.0,
    what: str = "the condition",
    interval: float = 0.02,
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns a true
    value, and return that value.

    :raises AssertionError: naming ``what``, after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
