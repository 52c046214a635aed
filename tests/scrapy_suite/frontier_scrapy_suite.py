"""pytest plugin: Scrapy's own scheduler tests, run against the frontier.

Loaded with ``-p frontier_scrapy_suite`` by
``tests/test_scrapy_scheduler_suite.py``, in a pytest process whose
``tests`` package is the one of Scrapy's source distribution (this
directory and the project's root come after it on ``sys.path``). It holds
none of Scrapy's test code; it changes how those tests build a scheduler:

* ``tests.test_scheduler.Scheduler`` (what ``create_scheduler`` builds
  with ``build_from_crawler``) becomes :class:`SuiteScheduler`: the
  frontier's :class:`~crawler.frontier.scheduler.FrontierScheduler` built
  with the frontier's settings (those :class:`crawler.addon.FrontierAddon`
  sets) over the test's own, against the Redis named by
  ``FRONTIER_SCRAPY_SUITE_REDIS_URL``;
* ``get_crawler`` of both test modules gives every crawler the add-on, the
  same Redis and the frontier's dupefilter (Scrapy's settings in those tests
  name ``scrapy.dupefilters.BaseDupeFilter``, an in-process component the
  frontier replaces);
* the crawl tests of ``tests.test_scheduler_base``
  (``Test*SchedulerCrawl``) crawl with the frontier's scheduler in place of
  their toy ones.

Scrapy's settings that name its in-process queues
(``SCHEDULER_PRIORITY_QUEUE``, ``SCHEDULER_DISK_QUEUE``,
``SCHEDULER_MEMORY_QUEUE``) have no meaning for the frontier; ``JOBDIR``
(Scrapy's "keep the queue for the next run") becomes ``SCHEDULER_PERSIST``.

**The engine stand-in.** Scrapy's tests take requests with
``next_request`` from an engine that is a ``Mock``: nothing ever tells the
scheduler that a request was handled. The frontier leases what it hands
out, and a lease counts as pending until Scrapy's engine finishes it
(``_slot.remove_request``). :class:`SuiteScheduler` does what the engine
does between two of its calls: before each ``next_request``,
``has_pending_requests``, ``len`` or ``close``, every request handed out
since is finished through the engine's ``_slot.remove_request``, which the
scheduler hooks at open. With a real engine (the crawl tests) it does
nothing: the engine acknowledges by itself. A crawler that has no engine
at all (``TestIncompatibility`` opens a scheduler from ``get_crawler``'s
crawler, never started) is given :class:`StandInEngine`.

**Differences by design.** :data:`EXPECTED_DIFFERENCES` maps test ids to
the reason; each such test is marked ``xfail(strict=True)``, so a test that
starts passing fails the run (docs/scrapy-scheduler-differences.md).

Coroutine and ``inlineCallbacks`` tests (Scrapy's ``coroutine_test``,
``inline_callbacks_test``) return a Deferred once the asyncio reactor is
installed; :func:`pytest_pyfunc_call` runs it to its end on the reactor's
loop (what pytest-twisted does in Scrapy's own runs).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
from typing import TYPE_CHECKING, Any

import pytest
import redis

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler

#: The environment variable naming the Redis the tests use (db flushed
#: before each test).
REDIS_URL_ENV = "FRONTIER_SCRAPY_SUITE_REDIS_URL"

#: Test id (as pytest names it from the rootdir) -> why the frontier
#: differs there on purpose (docs/scrapy-scheduler-differences.md).
EXPECTED_DIFFERENCES: dict[str, str] = {
    "tests/test_scheduler.py::test_unserializable_requests": (
        "a request that no encoding can carry (a function in meta) is refused when "
        "scheduled (scheduler/unencodable, one error line naming the key): the "
        "frontier has no per-process memory queue to keep it in"
    ),
    "tests/test_scheduler.py::TestMigration::test_migration": (
        "no JOBDIR queue state to migrate: the queue lives in Redis in one format "
        "whatever SCHEDULER_PRIORITY_QUEUE names (the frontier does not use it)"
    ),
    "tests/test_scheduler.py::TestIncompatibility::test_incompatibility": (
        "CONCURRENT_REQUESTS_PER_IP is accepted: it limits each worker's own "
        "downloader, while the frontier paces sites by download slot "
        "(docs/politeness.md); SCHEDULER_PRIORITY_QUEUE is not used"
    ),
    "tests/test_scheduler.py::test_scheduler_without_crawler": (
        "the constructor is scrapy-redis's (a Redis client first); the frontier's "
        "scheduler is built with from_crawler only"
    ),
}

_workers = itertools.count()
_opened: list[Any] = []


def _redis_url() -> str:
    url = os.environ.get(REDIS_URL_ENV)
    if not url:
        raise pytest.UsageError(f"{REDIS_URL_ENV} must name the Redis the tests may flush")
    return url


def frontier_settings(jobdir: object = None) -> dict[str, object]:
    """The frontier's settings for a test's crawler: its scheduler, queue
    and dupefilter (:data:`crawler.addon.ADDON_SETTINGS`), this run's Redis,
    a worker id of its own, and ``SCHEDULER_PERSIST`` from ``JOBDIR``."""
    from crawler.addon import ADDON_SETTINGS

    return {
        **ADDON_SETTINGS,
        "SCHEDULER_PERSIST": bool(jobdir),
        "REDIS_URL": _redis_url(),
        "FRONTIER_WORKER_ID": f"scrapy-suite-{next(_workers)}",
    }


class _StandInSlot:
    """The engine slot's ``remove_request``, which the scheduler hooks."""

    def remove_request(self, request: Request) -> None:
        pass


class StandInEngine:
    """An engine for a crawler that never started (Scrapy's
    ``TestIncompatibility`` opens a scheduler without one): a slot to hook,
    and no downloader (the scheduler then leases one request at a time)."""

    def __init__(self) -> None:
        self._slot = _StandInSlot()
        self.downloader = None


def _prepare_mock_crawler(crawler: Crawler) -> None:
    """Make the not-started crawler of Scrapy's ``MockCrawler`` (its settings
    not frozen: the crawl never began) what a crawl with the frontier's
    add-on has when it builds the scheduler: the frontier's settings and the
    request fingerprinter (Scrapy's ``RFPDupeFilter`` needs it as ours does;
    the tests use ``BaseDupeFilter``, which does not). Crawlers of real
    crawls (``get_crawler``) are left as they are."""
    from scrapy.utils.misc import build_from_crawler, load_object

    if crawler._engine is None:
        crawler.engine = StandInEngine()
    settings = crawler.settings
    if settings.frozen:
        return
    settings.update(frontier_settings(settings.get("JOBDIR")), "cmdline")
    if crawler._request_fingerprinter is None:
        crawler.request_fingerprinter = build_from_crawler(
            load_object(settings["REQUEST_FINGERPRINTER_CLASS"]), crawler
        )


def _scheduler_class() -> type:
    from scrapy.core.engine import ExecutionEngine

    from crawler.frontier.scheduler import FrontierScheduler

    class SuiteScheduler(FrontierScheduler):  # type: ignore[misc]
        """The frontier's scheduler, with the frontier's settings, and the
        engine stand-in described in the module's docstring."""

        @classmethod
        def from_crawler(cls, crawler: Crawler) -> Any:
            _prepare_mock_crawler(crawler)
            scheduler = super().from_crawler(crawler)
            scheduler._taken = []
            _opened.append(scheduler)
            return scheduler

        def _engine_finishes(self) -> None:
            """What Scrapy's engine does once it has handled each request
            it took: ``_slot.remove_request`` (hooked at open: the ack)."""
            engine = getattr(self.crawler, "engine", None)
            if isinstance(engine, ExecutionEngine):
                self._taken.clear()  # a real engine acknowledges by itself
                return
            while self._taken:
                engine._slot.remove_request(self._taken.pop(0))

        def next_request(self) -> Request | None:
            self._engine_finishes()
            request = super().next_request()
            if request is not None:
                self._taken.append(request)
            return request

        def has_pending_requests(self) -> bool:
            self._engine_finishes()
            return bool(super().has_pending_requests())

        def __len__(self) -> int:
            self._engine_finishes()
            return int(super().__len__())

        def close(self, reason: str) -> None:
            self._engine_finishes()
            super().close(reason)

    SuiteScheduler.__module__ = __name__
    return SuiteScheduler


def _get_crawler(original: Any) -> Any:
    """``scrapy.utils.test.get_crawler`` with the frontier's add-on, its
    scheduler and dupefilter and this run's Redis over the test's settings."""

    def get_crawler(spidercls: Any = None, settings_dict: Any = None, **kwargs: Any) -> Any:
        settings = dict(settings_dict or {})
        settings.update(frontier_settings(settings.get("JOBDIR")))
        settings["ADDONS"] = {"crawler.addon.FrontierAddon": 0, **settings.get("ADDONS", {})}
        settings["SCHEDULER"] = f"{__name__}.SuiteScheduler"
        return original(spidercls, settings, **kwargs)

    return get_crawler


SuiteScheduler: type | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Install and start the asyncio reactor before Scrapy's test modules
    import (their decorators choose by it); make the certificates Scrapy's
    MockServer serves HTTPS with; build :class:`SuiteScheduler`."""
    global SuiteScheduler  # noqa: PLW0603
    from scrapy.utils.reactor import install_reactor, is_reactor_installed

    if not is_reactor_installed():
        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    from twisted.internet import reactor

    # Started, not run: its startup triggers (the thread pool that
    # deferToThread needs) fire; tests then drive its asyncio loop.
    reactor.startRunning(installSignalHandlers=False)  # type: ignore[attr-defined]
    from tests.keys import generate_keys

    generate_keys()
    SuiteScheduler = _scheduler_class()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Shut the reactor down (its thread pool's threads end)."""
    from twisted.internet import reactor

    if reactor.running:  # type: ignore[attr-defined]
        reactor.fireSystemEvent("shutdown")  # type: ignore[attr-defined]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that differ by design ``xfail(strict=True)``."""
    for item in items:
        reason = EXPECTED_DIFFERENCES.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def _loop() -> asyncio.AbstractEventLoop:
    from twisted.internet import reactor

    loop: asyncio.AbstractEventLoop = reactor._asyncioEventloop  # type: ignore[attr-defined]
    asyncio.set_event_loop(loop)
    return loop


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a test that returns a Deferred or a coroutine to its end on the
    reactor's asyncio loop."""
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet.defer import Deferred

    names = pyfuncitem._fixtureinfo.argnames
    result = pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names})
    if inspect.iscoroutine(result):
        result = deferred_from_coro(result)
    if isinstance(result, Deferred):
        loop = _loop()
        loop.run_until_complete(result.asFuture(loop))
    return True


@pytest.fixture(scope="session")
def mockserver() -> Iterator[Any]:
    """Scrapy's MockServer (the fixture of Scrapy's own conftest)."""
    from tests.mockserver.http import MockServer

    with MockServer() as server:
        yield server


@pytest.fixture(autouse=True)
def frontier_in_place(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A clean Redis, and the frontier's scheduler where the test builds one."""
    client = redis.Redis.from_url(_redis_url())
    try:
        client.flushdb()
    finally:
        client.close()
    module = request.module
    name = module.__name__
    if name in {"tests.test_scheduler", "tests.test_scheduler_base"}:
        monkeypatch.setattr(module, "get_crawler", _get_crawler(module.get_crawler))
    if name == "tests.test_scheduler":
        monkeypatch.setattr(module, "Scheduler", SuiteScheduler)
    cls = request.cls
    if cls is not None and name == "tests.test_scheduler_base":
        if hasattr(cls, "scheduler_cls"):  # the crawl tests
            monkeypatch.setattr(cls, "scheduler_cls", SuiteScheduler)
    yield
    _stop_opened()


def _stop_opened() -> None:
    """Stop the heartbeats and outbox timers of the schedulers opened by the
    test, and let the loop finish their cancelled tasks."""
    while _opened:
        scheduler = _opened.pop()
        beat = getattr(scheduler, "_heartbeat", None)
        if beat is not None and beat.running:
            beat.stop()
        if scheduler.outbox.flush_call is not None:
            scheduler.outbox.flush_call.cancel()
            scheduler.outbox.flush_call = None
    loop = _loop()
    if not loop.is_running():
        loop.run_until_complete(asyncio.sleep(0))
