"""``scrapy seed SPIDER [URL ...] [--file FILE] [--priority N] [--meta JSON]``.

Pushes seeds into ``<spider>:start_urls`` in the JSON form workers read
(see :mod:`crawler.frontier.seeds`), validating each one first.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

from redis.exceptions import RedisError
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from scrapy.exceptions import UsageError
from scrapy.spiderloader import get_spider_loader

from crawler.addon import EnvironmentCommand
from crawler.commands.frontier import check_spider
from crawler.frontier.connection import get_redis, redis_location
from crawler.frontier.seeds import BadSeed, SeedPusher, seed_json
from crawler.frontier.store import PRIORITY_LIMIT
from crawler.keys import CrawlKeys

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable, Iterator


logger = logging.getLogger(__name__)

__all__ = ["Command"]


class Command(EnvironmentCommand):
    """Validate seeds and push them into ``<spider>:start_urls``.

    Exit status: 0 when every seed was queued, 1 when some were invalid (the
    valid ones are queued all the same), 2 on a usage error, 3 when Redis
    failed (seeds sent before the failure stay queued).
    """

    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "SPIDER [URL ...] [--file FILE] [--priority N] [--meta JSON]"

    def short_desc(self) -> str:
        return "Push seeds into a spider's seed list"

    def long_desc(self) -> str:
        return (
            "Validate seeds (bare URLs or JSON seed objects, as redis-cli takes them) "
            "and push the valid ones into <spider>:start_urls as JSON, in order. "
            "Invalid seeds are reported on stderr with their line numbers and skipped. "
            "--file reads one seed per line (- for stdin); blank lines and lines "
            "starting with # are ignored. Exit status 1 when some seeds were invalid."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--file",
            "-f",
            metavar="FILE",
            action="append",
            default=[],
            help="read seeds from FILE, one per line (- for stdin); repeatable",
        )
        parser.add_argument(
            "--priority",
            "-p",
            type=int,
            default=None,
            metavar="N",
            help="priority of seeds that set none (default: 0)",
        )
        parser.add_argument(
            "--meta", default=None, metavar="JSON", help="JSON object merged into each seed's meta"
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=1000,
            metavar="N",
            help="seeds per LPUSH (default: 1000)",
        )
        parser.add_argument(
            "--quiet", "-q", action="store_true", help="do not list invalid seeds, only count them"
        )

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if not args:
            raise UsageError("name the spider to seed")
        spider, urls = args[0], args[1:]
        if not urls and not opts.file:
            raise UsageError("give seeds as arguments or with --file")
        spider_cls = get_spider_loader(self.settings).load(check_spider(self.settings, spider))
        meta = None
        if opts.meta is not None:
            try:
                meta = json.loads(opts.meta)
            except json.JSONDecodeError as exc:
                raise UsageError(f"--meta is not JSON: {exc}", print_help=False) from None
            if not isinstance(meta, dict):
                raise UsageError("--meta must be a JSON object", print_help=False)
        if opts.batch_size < 1:
            raise UsageError("--batch-size must be positive", print_help=False)
        if opts.priority is not None and not -PRIORITY_LIMIT <= opts.priority <= PRIORITY_LIMIT:
            raise UsageError(
                f"--priority must be from -{PRIORITY_LIMIT:,} to {PRIORITY_LIMIT:,}",
                print_help=False,
            )
        key = CrawlKeys.for_spider(spider, self.settings).seeds
        pusher = SeedPusher(get_redis(self.settings), key, opts.batch_size,
                            as_set=self.settings.getbool("REDIS_START_URLS_AS_SET"))
        invalid = 0

        def push(source: str, lines: Iterable[bytes | str]) -> None:
            nonlocal invalid
            for number, line in enumerate(lines, 1):
                stripped = line.strip()
                if not stripped or stripped[:1] in (b"#", "#"):
                    continue
                try:
                    seed, unknown = seed_json(stripped, opts.priority, meta, spider_cls)
                except BadSeed as exc:
                    invalid += 1
                    if not opts.quiet:
                        print(f"{source}:{number}: invalid seed: {exc}", file=sys.stderr)
                    continue
                if unknown and not opts.quiet:
                    keys = ", ".join(unknown)
                    print(f"{source}:{number}: form data keys {keys}", file=sys.stderr)
                pusher.add(seed)

        try:
            if urls:
                push("argument", urls)
            for name in opts.file:
                self._push_file(name, push)
            pusher.flush()
        except RedisError as exc:
            print(
                f"Redis at {redis_location(self.settings)} failed after {pusher.pushed} "
                f"seeds were queued in {key}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            self.exitcode = 3
            return
        print(f"queued {pusher.pushed} seeds in {key}; {invalid} invalid")
        if invalid:
            self.exitcode = 1

    def _push_file(self, name: str, push: Callable[[str, Iterable[bytes]], None]) -> None:
        """Push the seeds of file ``name`` (``-``: stdin), with a progress bar on a TTY."""
        if name == "-":
            push("<stdin>", sys.stdin.buffer)
            return
        path = Path(name)
        try:
            stream = path.open("rb")
        except OSError as exc:
            raise UsageError(f"cannot read {name}: {exc.strerror}", print_help=False) from None
        with stream:
            if not sys.stderr.isatty():
                push(name, stream)
                return
            progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            with progress:
                task = progress.add_task(name, total=path.stat().st_size)
                push(name, _tracked(stream, progress, task))


def _tracked(stream: IO[bytes], progress: Progress, task: TaskID) -> Iterator[bytes]:
    """Yield the lines of ``stream``, advancing the progress bar by their bytes."""
    done = 0
    for number, line in enumerate(stream, 1):
        done += len(line)
        if number % 5000 == 0:
            progress.update(task, completed=done)
        yield line
    progress.update(task, completed=done)
