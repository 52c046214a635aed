"""Bounded state: the workers' periodic housekeeping of a crawl's Redis keys.

Three keys of a crawl would otherwise grow for as long as it runs:

* the worker registry ``{s}:workers`` keeps one record per worker that ever
  ran (a closed worker's final record, one that died its last heartbeat);
  a record whose heartbeat (or close) is older than
  ``FRONTIER_WORKER_FORGET_AFTER`` seconds (default 86400, a day) is removed
  (``lua/forget_workers.lua``, which reads the record again inside the call,
  so a worker that came back is kept);
* the dead-letter list ``{s}:dead`` is trimmed to its newest
  ``FRONTIER_DEAD_LETTERS_MAX`` entries (default 100,000; 0: no cap); what
  is trimmed is counted in ``{s}:dead:trimmed``, beside the list
  (``lua/trim_dead.lua``: LLEN, LTRIM and INCRBY in one atomic call that
  counts exactly what it removed, so a call sent twice counts nothing
  twice); the status (:mod:`crawler.status`) reports the sum over the
  shards, plus the stat ``dead/trimmed`` of ``{s}:stats`` where versions
  before shards counted them;
* the per-site state of sites that had no work for
  ``FRONTIER_SITE_FORGET_AFTER`` seconds (default 3600) is deleted: their
  fields in ``{s}:due``, ``{s}:slow``, ``{s}:rdelay``, ``{s}:robots``,
  ``{s}:robots:down``, ``{s}:retryat``, ``{s}:joined`` (left behind only by
  a hand edit) and zero counters in ``{s}:active``
  (``lua/forget_sites.lua``). A site is idle when it is in neither
  ``{s}:wait`` nor ``{s}:ready``, has no queued request (no field in ``{s}:lv``),
  no download slot taken, and its due time, and that of its last retry
  (``{s}:retryat``: a site whose only work waits in ``{s}:retries`` has
  work), are older than the bound (and while a due retry waits unmoved in
  ``{s}:retries``, the workers paused or behind, no site with a retry time
  is idle); the
  check and the deletes are one atomic call, so a site that gets work in
  between is never touched. The sites are visited with ``HSCAN`` of
  ``{s}:due``, ``FRONTIER_HOUSEKEEPING_BATCH`` (default 200) per run, the
  cursor kept in ``{s}:forget`` so that the workers share one pass. The
  operator's overrides (``{s}:delay``, ``{s}:conc``, ``{s}:revisit``) stay.
  ``{s}:wactive`` needs no pass: the scripts delete its counters when they
  fall to 0. A forgotten site that gets work again starts afresh: no
  delay since its last request (it was long ago), its robots.txt fetched
  again.

**Shards.** With ``FRONTIER_SHARDS`` = N > 1 (:mod:`crawler.keys`) the
dead letters and the per-site state are in each shard's keys, ``{s}:``
above standing for the shard's prefix ``{<spider>:<i>}:``: every run trims
each shard's list to ``ceil(FRONTIER_DEAD_LETTERS_MAX / N)`` entries (the
sites, and so their dead letters, spread evenly over the shards) and looks at ``ceil(batch / N)``
sites of each shard's ``{s}:due``, with a cursor per shard, so a run does
about ``FRONTIER_HOUSEKEEPING_BATCH`` sites' work whatever N. The worker
registry is crawl-wide (``{<spider>}:workers``). A shard whose keys a
script refuses (a key of another type) is reported in the run's problems
and the other shards are still swept.

Each worker runs all three every ``FRONTIER_HOUSEKEEPING_INTERVAL`` seconds
(default 30.0) in a thread (:class:`FrontierHousekeeping`, an extension); a
failed run is logged and tried again at the next one. Every script declares
its keys in KEYS (no key is built inside a script).

**Round trips.** A run (:meth:`Housekeeper.run`) takes three round trips
whatever the shard count, the independent calls of each in one pipeline
per Redis node (``transaction=False``; on a cluster a plain pipeline of
each master's own client, as the scheduler sends its calls): the
registry's next page, and each shard's trim and cursor; the stale workers'
records, and each shard's next sites of ``{s}:due``; each shard's sweep of
those sites. No call is ever sent twice by redis-py (its retries are off,
and a cluster pipeline's own resends are not used); a call whose reply says
it did not run (``NOSCRIPT`` after a restart, ``MOVED``) is sent once more
alone, as the scheduler does. A lost reply fails the run; the next run
starts over, which every call here allows (reads, and scripts that judge
again what they remove and count only what they removed).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from redis.exceptions import ResponseError
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import create_looping_call
from twisted.internet.threads import deferToThread

from crawler.config import FrontierConfig
from crawler.frontier import protocol
from crawler.frontier.clock import CLOCK
from crawler.frontier.connection import (
    NOT_RUN,
    config_error,
    get_redis,
    is_no_master,
    report_redis_failure,
)
from crawler.frontier.shards import node_pipelines
from crawler.frontier.store import BAD_VALUE_HINT, _Lua
from crawler.keys import shard_count, shard_prefixes, spider_name_of, workers_key

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis import Redis
    from scrapy.crawler import Crawler
    from scrapy.utils.asyncio import AsyncioLoopingCall
    from twisted.internet.defer import Deferred
    from twisted.internet.task import LoopingCall

logger = logging.getLogger(__name__)

__all__ = ["FrontierHousekeeping", "Housekeeper", "Swept"]


class _Call(NamedTuple):
    """One housekeeping call.

    :ivar key: a key it touches (the one that routes it to its node).
    :ivar send: queues it on the pipeline given, or (given None) sends it
        now through the housekeeper's client and returns its reply.
    """

    key: str
    send: Callable[[Any], Any]


class Swept(NamedTuple):
    """What one housekeeping run did.

    :ivar workers: worker records removed from ``{s}:workers``.
    :ivar dead_trimmed: dead letters trimmed off ``{s}:dead``, every shard.
    :ivar sites: sites whose per-site state was deleted, every shard.
    :ivar problems: bad values met (one line each); the entry was left
        alone. A shard whose keys a script refused is one line too.
    """

    workers: int = 0
    dead_trimmed: int = 0
    sites: int = 0
    problems: tuple[str, ...] = ()


class Housekeeper:
    """The housekeeping of one crawl's keys; each method is one bounded step.

    :param redis: a redis-py client returning bytes (a cluster client
        sends each call to the master of its shard).
    :param spider: the spider's name (keys ``{<spider>}:...``).
    :param shards: the frontier's shard count (``FRONTIER_SHARDS``).
    :param worker_forget_after: seconds after its last heartbeat a worker's
        record is removed.
    :param dead_max: most dead letters kept, all shards (0: no cap); each
        shard keeps ``ceil(dead_max / shards)``.
    :param site_forget_after: seconds without work after which a site's
        state is deleted.
    :param batch: sites looked at (over all shards), and worker records
        read, per run.
    """

    def __init__(
        self,
        redis: Redis,
        spider: str,
        *,
        shards: int = 1,
        worker_forget_after: float = 86400.0,
        dead_max: int = 100_000,
        site_forget_after: float = 3600.0,
        batch: int = 200,
    ) -> None:
        self.redis = redis
        self.spider = spider
        self.prefixes = shard_prefixes(spider, shards)
        self.prefix = self.prefixes[0]
        self.worker_forget_after = worker_forget_after
        self.dead_max = dead_max
        self.site_forget_after_ms = max(0, round(site_forget_after * 1000))
        self.batch = batch
        self._workers_cursor = 0
        self._forget_workers = _Lua(redis, "forget_workers.lua")
        self._trim_dead = _Lua(redis, "trim_dead.lua", lib=True)
        self._forget_sites = _Lua(redis, "forget_sites.lua", lib=True)
        self._trim_header = protocol.header("trim_dead")
        self._forget_header = protocol.header("forget_sites")

    def key(self, name: str, shard: int = 0) -> str:
        """``<prefix of shard>name``: ``{<spider>}:<name>`` with one shard."""
        return self.prefixes[shard] + name

    @property
    def dead_max_per_shard(self) -> int:
        """Dead letters each shard keeps: ``ceil(dead_max / shards)`` (0: no cap)."""
        return max(0, -(-self.dead_max // len(self.prefixes)))

    @property
    def site_batch(self) -> int:
        """Sites looked at per shard and run: ``ceil(batch / shards)``."""
        return max(1, -(-self.batch // len(self.prefixes)))

    def run(self) -> Swept:
        """All three steps, the last two over every shard, in three round
        trips (:meth:`_round`: one pipeline per Redis node): the registry's
        next page, each shard's trim and its cursor; the stale workers'
        records and each shard's next sites; each shard's sites.

        A shard whose call Redis refused (a key of the wrong type: nothing
        was written by that call) is named in the problems; the other
        shards are swept all the same.

        :raises redis.exceptions.RedisError: Redis failed, refused the
            worker registry's call (once the calls of its round have run),
            or refused a call for a reason of configuration
            (:func:`~crawler.frontier.connection.config_error`).
        """
        problems: list[str] = []
        page, trimmed, cursors = self._trim_and_cursors(problems)
        workers, pages = self._workers_and_sites(page, cursors, problems)
        sites = self._forget_pages(pages, problems)
        return Swept(workers, trimmed, sites, tuple(problems))

    def _trim_and_cursors(
        self, problems: list[str]
    ) -> tuple[tuple[int, dict[bytes, bytes]], int, dict[int, int]]:
        """The first round trip: the registry's next page, each shard's
        trim and the cursor of its sweep.

        :returns: the page, the dead letters trimmed and each readable
            shard's cursor; the shards' refusals are added to ``problems``.
        """
        trims = self.dead_max > 0
        calls = [self._scan_workers_call()]
        for shard in range(len(self.prefixes)):
            if trims:
                calls.append(self._trim_call(shard))
            calls.append(self._cursor_call(shard))
        replies = self._round(calls)
        page = _raised(replies.pop(0))
        trimmed = 0
        cursors: dict[int, int] = {}
        for shard in range(len(self.prefixes)):
            if trims:
                reply = replies.pop(0)
                if isinstance(reply, ResponseError):
                    problems.append(_refused(reply))
                else:
                    trimmed += int(reply)
            reply = replies.pop(0)
            if isinstance(reply, ResponseError):
                problems.append(_refused(reply))
            else:
                cursors[shard] = _cursor(reply)
        return page, trimmed, cursors

    def _workers_and_sites(
        self,
        page: tuple[int, dict[bytes, bytes]],
        cursors: dict[int, int],
        problems: list[str],
    ) -> tuple[int, dict[int, tuple[list[str], int]]]:
        """The second round trip: the stale workers of ``page`` forgotten,
        and the next sites of each shard of ``cursors`` read.

        :returns: worker records removed, and each readable shard's sites
            and next cursor; problems are added to ``problems``.
        """
        stale = self._stale_workers(page)
        calls = [self._forget_workers_call(stale)] if stale else []
        calls += [self._scan_due_call(shard, cursor) for shard, cursor in cursors.items()]
        replies = self._round(calls)
        workers = 0
        if stale:
            removed, found = _raised(replies.pop(0))
            workers = int(removed)
            problems[:0] = [_text(p) for p in found]
        pages: dict[int, tuple[list[str], int]] = {}
        for shard, reply in zip(cursors, replies, strict=True):
            if isinstance(reply, ResponseError):
                problems.append(_refused(reply))
            else:
                nxt, fields = reply
                pages[shard] = ([_text(site) for site in fields], int(nxt))
        return workers, pages

    def _forget_pages(
        self, pages: dict[int, tuple[list[str], int]], problems: list[str]
    ) -> int:
        """The third round trip: each shard's sites of ``pages`` swept
        (:meth:`forget`).

        :returns: sites forgotten; problems are added to ``problems``.
        """
        calls = [
            self._forget_call(sites, nxt, shard) for shard, (sites, nxt) in pages.items()
        ]
        forgotten = 0
        for reply in self._round(calls):
            if isinstance(reply, ResponseError):
                problems.append(_refused(reply))
                continue
            n, found = protocol.forgot_of(reply)
            forgotten += n
            problems += found
        return forgotten

    def _round(self, calls: list[_Call]) -> list[Any]:
        """Send ``calls`` in one round trip: one pipeline per Redis node
        (``transaction=False``, :func:`~crawler.frontier.shards.node_pipelines`:
        redis-py never sends a pipelined call twice), each script a bare
        ``EVALSHA``.

        A call whose reply says it did not run
        (:data:`~crawler.frontier.connection.NOT_RUN`: a script Redis forgot,
        a slot that moved) is sent once more, alone, through the client
        (which loads a script Redis lacks, or follows the slot): the rule of
        the scheduler. (Every housekeeping call is safe to send again
        anyway: reads, and scripts that judge again what they remove.)

        :returns: the replies in the order of ``calls``, a
            :class:`~redis.exceptions.ResponseError` in place of a call
            Redis refused.
        :raises redis.exceptions.RedisError: a connection failed.
        """
        replies: list[Any] = [None] * len(calls)
        for pipe, positions in node_pipelines(self.redis, [call.key for call in calls]):
            with pipe:
                for n in positions:
                    calls[n].send(pipe)
                got = pipe.execute(raise_on_error=False)
            for n, reply in zip(positions, got, strict=True):
                if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                    raise reply  # a connection error in the replies
                replies[n] = reply
        for n, reply in enumerate(replies):
            if isinstance(reply, NOT_RUN):
                try:
                    replies[n] = calls[n].send(None)
                except ResponseError as exc:
                    replies[n] = exc
        return replies

    def forget_workers(self) -> tuple[int, list[str]]:
        """Remove stale records among the next ``batch`` of ``{s}:workers``.

        The records are read with ``HSCAN`` (this object keeps the cursor);
        those older than the bound by this worker's clock are sent to
        ``forget_workers.lua``, which judges each one again by the Redis
        server's clock. Safe to send again.

        :returns: records removed, and the problems the script reported.
        """
        stale = self._stale_workers(self._scan_workers_call().send(None))
        if not stale:
            return 0, []
        removed, problems = self._forget_workers_call(stale).send(None)
        return int(removed), [_text(p) for p in problems]

    def _scan_workers_call(self) -> _Call:
        """``HSCAN`` of the registry's next ``batch`` records."""
        key = workers_key(self.spider)
        return _Call(key, lambda c: self._client(c).hscan(
            key, self._workers_cursor, count=self.batch
        ))

    def _stale_workers(self, reply: tuple[int, dict[bytes, bytes]]) -> list[bytes]:
        """The workers of an ``HSCAN`` page of the registry whose heartbeat
        is older than the bound by the corrected clock (:data:`CLOCK`; the
        script judges again by Redis ``TIME``; the cursor moves on)."""
        cursor, records = reply
        self._workers_cursor = int(cursor)
        bound = CLOCK.now() - self.worker_forget_after
        stale = []
        for worker, raw in records.items():
            try:
                beat = float(json.loads(raw).get("last_heartbeat") or 0.0)
            except (ValueError, TypeError, AttributeError):
                continue
            if beat < bound:
                stale.append(worker)
        return stale

    def _forget_workers_call(self, stale: list[bytes]) -> _Call:
        key = workers_key(self.spider)
        return _Call(key, lambda c: self._forget_workers(
            keys=[key], args=[self.worker_forget_after, *stale], client=c
        ))

    def trim_dead(self) -> int:
        """Trim every shard's ``{s}:dead`` to its newest
        :attr:`dead_max_per_shard` entries,
        counting the trimmed ones in the shard's ``{s}:dead:trimmed``
        (:meth:`trim_dead_shard`). Safe to send again.

        :returns: entries trimmed by these calls (0 with no cap).
        :raises redis.exceptions.ResponseError: a shard's script refused
            (the shards before it were trimmed).
        """
        return sum(self.trim_dead_shard(shard) for shard in range(len(self.prefixes)))

    def trim_dead_shard(self, shard: int = 0) -> int:
        """Trim shard ``shard``'s ``{s}:dead`` to its newest
        :attr:`dead_max_per_shard` entries, counting the trimmed ones in
        its ``{s}:dead:trimmed`` (one ``trim_dead.lua`` call). Safe to send
        again.

        :returns: entries trimmed by this call (0 with no cap).
        """
        if self.dead_max <= 0:
            return 0
        return int(self._trim_call(shard).send(None))

    def _trim_call(self, shard: int) -> _Call:
        keys = protocol.shard_keys(self.prefixes[shard])
        header = self._trim_header({"keep": self.dead_max_per_shard})
        return _Call(keys[0], lambda c: self._trim_dead(keys=keys, args=[header], client=c))

    def forget_sites(self) -> tuple[int, list[str]]:
        """Look at the next sites of every shard's ``{s}:due``
        (:attr:`site_batch` each) and delete the state of the idle ones (see
        the module's docstring). Safe to send again.

        :returns: sites forgotten, and the problems the script reported.
        :raises redis.exceptions.ResponseError: a shard's script refused
            (the shards before it were swept).
        """
        forgotten, problems = 0, []
        for shard in range(len(self.prefixes)):
            n, found = self.forget_sites_shard(shard)
            forgotten += n
            problems += found
        return forgotten, problems

    def forget_sites_shard(self, shard: int = 0) -> tuple[int, list[str]]:
        """Look at the next :attr:`site_batch` sites of shard ``shard``'s
        ``{s}:due`` (its cursor in its ``{s}:forget``) and delete the state
        of the idle ones. Safe to send again.

        :returns: sites forgotten, and the problems the script reported.
        """
        cursor = _cursor(self._cursor_call(shard).send(None))
        nxt, fields = self._scan_due_call(shard, cursor).send(None)
        return self.forget([_text(site) for site in fields], int(nxt), shard=shard)

    def _cursor_call(self, shard: int) -> _Call:
        """``GET`` of the shard's ``{s}:forget``, the cursor of its sweep."""
        key = self.key("forget", shard)
        return _Call(key, lambda c: self._client(c).get(key))

    def _scan_due_call(self, shard: int, cursor: int) -> _Call:
        """``HSCAN`` of the shard's next :attr:`site_batch` sites of ``{s}:due``."""
        key = self.key("due", shard)
        return _Call(key, lambda c: self._client(c).hscan(key, cursor, count=self.site_batch))

    def forget(
        self, sites: list[str], cursor: int = 0, *, shard: int = 0
    ) -> tuple[int, list[str]]:
        """Delete the state of those of ``sites`` that are idle, and store
        ``cursor`` in ``{s}:forget`` (one ``forget_sites.lua`` call).

        :param sites: site names (``host`` or ``host:port``), all of shard
            ``shard``.
        :param cursor: the ``HSCAN`` cursor of the next run (0: start over).
        :param shard: the shard whose keys are swept.
        :returns: sites forgotten, and the problems the script reported.
        """
        return protocol.forgot_of(self._forget_call(sites, cursor, shard).send(None))

    def _forget_call(self, sites: list[str], cursor: int, shard: int) -> _Call:
        keys = protocol.shard_keys(self.prefixes[shard])
        header = self._forget_header(
            {"cursor": str(cursor), "after_ms": self.site_forget_after_ms},
            {"sites": len(sites)} if sites else None,
        )
        return _Call(keys[0], lambda c: self._forget_sites(
            keys=keys, args=[header, *sites], client=c
        ))

    def _client(self, client: Any) -> Any:
        """``client`` (a pipeline), or this housekeeper's client when None."""
        return self.redis if client is None else client


class FrontierHousekeeping:
    """Run :class:`Housekeeper` every ``FRONTIER_HOUSEKEEPING_INTERVAL``
    seconds in each worker, in a thread (the crawl never waits on it).

    Settings: ``FRONTIER_HOUSEKEEPING_INTERVAL`` (seconds, default 30.0; 0
    switches it off: NotConfigured), ``FRONTIER_HOUSEKEEPING_BATCH`` (sites
    per run, over all shards, default 200), ``FRONTIER_SHARDS``,
    ``FRONTIER_WORKER_FORGET_AFTER`` (seconds, default 86400),
    ``FRONTIER_DEAD_LETTERS_MAX`` (all shards; default 100,000; 0: no cap),
    ``FRONTIER_SITE_FORGET_AFTER`` (seconds, default 3600).

    Stats: ``frontier/housekeeping/workers_forgotten``,
    ``frontier/housekeeping/sites_forgotten`` (this worker's runs); dead
    letters trimmed count cluster-wide in each shard's ``{s}:dead:trimmed``
    (the status and the metrics sum them).
    """

    def __init__(self, crawler: Crawler, housekeeper: Housekeeper, interval: float) -> None:
        self.crawler = crawler
        self.housekeeper = housekeeper
        self.interval = interval
        self._task: AsyncioLoopingCall | LoopingCall | None = None
        self._inflight: Deferred[Swept] | None = None
        self._problems: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the extension; no Redis I/O here.

        :raises NotConfigured: ``FRONTIER_HOUSEKEEPING_INTERVAL`` is 0.
        """
        settings = crawler.settings
        config = FrontierConfig.of(crawler)
        interval = config.housekeeping_interval
        if interval <= 0:
            logger.info("Frontier housekeeping off: FRONTIER_HOUSEKEEPING_INTERVAL is 0")
            raise NotConfigured  # (switched off on purpose: no WARNING)
        housekeeper = Housekeeper(
            get_redis(settings),
            spider_name_of(crawler),  # the instance's, at open (spider_opened)
            shards=shard_count(settings),
            worker_forget_after=config.worker_forget_after,
            dead_max=config.dead_letters_max,
            site_forget_after=config.site_forget_after,
            batch=config.housekeeping_batch,
        )
        ext = cls(crawler, housekeeper, interval)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self) -> None:
        """Start the periodic runs (the first one interval seconds from now),
        on the keys of the spider instance's name."""
        old = self.housekeeper
        name = spider_name_of(self.crawler)
        if name != old.spider:
            self.housekeeper = Housekeeper(
                old.redis, name, shards=len(old.prefixes),
                worker_forget_after=old.worker_forget_after, dead_max=old.dead_max,
                site_forget_after=old.site_forget_after_ms / 1000, batch=old.batch,
            )
        self._task = create_looping_call(self.tick)
        self._task.start(self.interval, now=False)

    def spider_closed(self) -> None:
        """Stop the runs (one in flight finishes on its own)."""
        if self._task is not None and self._task.running:
            self._task.stop()

    def tick(self) -> None:
        """Start one run in a thread, unless the last one is still running."""
        if self._inflight is not None:
            return
        d: Deferred[Swept] = deferToThread(self.housekeeper.run)
        d.addCallbacks(self._done, self._failed)
        self._inflight = d

    def _done(self, swept: Swept) -> None:
        self._inflight = None
        stats = self.crawler.stats
        assert stats is not None
        if swept.workers:
            stats.inc_value("frontier/housekeeping/workers_forgotten", swept.workers)
        if swept.sites:
            stats.inc_value("frontier/housekeeping/sites_forgotten", swept.sites)
        for text in swept.problems:
            if text not in self._problems:
                self._problems.add(text)
                logger.warning("Bad value in Redis: %s%s", text, BAD_VALUE_HINT)
        if swept.workers or swept.dead_trimmed or swept.sites:
            logger.debug(
                "Housekeeping: %d worker records, %d dead letters, %d sites forgotten",
                swept.workers, swept.dead_trimmed, swept.sites,
            )

    def _failed(self, failure: Any) -> None:
        self._inflight = None
        report_redis_failure(
            self.crawler, failure, logger,
            retrying="Frontier housekeeping failed (will retry): %s",
            failed="Frontier housekeeping failed: %s",
            server=self.housekeeper.redis,
        )


def _refused(exc: ResponseError) -> str:
    """A shard's refused call as a problem line; a configuration error
    (an ACL, a command unknown) or a server that is no master (``READONLY``
    and the like: :func:`~crawler.frontier.connection.is_no_master`, an
    outage) is raised again: it is no bad value."""
    if config_error(exc) is not None or is_no_master(exc):
        raise exc
    return f"refused: {exc}"


def _raised(reply: Any) -> Any:
    """``reply``, or raised when it is an error."""
    if isinstance(reply, Exception):
        raise reply
    return reply


def _cursor(raw: bytes | None) -> int:
    """The cursor stored in a shard's ``{s}:forget`` (0: none, or not a number)."""
    return int(raw) if raw is not None and raw.isdigit() else 0


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
