"""``scrapy deadletters list|requeue|purge SPIDER``: the dead-letter queue.

With ``FRONTIER_SHARDS`` > 1 each frontier shard has its own dead-letter
list (``{<spider>:<i>}:dead``, :mod:`crawler.keys`); every command acts on
all of them, shard 0 first, oldest first within a shard.

Exit status: 0; 2 for a usage error or a spider the project does not have
(nothing is read or written); 3 when Redis could not be reached or refused a
call (the message names its address, credentials masked, and the cause;
dead letters requeued before the failure stay requeued).
"""

from __future__ import annotations

import json
import sys
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, cast

from redis import StrictRedis
from redis.exceptions import RedisClusterException, RedisError
from scrapy.exceptions import UsageError

from crawler.addon import EnvironmentCommand, Subcommand, operands
from crawler.commands.frontier import check_spider
from crawler.frontier import serializer as json_serializer
from crawler.frontier.connection import get_redis, redis_location
from crawler.frontier.deadletters import upgrade
from crawler.frontier.scheduler import DEFAULT_PRIORITY_ADJUST, first_priority, whole_number
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import PRIORITY_LIMIT, Commit, Frontier, Push
from crawler.keys import recorded_shards, shard_count

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator

__all__ = [
    "Command", "dead_letters", "first_priority", "load_record", "purge", "requeue",
    "requeue_each", "requeue_push",
]

#: The subcommands, for their help (``scrapy deadletters SUB --help``).
DEADLETTER_SUBCOMMANDS = (
    Subcommand("list", "list SPIDER [--limit N] [--json]",
               "Print the spider's dead letters, oldest first, one line each.",
               "--json: one JSON array of objects (the records without the request; [] "
               "when there are none)."),
    Subcommand("requeue", "requeue SPIDER [--limit N]",
               "Queue the dead letters' requests again, at the priority they were first "
               "scheduled at.",
               "A dead letter without a request (an undecodable frontier entry) stays."),
    Subcommand("purge", "purge SPIDER", "Delete every dead letter of the spider."),
)
ACTIONS = tuple(sub.name for sub in DEADLETTER_SUBCOMMANDS)
#: Exit status when Redis could not be reached or refused a call (as
#: ``scrapy seed`` and ``scrapy frontier delay|concurrency|overrides``).
REDIS_FAILED = 3
#: Key of a dead letter on its way to another shard (see :func:`requeue_each`):
#: a token naming the move.
MOVING = "requeue_move"


def _shards(frontier: Frontier | FrontierShards) -> FrontierShards:
    """``frontier`` as shards (one :class:`Frontier` is a frontier of one shard)."""
    if isinstance(frontier, FrontierShards):
        return frontier
    return FrontierShards([frontier], frontier.prefix)  # (the name is for check_count only)


def dead_letters(
    frontier: Frontier | FrontierShards, limit: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """Every dead letter as ``(shard, exact list entry)``: shard 0 first,
    oldest first within a shard (one ``LRANGE`` per shard, read when its
    turn comes). A dead letter on its way to another shard (see
    :func:`requeue_each`) may sit in two lists for a moment: it is listed once.

    :param limit: at most this many.
    :raises redis.exceptions.RedisError: Redis failed.
    """
    moving: set[str] = set()
    count = 0
    for i, raw in _every_copy(frontier):
        if limit is not None and count >= limit:
            return
        token = _moving_token(raw)
        if token is not None:
            if token in moving:
                continue
            moving.add(token)
        count += 1
        yield i, raw


def _every_copy(frontier: Frontier | FrontierShards) -> Iterator[tuple[int, bytes]]:
    """Every dead-letter list entry as ``(shard, entry)``, shard 0 first (one
    ``LRANGE`` per shard, read when its turn comes): both copies of one on
    its way to another shard."""
    for i, shard in enumerate(_shards(frontier)):
        for raw in cast("list[bytes]", shard.redis.lrange(shard.key("dead"), 0, -1)):
            yield i, raw


def _moving_token(raw: bytes) -> str | None:
    if MOVING.encode() not in raw:  # most dead letters: no JSON decoding
        return None
    token = load_record(raw).get(MOVING)
    return token if isinstance(token, str) else None


def load_record(raw: bytes) -> dict[str, Any]:
    """Read one dead letter in the one record shape
    (:mod:`crawler.frontier.deadletters`; a record of an earlier shape is
    upgraded by :func:`~crawler.frontier.deadletters.upgrade`); one that is
    not a JSON object (it holds bytes that are not UTF-8, say) is read as far
    as possible, never raises."""
    for text in (raw, raw.decode("utf-8", "replace")):
        try:
            record = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            continue
        if isinstance(record, dict):
            return upgrade(record)
    return upgrade({"reason": "unreadable dead letter", "entry": raw.decode("latin-1")})


def requeue_push(
    record: dict[str, Any], priority_adjust: int = DEFAULT_PRIORITY_ADJUST
) -> Push | None:
    """The push that sends a dead letter's request back to the frontier,
    as it was first scheduled: its retry count reset, its priority the one
    it had before Scrapy's retries lowered it (:func:`first_priority`), and
    bypassing the dupefilter; None when the dead letter carries no request
    that can be decoded, or that priority is outside the frontier's range
    (``PRIORITY_LIMIT``).

    The request is the record's ``entry``, read with its ``site`` (a record
    as :func:`load_record` gives it); its priority is the entry's, else the
    record's ``priority``. The priority it is requeued at is the record's
    ``first_priority`` when the crawl recorded it (the scheduler does, with
    its own ``RETRY_PRIORITY_ADJUST``), else :func:`first_priority` with
    ``priority_adjust``.

    :param record: a dead letter (an earlier shape is upgraded first).
    :param priority_adjust: ``RETRY_PRIORITY_ADJUST`` of the crawl (for
        records without ``first_priority``).
    """
    record = upgrade(record)
    entry_text, site = record["entry"], record["site"]
    if not isinstance(entry_text, str) or not isinstance(site, str):
        return None
    try:
        entry = json_serializer.entry_fields(entry_text, site)
        json_serializer.loads(json_serializer.pack_fields(entry), site)  # raises if not a request
        meta = json_serializer.entry_meta(entry)
    except (ValueError, KeyError, TypeError):
        return None
    priority = whole_number(entry.get("p"))
    if priority is None:
        priority = whole_number(record.get("priority")) or 0
    first = whole_number(record.get("first_priority"))  # recorded by the crawl itself
    priority = first if first is not None else first_priority(priority, meta, priority_adjust)
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        return None
    meta.pop("retry_times", None)
    json_serializer.set_entry_meta(entry, meta)
    if priority:
        entry["p"] = priority
    else:
        entry.pop("p", None)
    return Push(json_serializer.pack_fields(entry, site), site, priority, None, True)


def requeue_each(
    frontier: Frontier | FrontierShards,
    limit: int | None = None,
    priority_adjust: int = DEFAULT_PRIORITY_ADJUST,
) -> Iterator[bool]:
    """Send dead letters back to the frontier, shard by shard, oldest first
    (see :func:`requeue`); yields True for each one requeued, False for each
    one kept (it carries no request).

    A dead letter whose request's site belongs to the shard whose list holds
    it (every dead letter a crawl writes, but those with no site, kept in
    shard 0) is requeued in one atomic ``commit.lua`` call: the claim (take
    this exact entry out of the list; nothing happens when it is gone) and
    the push. One in another shard's list cannot be: a script touches one
    shard. It moves in steps that each leave it somewhere, none of which can
    run twice (:func:`_move`):

    1. in its shard, one atomic call claims it and appends a copy marked
       with a move token (``requeue_move``): a requeue racing a purge or
       another requeue claims it once;
    2. the marked copy is appended to the dead letters of its site's shard,
       unless it is there already or step 3 ran (a ``WATCH`` transaction);
    3. there, one atomic call claims that copy, pushes the request and sets
       the commit marker ``sent:requeue#<token>``
       (:meth:`~crawler.frontier.store.Frontier.marker_key`);
    4. the marked copy in its first shard is claimed.

    A crash or a lost reply between two steps leaves the marked copy in the
    first shard; the next requeue reads the marker to know whether step 3
    ran and goes on from there: the request is queued once, never lost.
    Copying first and claiming after (no token) could queue it twice after a
    crash; claiming and pushing without the marked copy could lose it. The
    marker lasts a day (``Frontier.MARKER_TTL_MS``): a move cut off between
    steps 3 and 4 and resumed later than that queues its request again.

    :raises redis.exceptions.RedisError: Redis failed (the ones yielded
        True before are requeued; a move cut off is finished by the next
        requeue).
    """
    shards = _shards(frontier)
    requeued = 0
    # Both copies of a dead letter on its way: when its site's shard comes
    # first, the copy there is pushed, and the one left in the shard it
    # came from is claimed in that shard's turn (step 4).
    for i, raw in _every_copy(shards):
        if limit is not None and requeued >= limit:
            break
        record = load_record(raw)
        push = requeue_push(record, priority_adjust)
        if push is None:
            yield False
            continue
        target = shards.index_of(push.site)
        token = record.get(MOVING)
        if target == i and not isinstance(token, str):
            done = shards[i].commit(Commit(pushes=[push], claim=raw))
            ok = done is not None and done.claimed
        else:
            ok = _move(shards, i, raw, record, push=push, target=target)
        if ok:
            requeued += 1
            yield True


def _move(
    shards: FrontierShards, i: int, raw: bytes, record: dict[str, Any], *, push: Push, target: int
) -> bool:
    """Requeue the dead letter ``raw`` of shard ``i`` into shard ``target``
    (the steps of :func:`requeue_each`); True when this call pushed it."""
    source, dest = shards[i], shards[target]
    token = record.get(MOVING)
    if not isinstance(token, str):  # step 1
        token = uuid.uuid4().hex
        marked = json.dumps({**record, MOVING: token}, ensure_ascii=False).encode()
        done = source.commit(Commit(claim=raw, dead=[marked]))
        if done is None or not done.claimed:
            return False  # purged or requeued by another call meanwhile
        raw = marked
    holder = f"requeue#{token}"
    marker = dest.marker_key(holder)
    pushed = False
    if dest.redis.get(marker) is None:
        if i != target:
            _append_once(dest, raw, marker)  # step 2
        done = dest.commit(Commit(pushes=[push], claim=raw, marker=(holder, 1)))  # step 3
        pushed = done is not None and done.claimed
        if not pushed and dest.redis.get(marker) is None:
            return False  # the copy was purged there: the next requeue copies it again
    if i != target:  # (a copy in its site's shard: the one it came from is claimed in its turn)
        source.commit(Commit(claim=raw))  # step 4
    return pushed


def _append_once(frontier: Frontier, entry: bytes, marker: str) -> None:
    """Append ``entry`` to the shard's dead letters unless it is in the
    list already or ``marker`` exists (one ``WATCH`` transaction on the
    shard's node, tried again if either changed meanwhile)."""
    redis: Any = frontier.redis
    if not isinstance(redis, StrictRedis):  # a cluster: the node of the shard
        redis = redis.get_redis_connection(redis.get_node_from_key(frontier.key("dead")))
    dead = frontier.key("dead")

    def append(pipe: Any) -> None:
        if pipe.exists(marker) or pipe.lpos(dead, entry) is not None:
            return
        pipe.multi()
        pipe.rpush(dead, entry)

    redis.transaction(append, dead, marker)


def requeue(
    frontier: Frontier | FrontierShards,
    limit: int | None = None,
    priority_adjust: int = DEFAULT_PRIORITY_ADJUST,
) -> tuple[int, int]:
    """Send dead letters back to the frontier, every shard's, oldest first.

    Each dead letter that carries its request is queued again as it was
    first scheduled (:func:`requeue_push`: retry count reset, priority from
    before Scrapy's retry adjustments, bypassing the dupefilter) and taken
    out of the dead-letter list in the same atomic call, which does nothing
    when the entry is gone already: a requeue racing a purge or another
    requeue never queues one that was deleted, nor one twice. Dead letters
    with no request (undecodable entries) stay. A dead letter in another
    shard's list than its site's moves there in steps (:func:`requeue_each`),
    requeued once even when the command is cut off between them.

    :param limit: most dead letters to requeue; None for all.
    :param priority_adjust: ``RETRY_PRIORITY_ADJUST`` of the crawl.
    :returns: ``(requeued, kept)``.
    :raises redis.exceptions.RedisError: Redis failed.
    """
    done = list(requeue_each(frontier, limit, priority_adjust))
    return done.count(True), done.count(False)


def purge(frontier: Frontier | FrontierShards) -> int:
    """Delete every dead letter of every shard; returns how many (one atomic
    transaction per shard). A dead letter on its way to another shard (see
    :func:`requeue_each`) counts once per list that held it."""
    total = 0
    for shard in _shards(frontier):
        with shard.redis.pipeline(transaction=True) as pipe:
            pipe.llen(shard.key("dead"))
            pipe.delete(shard.key("dead"))
            count, _ = pipe.execute()
        total += int(count)
    return total


class Command(EnvironmentCommand):
    """List, requeue or purge a spider's dead letters (``{<spider>}:dead``;
    with ``FRONTIER_SHARDS`` > 1 every shard's ``{<spider>:<i>}:dead``).

    ``requeue`` queues each request at the priority it was first scheduled
    at: Scrapy's retries lower it by ``RETRY_PRIORITY_ADJUST`` (or the
    request's ``meta["priority_adjust"]``) each time, which is undone with
    the settings this command runs with (:func:`first_priority`). Exit
    status: see the module.
    """

    requires_project = True
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "SUBCOMMAND SPIDER [OPTIONS]"

    def short_desc(self) -> str:
        return "List, requeue or purge the dead-letter queue of a spider"

    def long_desc(self) -> str:
        return (
            "List, requeue or purge the dead-letter queue of a spider. "
            "scrapy deadletters SUBCOMMAND --help prints a subcommand's usage and options."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        self.add_subcommands(parser, "deadletters", DEADLETTER_SUBCOMMANDS, self._sub_options)

    @staticmethod
    def _sub_options(name: str, parser: argparse.ArgumentParser) -> None:
        """The options of subcommand ``name``."""
        if name in ("list", "requeue"):
            parser.add_argument("--limit", type=int, default=None, metavar="N",
                                help="at most N dead letters")
        if name == "list":
            parser.add_argument("--json", action="store_true",
                                help="print one JSON array of objects ([] when none)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        self.run_json_safe(lambda: self._run(operands(opts, args, "deadletters"), opts), opts)

    def _run(self, args: list[str], opts: argparse.Namespace) -> None:
        action = opts.subcommand
        if action not in ACTIONS:
            raise UsageError(f"expected a subcommand: {', '.join(ACTIONS)}")
        if len(args) != 1:
            raise UsageError(f"expected: {action} SPIDER", print_help=False)
        spider = args[0]
        as_json = bool(getattr(opts, "json", False))
        limit = getattr(opts, "limit", None)
        assert self.settings is not None
        check_spider(self.settings, spider)
        requeued = 0
        try:
            redis = get_redis(self.settings)
            frontier = FrontierShards.build(redis, spider, recorded_shards(
                redis, spider, shard_count(self.settings)
            ))
            if action == "list":
                if not self._list(frontier, limit, as_json=as_json) and not as_json:
                    print(f"no dead letters of {spider}")
            elif action == "requeue":
                adjust = self.settings.getint("RETRY_PRIORITY_ADJUST")
                kept = 0
                for done in requeue_each(frontier, limit, adjust):
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
            message = (f"Redis at {redis_location(self.settings)} failed{after}: "
                       f"{type(exc).__name__}: {exc}")
            if as_json:
                self.json_error(message)
            print(message, file=sys.stderr)
            self.exitcode = REDIS_FAILED
        sys.stdout.flush()

    @staticmethod
    def _list(frontier: FrontierShards, limit: int | None, *, as_json: bool) -> int:
        """Print the dead letters (one line each; ``as_json``: one JSON array,
        one element per line, ``[]`` when there are none, printed once all
        were read, so that a Redis failure half-way prints no partial
        array); how many were printed."""
        count = 0
        records = []
        for _, raw in dead_letters(frontier, limit):
            count += 1
            record = load_record(raw)
            record.pop(MOVING, None)
            if as_json:
                records.append(json.dumps(record, ensure_ascii=False))
            else:
                when = datetime.fromtimestamp(record.get("time", 0), UTC)
                print(f"{when:%Y-%m-%d %H:%M:%S}  attempts={record.get('attempts')}  "
                      f"{record.get('url')}  {record.get('reason')}")
        if as_json:
            print("[\n" + ",\n".join(records) + "\n]" if records else "[]")
        return count
