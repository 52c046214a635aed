"""A forced stop (a second SIGTERM/SIGINT) gives the worker's leases back.

Scrapy answers a second shutdown signal by stopping the reactor at once
(``CrawlerProcess._signal_kill``): the engine and the scheduler are never
closed. The reactor still fires its ``before shutdown`` triggers, so the
scheduler registers one (:func:`before_reactor_stops`) that gives its leases
back in one bounded call before the process ends.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from scrapy.utils.reactor import is_reactor_installed

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Longest a forced stop waits for Redis to answer the give-back (seconds).
GIVE_BACK_TIMEOUT = 2.0
#: Longest a graceful stop waits for Redis (seconds; ``FRONTIER_LEASE_TIMEOUT``
#: when shorter) to take the leases given back and the outbox: past it,
#: Redis is taken for down, and what was not sent is left to the leases'
#: expiry (docs/stopping.md).
CLOSE_REDIS_WAIT = 10.0


def before_reactor_stops(call: Callable[[], None]) -> Callable[[], None]:
    """Run ``call`` on the reactor thread before the reactor stops.

    :returns: a function that unregisters it (a no-op when no Twisted
        reactor is installed, where nothing is registered).
    """
    if not is_reactor_installed():
        return lambda: None
    # (imported here: importing it installs the default reactor)
    from twisted.internet import reactor as installed  # noqa: PLC0415

    reactor: Any = installed  # (its interface's stubs lack ``self``)

    trigger = reactor.addSystemEventTrigger("before", "shutdown", call)

    def remove() -> None:
        try:
            reactor.removeSystemEventTrigger(trigger)
        except (KeyError, ValueError):
            pass  # already fired or removed

    return remove


def run_bounded(
    call: Callable[[], bool], timeout: float = GIVE_BACK_TIMEOUT,
    what: str = "The give-back at a forced stop",
) -> bool | None:
    """Run ``call`` in a daemon thread; wait at most ``timeout`` seconds.
    ``what`` names the call in the log line of an exception it raised.

    :returns: what ``call`` returned, or None when it had not returned in
        time or raised (the thread is left to the process's exit: a Redis
        call is never sent again from here).
    """
    result: list[bool] = []

    def run() -> None:
        try:
            result.append(call())
        except Exception:
            logger.exception("%s failed", what)

    thread = threading.Thread(target=run, name="frontier-give-back", daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0] if result else None
