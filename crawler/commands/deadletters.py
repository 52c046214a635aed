"""``scrapy deadletters list|requeue|purge SPIDER``: the dead-letter queue."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy import Request
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from crawler.frontier.connection import get_redis
from crawler.frontier.sites import site_of
from crawler.frontier.store import Frontier

if TYPE_CHECKING:
    import argparse

__all__ = ["Command", "requeue"]

ACTIONS = ("list", "requeue", "purge")


def requeue(frontier: Frontier, limit: int | None = None) -> tuple[int, int]:
    """Send dead letters back to the frontier, oldest first.

    Each dead letter that carries its encoded request is queued again (its
    retry count reset, as a new request that bypasses the dupefilter) and
    removed from the dead-letter list in the same transaction. Dead letters
    with no request (undecodable entries) stay.

    :param limit: most dead letters to requeue; None for all.
    :returns: ``(requeued, kept)``.
    """
    redis = frontier.redis
    key = frontier.key("dead")
    requeued = kept = 0
    for raw in redis.lrange(key, 0, -1):
        if limit is not None and requeued >= limit:
            break
        record = json.loads(raw)
        encoded = record.get("request")
        if not encoded:
            kept += 1
            continue
        entry = json.loads(encoded)
        meta = entry.get("m", {})
        meta.pop("retry_times", None)
        if meta:
            entry["m"] = meta
        else:
            entry.pop("m", None)
        with redis.pipeline(transaction=True) as pipe:
            frontier.push(
                json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode(),
                site=site_of(Request(entry["u"])),
                priority=int(entry.get("p", 0)),
                fingerprint=None,
                dont_filter=True,
                client=pipe,
            )
            pipe.lrem(key, 1, raw)  # type: ignore[arg-type]
            pipe.execute()
        requeued += 1
    return requeued, kept


class Command(ScrapyCommand):
    """List, requeue or purge a spider's dead letters (``{<spider>}:dead``)."""

    requires_project = True
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "list|requeue|purge SPIDER [--limit N] [--json]"

    def short_desc(self) -> str:
        return "List, requeue or purge the dead-letter queue of a spider"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--limit", type=int, default=None,
                            help="at most N dead letters (list, requeue)")
        parser.add_argument("--json", action="store_true",
                            help="list: one JSON object per line")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) != 2 or args[0] not in ACTIONS:
            raise UsageError(f"expected one of {', '.join(ACTIONS)} and a spider name")
        action, spider = args
        assert self.settings is not None
        frontier = Frontier(get_redis(self.settings), spider)
        key = frontier.key("dead")
        if action == "list":
            end = -1 if opts.limit is None else opts.limit - 1
            for raw in frontier.redis.lrange(key, 0, end):
                record: dict[str, Any] = json.loads(raw)
                if opts.json:
                    record.pop("request", None)
                    print(json.dumps(record, ensure_ascii=False))
                else:
                    when = datetime.fromtimestamp(record.get("time", 0), UTC)
                    print(f"{when:%Y-%m-%d %H:%M:%S}  attempts={record.get('attempts')}  "
                          f"{record.get('url')}  {record.get('reason')}")
        elif action == "requeue":
            requeued, kept = requeue(frontier, opts.limit)
            print(f"requeued {requeued} dead letters of {spider}"
                  + (f"; {kept} without a request stay" if kept else ""))
        else:
            count = int(frontier.redis.llen(key))
            frontier.redis.delete(key)
            print(f"purged {count} dead letters of {spider}")
        sys.stdout.flush()
