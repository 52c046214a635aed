"""The frontier's Redis data model and its atomic operations.

One crawl (one spider) keeps these keys, all with the hash tag ``{<spider>}``
so that each Lua script touches a single Redis Cluster slot:

==================================  ======  ==========================================
key                                 type    holds
==================================  ======  ==========================================
``{s}:q:<site>:<priority>``         list    queued requests of one site and priority,
                                            oldest at the right (FIFO)
``{s}:lv:<site>``                   zset    the site's non-empty priorities, score
                                            ``-priority``
``{s}:wait``                        zset    sites with work and a free slot, scored by
                                            the time (ms) they may be served next
``{s}:due``                         hash    site -> ms before which it is not served
``{s}:active``                      hash    site -> requests leased now
``{s}:count``                       string  requests queued, all sites
``{s}:leases``                      zset    lease id -> deadline (ms)
``{s}:ldata``                       hash    lease id -> ``priority\\tsite\\trequest``
``{s}:retries``                     zset    ``priority\\tsite\\trequest`` -> due (ms)
``{s}:dead``                        list    dead letters, JSON objects
``{s}:delay`` / ``{s}:conc``        hash    per-site delay (ms) / concurrency overrides,
                                            editable while the crawl runs
``{s}:slow``                        hash    per-site adaptive extra delay (ms)
``{s}:rdelay``                      hash    per-site robots.txt Crawl-delay (ms)
``{s}:robots``                      hash    per-site robots.txt, ``fetched\nbody``
``{s}:alive``                       zset    worker id -> ms of its last lease call
                                            or heartbeat
``{s}:lslot``                       hash    lease id -> 1 while its download holds a
                                            slot of its site
``{s}:wactive``                     hash    ``worker\tsite`` -> leases the worker holds
``{s}:dupefilter``                  set     request fingerprints
==================================  ======  ==========================================

A *site* is a host, with its port when that is not the scheme's default
(``example.com``, ``127.0.0.2:8080``). Times are milliseconds of the Redis
server's clock (``TIME``, read inside the scripts), so workers with skewed
clocks agree. The scripts live in ``crawler/frontier/lua/``, one file each,
with a comment on every key and argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from redis import StrictRedis

if TYPE_CHECKING:
    from collections.abc import Sequence

    from redis import Redis
    from redis.commands.core import Script

    from crawler.frontier.bloom import BloomFilter

__all__ = ["Frontier", "Lease", "NotDue", "Push", "frontier_prefix"]

#: Highest and lowest priorities kept apart; larger ones are clamped.
PRIORITY_LIMIT = 1_000_000


def frontier_prefix(spider_name: str) -> str:
    """The key prefix of a spider's frontier: ``{<name>}:``."""
    return f"{{{spider_name}}}:"


class _Lua:
    """One Lua script of ``lua/``, callable directly or on a pipeline.

    Called directly, it is redis-py's :class:`~redis.commands.core.Script`
    (``EVALSHA``, loading the script when Redis lacks it). Queued on a
    pipeline of a standalone Redis, it is a bare ``EVALSHA``: redis-py's
    Script objects make every pipeline ``execute`` ask ``SCRIPT EXISTS``
    first, one more round trip per transaction. The scripts are loaded with
    :meth:`Frontier.load_scripts`; a pipeline that meets ``NOSCRIPT`` (Redis
    restarted) loads them and is sent again.
    """

    def __init__(self, redis: Redis, name: str) -> None:
        self.source = resources.files("crawler.frontier").joinpath("lua", name).read_text()
        self.script: Script = redis.register_script(self.source)
        self.bare_pipelines = isinstance(redis, StrictRedis)

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        if client is not None and self.bare_pipelines:
            return client.evalsha(self.script.sha, len(keys), *keys, *args)
        return self.script(keys=keys, args=args, client=client)


class Push(NamedTuple):
    """One request for :meth:`Frontier.push_many`.

    :ivar data: the encoded request.
    :ivar site: its site (``host`` or ``host:port``).
    :ivar priority: higher is served first; clamped to +-1,000,000.
    :ivar fingerprint: recorded in the dupefilter; None skips it.
    :ivar dont_filter: queue even when the fingerprint was seen.
    """

    data: bytes
    site: str
    priority: int
    fingerprint: bytes | None
    dont_filter: bool


@dataclass(frozen=True)
class Lease:
    """A request handed to this worker until it is acknowledged.

    :ivar data: the encoded request.
    :ivar site: the site it belongs to.
    :ivar lease_id: the id to acknowledge.
    :ivar expired: leases of others this call returned to the queue.
    :ivar retried: due retries this call moved into the queue.
    """

    data: bytes
    site: str
    lease_id: str
    expired: int
    retried: int


@dataclass(frozen=True)
class NotDue:
    """Nothing can be leased now.

    :ivar wait: seconds until a site or a retry becomes due, or None when
        nothing is queued or waiting to be retried.
    """

    wait: float | None
    expired: int
    retried: int


class Frontier:
    """Atomic frontier operations for one spider, each one Redis round trip.

    :param redis: a redis-py client returning bytes.
    :param spider_name: the spider; keys are ``{<name>}:...``.
    :param default_delay: seconds between two requests to one site, across
        all workers, unless ``{s}:delay`` overrides it for the site.
    :param default_concurrency: requests to one site at once, across all
        workers, unless ``{s}:conc`` overrides it.
    :param lease_timeout: seconds a lease lasts without a heartbeat.
    :param candidates: due sites compared for priority per lease.
    :param housekeeping: expired leases and due retries handled per lease.
    :param delay_margin: a site's delay is stretched by this fraction, so that
        the jitter between a lease and its request reaching the site never
        brings two requests closer than the delay.
    :param robots_gate: serve a site one request at a time until its
        robots.txt is in ``{s}:robots`` (set when robots.txt is obeyed, so
        that its Crawl-delay holds from the first request on).
    :param bloom: record fingerprints in this Bloom filter
        (:class:`~crawler.frontier.bloom.BloomFilter`) instead of the set
        ``{s}:dupefilter``.
    """

    def __init__(
        self,
        redis: Redis,
        spider_name: str,
        *,
        default_delay: float = 0.0,
        default_concurrency: int = 8,
        lease_timeout: float = 60.0,
        candidates: int = 32,
        housekeeping: int = 50,
        bloom: BloomFilter | None = None,
        delay_margin: float = 0.1,
        robots_gate: bool = False,
    ) -> None:
        self.redis = redis
        self.bloom = bloom
        self.prefix = frontier_prefix(spider_name)
        self.default_delay_ms = round(default_delay * 1000)
        self.default_concurrency = default_concurrency
        self.lease_timeout_ms = int(lease_timeout * 1000)
        self.candidates = candidates
        self.housekeeping = housekeeping
        self.delay_margin = delay_margin
        self.robots_gate = robots_gate
        #: ms to wait before leasing again when every site with queued work
        #: is at its concurrency (an ack elsewhere frees a slot).
        self.recheck_ms = 50
        self._push = _Lua(redis, "push.lua")
        self._lease = _Lua(redis, "lease.lua")
        self._ack = _Lua(redis, "ack.lua")
        self._extend = _Lua(redis, "extend.lua")
        self._retry = _Lua(redis, "retry.lua")
        self._release_slots = _Lua(redis, "release.lua")
        self._alive = _Lua(redis, "alive.lua")
        self._scripts = [
            self._push, self._lease, self._ack, self._extend, self._retry, self._release_slots,
            self._alive,
        ]

    def load_scripts(self) -> None:
        """Load the Lua scripts into Redis (``SCRIPT LOAD``), e.g. after a restart.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        for lua in self._scripts:
            self.redis.script_load(lua.source)

    def key(self, name: str) -> str:
        """The full key of ``name``, e.g. ``key("wait") == "{s}:wait"``."""
        return self.prefix + name

    def push(
        self,
        data: bytes,
        *,
        site: str,
        priority: int,
        fingerprint: bytes | None,
        dont_filter: bool,
        client: Any = None,
    ) -> bool:
        """Queue an encoded request unless its fingerprint was seen.

        :param fingerprint: recorded in the dupefilter (the set, or the
            Bloom filter's bits when the frontier has one); None skips it.
        :param dont_filter: queue even when the fingerprint was seen.
        :param client: a redis-py pipeline to queue the call on (its result,
            ``[1]`` or ``[0]``, then comes from ``execute()``); default: run
            it now.
        :returns: False when filtered as a duplicate (always False when
            queued on a pipeline).
        """
        queued = self.push_many([Push(data, site, priority, fingerprint, dont_filter)], client)
        return bool(queued and queued[0])

    def push_many(self, pushes: Sequence[Push], client: Any = None) -> list[bool]:
        """Queue encoded requests, each unless its fingerprint was seen: one
        ``push.lua`` call, one round trip however many there are.

        Requests are handled in order, so of two with one fingerprint the
        second is filtered. In Bloom mode every bitmap is checked before
        anything is written.

        :param client: a redis-py pipeline to queue the call on (the list of
            1/0 then comes from ``execute()``, and this returns ``[]``).
        :returns: per request, True when queued, False when filtered.
        :raises redis.exceptions.ResponseError: a Bloom bitmap exists with
            another size than this worker's settings give.
        """
        if not pushes:
            return []
        k = self.key
        bloom = self.bloom
        args: list[Any] = [
            self.prefix,
            self.default_concurrency,
            "set" if bloom is None else "bloom",
            "" if bloom is None else bloom.size,
        ]
        for p in pushes:
            spec = b""
            if bloom is not None and p.fingerprint:
                key, offsets = bloom.locate(p.fingerprint)
                spec = key.encode() + b" " + offsets
            args += (
                p.fingerprint or b"", b"1" if p.dont_filter else b"0", p.site,
                _clamp(p.priority), p.data, spec,
            )
        queued = self._push(
            keys=[k("dupefilter"), k("wait"), k("active"), k("due"), k("conc"), k("count")],
            args=args,
            client=client,
        )
        if client is not None:
            return []
        return [bool(q) for q in queued]

    def push_retry(
        self, data: bytes, *, site: str, priority: int, delay: float, client: Any = None
    ) -> None:
        """Hold an encoded request in ``{s}:retries`` for ``delay`` seconds."""
        entry = f"{_clamp(priority)}\t{site}\t".encode() + data
        self._retry(
            keys=[self.key("retries")], args=[entry, int(delay * 1000)], client=client
        )

    def lease(self, lease_id: str) -> Lease | NotDue:
        """Lease the best due request (see ``lua/lease.lua``).

        :param lease_id: unique id for the lease, ``<worker id>:<n>``; a
            worker takes at most its fair share of a site's concurrency (the
            concurrency divided among workers that leased within a lease's
            length, rounded up).
        """
        result = self.lease_many([lease_id])
        return result[0] if isinstance(result, list) else result

    @overload
    def lease_many(self, lease_ids: Sequence[str]) -> list[Lease] | NotDue: ...

    @overload
    def lease_many(self, lease_ids: Sequence[str], client: Any) -> list[Lease] | NotDue | None: ...

    def lease_many(
        self, lease_ids: Sequence[str], client: Any = None
    ) -> list[Lease] | NotDue | None:
        """Lease up to ``len(lease_ids)`` due requests in one call.

        Each request is chosen as :meth:`lease` chooses one, with the
        previous ones of the call already counted against their sites'
        delay, concurrency and this worker's share; the first leases use the
        first ids. All ids must belong to one worker.

        :param client: a redis-py pipeline to queue the call on; this then
            returns None, and :meth:`leases_of` reads the reply.
        :returns: the leases (at least one; housekeeping counts on the
            first), or :class:`NotDue` when nothing can be leased now.
        :raises ValueError: ``lease_ids`` is empty.
        """
        if not lease_ids:
            raise ValueError("lease_many needs at least one lease id")
        k = self.key
        reply = self._lease(
            keys=[
                k("wait"), k("leases"), k("ldata"), k("active"), k("due"),
                k("retries"), k("delay"), k("conc"), k("count"), k("slow"),
                k("alive"), k("wactive"), k("rdelay"), k("lslot"), k("robots"),
            ],
            args=[
                self.prefix,
                "",
                self.lease_timeout_ms,
                self.default_delay_ms,
                self.default_concurrency,
                self.candidates,
                self.housekeeping,
                lease_ids[0].rsplit(":", 1)[0],
                self.recheck_ms,
                self.delay_margin,
                "1" if self.robots_gate else "0",
                *lease_ids,
            ],
            client=client,
        )
        return None if client is not None else self.leases_of(reply, lease_ids)

    @staticmethod
    def leases_of(reply: list[Any], lease_ids: Sequence[str]) -> list[Lease] | NotDue:
        """Read ``lease.lua``'s reply to a call with ``lease_ids``."""
        n, wait, expired, retried = (int(v) for v in reply[:4])
        if n == 0:
            return NotDue(None if wait < 0 else wait / 1000, expired, retried)
        return [
            Lease(
                reply[4 + 2 * i], reply[5 + 2 * i].decode(), lease_ids[i],
                expired if i == 0 else 0, retried if i == 0 else 0,
            )
            for i in range(n)
        ]

    def ack(self, lease_ids: list[str], client: Any = None) -> int:
        """End leases; returns how many were still held."""
        if not lease_ids:
            return 0
        k = self.key
        ended = self._ack(
            keys=[
                k("wait"), k("leases"), k("ldata"), k("active"), k("due"), k("conc"),
                k("wactive"), k("lslot"),
            ],
            args=[self.prefix, self.default_concurrency, *lease_ids],
            client=client,
        )
        return 0 if client is not None else int(ended)

    def release_slots(self, lease_ids: list[str], client: Any = None) -> int:
        """Free the download slots of leases whose download has ended.

        The leases stay until :meth:`ack`; a site's concurrency counts
        downloads in flight, not responses being processed. Returns how many
        slots were freed (0 when queued on a pipeline).
        """
        if not lease_ids:
            return 0
        k = self.key
        freed = self._release_slots(
            keys=[
                k("wait"), k("ldata"), k("active"), k("due"), k("conc"), k("wactive"),
                k("lslot"), k("robots"),
            ],
            args=[
                self.prefix, self.default_concurrency, "1" if self.robots_gate else "0",
                *lease_ids,
            ],
            client=client,
        )
        return 0 if client is not None else int(freed)

    def alive(self, worker: str) -> None:
        """Count ``worker`` as live in fair shares now (at open and on each
        heartbeat; lease calls do it too). A worker silent for a lease's
        length stops counting."""
        self._alive(keys=[self.key("alive")], args=[worker])

    def leave(self, worker: str) -> None:
        """Stop counting ``worker`` as live (it closes): the others' fair
        shares grow at once, not a lease's length later."""
        self.redis.zrem(self.key("alive"), worker)

    def extend(self, lease_ids: list[str]) -> int:
        """Push the deadlines of held leases ``lease_timeout`` past now.

        Leases that already expired are not revived. Returns how many were
        extended.
        """
        if not lease_ids:
            return 0
        n = self._extend(keys=[self.key("leases")], args=[self.lease_timeout_ms, *lease_ids])
        return int(n)

    def release(self, lease_ids: list[str], client: Any = None) -> None:
        """Give leases back: they expire now and the next lease requeues them."""
        if lease_ids:
            self._extend(keys=[self.key("leases")], args=[0, *lease_ids], client=client)

    def dead_letter(self, record: dict[str, Any], client: Any = None) -> None:
        """Append a JSON dead letter to ``{s}:dead``."""
        (client or self.redis).rpush(self.key("dead"), json.dumps(record, default=str))

    def pending(self) -> int:
        """Requests queued, waiting to be retried, or leased (one round trip)."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self.key("count"))
            pipe.zcard(self.key("retries"))
            pipe.zcard(self.key("leases"))
            queued, retries, leases = pipe.execute()
        return int(queued or 0) + int(retries) + int(leases)

    def audit(self) -> dict[str, Any]:
        """Check the frontier's counters against what it holds.

        Meant for the end of a crawl (tests, the soak, an operator's check):
        with no worker running, a consistent frontier has no lease, no
        download slot taken, and a pending count equal to the requests in
        its queues. Reads with ``SCAN`` for the per-site queues: not for a
        hot path.

        :returns: the problems found, by name (empty when consistent):
            ``leases`` (lease ids still held), ``lslot`` (leases holding a
            slot), ``active`` / ``wactive`` (slot counters above zero, by
            site or ``worker\tsite``), ``count`` (``{s}:count``) against
            ``queued`` (entries in ``{s}:q:*`` lists).
        """
        r = self.redis
        problems: dict[str, Any] = {}
        leases = r.zrange(self.key("leases"), 0, -1)
        if leases:
            problems["leases"] = [x.decode() for x in leases]
        for name in ("lslot", "active", "wactive"):
            held = {
                k.decode(): v.decode()
                for k, v in r.hgetall(self.key(name)).items()
                if v not in (b"0",)
            }
            if held:
                problems[name] = held
        pattern = self.prefix.replace("{", "\\{").replace("}", "\\}") + "q:*"
        queued = sum(int(r.llen(k)) for k in r.scan_iter(match=pattern, count=1000))
        count = int(r.get(self.key("count")) or 0)
        if count != queued:
            problems["count"] = count
            problems["queued"] = queued
        return problems

    def clear(self) -> None:
        """Delete every key of the frontier except the dupefilter."""
        keys = list(self.redis.scan_iter(match=self.prefix.replace("{", "\\{").replace(
            "}", "\\}") + "*", count=1000))
        keep = self.key("dupefilter").encode()
        doomed = [key for key in keys if key != keep]
        for i in range(0, len(doomed), 500):
            self.redis.delete(*doomed[i : i + 500])


def _clamp(priority: int) -> int:
    return max(-PRIORITY_LIMIT, min(PRIORITY_LIMIT, int(priority)))
