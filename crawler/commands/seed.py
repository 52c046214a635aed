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
from crawler.frontier.seeds import BadSeed, parse_seed
from crawler.keys import CrawlKeys

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable, Iterator

    from redis import Redis

logger = logging.getLogger(__name__)

__all__ = ["Command", "SeedPusher", "seed_json"]


def seed_json(
    line: bytes | str,
    priority: int | None = None,
    meta: dict[str, Any] | None = None,
    spider_cls: type | None = None,
) -> tuple[str, tuple[str, ...]]:
    """Validate one seed and return it in the JSON form pushed to Redis.

    :param line: a bare URL or a JSON seed object, as ``redis-cli`` takes.
    :param priority: ``--priority``, used when the seed sets none.
    :param meta: ``--meta``, merged under the seed's own meta keys.
    :param spider_cls: when given, a seed's ``callback`` must be one of its
        methods.
    :returns: ``(json_text, form_keys)``: compact JSON with ``url`` first
        and defaults (priority 0, empty meta) left out; the JSON keys the
        workers send as form data (scrapy-redis's reading), sorted.
    :raises BadSeed: the seed cannot become a request; the message says why.
    """
    seed = parse_seed(line)
    text = line.decode() if isinstance(line, bytes) else line
    text = text.strip()
    obj: dict[str, Any] = {"url": seed.url}
    if text.startswith("{"):
        obj.update(json.loads(text))
        obj["url"] = seed.url
    if priority is not None and "priority" not in obj:
        obj["priority"] = priority
    if meta:
        obj["meta"] = {**meta, **obj.get("meta", {})}
    if not obj.get("priority"):
        obj.pop("priority", None)
    if not obj.get("meta"):
        obj.pop("meta", None)
    if seed.callback is not None and spider_cls is not None:
        if not callable(getattr(spider_cls, seed.callback, None)):
            raise BadSeed(f"spider has no callback {seed.callback!r}")
    form_keys = tuple(sorted(seed.formdata))
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False), form_keys


class SeedPusher:
    """Push validated seeds into a seed list in pipelined ``LPUSH`` batches.

    ``LPUSH key s1 s2 s3`` and workers taking from the right (``RPOP``)
    mean seeds are crawled in the order given.

    :param server: a redis-py client.
    :param key: the seed list, e.g. ``quotes:start_urls``.
    :param batch_size: seeds per ``LPUSH``; a pipeline carries
        ``pipeline_batches`` of them per round trip.
    """

    def __init__(
        self, server: Redis, key: str, batch_size: int = 1000, pipeline_batches: int = 10
    ) -> None:
        self.server = server
        self.key = key
        self.batch_size = batch_size
        self.pipeline_batches = pipeline_batches
        self.pushed = 0
        self._batch: list[str] = []
        self._batches: list[list[str]] = []

    def add(self, seed: str) -> None:
        """Queue one seed (JSON text); sends when enough are waiting.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        self._batch.append(seed)
        if len(self._batch) >= self.batch_size:
            self._batches.append(self._batch)
            self._batch = []
            if len(self._batches) >= self.pipeline_batches:
                self.flush()

    def flush(self) -> None:
        """Send everything queued.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        if self._batch:
            self._batches.append(self._batch)
            self._batch = []
        if not self._batches:
            return
        pipe = self.server.pipeline(transaction=False)
        for batch in self._batches:
            pipe.lpush(self.key, *batch)
        pipe.execute()
        self.pushed += sum(map(len, self._batches))
        self._batches = []


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
        key = CrawlKeys.for_spider(spider, self.settings).seeds
        pusher = SeedPusher(get_redis(self.settings), key, opts.batch_size)
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
