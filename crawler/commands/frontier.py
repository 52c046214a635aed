"""``scrapy frontier status|delay|concurrency|overrides|pause|resume|stop``: look at
and steer the frontier.

``status [SPIDER ...] [--json] [--watch]`` prints, per spider, what the
shared frontier holds (see :mod:`crawler.status` for the figures and
:mod:`crawler.keys` for the keys).

``delay SPIDER SITE SECONDS``, ``concurrency SPIDER SITE N`` (each with
``--unset`` instead of the value) and ``overrides [SPIDER ...]`` set, remove
and list the per-site politeness overrides that workers read at every lease
(the hashes ``{<spider>}:delay`` and ``{<spider>}:conc``, see
:mod:`crawler.overrides`).

``pause SPIDER``, ``resume SPIDER`` and ``stop SPIDER`` set the crawl's state
in ``{<spider>}:control``, which every worker of the crawl follows within
``FRONTIER_CONTROL_INTERVAL`` seconds (see :mod:`crawler.control`).

``clear SPIDER --yes`` deletes the crawl's frontier, every shard of it
(:func:`clear_frontier`), so that it can start again, e.g. with another
``FRONTIER_SHARDS``.

``audit SPIDER [--json] [--repair]`` reports what is wrong with the crawl's
Redis structures (:mod:`crawler.frontier.audit`) and repairs what can be
repaired safely.

``SUBCOMMAND --help`` prints that subcommand's help.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from redis.exceptions import RedisClusterException, RedisError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from scrapy.exceptions import UsageError

from crawler.addon import EnvironmentCommand, Subcommand, operands, with_project_addons
from crawler.checks import validate_settings
from crawler.config import FrontierConfig, SettingsError
from crawler.control import PAUSED, RUNNING, STOPPED, ControlState, read_state, write_state
from crawler.frontier.audit import audit_crawl
from crawler.frontier.connection import get_redis, redis_location
from crawler.frontier.eviction import missing_message
from crawler.frontier.intake import IntakeKeys
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Frontier, frontier_prefix
from crawler.keys import (
    CrawlKeys,
    created_key,
    recorded_shards,
    shard_count,
    shard_prefixes,
    shards_key,
    site_prefix,
)
from crawler.overrides import (
    CONCURRENCY,
    DELAY,
    MAX_CONCURRENCY,
    MAX_DELAY_SECONDS,
    MAX_REVISIT_SECONDS,
    REVISIT,
    OverrideKind,
    parse_concurrency,
    parse_delay,
    parse_revisit,
    parse_site,
    stored_value_ok,
)
from crawler.status import (
    ACTIVE,
    FINISHED,
    IDLE,
    ClusterStatus,
    SpiderStatus,
    StatusReader,
)

if TYPE_CHECKING:
    import argparse

    from redis import Redis
    from rich.console import RenderableType
    from scrapy.settings import BaseSettings

__all__ = [
    "Command", "Override", "check_spider", "clear_frontier", "error_lines", "project_spiders",
    "read_overrides", "render",
]

#: The subcommands, for their help (``scrapy frontier SUB --help``).
FRONTIER_SUBCOMMANDS = (
    Subcommand(
        "status", "status [SPIDER ...] [--json] [--watch [--interval SECONDS]]",
        "Show per spider the crawl's state, its frontier, its workers and the items stored.",
        "Per spider: the state (running, paused, stopped, idle, finished), frontier shards, "
        "seeds waiting, requests queued by priority, leased, retries, revisits, dead "
        "letters, URLs seen, documents it added per collection; each worker's pages and "
        "items. Without SPIDER, every spider of the project. --json: one JSON object "
        "(with an \"error\" field and exit 1 when a server could not be read); --watch: "
        "refresh every --interval seconds.",
    ),
    Subcommand("delay", "delay SPIDER SITE SECONDS|--unset",
               "Set (or remove) a site's delay for every worker of the crawl.",
               "SITE is a host (example.com, example.com:8080) or a URL; SECONDS e.g. 2 "
               "or 0.25."),
    Subcommand("concurrency", "concurrency SPIDER SITE N|--unset",
               "Set (or remove) a site's concurrency for every worker of the crawl."),
    Subcommand("overrides", "overrides [SPIDER ...] [--json]",
               "List the per-site overrides, flagging values the workers ignore (exit 1).",
               "--json: one JSON array of objects."),
    Subcommand("revisit", "revisit SPIDER SITE SECONDS|--unset",
               "Set (or remove) a site's revisit interval (0: never revisit it)."),
    Subcommand("pause", "pause SPIDER", "Every worker of the crawl stops starting downloads."),
    Subcommand("resume", "resume SPIDER", "Every worker of the crawl crawls again."),
    Subcommand("stop", "stop SPIDER",
               "Every worker finishes what is in flight, gives back its leases and exits; "
               "the frontier is kept."),
    Subcommand("clear", "clear SPIDER --yes",
               "Delete the crawl's frontier (every shard), keeping the seeds, stats, worker "
               "records and control; refused while workers are live."),
    Subcommand(
        "audit", "audit SPIDER [--json] [--repair]",
        "Report what is wrong with the crawl's Redis structures, one line each.",
        "Structures that vanished (a flush, an eviction, a restart without persistence), "
        "counters that disagree with the queues or slots, leases without data or data "
        "without a deadline, keys of the wrong type, bad values (--json: one JSON array "
        "of objects). Exit 0 when nothing is wrong, 1 when something is (a crawl with "
        "nothing in Redis is not clean), 2 for a usage error, 3 when Redis failed. "
        "--repair fixes what can be fixed safely and says so per line.",
    ),
)
SUBCOMMANDS = tuple(sub.name for sub in FRONTIER_SUBCOMMANDS)
#: The state each control subcommand sets (:mod:`crawler.control`).
_CONTROL: dict[str, ControlState] = {"pause": PAUSED, "resume": RUNNING, "stop": STOPPED}
#: What the workers do, per state, for the command's output.
_CONTROL_EFFECT: dict[ControlState, str] = {
    PAUSED: "workers start no new download (those in flight finish) and stay up",
    RUNNING: "workers crawl again; workers started from now on crawl",
    STOPPED: "workers finish the downloads in flight, give back their other leases, "
             "flush their items and exit 0; the frontier is kept, and workers started "
             "while it is stopped exit at once",
}
#: The override subcommands, by kind.
_COMMANDS: dict[OverrideKind, str] = {DELAY: "delay", CONCURRENCY: "concurrency",
                                      REVISIT: "revisit"}
#: Exit status of the override subcommands when Redis cannot be reached (as
#: ``scrapy seed``); a bad value or a usage error exits 2.
REDIS_FAILED = 3
#: Errors of a Redis client that cannot reach or use Redis (redis-py's
#: cluster client raises RedisClusterException, which is no RedisError).
REDIS_ERRORS = (RedisError, RedisClusterException)
#: Server names of :attr:`ClusterStatus.errors`, for messages.
_SERVERS = {"redis": "Redis", "mongodb": "MongoDB"}
#: What each kind's hash holds, for messages.
_RULES: dict[OverrideKind, str] = {
    DELAY: "whole milliseconds >= 0 (at most 15 digits)",
    CONCURRENCY: "a whole number >= 1 (at most 15 digits)",
    REVISIT: "whole milliseconds >= 0 (at most 15 digits)",
}
#: The most each kind's subcommand sets; a value over it was written by
#: hand, and ``overrides`` says so (it is used all the same).
_LIMITS: dict[OverrideKind, tuple[int, str]] = {
    DELAY: (MAX_DELAY_SECONDS * 1000, "frontier delay"),
    CONCURRENCY: (MAX_CONCURRENCY, "frontier concurrency"),
    REVISIT: (MAX_REVISIT_SECONDS * 1000, "frontier revisit"),
}


@dataclass(frozen=True)
class Override:
    """One field of ``{<spider>}:delay`` or ``{<spider>}:conc``.

    :ivar kind: ``"delay"`` (``value`` in ms) or ``"conc"``.
    :ivar raw: the stored value, as Redis holds it.
    :ivar ok: whether the lease script accepts it
        (:func:`~crawler.overrides.stored_value_ok`); when not, it
        uses the default for the site.
    """

    spider: str
    kind: OverrideKind
    site: str
    raw: bytes
    ok: bool

    def describe(self) -> str:
        """The value for people: ``2000 ms (2 s)``, ``4``, or why it is bad.

        A value the lease script uses but the kind's subcommand would refuse
        (a delay over a day, say: written by hand) is shown with a warning:
        ``999999999 ms (1e+06 s) - over the most scrapy frontier delay
        sets, 86400000``.
        """
        value = self.raw.decode("utf-8", "backslashreplace")
        if not self.ok:
            return f"BAD {value!r}: not {_RULES[self.kind]}, the default is used"
        shown = value if self.kind == CONCURRENCY else f"{value} ms ({int(value) / 1000:g} s)"
        most, command = _LIMITS[self.kind]
        if int(value) > most:
            shown += f" - over the most scrapy {command} sets, {most}"
        return shown

    def as_dict(self) -> dict[str, Any]:
        """``{"spider", "kind", "site", "value", "ok"}``; ``value`` as a string."""
        return {
            "spider": self.spider,
            "kind": self.kind,
            "site": self.site,
            "value": self.raw.decode("utf-8", "backslashreplace"),
            "ok": self.ok,
        }


def override_key(
    spider: str, kind: OverrideKind, site: str | None = None, shards: int = 1
) -> str:
    """``{<spider>}:delay``, ``{<spider>}:conc`` or ``{<spider>}:revisit``;
    with ``FRONTIER_SHARDS`` = ``shards`` > 1, the hash of the shard that
    holds ``site`` (:func:`crawler.keys.site_prefix`)."""
    if site is None or shards <= 1:
        return frontier_prefix(spider) + kind
    return site_prefix(spider, site, shards) + kind


def read_overrides(redis: Redis, spider: str, shards: int = 1) -> list[Override]:
    """Every delay and concurrency override of ``spider``, by kind then site
    (of every shard).

    :raises redis.exceptions.RedisError: Redis is unreachable.
    """
    found: list[Override] = []
    for kind in (DELAY, CONCURRENCY, REVISIT):
        stored: dict[bytes | str, bytes | str] = {}
        for prefix in shard_prefixes(spider, shards):
            stored.update(redis.hgetall(prefix + kind))
        for field, value in stored.items():
            # Bytes, unless REDIS_PARAMS asks the client to decode responses.
            site = field if isinstance(field, str) else field.decode("utf-8", "backslashreplace")
            raw = value.encode() if isinstance(value, str) else value
            found.append(Override(spider, kind, site, raw, stored_value_ok(kind, raw)))
    order = {DELAY: 0, CONCURRENCY: 1, REVISIT: 2}
    found.sort(key=lambda o: (order[o.kind], o.site))
    return found


def clear_frontier(redis: Redis, spider: str, settings: BaseSettings) -> int:
    """Delete the frontier of ``spider``'s crawl: every key of every shard
    (queues, leases, retries, dead letters, revisits, per-site state and
    overrides, the dupefilter set or Bloom bitmap) and the recorded shard
    count ``{<spider>}:shards``. The shards are those of the recorded count
    and of ``FRONTIER_SHARDS`` in ``settings`` (they differ when the count
    is being changed). The seeds (``<spider>:start_urls`` and its intake)
    stay, and so do the crawl-wide ``stats``, ``workers`` and ``control``
    (a stopped crawl stays stopped); the mark that the spider's
    ``start_urls`` were queued goes, so the next crawl queues them again.
    Meant for a crawl with no worker running. Finds the keys with ``SCAN``
    (on a cluster, of every master).

    :returns: how many keys were deleted.
    :raises redis.exceptions.RedisError: Redis failed (keys deleted before stay deleted).
    """
    raw: Any = redis.get(shards_key(spider))
    counts = {shard_count(settings)}
    if raw is not None and raw.isdigit() and int(raw) >= 1:
        counts.add(int(raw))
    prefixes = {p for n in counts for p in shard_prefixes(spider, n)}
    keys = CrawlKeys.for_spider(spider, settings)
    keep = {key.encode() for key in (keys.stats, keys.workers, keys.control)}
    deleted = 0
    for prefix in sorted(prefixes):
        pattern = prefix.replace("{", "\\{").replace("}", "\\}") + "*"
        doomed = [k for k in redis.scan_iter(match=pattern, count=1000) if k not in keep]
        for i in range(0, len(doomed), 500):
            deleted += int(redis.delete(*doomed[i : i + 500]))
    deleted += int(redis.delete(shards_key(spider)))
    deleted += int(redis.delete(created_key(spider)))
    deleted += int(redis.delete(IntakeKeys.for_seed_list(keys.seeds).seeded))
    return deleted


def project_spiders(settings: BaseSettings) -> list[str]:
    """The names of the project's spiders (Scrapy's spider loader), sorted."""
    from scrapy.spiderloader import get_spider_loader  # noqa: PLC0415

    return sorted(get_spider_loader(settings).list())


def live_workers(redis: Any, spider: str, timeout: float) -> list[str]:
    """The ids of ``spider``'s workers whose record in ``{<spider>}:workers``
    is not closed and whose heartbeat is at most ``timeout`` seconds old
    (``FRONTIER_WORKER_TIMEOUT``); a record that cannot be read counts as
    not live.

    :raises redis.exceptions.RedisError: Redis failed.
    """
    now = time.time()
    live = []
    for worker, raw in redis.hgetall(CrawlKeys.for_spider(spider).workers).items():
        try:
            record = json.loads(raw)
            beat = float(record.get("last_heartbeat") or 0.0)
        except (ValueError, TypeError, AttributeError):
            continue
        if record.get("closed") is None and now - beat <= timeout:
            live.append(worker.decode("utf-8", "replace") if isinstance(worker, bytes) else worker)
    return live


def check_spider(settings: BaseSettings, name: str) -> str:
    """``name`` if the project has that spider.

    :raises UsageError: it has not (exit status 2): a typo would read an
        empty crawl, or write keys no worker reads. The message lists the
        spiders the project has. Also when a setting is bad
        (:func:`crawler.checks.validate_settings`), as ``scrapy crawl``
        refuses it: a command would act on keys the crawl does not use.
        The settings are checked as a crawl sees them, with the project's
        add-ons of this package applied
        (:func:`crawler.addon.with_project_addons`).
    """
    try:
        validate_settings(with_project_addons(settings), warn_unknown=False)
    except SettingsError as exc:  # a command acts on keys the settings name
        raise UsageError("Bad setting: " + "; ".join(exc.problems), print_help=False) from None
    known = project_spiders(settings)
    if name not in known:
        raise UsageError(
            f"unknown spider {name!r}: expected one of {', '.join(known)}",
            print_help=False,
        )
    return name


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _state_detail(spider: SpiderStatus) -> str:
    """Why the crawl is in its state (:func:`crawler.status.crawl_state`),
    after the control key."""
    live, left = len(spider.live_workers), spider.work_left
    workers = f"{live} live worker{'s' * (live != 1)}"
    if spider.control in (PAUSED, STOPPED):
        return f"; set by scrapy frontier {spider.control}; {workers}, {left} left"
    if spider.state == IDLE and not live:
        return "; not started: seed it (scrapy seed) and start workers"
    later = f"; {spider.revisits} revisits scheduled" if spider.revisits else ""
    details = {
        ACTIVE: f"; {workers}, {left} seeds and requests left",
        IDLE: f"; {workers} {'waits' if live == 1 else 'wait'} for seeds, nothing left",
        STOPPED: f"; no live worker, {left} seeds and requests left: start workers to go on",
        FINISHED: f"; no live worker, nothing left{later}",
    }
    return details.get(spider.state, "")


def _spider_table(spider: SpiderStatus) -> Table:
    title = f"spider {spider.spider}"
    if not spider.started:
        title += " (not started: none of its keys is in Redis)"
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    table.add_column("detail")
    state = spider.state
    if spider.state_bad_value is not None:
        state += f" (BAD value {spider.state_bad_value!r})"
    table.add_row("state", state, spider.keys["control"] + _state_detail(spider))
    table.add_row(
        "frontier shards", str(spider.shards),
        spider.keys["shards"] if spider.shards > 1 else "",
    )
    table.add_row("seeds waiting", str(spider.seeds), spider.keys["seeds"])
    if spider.queued_by_priority is None:
        by_priority = (
            f"by priority unknown (no {spider.keys['prio']}: a frontier of an older version)"
        )
    else:
        by_priority = ", ".join(f"{p}: {n}" for p, n in spider.queued_by_priority.items())
        if spider.queued_by_priority_truncated:
            by_priority += ", ..."
        by_priority = by_priority and f"by priority {by_priority}"
    table.add_row("requests queued", str(spider.queued), by_priority)
    per_worker = ", ".join(f"{w}: {n}" for w, n in sorted(spider.leases_by_worker.items()))
    table.add_row("requests leased", str(spider.leases), per_worker)
    table.add_row("retries waiting", str(spider.retries), "")
    table.add_row("revisits scheduled", str(spider.revisits), "")
    dead = spider.keys["dead"] + (f" and {spider.shards - 1} more shards"
                                  if spider.shards > 1 else "")
    if spider.dead_trimmed:
        dead += f" ({spider.dead_trimmed} older ones trimmed)"
    table.add_row("dead letters", str(spider.dead_letters), dead)
    if spider.seen is None:
        table.add_row("URLs seen", "unknown", f"Bloom filter {spider.keys['bloom']}")
    else:
        table.add_row("URLs seen", str(spider.seen), spider.keys["dupefilter"])
    for collection, count in sorted(spider.items.items()):
        table.add_row(f"items in {collection}", str(count),
                      f"documents {spider.spider} added to MongoDB")
    for feed, count in spider.feeds.items():
        table.add_row("items in feed, all runs", str(count), feed)
    for stat in ("response_received_count", "item_scraped_count"):
        if stat in spider.stats:
            table.add_row(stat, str(spider.stats[stat]), "cluster-wide")
    table.add_row("live workers", str(len(spider.live_workers)), f"of {len(spider.workers)} known")
    return table


def _workers_table(spider: SpiderStatus) -> Table | None:
    if not spider.workers:
        return None
    table = Table(title=f"workers of {spider.spider}", title_justify="left")
    numbers = ("pages", "pages/min", "items", "scraped")
    for name in ("worker", "job", *numbers, "last heartbeat", "live"):
        table.add_column(name, justify="right" if name in numbers else "left")
    for worker in spider.workers:
        if worker.closed is not None:
            live = f"no: closed ({worker.finish_reason or '?'})"
        else:
            live = "yes" if worker.live else "no: no heartbeat"
        table.add_row(
            worker.id,
            worker.job or "-",
            str(worker.pages),
            f"{worker.pages_per_minute:g}",
            str(worker.items),
            str(worker.scraped),
            f"{_when(worker.last_heartbeat)} ({worker.age:.0f}s ago)",
            live,
        )
    if len(spider.workers) > 1:
        table.add_row(
            "total", "", str(sum(w.pages for w in spider.workers)), "",
            str(sum(w.items for w in spider.workers)),
            str(sum(w.scraped for w in spider.workers)), "", "",
        )
    table.caption = ("as of each worker's last heartbeat or close; pages: responses received; "
                     "items: documents added to MongoDB (items scraped without MongoDB); "
                     "scraped: items scraped")
    table.caption_justify = "left"
    return table


def error_lines(status: ClusterStatus) -> list[str]:
    """One line per server that could not be read: ``could not read Redis
    at redis://:***@host:6379/0: ConnectionError: ...``."""
    lines = []
    for name, error in status.errors.items():
        server = _SERVERS.get(name, name)
        where = " at " if name in status.servers else ": "
        lines.append(f"could not read {server}{where}{error}")
    return lines


def render(status: ClusterStatus, *, errors: bool = True) -> RenderableType:
    """The status as rich tables: one per spider, its workers, the items.

    :param errors: start with a line per server that could not be read
        (:func:`error_lines`).
    """
    parts: list[RenderableType] = [Text(f"frontier status at {_when(status.time)}")]
    if errors:
        parts.extend(Text(line, style="bold red") for line in error_lines(status))
    for spider in status.spiders.values():
        if spider.missing:
            parts.append(Text(missing_message(spider.spider, spider.missing), style="bold red"))
        parts.append(_spider_table(spider))
        workers = _workers_table(spider)
        if workers is not None:
            parts.append(workers)
    if "mongodb" in status.servers and "mongodb" not in status.errors and status.items:
        title = "documents in MongoDB, in these spiders' collections"
        items = Table(title=title, title_justify="left", min_width=len(title))
        items.add_column("collection")
        items.add_column("documents", justify="right")
        for collection, count in sorted(status.items.items()):
            items.add_row(collection, str(count))
        parts.append(items)
    return Group(*parts)


#: Columns of the tables written off a terminal (piped, redirected), where
#: rich would use 80 and cut the heartbeat and live columns; ``COLUMNS`` in
#: the environment wins, as rich's own rule.
PLAIN_WIDTH = 160


def _console() -> Console:
    """rich's console for stdout: the terminal's width on a terminal, else
    ``COLUMNS`` or :data:`PLAIN_WIDTH`."""
    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(width=PLAIN_WIDTH)
    return console


class Command(EnvironmentCommand):
    """Show what the shared frontier holds; set, remove and list per-site overrides.

    ``status [SPIDER ...]``: ``--json`` prints one JSON object (see
    :meth:`crawler.status.ClusterStatus.as_dict`, with ``"error"``: the
    servers that could not be read, when any); with ``--watch`` it
    prints one such line per refresh. With ``--json``, every failure
    prints a JSON object with an ``"error"`` field on stdout (and the
    message on stderr) and exits non-zero: a usage error or an unknown
    spider 2, Redis failing 1 (status) or 3 (the other subcommands). A
    server that could not be read is
    named on stderr with its address (credentials masked) and the cause, and
    its figures are left out (not shown as zeros); the figures read are
    still printed. ``--watch`` refreshes in place on a terminal (rich's
    ``Live``); off a terminal (a pipe, a file) it writes a plain-text
    snapshot per refresh, with no escape codes. A server that cannot be
    read is shown as an error line in that refresh, and the watch goes on.
    Exit status 0; 1 when Redis or MongoDB could not be read (with
    ``--watch``: at the last refresh before Ctrl-C); 2 for an unknown spider
    or a usage error.

    ``delay SPIDER SITE SECONDS`` stores the site's delay in
    ``{<spider>}:delay`` (milliseconds), ``concurrency SPIDER SITE N`` its
    concurrency in ``{<spider>}:conc``; with ``--unset`` instead of the
    value, the override is removed and the default applies again. Workers
    read them at their next lease. ``overrides [SPIDER ...]`` lists them
    (``--json``: one JSON array of objects) and flags values the lease script
    would refuse. Exit status 0; 1 when ``overrides`` found a bad value; 2
    for a usage error, an unknown spider or a refused value (nothing is
    written); 3 when Redis could not be reached or refused the call (the
    message names its address, credentials masked, and the cause).

    ``pause SPIDER``, ``resume SPIDER``, ``stop SPIDER`` set the crawl's
    state in ``{<spider>}:control`` (``resume`` deletes it) and print the
    state before and after, who set it (``user@host``) and when. Exit
    status 0; 2 for a usage error or an unknown spider (nothing written);
    3 when Redis could not be reached or refused the call.

    ``clear SPIDER --yes`` deletes the crawl's frontier, every shard
    (:func:`clear_frontier`). Exit status 0; 2 for a usage error, an unknown
    spider or no ``--yes`` (nothing deleted); 3 when Redis failed.

    ``audit SPIDER`` prints one line per thing wrong with the crawl's
    structures (``--json``: one JSON array of objects; see
    :class:`crawler.frontier.audit.Finding`), ``--repair`` fixes what it
    safely can. Exit status 0 when nothing is wrong (or all was repaired);
    1 when something is, a crawl with nothing in Redis included; 2 for a
    usage error or an unknown spider; 3 when Redis failed.
    """

    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "SUBCOMMAND [ARGS] [OPTIONS]"

    def short_desc(self) -> str:
        return (
            "Show the shared frontier: seeds, queue, workers, items; per-site overrides; "
            "pause, resume, stop a crawl"
        )

    def long_desc(self) -> str:
        return (
            "Look at and steer the shared frontier of a crawl. "
            "scrapy frontier SUBCOMMAND --help prints a subcommand's usage and options."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        self.add_subcommands(parser, "frontier", FRONTIER_SUBCOMMANDS, self._sub_options)

    @staticmethod
    def _sub_options(name: str, parser: argparse.ArgumentParser) -> None:
        """The options of subcommand ``name``."""
        if name in ("status", "overrides", "audit"):
            parser.add_argument(
                "--json", action="store_true",
                help="print one JSON object" if name == "status" else "print one JSON array",
            )
        if name == "status":
            parser.add_argument("--watch", "-w", action="store_true",
                                help="refresh until Ctrl-C (--json: one line per refresh)")
            parser.add_argument(
                "--interval", type=float, default=2.0, metavar="SECONDS",
                help="seconds between refreshes with --watch (default: 2)",
            )
        if name == "audit":
            parser.add_argument("--repair", action="store_true",
                                help="fix what can be fixed safely, and say what was")
        if name == "clear":
            parser.add_argument("--yes", action="store_true", help="delete without asking")
        if name in ("delay", "concurrency", "revisit"):
            parser.add_argument(
                "--unset", action="store_true",
                help="remove the site's override (the default applies)",
            )

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        self.run_json_safe(
            lambda: self._run(opts.subcommand, operands(opts, args, "frontier"), opts), opts
        )

    def _run(self, command: str | None, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if command not in SUBCOMMANDS:
            raise UsageError(f"expected a subcommand: {', '.join(SUBCOMMANDS)}")
        as_json = bool(getattr(opts, "json", False))
        if command == "status":
            self._status(args, opts)
            return
        try:
            if command == "audit":
                self._audit(args, as_json=as_json, repair=opts.repair)
            elif command in _CONTROL:
                self._control(command, args)
            elif command == "clear":
                self._clear(args, opts.yes)
            elif command == "overrides":
                self._list(args, as_json)
            else:
                kinds = {name: kind for kind, name in _COMMANDS.items()}
                self._set(kinds[command], args, opts.unset)
        except REDIS_ERRORS as exc:
            message = (f"Redis at {redis_location(self.settings)} failed: "
                       f"{type(exc).__name__}: {exc}")
            if as_json:
                self.json_error(message)
            sys.stderr.write(message + "\n")
            self.exitcode = REDIS_FAILED

    def _status(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if opts.interval <= 0:
            raise UsageError("--interval must be positive", print_help=False)
        spiders = [self._spider(name) for name in args] or None
        try:
            reader = StatusReader.from_settings(self.settings, spiders)
        except REDIS_ERRORS as exc:  # a cluster client connects when built
            message = (f"could not read Redis at {redis_location(self.settings)}: "
                       f"{type(exc).__name__}: {exc}")
            if opts.json:
                self.json_error(message)
            sys.stderr.write(message + "\n")
            self.exitcode = 1
            return
        try:
            if opts.watch:
                self._watch(reader, opts)
            else:
                status = reader.read()
                self._print(status, opts.json)
                for line in error_lines(status):
                    sys.stderr.write(line + "\n")
                self.exitcode = 1 if status.errors else 0
        except KeyboardInterrupt:
            pass
        finally:
            reader.close()

    def _set(self, kind: OverrideKind, args: list[str], unset: bool) -> None:
        """``delay|concurrency|revisit SPIDER SITE VALUE`` or ``... SPIDER SITE --unset``.

        :raises UsageError: wrong arguments, an unknown spider, a bad site or
            a bad value (exit status 2, nothing written).
        """
        assert self.settings is not None
        command = _COMMANDS[kind]
        wanted = 2 if unset else 3
        if len(args) != wanted:
            what = "N" if kind == CONCURRENCY else "SECONDS"
            raise UsageError(
                f"expected: {command} SPIDER SITE {what}, or {command} SPIDER SITE --unset",
                print_help=False,
            )
        spider = self._spider(args[0])
        try:
            site = parse_site(args[1])
        except ValueError as exc:
            raise UsageError(str(exc), print_help=False) from None
        value = 0
        if not unset:
            try:
                parse = {DELAY: parse_delay, REVISIT: parse_revisit}.get(kind, parse_concurrency)
                value = parse(args[2])
            except ValueError as exc:
                raise UsageError(f"refused: {exc}", print_help=False) from None
        redis = get_redis(self.settings)
        try:
            key = override_key(spider, kind, site, self._shards(redis, spider))
            removed, moved = self._write(
                redis, kind, key, spider=spider, site=site, value=None if unset else value
            )
            if unset:
                sys.stdout.write(
                    f"removed the {command} override of {site} from {key}; the default applies\n"
                    if removed
                    else f"{site} had no {command} override in {key}\n"
                )
            else:
                shown = str(value) if kind == CONCURRENCY else f"{value} ms ({value / 1000:g} s)"
                sys.stdout.write(f"{key} {site} = {shown}\n")
            if moved:
                sys.stdout.write(
                    f"{site}'s next request moved {abs(moved) / 1000:g} s "
                    f"{'sooner' if moved < 0 else 'later'}: the delay counts from its last one\n"
                )
            if unset:
                return
            if kind == REVISIT and not FrontierConfig.from_settings(self.settings).revisit_after:
                sys.stderr.write(
                    "note: revisits are off in this project's settings "
                    "(FRONTIER_REVISIT_AFTER=0): the override applies to workers started "
                    "with FRONTIER_REVISIT_AFTER > 0\n"
                )
        finally:
            sys.stdout.flush()
            redis.close()

    def _control(self, command: str, args: list[str]) -> None:
        """``pause|resume|stop SPIDER``: set the crawl's state.

        :raises UsageError: not exactly one spider, or an unknown one (exit
            status 2, nothing written).
        :raises redis.exceptions.RedisError: Redis failed (exit status 3).
        """
        assert self.settings is not None
        if len(args) != 1:
            raise UsageError(f"expected: {command} SPIDER", print_help=False)
        spider = self._spider(args[0])
        state = _CONTROL[command]
        redis = get_redis(self.settings)
        try:
            before, raw = read_state(redis, spider)
            write_state(redis, spider, state)
        finally:
            redis.close()
        if before is None:
            was = f"was a bad value {(raw or b'').decode('utf-8', 'backslashreplace')!r}"
        else:
            was = f"was {before}"
        try:
            user = getpass.getuser()
        except (OSError, KeyError):  # no login name, no passwd entry
            user = "?"
        who = f"{user}@{socket.gethostname()}"
        key = frontier_prefix(spider) + "control"
        sys.stdout.write(
            f"crawl {spider}: {state} ({was}; {key}) by {who} at {_when(time.time())}\n"
            f"{_CONTROL_EFFECT[state]}, within FRONTIER_CONTROL_INTERVAL "
            f"({FrontierConfig.from_settings(self.settings).control_interval:g} s)\n"
        )
        sys.stdout.flush()
        self.exitcode = 0

    def _clear(self, args: list[str], yes: bool) -> None:
        """``clear SPIDER --yes``: delete the crawl's frontier (:func:`clear_frontier`).

        :raises UsageError: not exactly one spider, an unknown one, or no
            ``--yes`` (exit status 2, nothing deleted).
        :raises redis.exceptions.RedisError: Redis failed (exit status 3).
        """
        assert self.settings is not None
        if len(args) != 1:
            raise UsageError("expected: clear SPIDER --yes", print_help=False)
        spider = self._spider(args[0])
        if not yes:
            raise UsageError(
                f"clear deletes the frontier of {spider} (every shard: queued requests, "
                "leases, dead letters, URLs seen); add --yes to do it", print_help=False,
            )
        redis = get_redis(self.settings)
        try:
            live = live_workers(
                redis, spider, FrontierConfig.from_settings(self.settings).worker_timeout
            )
            if live:
                raise UsageError(
                    f"refused: {len(live)} worker(s) of {spider} are live "
                    f"({', '.join(sorted(live)[:5])}): a running worker writes the keys "
                    f"again as they are deleted; stop them first (scrapy frontier stop "
                    f"{spider}, then wait for them to exit)", print_help=False,
                )
            deleted = clear_frontier(redis, spider, self.settings)
        finally:
            redis.close()
        sys.stdout.write(f"cleared the frontier of {spider}: {deleted} keys deleted; "
                         "seeds, stats, workers and control kept\n")
        sys.stdout.flush()
        self.exitcode = 0

    def _audit(self, args: list[str], *, as_json: bool, repair: bool) -> None:
        """``audit SPIDER [--json] [--repair]``: what is wrong with the
        crawl's structures (:func:`crawler.frontier.audit.audit_crawl`),
        one line (or JSON object) each. Exit 0 when nothing is, else 1.

        :raises UsageError: not exactly one spider, or an unknown one.
        :raises redis.exceptions.RedisError: Redis failed (exit status 3).
        """
        assert self.settings is not None
        if len(args) != 1:
            raise UsageError("expected: audit SPIDER [--json] [--repair]", print_help=False)
        spider = self._spider(args[0])
        redis = get_redis(self.settings)
        try:
            keys = CrawlKeys.for_spider(spider, self.settings)
            crawl = FrontierShards.build(redis, spider, self._shards(redis, spider))
            found = audit_crawl(crawl, stats_key=keys.stats, workers_key=keys.workers,
                                repair=repair)
        finally:
            redis.close()
        if as_json:
            sys.stdout.write(
                json.dumps([{"spider": spider, **finding.as_dict()} for finding in found]) + "\n"
            )
        else:
            for finding in found:
                sys.stdout.write(finding.line() + "\n")
            if not found:
                sys.stdout.write(f"crawl {spider}: nothing wrong found\n")
            else:
                fixed = sum(f.repaired for f in found)
                sys.stdout.write(
                    f"crawl {spider}: {len(found)} problem(s)"
                    + (f", {fixed} repaired" if repair else
                       f", {sum(f.repairable for f in found)} that --repair fixes")
                    + "\n"
                )
        sys.stdout.flush()
        self.exitcode = 1 if any(not f.repaired for f in found) else 0

    def _list(self, spiders: list[str], as_json: bool) -> None:
        """``overrides [SPIDER ...]``: every override, bad ones flagged (exit 1)."""
        assert self.settings is not None
        names = [self._spider(name) for name in spiders] or self._spiders()
        redis = get_redis(self.settings)
        try:
            shards = {name: self._shards(redis, name) for name in names}
            found = [o for name in names for o in read_overrides(redis, name, shards[name])]
        finally:
            redis.close()
        bad = [o for o in found if not o.ok]
        if as_json:
            sys.stdout.write(json.dumps([override.as_dict() for override in found]) + "\n")
            sys.stdout.flush()
        else:
            # One line per override (grep-able): key, site, value.
            width = max((len(o.site) for o in found), default=0)
            for o in found:
                key = override_key(o.spider, o.kind, o.site, shards[o.spider])
                sys.stdout.write(f"{key:<{len(o.spider) + 8}} {o.site:<{width}}  {o.describe()}\n")
            if not found:
                sys.stdout.write(f"no overrides for {', '.join(names)}\n")
            if bad:
                sys.stdout.write(
                    f"{len(bad)} bad value(s): the workers use the default for those sites;"
                    " set them again with scrapy frontier delay|concurrency|revisit\n"
                )
            sys.stdout.flush()
        self.exitcode = 1 if bad else 0

    def _spiders(self) -> list[str]:
        """The project's spider names."""
        assert self.settings is not None
        return project_spiders(self.settings)

    def _write(
        self, redis: Any, kind: OverrideKind, key: str, *, spider: str, site: str,
        value: int | None,
    ) -> tuple[bool, int]:
        """Set ``site``'s override of ``kind`` in hash ``key`` to ``value``
        (None: remove it). A delay goes through :meth:`Frontier.set_delay`:
        the site's next request moves by the change of its pace.

        :returns: whether an override was removed, and the ms the site's
            next request moved by (0 but for a delay).
        """
        if kind == DELAY:
            return self._delays(redis, key, spider).set_delay(site, value)
        if value is None:
            return bool(redis.hdel(key, site)), 0
        redis.hset(key, site, str(value))
        return False, 0

    def _delays(self, redis: Any, key: str, spider: str) -> Frontier:
        """The frontier on ``redis`` of the shard whose delay hash is ``key``, with this
        project's default delay and margin (``FRONTIER_DELAY``, else
        ``DOWNLOAD_DELAY``, as the add-on sets it for the workers; and
        ``FRONTIER_DELAY_MARGIN``): what :meth:`Frontier.set_delay` computes
        a site's pace with."""
        assert self.settings is not None
        config = FrontierConfig.from_settings(self.settings)
        default = config.delay
        if default is None:
            default = self.settings.getfloat("DOWNLOAD_DELAY")
        return Frontier(
            redis, spider, prefix=key[: -len(DELAY)],
            default_delay=max(0.0, default),
            delay_margin=config.delay_margin,
        )

    def _shards(self, redis: Any, spider: str) -> int:
        """The crawl's recorded shard count, else ``FRONTIER_SHARDS``
        (:func:`crawler.keys.recorded_shards`)."""
        assert self.settings is not None
        return recorded_shards(redis, spider, shard_count(self.settings))

    def _spider(self, name: str) -> str:
        """``name`` if the project has that spider (:func:`check_spider`)."""
        assert self.settings is not None
        return check_spider(self.settings, name)

    def _print(self, status: ClusterStatus, as_json: bool) -> None:
        """One reading on stdout; the errors go to stderr (see :meth:`_status`)."""
        if as_json:
            data = status.as_dict()
            if status.errors:
                data["error"] = "; ".join(error_lines(status))
            sys.stdout.write(json.dumps(data) + "\n")
            sys.stdout.flush()
        else:
            _console().print(render(status, errors=False))

    def _watch(self, reader: StatusReader, opts: argparse.Namespace) -> None:
        """Print a reading every ``--interval`` seconds until Ctrl-C.

        ``--json``: one line each. On a terminal: the tables, refreshed in
        place. Off a terminal (rich's ``Live`` would write nothing until it
        stops): one plain-text snapshot each, flushed, no escape codes.
        Errors are part of each reading, so the watch goes on through them.
        """
        console = _console()
        if opts.json or not console.is_terminal:
            first = True
            while True:
                status = reader.read()
                self.exitcode = 1 if status.errors else 0
                if opts.json:
                    self._print(status, as_json=True)
                else:
                    if not first:
                        console.line()
                    console.print(render(status))
                    console.file.flush()
                first = False
                time.sleep(opts.interval)
        status = reader.read()
        self.exitcode = 1 if status.errors else 0
        with Live(render(status), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(opts.interval)
                status = reader.read()
                self.exitcode = 1 if status.errors else 0
                live.update(render(status), refresh=True)
