"""``scrapy deadletters list|requeue|purge SPIDER``: the dead-letter queue.

Exit status: 0; 2 for a usage error or a spider the project does not have
(nothing is read or written); 3 when Redis could not be reached or refused a
call (the message names its address, credentials masked, and the cause;
dead letters requeued before the failure stay requeued).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, cast

from redis.exceptions import RedisClusterException, RedisError
from scrapy import Request
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from crawler.commands.frontier import check_spider
from crawler.frontier import serializer as json_serializer
from crawler.frontier.connection import get_redis, redis_location
from crawler.frontier.scheduler import DEFAULT_PRIORITY_ADJUST, first_priority, whole_number
from crawler.frontier.sites import site_of
from crawler.frontier.store import Commit, Frontier, Push

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator

__all__ = [
    "Command", "first_priority", "load_record", "purge", "requeue", "requeue_each",
    "requeue_push",
]

ACTIONS = ("list", "requeue", "purge")
#: Exit status when Redis could not be reached or refused a call (as
#: ``scrapy seed`` and ``scrapy frontier delay|concurrency|overrides``).
REDIS_FAILED = 3


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


def requeue_push(
    record: dict[str, Any], priority_adjust: int = DEFAULT_PRIORITY_ADJUST
) -> Push | None:
    """The push that sends a dead letter's request back to the frontier,
    as it was first scheduled: its retry count reset, its priority the one
    it had before Scrapy's retries lowered it (:func:`first_priority`), and
    bypassing the dupefilter; None when the dead letter carries no request
    that can be decoded.

    Two forms carry one: ``request`` (the full encoded request, written by
    the scheduler) and ``entry`` with ``site`` (the queued entry, written by
    the frontier's scripts for a request past ``FRONTIER_MAX_DELIVERIES``;
    its priority is the entry's, else the record's ``priority``). The
    priority is the record's ``first_priority`` when the crawl recorded it
    (the scheduler does, with its own ``RETRY_PRIORITY_ADJUST``), else
    :func:`first_priority` with ``priority_adjust``.

    :param priority_adjust: ``RETRY_PRIORITY_ADJUST`` of the crawl (for
        records without ``first_priority``).
    """
    try:
        if isinstance(record.get("request"), str):
            entry = json_serializer.entry_fields(record["request"])
            site = site_of(Request(entry["u"]))
        elif isinstance(record.get("entry"), str) and isinstance(record.get("site"), str):
            entry, site = json_serializer.entry_fields(record["entry"]), record["site"]
        else:
            return None
        json_serializer.loads(json_serializer.pack_fields(entry), site)  # raises if not a request
    except (ValueError, KeyError, TypeError):
        return None
    meta = entry.get("m", {})
    if not isinstance(meta, dict):
        return None
    priority = whole_number(entry.get("p"))
    if priority is None:
        priority = whole_number(record.get("priority")) or 0
    first = whole_number(record.get("first_priority"))  # recorded by the crawl itself
    priority = first if first is not None else first_priority(priority, meta, priority_adjust)
    meta.pop("retry_times", None)
    if meta:
        entry["m"] = meta
    else:
        entry.pop("m", None)
    if priority:
        entry["p"] = priority
    else:
        entry.pop("p", None)
    return Push(json_serializer.pack_fields(entry), site, priority, None, True)


def requeue_each(
    frontier: Frontier, limit: int | None = None, priority_adjust: int = DEFAULT_PRIORITY_ADJUST
) -> Iterator[bool]:
    """Send dead letters back to the frontier, oldest first, one atomic
    call each (see :func:`requeue`); yields True for each one requeued,
    False for each one kept (it carries no request).

    :raises redis.exceptions.RedisError: Redis failed (the ones yielded
        True before are requeued).
    """
    redis = frontier.redis
    key = frontier.key("dead")
    requeued = 0
    for raw in cast("list[bytes]", redis.lrange(key, 0, -1)):
        if limit is not None and requeued >= limit:
            break
        push = requeue_push(load_record(raw), priority_adjust)
        if push is None:
            yield False
            continue
        done = frontier.commit(Commit(pushes=[push], claim=raw))
        if done is not None and done.claimed:
            requeued += 1
            yield True


def requeue(
    frontier: Frontier, limit: int | None = None, priority_adjust: int = DEFAULT_PRIORITY_ADJUST
) -> tuple[int, int]:
    """Send dead letters back to the frontier, oldest first.

    Each dead letter that carries its request is queued again as it was
    first scheduled (:func:`requeue_push`: retry count reset, priority from
    before Scrapy's retry adjustments, bypassing the dupefilter) and taken
    out of the dead-letter list in the same atomic call, which does nothing
    when the entry is gone already: a requeue racing a purge or another
    requeue never queues one that was deleted, nor one twice. Dead letters
    with no request (undecodable entries) stay.

    :param limit: most dead letters to requeue; None for all.
    :param priority_adjust: ``RETRY_PRIORITY_ADJUST`` of the crawl.
    :returns: ``(requeued, kept)``.
    :raises redis.exceptions.RedisError: Redis failed.
    """
    done = list(requeue_each(frontier, limit, priority_adjust))
    return done.count(True), done.count(False)


def purge(frontier: Frontier) -> int:
    """Delete every dead letter; returns how many (one atomic transaction)."""
    with frontier.redis.pipeline(transaction=True) as pipe:
        pipe.llen(frontier.key("dead"))
        pipe.delete(frontier.key("dead"))
        count, _ = pipe.execute()
    return int(count)


class Command(ScrapyCommand):
    """List, requeue or purge a spider's dead letters (``{<spider>}:dead``).

    ``requeue`` queues each request at the priority it was first scheduled
    at: Scrapy's retries lower it by ``RETRY_PRIORITY_ADJUST`` (or the
    request's ``meta["priority_adjust"]``) each time, which is undone with
    the settings this command runs with (:func:`first_priority`). Exit
    status: see the module.
    """

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
        check_spider(self.settings, spider)
        requeued = 0
        try:
            frontier = Frontier(get_redis(self.settings), spider)
            if action == "list":
                self._list(frontier, opts)
            elif action == "requeue":
                adjust = self.settings.getint("RETRY_PRIORITY_ADJUST", DEFAULT_PRIORITY_ADJUST)
                kept = 0
                for done in requeue_each(frontier, opts.limit, adjust):
                    requeued += done
                    kept += not done
                print(f"requeued {requeued} dead letters of {spider}"
                      + (f"; {kept} without a request stay" if kept else ""))
            else:
                count = purge(frontier)
                print(f"purged {count} dead letters of {spider}")
        except (RedisError, RedisClusterException) as exc:
            sys.stdout.flush()
            after = f" after {requeued} dead letters of {spider} were requeued" if requeued else ""
            print(
                f"Redis at {redis_location(self.settings)} failed{after}: "
                f"{type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            self.exitcode = REDIS_FAILED
        sys.stdout.flush()

    @staticmethod
    def _list(frontier: Frontier, opts: argparse.Namespace) -> None:
        end = -1 if opts.limit is None else opts.limit - 1
        for raw in cast("list[bytes]", frontier.redis.lrange(frontier.key("dead"), 0, end)):
            record = load_record(raw)
            if opts.json:
                record.pop("request", None)
                print(json.dumps(record, ensure_ascii=False))
            else:
                when = datetime.fromtimestamp(record.get("time", 0), UTC)
                print(f"{when:%Y-%m-%d %H:%M:%S}  attempts={record.get('attempts')}  "
                      f"{record.get('url')}  {record.get('reason')}")
