"""The frontier's Scrapy add-ons (``ADDONS``): one line turns the frontier on
in any Scrapy project, another one MongoDB storage.

.. code-block:: python

    ADDONS = {
        "crawler.addon.FrontierAddon": 0,
        # "crawler.addon.MongoAddon": 0,   # items to MongoDB as well
    }

Connection settings that the project does not set come from the environment
variables of the same name (:data:`ENVIRONMENT_FOR_FRONTIER`,
:data:`ENVIRONMENT_FOR_MONGO`), so that credentials never live in code and each
machine names its own servers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.commands import ScrapyCommand, ScrapyHelpFormatter
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import UsageError
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from crawler.checks import validate_settings
from crawler.config import SettingsError
from crawler.frontier.slots import FrontierDownloader

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy.settings import BaseSettings

__all__ = [
    "ENVIRONMENT_FOR_COMMANDS",
    "ENVIRONMENT_FOR_FRONTIER",
    "ENVIRONMENT_FOR_MONGO",
    "EnvironmentCommand",
    "FrontierAddon",
    "MongoAddon",
    "Subcommand",
    "operands",
    "settings_from_environment",
    "with_project_addons",
]

#: Scrapy's own downloader, which the add-on replaces.
_SCRAPY_DOWNLOADER = "scrapy.core.downloader.Downloader"
#: Each worker's downloader under the frontier: no delay of its own.
_DOWNLOADER = "crawler.frontier.slots.FrontierDownloader"

#: The priority add-ons set settings with (Scrapy's ``"addon"``, 15): below
#: the project's settings, the spider's ``custom_settings`` and ``-s``.
_ADDON = SETTINGS_PRIORITIES["addon"]

#: Settings :class:`FrontierAddon` (and the ``scrapy`` commands of
#: :mod:`crawler.commands`) read from the environment variable of the same
#: name when no project setting, ``custom_settings`` or ``-s`` sets them.
#: Defaults when neither does: ``REDIS_URL`` ``redis://localhost:6379/0``
#: (scrapy-redis's), ``MAX_IDLE_TIME_BEFORE_CLOSE`` 0 (wait for work
#: forever), ``FRONTIER_WORKER_ID`` ``<hostname>:<pid>``,
#: ``FRONTIER_REDIS_CLUSTER`` off (``1`` or ``true``: ``REDIS_URL`` names a
#: node of a Redis Cluster), ``LOG_LEVEL`` Scrapy's (``DEBUG``),
#: ``LOG_JSON_ENABLED`` off, ``METRICS_HOST`` ``127.0.0.1``, ``METRICS_PORT``
#: 9410.
ENVIRONMENT_FOR_FRONTIER = (
    "REDIS_URL",
    "MAX_IDLE_TIME_BEFORE_CLOSE",
    "FRONTIER_WORKER_ID",
    "FRONTIER_REDIS_CLUSTER",
    "LOG_LEVEL",
    "LOG_JSON_ENABLED",
    "METRICS_HOST",
    "METRICS_PORT",
)
#: Settings :class:`MongoAddon` (and ``scrapy frontier status``, ``scrapy
#: loadspill``) read from the environment the same way. Defaults:
#: ``MONGO_URI`` ``mongodb://localhost:27017`` (with the add-on),
#: ``MONGO_DATABASE`` ``crawler``.
ENVIRONMENT_FOR_MONGO = ("MONGO_URI", "MONGO_DATABASE")
#: What the project's ``scrapy`` commands (``seed``, ``frontier``,
#: ``deadletters``, ``loadspill``) read from the environment, the same way.
ENVIRONMENT_FOR_COMMANDS = ENVIRONMENT_FOR_FRONTIER + ENVIRONMENT_FOR_MONGO

#: What :class:`FrontierAddon` sets, at the add-on priority: the project's
#: settings, ``custom_settings`` and ``-s`` win over each.
ADDON_SETTINGS: dict[str, object] = {
    # scrapy-redis's setting names, our components.
    "SCHEDULER": "crawler.frontier.scheduler.FrontierScheduler",
    "SCHEDULER_QUEUE_CLASS": "crawler.frontier.queue.LeasedPriorityQueue",
    "DUPEFILTER_CLASS": "crawler.frontier.dupefilter.FrontierDupeFilter",
    # Other workers go on using the frontier when one closes.
    "SCHEDULER_PERSIST": True,
    # Every key of a crawl under the hash tag {<spider>} (Redis Cluster).
    "SCHEDULER_QUEUE_KEY": "{%(spider)s}",
    "SCHEDULER_DUPEFILTER_KEY": "{%(spider)s}:dupefilter",
}

#: Components :class:`FrontierAddon` adds (component priority dictionaries:
#: setting -> class path -> order), unless the project lists them already
#: (with any order, or None to keep one off).
ADDON_COMPONENTS: dict[str, dict[str, int]] = {
    "SPIDER_MIDDLEWARES": {
        # Links followed only on the seeds' hosts (FRONTIER_STAY_ON_SEED_HOSTS).
        "crawler.middlewares.SeedHostsMiddleware": 550,
    },
    "DOWNLOADER_MIDDLEWARES": {
        # robots.txt fetched once for the cluster, at Scrapy's middleware's place.
        "crawler.politeness.SharedRobotsTxtMiddleware": 100,
        # Retries wait in Redis with backoff; give-ups become dead letters.
        "crawler.middlewares.BackoffRetryMiddleware": 550,
        # 429/503 and slow responses slow a site down for every worker.
        "crawler.politeness.AdaptiveSlowdownMiddleware": 560,
        # Conditional revisits (FRONTIER_REVISIT_AFTER > 0).
        "crawler.middlewares.RevisitMiddleware": 570,
        # Redirects off the seeds' hosts dropped (after RedirectMiddleware).
        "crawler.middlewares.SeedHostsMiddleware": 650,
        # WARC files of every download (WARC_DIR; none by default).
        "crawler.warc.WarcWriterMiddleware": 950,
    },
    "EXTENSIONS": {
        # JSON-lines logs (LOG_JSON_ENABLED).
        "crawler.jsonlog.JsonLogging": 0,
        # Cluster-wide stats and worker heartbeats in Redis.
        "crawler.extensions.ClusterStats": 500,
        # scrapy frontier pause|resume|stop.
        "crawler.control.CrawlControl": 510,
        # Dead workers, dead letters and idle sites forgotten.
        "crawler.frontier.housekeeping.FrontierHousekeeping": 520,
    },
}

#: Scrapy's components that ours replace: switched off unless the project
#: lists them itself (a project that does keeps them, next to ours).
ADDON_REPLACES: dict[str, tuple[type, ...]] = {
    "DOWNLOADER_MIDDLEWARES": (RobotsTxtMiddleware, RetryMiddleware),
}

#: Components :class:`MongoAddon` adds, as :data:`ADDON_COMPONENTS`.
MONGO_ADDON_COMPONENTS: dict[str, dict[str, int]] = {
    "ITEM_PIPELINES": {"crawler.pipelines.MongoPipeline": 300},
    # Stable _ids for items without a natural key (MONGO_ITEM_IDS_ENABLED).
    "SPIDER_MIDDLEWARES": {"crawler.middlewares.ItemIdMiddleware": 40},
}


def _set_by_project(settings: BaseSettings, name: str) -> bool:
    """Whether a project setting, ``custom_settings``, ``-s`` (or another
    add-on) set ``name``: its priority is the add-on priority or above."""
    priority = settings.getpriority(name)
    return priority is not None and priority >= _ADDON


def settings_from_environment(settings: BaseSettings, names: Iterable[str]) -> list[str]:
    """Set each of ``names`` from the environment variable of the same name,
    at the add-on priority, when nothing above Scrapy's defaults set it and
    the variable is not empty.

    Values are set as text, as ``-s`` sets them; :func:`crawler.config.
    validate_settings` checks them with the others.

    :returns: the names set, in order.
    """
    found = []
    for name in names:
        value = os.environ.get(name)
        if value and not _set_by_project(settings, name):
            settings.set(name, value, _ADDON)
            found.append(name)
    return found


def with_project_addons(settings: BaseSettings) -> BaseSettings:
    """A copy of ``settings`` as a crawl of the project sees them: with the
    ``update_settings`` of each of this package's add-ons that ``ADDONS``
    lists (:class:`FrontierAddon`, :class:`MongoAddon` or a subclass)
    applied, in ``ADDONS`` order. The ``scrapy`` commands check and use
    these, not the project's settings alone. Other add-ons are left out:
    they may need a crawler.

    :raises crawler.config.SettingsError: as :meth:`FrontierAddon.update_settings`.
    """
    out = settings.copy()
    out.frozen = False  # a copy of frozen settings is frozen too
    for key in build_component_list(settings.getdict("ADDONS")):
        try:
            cls = load_object(key) if isinstance(key, str) else key
        except (ImportError, NameError, ValueError, AttributeError):
            continue  # the ADDONS setting's own check names it
        if isinstance(cls, type) and issubclass(cls, FrontierAddon | MongoAddon):
            cls().update_settings(out)
    return out


def _add_components(settings: BaseSettings, components: dict[str, dict[str, int]]) -> None:
    """Add each component at its order unless the project's dict names it
    (by class or by path, with an order or None)."""
    for setting, entries in components.items():
        for path, order in entries.items():
            settings.setdefault_in_component_priority_dict(setting, load_object(path), order)


def _listed(settings: BaseSettings, setting: str, cls: type) -> bool:
    """Whether the project's ``setting`` dict names ``cls`` (by class or path)."""
    return any(load_object(key) is cls for key in settings.getdict(setting))


class FrontierAddon:
    """Turn the shared Redis frontier on, with everything it needs.

    One ``ADDONS`` entry sets, below the project's own settings (Scrapy's
    ``"addon"`` priority, so the project, ``custom_settings`` and ``-s``
    win):

    * the scheduler, its queue and dupefilter (:data:`ADDON_SETTINGS`,
      scrapy-redis's setting names);
    * the frontier's middlewares and extensions (:data:`ADDON_COMPONENTS`):
      seed hosts, robots.txt shared by the cluster (in place of Scrapy's
      ``RobotsTxtMiddleware``), retries with backoff and dead letters (in
      place of Scrapy's ``RetryMiddleware``), adaptive slow-down, revisits,
      WARC files, cluster stats, crawl control, housekeeping;
    * the connection settings the project leaves unset, from the environment
      (:data:`ENVIRONMENT_FOR_FRONTIER`: ``REDIS_URL`` first of all).

    Items are not stored by the frontier: feed exports (``-O items.jsonl``,
    ``FEEDS``) and the project's pipelines work as in any Scrapy project;
    :class:`MongoAddon` adds MongoDB storage.

    Then, as before any crawl, it checks every setting
    (:func:`crawler.checks.validate_settings`) and makes Scrapy's
    per-process politeness settings hold for the cluster:
    ``DOWNLOAD_DELAY``, ``CONCURRENT_REQUESTS_PER_DOMAIN``, ``DOWNLOAD_SLOTS``,
    a spider's ``download_delay`` and ``max_concurrent_requests`` and
    ``meta["download_slot"]`` keep their Scrapy meaning, per download slot,
    but for all workers together: the frontier enforces them
    (:class:`crawler.frontier.slots.SitePolicy`). Each worker's own
    downloader then waits no delay (``DOWNLOADER`` is set to
    :class:`crawler.frontier.slots.FrontierDownloader`): a second, local
    delay would only hold requests that the frontier already timed, and
    bunch them up.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        """Switch the frontier on, read the environment, check the settings
        and put the frontier's downloader in place.

        :raises crawler.config.SettingsError: a setting has a value that is
            not allowed (the message names each one and what is allowed),
            or ``DOWNLOADER`` is another downloader than Scrapy's or
            :class:`~crawler.frontier.slots.FrontierDownloader` (or a
            subclass): its delays would add to the cluster's.
        """
        for name, value in ADDON_SETTINGS.items():
            settings.set(name, value, _ADDON)
        for setting, replaced in ADDON_REPLACES.items():
            for cls in replaced:
                if not _listed(settings, setting, cls):
                    settings.set_in_component_priority_dict(setting, cls, None)
        _add_components(settings, ADDON_COMPONENTS)
        settings_from_environment(settings, ENVIRONMENT_FOR_FRONTIER)
        validate_settings(settings)
        downloader = settings.get("DOWNLOADER")
        if downloader is None or load_object(downloader) is load_object(_SCRAPY_DOWNLOADER):
            settings.set(
                "DOWNLOADER", _DOWNLOADER, max(15, settings.getpriority("DOWNLOADER") or 0)
            )
            return
        cls = load_object(downloader) if isinstance(downloader, str) else downloader
        if not (isinstance(cls, type) and issubclass(cls, FrontierDownloader)):
            raise SettingsError([
                f"DOWNLOADER={downloader}: must be {_DOWNLOADER} or a subclass of it "
                "(the frontier paces each download slot for the whole cluster; a "
                "worker's own delays would add to it)"
            ])


class MongoAddon:
    """Store items in MongoDB (:class:`crawler.pipelines.MongoPipeline`).

    Adds the pipeline (order 300) and the middleware that gives items
    without a natural key a stable ``_id``
    (:class:`crawler.middlewares.ItemIdMiddleware`, order 40), and reads
    ``MONGO_URI`` and ``MONGO_DATABASE`` from the environment when the
    project does not set them (:data:`ENVIRONMENT_FOR_MONGO`); ``MONGO_URI``
    defaults to ``mongodb://localhost:27017``. Independent of
    :class:`FrontierAddon`: list both to crawl with the frontier into MongoDB.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        """Add the pipeline and its middleware; read the environment."""
        _add_components(settings, MONGO_ADDON_COMPONENTS)
        settings_from_environment(settings, ENVIRONMENT_FOR_MONGO)
        if not settings.get("MONGO_URI"):
            settings.set("MONGO_URI", "mongodb://localhost:27017", _ADDON)


class EnvironmentCommand(ScrapyCommand):
    """Base of the project's ``scrapy`` commands (``seed``, ``frontier``,
    ``deadletters``, ``loadspill``): after Scrapy's options (``-s``,
    ``--set``), the connection settings the project leaves unset come from
    the environment, as with the add-ons (:data:`ENVIRONMENT_FOR_COMMANDS`).

    Defined here, not in :mod:`crawler.commands`: Scrapy takes every
    command class of that package for a command of its own."""

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        assert self.settings is not None
        settings_from_environment(self.settings, ENVIRONMENT_FOR_COMMANDS)

    def add_subcommands(
        self,
        parser: argparse.ArgumentParser,
        command: str,
        subcommands: Iterable[Subcommand],
        add_options: Callable[[str, argparse.ArgumentParser], None],
    ) -> None:
        """Give ``parser`` (Scrapy's parser of ``scrapy <command>``) one
        argparse subparser per subcommand, so that ``scrapy <command> SUB
        --help`` prints that subcommand's usage, its one-line description,
        its options and Scrapy's global ones, and ``scrapy <command>
        --help`` lists the subcommands.

        Parsed, ``opts.subcommand`` is the subcommand's name (None when none
        was given) and ``opts.operands`` its positional arguments; the
        options ``add_options(name, subparser)`` adds exist in ``opts`` only
        for that subcommand (read them with ``getattr(opts, name, default)``).
        Scrapy's global options (``-s``, ``--logfile``, ...) are taken
        before or after the subcommand.
        """
        subparsers = parser.add_subparsers(
            dest="subcommand", metavar="SUBCOMMAND", title="Subcommands",
            prog=f"scrapy {command}",
            description=f"scrapy {command} SUBCOMMAND --help: that subcommand's help",
        )
        for sub in subcommands:
            subparser = subparsers.add_parser(
                sub.name, help=sub.summary, description=sub.summary + " " + sub.detail,
                usage=f"scrapy {command} {sub.usage}", formatter_class=ScrapyHelpFormatter,
                conflict_handler="resolve",
            )
            subparser.add_argument("operands", nargs="*", help=argparse.SUPPRESS)
            add_options(sub.name, subparser)
            # The global options, again: given after the subcommand, they
            # would otherwise be left over. Not given, they leave what was
            # given before the subcommand alone.
            before = len(subparser._actions)
            ScrapyCommand.add_options(self, subparser)
            for action in subparser._actions[before:]:
                action.default = argparse.SUPPRESS

    @staticmethod
    def json_error(message: str) -> None:
        """Print ``{"error": message}`` on stdout (a ``--json`` run that failed)."""
        sys.stdout.write(json.dumps({"error": message}) + "\n")
        sys.stdout.flush()

    def run_json_safe(
        self, run: Callable[[], None], opts: argparse.Namespace, *, usage_exit: int = 2
    ) -> None:
        """Call ``run``; with ``--json``, a usage error prints
        ``{"error": ...}`` on stdout (and its message on stderr) and exits
        ``usage_exit``, instead of Scrapy's usage text."""
        try:
            run()
        except UsageError as exc:
            if not getattr(opts, "json", False):
                raise
            self.json_error(str(exc) or "usage error")
            sys.stderr.write(f"error: {exc}\n")
            self.exitcode = usage_exit


@dataclass(frozen=True)
class Subcommand:
    """One subcommand of a ``scrapy`` command, for its help.

    :ivar name: ``status``.
    :ivar usage: after ``scrapy <command>``: ``status [SPIDER ...] [--json]``.
    :ivar summary: one line: what it does.
    :ivar detail: more, for its ``--help`` (may be empty).
    """

    name: str
    usage: str
    summary: str
    detail: str = ""


def operands(opts: argparse.Namespace, args: list[str], command: str) -> list[str]:
    """The subcommand's positional arguments, then what argparse left over
    (``args``, which the command refuses where it takes none).

    :raises UsageError: an option the subcommand does not have (exit 2),
        naming the subcommand's ``--help``.
    """
    sub = getattr(opts, "subcommand", None)
    for arg in args:
        if arg.startswith("-") and len(arg) > 1 and not arg[1:].replace(".", "").isdigit():
            where = f"scrapy {command} {sub}" if sub else f"scrapy {command}"
            raise UsageError(f"{arg} is not an option of {where} (see {where} --help)",
                             print_help=False)
    return [*getattr(opts, "operands", []), *args]
