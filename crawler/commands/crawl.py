"""``scrapy crawl SPIDER``: Scrapy's command, with exit statuses for
configuration errors.

The project's commands module (``COMMANDS_MODULE``) overrides Scrapy's
``crawl`` with this subclass (scrapyd's jobs run it too). It runs the crawl
as Scrapy's does, and adds:

* **Settings are checked first** (:func:`crawler.checks.validate_settings`)
  in a project that switches the frontier on (:func:`frontier_enabled`),
  once the spider's ``custom_settings`` and the ``-s`` options are merged and
  before anything is built: a bad value is reported in one line per setting,
  ``FRONTIER_LEASE_TIMEOUT=-5: must be a number of seconds > 0``, and the
  command exits with status 2 (a usage error, as Scrapy's), without a
  traceback and without touching Redis or MongoDB.
* **A configuration error met at a server** (a wrong password, an ACL, a
  database that cannot be used: see :mod:`crawler.config`) stops the crawl
  with the finish reason ``config_error`` and the command exits with status
  1, as Scrapy's does when a crawl fails to start.
* **A spider the project does not have** is a usage error (status 2): the
  message lists the spiders it has, without Scrapy's ``KeyError`` traceback.
* **A Redis Cluster that does not answer yet** (``FRONTIER_REDIS_CLUSTER``)
  is waited for before the crawl is built, as an outage of one Redis server
  is waited out once it runs: a cluster client learns the slots from a node
  when it is made, so the crawl's components cannot be built without one.
  ``Redis Cluster at redis://:****@node:7000/0 unreachable (...); trying
  again in 0.5s`` is logged at WARNING, the wait doubling to 30 s; Ctrl-C
  or SIGTERM ends it (exit status 1, nothing was leased).
* A :class:`~crawler.config.ConfigurationError` raised while the crawl
  starts (by :class:`crawler.addon.FrontierAddon`'s check, say) is logged in
  one line, not as asyncio's "Task exception was never retrieved" traceback.

Exit statuses: 0 the crawl ran (Scrapy's meaning); 1 it could not start, or
stopped on a configuration error; 2 a usage error or a bad setting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisClusterException, RedisError
from scrapy.commands import crawl
from scrapy.exceptions import UsageError
from scrapy.utils.misc import load_object

from crawler.addon import FrontierAddon
from crawler.checks import validate_settings
from crawler.config import (
    ConfigurationError,
    SettingsError,
    config_error_of,
    scrub,
    secrets_of,
)
from crawler.frontier.connection import cluster_enabled, get_redis, redis_location
from crawler.frontier.scheduler import FrontierScheduler

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import BaseSettings
    from twisted.python.failure import Failure

logger = logging.getLogger(__name__)

__all__ = ["Command"]

#: Exit status of a crawl that could not start or stopped on a
#: configuration error (Scrapy's status for a crawl that failed to start).
EXIT_CONFIG_ERROR = 1
#: Exit status of a bad setting (Scrapy's status for a usage error).
EXIT_BAD_SETTING = 2
#: Seconds between the first tries to reach a Redis Cluster at start, and
#: the longest wait it doubles to (as the scheduler waits out an outage).
CLUSTER_WAIT_FIRST, CLUSTER_WAIT_MAX = 0.5, 30.0


def _configuration_error(exc: BaseException | None) -> ConfigurationError | None:
    """The :class:`ConfigurationError` that ``exc`` is, or was raised from
    or during (Scrapy may raise another error while it cleans up)."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, ConfigurationError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None



def frontier_enabled(settings: BaseSettings) -> bool:
    """Whether the project switches the frontier on: ``ADDONS`` lists
    :class:`crawler.addon.FrontierAddon` (or a subclass), or ``SCHEDULER``
    is ours. An installed package gives every project of the environment this
    command; a project without the frontier is left to run as Scrapy's."""
    for key in settings.getdict("ADDONS"):
        cls = load_object(key) if isinstance(key, str) else key
        if isinstance(cls, type) and issubclass(cls, FrontierAddon):
            return True
    scheduler = settings.get("SCHEDULER")
    cls = load_object(scheduler) if isinstance(scheduler, str) else scheduler
    return isinstance(cls, type) and issubclass(cls, FrontierScheduler)


class Command(crawl.Command):
    """Scrapy's ``crawl``, which exits non-zero on configuration errors."""

    def short_desc(self) -> str:
        return "Run a spider of the current project (exit 1 or 2 on a configuration error)"

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        """Check the settings, run the crawl, set the exit status.

        :raises UsageError: no spider, more than one, or one the project
            does not have (the message lists those it has).
        """
        if len(args) < 1:
            raise UsageError
        if len(args) > 1:
            raise UsageError("running 'scrapy crawl' with more than one spider is not supported")
        assert self.crawler_process
        known = sorted(self.crawler_process.spider_loader.list())
        if args[0] not in known:
            raise UsageError(
                f"unknown spider {args[0]!r}: expected one of {', '.join(known)}",
                print_help=False,
            )
        self._bad_setting = False
        crawler = self._create_crawler(args[0])
        try:
            # Unknown names are warned about once, by the add-on's check.
            if frontier_enabled(crawler.settings):
                validate_settings(crawler.settings, warn_unknown=False)
        except SettingsError as exc:
            self._log_error(exc)
            self.exitcode = EXIT_BAD_SETTING
            return
        if cluster_enabled(crawler.settings) and not self._wait_for_cluster(crawler.settings):
            self.exitcode = EXIT_CONFIG_ERROR
            return
        running: Any = self.crawler_process.crawl(crawler, **opts.spargs)
        if isinstance(running, asyncio.Future):
            running.add_done_callback(self._crawl_done)
        else:  # a Deferred (FORCE_CRAWLER_PROCESS)
            running.addErrback(self._crawl_failed)
        self.crawler_process.start()
        if self._bad_setting:
            self.exitcode = EXIT_BAD_SETTING
        elif self.crawler_process.bootstrap_failed or config_error_of(crawler) is not None:
            self.exitcode = EXIT_CONFIG_ERROR

    def _wait_for_cluster(self, settings: BaseSettings) -> bool:
        """Wait until a node of the Redis Cluster at ``REDIS_URL`` answers
        with the cluster's slots, before the crawl is built (the reactor is
        not running yet: Ctrl-C raises ``KeyboardInterrupt`` here, and
        SIGTERM ends the process as by default).

        :returns: True once a cluster client could be made; False after a
            configuration error (logged in one line) or Ctrl-C.
        """
        wait = CLUSTER_WAIT_FIRST
        while True:
            try:
                get_redis(settings).close()
                return True
            except ConfigurationError as exc:
                self._log_error(exc)
                return False
            except (RedisError, RedisClusterException) as exc:
                logger.warning(
                    "Redis Cluster at %s unreachable (%s: %s); trying again in %.1fs",
                    redis_location(settings), type(exc).__name__,
                    scrub(str(exc), secrets_of(settings.get("REDIS_URL"))), wait,
                )
            try:
                time.sleep(wait)
            except KeyboardInterrupt:
                logger.error("Stopped while waiting for the Redis Cluster: nothing was crawled")
                return False
            wait = min(CLUSTER_WAIT_MAX, wait * 2)

    def _crawl_done(self, task: asyncio.Future[Any]) -> None:
        """Log a configuration error that ended the crawl task in one line
        (the exception is then retrieved: no asyncio traceback); leave any
        other error to asyncio's report."""
        if task.cancelled():
            return
        exc = task.exception()
        error = _configuration_error(exc)
        if error is None:
            if exc is not None:
                task.get_loop().call_exception_handler(
                    {"message": "Task exception was never retrieved", "exception": exc,
                     "future": task}
                )
            return
        self._log_error(error)

    def _crawl_failed(self, failure: Failure) -> Failure | None:
        error = _configuration_error(failure.value)
        if error is None:
            return failure
        self._log_error(error)
        return None

    def _log_error(self, error: ConfigurationError) -> None:
        if isinstance(error, SettingsError):
            self._bad_setting = True
            for line in error.problems:
                logger.error("Bad setting: %s", line)
        else:
            logger.error("Configuration error: %s", error)
