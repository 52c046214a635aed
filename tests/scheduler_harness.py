"""The frontier scheduler in process, against a real Redis, without an engine.

The scheduler hooks the engine slot's ``remove_request`` to acknowledge
leases; :class:`StubSlot` stands in for it, and :func:`finish` does what the
engine does once it has handled a request. The stub engine's downloader has
``CONCURRENT_REQUESTS`` free slots and none taken, so the scheduler leases in
batches of up to that many, as in a crawl. Outbox flushes and heartbeats are
scheduled on the asyncio reactor's loop, which these tests do not run: they
send the outbox themselves, and the ``stop_heartbeats`` fixture (conftest)
stops the heartbeats of every scheduler opened here.
"""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import build_from_crawler
from scrapy.utils.reactor import install_reactor, is_reactor_installed
from scrapy.utils.test import get_crawler

from crawler.frontier.scheduler import FrontierScheduler
from tests.waiting import wait_for

if TYPE_CHECKING:
    from scrapy import Request, Spider

if not is_reactor_installed():
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")

#: The frontier's components, as crawler/settings.py configures them.
SETTINGS = {
    "SCHEDULER_QUEUE_CLASS": "crawler.frontier.queue.LeasedPriorityQueue",
    "SCHEDULER_QUEUE_KEY": "{%(spider)s}",
    "FRONTIER_DELAY": 0.0,
    "FRONTIER_CONCURRENCY": 8,
    # exact paces: tests/test_randomize_delay.py turns Scrapy's default on
    "DOWNLOAD_DELAY_JITTER": 0,
    "SCHEDULER_DUPEFILTER_KEY": "{%(spider)s}:dupefilter",
    "DUPEFILTER_CLASS": "crawler.frontier.dupefilter.FrontierDupeFilter",
    "SCHEDULER_PERSIST": True,
    # (with ROBOTSTXT_OBEY, the frontier's robots.txt gate is ours to open)
    "DOWNLOADER_MIDDLEWARES": {
        "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
        "crawler.politeness.SharedRobotsTxtMiddleware": 100,
    },
}

_workers = itertools.count()


def reactor_loop() -> asyncio.AbstractEventLoop:
    """The asyncio loop of the installed reactor, made the current loop
    (``asyncio.run`` in another test leaves none current)."""
    from twisted.internet import reactor

    loop: asyncio.AbstractEventLoop = reactor._asyncioEventloop  # type: ignore[attr-defined]
    asyncio.set_event_loop(loop)
    return loop
_opened: list[FrontierScheduler] = []


class StubSlot:
    """Stands in for the engine's slot: the scheduler hooks remove_request."""

    def remove_request(self, request: Request) -> None:
        pass


def open_scheduler(
    redis_url: str, spidercls: type[Spider], *, heartbeat_thread: bool = False, **settings: Any
) -> tuple[FrontierScheduler, Any]:
    """Open a scheduler as its own worker; returns it and its crawler.

    Its heartbeat thread (:class:`crawler.frontier.heartbeat.HeartbeatThread`)
    is stopped at once unless ``heartbeat_thread``: a scheduler left open
    then beats only when the test turns the loop, as the tests of dead
    workers expect."""
    worker = {"FRONTIER_WORKER_ID": f"test-worker-{next(_workers)}"}
    crawler = get_crawler(spidercls, {**SETTINGS, "REDIS_URL": redis_url, **worker, **settings})
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    crawler.engine = SimpleNamespace(
        _slot=StubSlot(),
        downloader=SimpleNamespace(
            total_concurrency=crawler.settings.getint("CONCURRENT_REQUESTS"), active=set()
        ),
    )
    scheduler = build_from_crawler(FrontierScheduler, crawler)
    reactor_loop()
    scheduler.open(crawler.spider)
    if not heartbeat_thread and scheduler.heartbeats.thread is not None:
        scheduler.heartbeats.thread.stop(timeout=5)
        scheduler.heartbeats.thread = None
    _opened.append(scheduler)
    return scheduler, crawler


def stop_opened() -> None:
    """Stop the heartbeats and outbox timers of every scheduler opened so
    far, and let the loop finish their cancelled tasks (else asyncio reports
    them at exit)."""
    while _opened:
        scheduler = _opened.pop()
        beat = scheduler.heartbeats.loop
        if beat is not None and beat.running:
            beat.stop()
        if scheduler.heartbeats.thread is not None:  # the heartbeat thread: no beat after the test
            scheduler.heartbeats.thread.stop(timeout=5)
            scheduler.heartbeats.thread = None
        if scheduler.outbox.flush_call is not None:  # its outbox timer: no write after the test
            scheduler.outbox.flush_call.cancel()
            scheduler.outbox.flush_call = None
    loop = reactor_loop()
    if not loop.is_running():
        loop.run_until_complete(asyncio.sleep(0))


def finish(scheduler: FrontierScheduler, request: Request) -> None:
    """What the engine does once it has handled ``request``."""
    scheduler.crawler.engine._slot.remove_request(request)
    assert scheduler.flush_outbox()


def lease_all(scheduler: FrontierScheduler) -> list[Request]:
    """Lease until nothing is due."""
    out = []
    while (request := scheduler.next_request()) is not None:
        out.append(request)
    return out


def wait_for_request(scheduler: FrontierScheduler, timeout: float = 5.0) -> Request:
    """Poll until a lease is handed out (leases and retries come due by time)."""
    return wait_for(scheduler.next_request, timeout, "a request to become due", 0.01)
