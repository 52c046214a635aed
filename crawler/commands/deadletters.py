"""``scrapy deadletters list|requeue|purge SPIDER``: the dead-letter queue."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, cast

from scrapy import Request
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from crawler.frontier import serializer as json_serializer
from crawler.frontier.connection import get_redis
from crawler.frontier.sites import site_of
from crawler.frontier.store import Commit, Frontier, Push

if TYPE_CHECKING:
    import argparse

__all__ = ["Command", "load_record", "purge", "requeue", "requeue_push"]

ACTIONS = ("list", "requeue", "purge")


def load_record(raw: bytes) -> dict[str, Any]:
    """Read one dead letter; one that is not a JSON object (it holds bytes
    that are not UTF-8, say) is read as far as possible, never raises."""
    for text in (raw, raw.decode("utf-8", "replace")):
        try:
            record = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            continue
        if isinstance(record, dict):
            return record
    return {"url": None, "reason": "unreadable dead letter", "entry": raw.decode("latin-1")}


def requeue_push(record: dict[str, Any]) -> Push | None:
    """The push that sends a dead letter's request back to the frontier,
    its retry count reset and bypassing the dupefilter; None when the dead
    letter carries no request that can be decoded.

    Two forms carry one: ``request`` (the full encoded request, written by
    the scheduler) and ``entry`` with ``site`` (the queued entry, written by
    the frontier's scripts for a request past ``FRONTIER_MAX_DELIVERIES``).
    """
    try:
        if isinstance(record.get("request"), str):
            entry = json.loads(record["request"])
            site = site_of(Request(entry["u"]))
        elif isinstance(record.get("entry"), str) and isinstance(record.get("site"), str):
            entry, site = json.loads(record["entry"]), record["site"]
        else:
            return None
        json_serializer.loads(json.dumps(entry), site)  # raises if not a request
    except (ValueError, KeyError, TypeError):
        return None
    meta = entry.get("m", {})
    meta.pop("retry_times", None)
    if meta:
        entry["m"] = meta
    else:
        entry.pop("m", None)
    data = json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode()
    return Push(data, site, int(entry.get("p", 0)), None, True)


def requeue(frontier: Frontier, limit: int | None = None) -> tuple[int, int]:
    """Send dead letters back to the frontier, oldest first.

    Each dead letter that carries its request is queued again (its retry
    count reset, as a new request that bypasses the dupefilter) and taken
    out of the dead-letter list in the same atomic call, which does nothing
    when the entry is gone already: a requeue racing a purge or another
    requeue never queues one that was deleted, nor one twice. Dead letters
    with no request (undecodable entries) stay.

    :param limit: most dead letters to requeue; None for all.
    :returns: ``(requeued, kept)``.
    """
    redis = frontier.redis
    key = frontier.key("dead")
    requeued = kept = 0
    for raw in cast("list[bytes]", redis.lrange(key, 0, -1)):
        if limit is not None and requeued >= limit:
            break
        push = requeue_push(load_record(raw))
        if push is None:
            kept += 1
            continue
        done = frontier.commit(Commit(pushes=[push], claim=raw))
        if done is not None and done.claimed:
            requeued += 1
    return requeued, kept


def purge(frontier: Frontier) -> int:
    """Delete every dead letter; returns how many (one atomic transaction)."""
    with frontier.redis.pipeline(transaction=True) as pipe:
        pipe.llen(frontier.key("dead"))
        pipe.delete(frontier.key("dead"))
        count, _ = pipe.execute()
    return int(count)


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
            for raw in cast("list[bytes]", frontier.redis.lrange(key, 0, end)):
                record = load_record(raw)
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
            count = purge(frontier)
            print(f"purged {count} dead letters of {spider}")
        sys.stdout.flush()
