"""``scrapy frontier status [SPIDER ...] [--json] [--watch]``.

Prints, per spider, what the shared frontier holds (see
:mod:`crawler.status` for the figures and :mod:`crawler.keys` for the keys).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from crawler.status import ClusterStatus, SpiderStatus, StatusReader

if TYPE_CHECKING:
    import argparse

    from rich.console import RenderableType

__all__ = ["Command", "render"]

SUBCOMMANDS = ("status",)


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _spider_table(spider: SpiderStatus) -> Table:
    table = Table(title=f"spider {spider.spider}", title_justify="left", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    table.add_column("detail")
    table.add_row("seeds waiting", str(spider.seeds), spider.keys["seeds"])
    by_priority = ", ".join(f"{p}: {n}" for p, n in spider.queued_by_priority.items())
    if spider.queued_by_priority_truncated:
        by_priority += ", ..."
    table.add_row(
        "requests queued", str(spider.queued), by_priority and f"by priority {by_priority}"
    )
    per_worker = ", ".join(f"{w}: {n}" for w, n in sorted(spider.leases_by_worker.items()))
    table.add_row("requests leased", str(spider.leases), per_worker)
    table.add_row("retries waiting", str(spider.retries), "")
    table.add_row("dead letters", str(spider.dead_letters), spider.keys["dead"])
    if spider.seen is None:
        table.add_row("URLs seen", "unknown", f"Bloom filter {spider.keys['bloom']}")
    else:
        table.add_row("URLs seen", str(spider.seen), spider.keys["dupefilter"])
    for collection, count in sorted(spider.items.items()):
        table.add_row(f"items in {collection}", str(count), "")
    for stat in ("response_received_count", "item_scraped_count"):
        if stat in spider.stats:
            table.add_row(stat, str(spider.stats[stat]), "cluster-wide")
    table.add_row("live workers", str(len(spider.live_workers)), f"of {len(spider.workers)} known")
    return table


def _workers_table(spider: SpiderStatus) -> Table | None:
    if not spider.workers:
        return None
    table = Table(title=f"workers of {spider.spider}", title_justify="left")
    for name in ("worker", "job", "pages", "pages/min", "items", "last heartbeat", "live"):
        table.add_column(
            name, justify="right" if name in ("pages", "pages/min", "items") else "left"
        )
    for worker in spider.workers:
        table.add_row(
            worker.id,
            worker.job or "-",
            str(worker.pages),
            f"{worker.pages_per_minute:g}",
            str(worker.items),
            f"{_when(worker.last_heartbeat)} ({worker.age:.0f}s ago)",
            "yes" if worker.live else "no",
        )
    return table


def render(status: ClusterStatus) -> RenderableType:
    """The status as rich tables: one per spider, its workers, the items."""
    parts: list[RenderableType] = [Text(f"frontier status at {_when(status.time)}")]
    for name, error in status.errors.items():
        parts.append(Text(f"{name} unreachable: {error}", style="bold red"))
    for spider in status.spiders.values():
        parts.append(_spider_table(spider))
        workers = _workers_table(spider)
        if workers is not None:
            parts.append(workers)
    items = Table(title="items stored", title_justify="left")
    items.add_column("collection")
    items.add_column("documents", justify="right")
    for collection, count in sorted(status.items.items()):
        items.add_row(collection, str(count))
    parts.append(items)
    return Group(*parts)


class Command(ScrapyCommand):
    """Show what the shared frontier holds.

    ``--json`` prints one JSON object (see
    :meth:`crawler.status.ClusterStatus.as_dict`); with ``--watch`` it
    prints one such line per refresh. Exit status 0, or 1 when Redis or
    MongoDB could not be read (the figures read are still printed).
    """

    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "status [SPIDER ...] [--json] [--watch [--interval SECONDS]]"

    def short_desc(self) -> str:
        return "Show the shared frontier: seeds, queue, workers, items"

    def long_desc(self) -> str:
        return (
            "Print per spider: seeds waiting, requests queued by priority, leased, "
            "retries waiting, dead letters, URLs seen, items stored per collection, and "
            "live workers with their pages per minute and last heartbeat. Without SPIDER, "
            "every spider of the project. --json prints one JSON object; --watch refreshes."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
        parser.add_argument(
            "--interval",
            type=float,
            default=2.0,
            metavar="SECONDS",
            help="seconds between refreshes with --watch (default: 2)",
        )

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if not args or args[0] not in SUBCOMMANDS:
            raise UsageError(f"expected a subcommand: {', '.join(SUBCOMMANDS)}")
        if opts.interval <= 0:
            raise UsageError("--interval must be positive", print_help=False)
        spiders = args[1:] or None
        reader = StatusReader.from_settings(self.settings, spiders)
        try:
            if opts.watch:
                self._watch(reader, opts)
            else:
                status = reader.read()
                self._print(status, opts.json)
                self.exitcode = 1 if status.errors else 0
        except KeyboardInterrupt:
            pass
        finally:
            reader.close()

    def _print(self, status: ClusterStatus, as_json: bool) -> None:
        if as_json:
            sys.stdout.write(json.dumps(status.as_dict()) + "\n")
            sys.stdout.flush()
        else:
            Console().print(render(status))

    def _watch(self, reader: StatusReader, opts: argparse.Namespace) -> None:
        if opts.json:
            while True:
                self._print(reader.read(), as_json=True)
                time.sleep(opts.interval)
        with Live(render(reader.read()), auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(opts.interval)
                live.update(render(reader.read()), refresh=True)
