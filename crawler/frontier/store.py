"""The frontier's Redis data model and its atomic operations.

One crawl (one spider) keeps these keys, all with the hash tag ``{<spider>}``
so that each Lua script touches a single Redis Cluster slot. Their names are
fixed: every key a script touches is one of its ``KEYS`` (no key is built
from a site's name inside a script), so a Redis Cluster moving the slot
answers ``ASK``/``TRYAGAIN`` rather than letting a script see half-moved
data. ``{s}:`` below
is the key prefix of one frontier (:attr:`Frontier.prefix`): ``{<spider>}:``
with one shard. With ``FRONTIER_SHARDS`` = N > 1 the crawl has N frontiers
(:class:`crawler.frontier.shards.FrontierShards`), shard ``i`` with the
prefix ``{<spider>:<i>}:`` or ``{<spider>:<i>.<salt>}:`` (a hash tag of its
own, aimed at the ``i``-th slice of the slots:
:func:`crawler.keys.shard_prefix`), and every key of this table exists once
per shard under it; a site's keys and fields (queues, ``due``, leases,
retries, dead letters, fingerprints, robots.txt, overrides) are in the shard
``BLAKE2b-64(site) % N`` (:func:`crawler.keys.shard_of`). The crawl-wide keys
(seeds, ``stats``, ``workers``, ``control``, ``shards``) are listed in
:mod:`crawler.keys`; they stay ``{<spider>}:``.

==================================  ======  ==========================================
key                                 type    holds
==================================  ======  ==========================================
``{s}:qm``                          hash    ``site\tpriority`` -> ``<head> <tail>``: the
                                            numbers of the first and last chunk of
                                            that queue (one queue per site and
                                            priority, first in, first out)
``{s}:qc``                          hash    ``site\tpriority\t<n>`` -> chunk ``n``:
                                            entries ``<length>:<bytes>`` one after
                                            another, up to 2 KiB a chunk
``{s}:lv``                          hash    site -> its non-empty priorities,
                                            highest first, space-separated
``{s}:wait``                        zset    sites with work and a free slot, not due
                                            yet, scored by the time (ms) they may be
                                            served next
``{s}:ready``                       zset    due sites with work and a free slot,
                                            scored ``-priority * 2**32 + turn`` by
                                            their best queued request (the top is
                                            served first; see ``lua/lease.lua``)
``{s}:seq``                         string  the last turn given in ``{s}:ready``
                                            (re-based to the count of its sites
                                            once it reaches 2**31)
``{s}:joined``                      hash    site in ``{s}:ready`` -> when it took its
                                            turn there, µs of the Redis clock
                                            (first in, first out across shards)
``{s}:prio``                        hash    priority -> requests queued at it, all
                                            sites (fields at 0 are deleted)
``{s}:due``                         hash    site -> ms before which it is not served
``{s}:active``                      hash    site -> requests leased now
``{s}:count``                       string  requests queued, all sites
``{s}:leases``                      zset    lease id (``<holder>:<n>``) -> deadline (ms)
``{s}:ldata``                       hash    lease id -> ``priority\\tsite\\t#<deliveries>#request``
``{s}:retries``                     zset    ``priority\\tsite\\trequest`` -> due (ms)
``{s}:retryat``                     hash    site -> when its last retry is due (ms):
                                            the site has work until then
                                            (housekeeping keeps its state)
``{s}:dead``                        list    dead letters, JSON objects
``{s}:revisits``                    zset    fingerprint -> when its revisit is due (ms)
``{s}:rdata``                       hash    fingerprint -> ``priority\tsite\trequest``:
                                            the request to send again, its
                                            validators in its meta
``{s}:revisit``                     hash    per-site revisit interval overrides (ms)
``{s}:delay`` / ``{s}:conc``        hash    per-site delay (ms) / concurrency overrides,
                                            editable while the crawl runs
``{s}:slow``                        hash    per-site adaptive extra delay (ms)
``{s}:rdelay``                      hash    per-site robots.txt Crawl-delay (ms)
``{s}:robots``                      hash    per-site robots.txt, ``fetched\nbody``
``{s}:robots:down``                 hash    per-site robots.txt unreachable: ``<next
                                            attempt ms> <failures> <first failure ms>``
``{s}:alive``                       zset    holder -> ms of its last lease call
                                            or heartbeat
``{s}:speaks``                      hash    holder -> the protocol it speaks
                                            (crawler/frontier/protocol.py)
``{s}:sent:<holder>``               string  sequence number of the holder's last
                                            commit (found out after a lost reply);
                                            deleted when the worker closes, else
                                            expires after a day
``{s}:lslot``                       hash    lease id -> its site, while its download
                                            holds a slot there
``{s}:wactive``                     hash    ``holder\tsite`` -> slots the worker holds
``{s}:dupefilter``                  set     request fingerprints (one shard:
                                            ``SCHEDULER_DUPEFILTER_KEY``)
``{s}:bloom``                       string  the Bloom dupefilter's bitmap instead
                                            (:mod:`crawler.frontier.bloom`)
``{s}:dead:trimmed``                string  dead letters trimmed off ``{s}:dead``
                                            past its cap (the housekeeping)
``{s}:forget``                      string  the housekeeping's ``HSCAN`` cursor over
                                            ``{s}:due``
==================================  ======  ==========================================

A queued request that was handed out before and never acknowledged (its
worker died) is stored as ``#<deliveries>#<request>``. A *holder* is a
worker's id and a nonce of its process (``<worker id>#<nonce>``): a worker
restarted under the same id is another holder, so its lease ids never equal
the dead process's.

A *site* is a host, with its port when that is not the scheme's default
(``example.com``, ``127.0.0.2:8080``). Times are milliseconds of the Redis
server's clock (``TIME``, read inside the scripts), so workers with skewed
clocks agree. The scripts live in ``crawler/frontier/lua/``, one file each,
with a comment on every key and argument.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, cast, overload

from redis import StrictRedis
from redis.client import Pipeline

from crawler.frontier import protocol
from crawler.frontier.lifecycle import lease_state
from crawler.frontier.luasource import script_source
from crawler.frontier.policy import Policy, SiteInputs
from crawler.frontier.protocol import Committed, Lease, NotDue
from crawler.keys import frontier_prefix

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from redis import Redis
    from redis.commands.core import Script

    from crawler.frontier.bloom import BloomFilter
    from crawler.frontier.replicas import ReplicaWait

__all__ = [
    "Commit", "Committed", "Frontier", "Lease", "NotDue", "Push", "Retry", "Revisit",
    "frontier_prefix", "holder_of",
]

#: Appended to each "Bad value in Redis" warning: what to do about it.
BAD_VALUE_HINT = (
    " (a key written by hand, or by another program or version? fix or delete it; "
    "the crawl goes on meanwhile)"
)

logger = logging.getLogger(__name__)

#: Priorities from -PRIORITY_LIMIT to PRIORITY_LIMIT keep their order; the
#: scripts (``PRIO_MAX`` in ``lua/lib.lua``) take no other. A site's place
#: in the ready index is scored ``-priority * 2^32 + turn``, exact in a
#: double only below 2^21 (see ``lua/lib.lua``).
PRIORITY_LIMIT = 1_000_000

#: Holders whose call keys a :class:`Frontier` keeps built (a worker's calls
#: name one holder; past this many, the kept ones are dropped and built again).
HOLDER_KEYS_KEPT = 64


class _Lua:
    """One Lua script of ``lua/``, callable directly or on a pipeline.

    The shard scripts get ``lib.lua`` (their shared helpers, and the
    binding of :func:`crawler.frontier.protocol.shard_keys` by name)
    prepended, so each is still one atomic call: the part of it they use,
    with the keys bound by number
    (:func:`crawler.frontier.luasource.shard_source`). Called directly, it is
    redis-py's :class:`~redis.commands.core.Script` (``EVALSHA``, loading the
    script when Redis lacks it). Queued on a pipeline of a standalone Redis,
    it is a bare ``EVALSHA``: redis-py's Script objects make every pipeline
    ``execute`` ask ``SCRIPT EXISTS`` first, one more round trip per call.
    The scripts are loaded with :meth:`Frontier.load_scripts`; a pipeline
    that meets ``NOSCRIPT`` (Redis restarted) loads them; the scheduler then
    finds out what ran before it sends anything again.
    """

    def __init__(self, redis: Redis, name: str, *, lib: bool = False) -> None:
        self.source = script_source(name, lib=lib)
        self.script: Script = redis.register_script(self.source)
        self.bare_pipelines = isinstance(redis, StrictRedis)

    @property
    def sha(self) -> str:
        """The script's SHA1, as sent in ``EVALSHA``."""
        return str(self.script.sha)

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        if client is not None and (self.bare_pipelines or isinstance(client, Pipeline)):
            return client.evalsha(self.script.sha, len(keys), *keys, *args)
        return self.script(keys=keys, args=args, client=client)


class Push(NamedTuple):
    """One request for :meth:`Frontier.push_many`.

    :ivar data: the encoded request.
    :ivar site: its site (``host`` or ``host:port``).
    :ivar priority: higher is served first; from -1,000,000 to 1,000,000
        (``PRIORITY_LIMIT``; :meth:`Frontier.push_many` refuses others).
    :ivar fingerprint: recorded in the dupefilter; None skips it.
    :ivar dont_filter: queue even when the fingerprint was seen.
    """

    data: bytes
    site: str
    priority: int
    fingerprint: bytes | None
    dont_filter: bool


class Retry(NamedTuple):
    """One request for the retry set: queued again ``delay`` seconds from now."""

    data: bytes
    site: str
    priority: int
    delay: float


class Revisit(NamedTuple):
    """One fetched request to send again later (``FRONTIER_REVISIT_AFTER``).

    :ivar data: the encoded request, validators of its last response in its meta.
    :ivar site: its site.
    :ivar priority: its priority when it is queued again.
    :ivar fingerprint: its fingerprint: one revisit per fingerprint is kept,
        the newest.
    """

    data: bytes
    site: str
    priority: int
    fingerprint: bytes


@dataclass
class Commit:
    """A worker's writes for :meth:`Frontier.commit`, sent in one atomic call.

    :ivar pushes: new requests (queued unless seen).
    :ivar retries: requests for the retry set.
    :ivar dead: dead letters, JSON objects.
    :ivar slots: lease ids whose download ended (their site's slot is freed).
    :ivar acks: lease ids whose request was handled (the lease ends).
    :ivar givebacks: lease ids given back unhandled (their requests return
        to the front of their queues, not counted as failed deliveries).
    :ivar marker: ``(holder, sequence number)``: the call also stores the
        number in ``{s}:sent:<holder>``, so that after a lost reply
        :meth:`Frontier.recover` tells whether it ran.
    :ivar claim: a dead letter (its exact bytes in ``{s}:dead``) to take out
        of the list first; when it is gone, the call writes nothing.
    :ivar revisits: fetched requests to send again the site's revisit
        interval from now (``{s}:revisits``).
    """

    pushes: list[Push] = field(default_factory=list)
    retries: list[Retry] = field(default_factory=list)
    dead: list[bytes] = field(default_factory=list)
    slots: list[str] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    givebacks: list[str] = field(default_factory=list)
    marker: tuple[str, int] | None = None
    claim: bytes | None = None
    revisits: list[Revisit] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.pushes or self.retries or self.dead or self.slots or self.acks
            or self.givebacks or self.claim or self.revisits
        )


class Frontier:
    """Atomic frontier operations for one spider, each one Redis round trip.

    Every write goes through one script, ``commit.lua``
    (:meth:`commit`); leases through ``lease.lua`` (:meth:`lease_many`).
    Neither may be sent twice: the client must not retry them on its own
    (:func:`crawler.frontier.connection.get_redis` turns redis-py's retries
    off), and after a lost reply :meth:`recover` tells what ran.

    :param redis: a redis-py client returning bytes.
    :param spider_name: the spider; keys are ``{<name>}:...``.
    :param default_delay: seconds between two requests to one site, across
        all workers, unless ``{s}:delay`` overrides it for the site.
    :param default_concurrency: requests to one site at once, across all
        workers, unless ``{s}:conc`` overrides it.
    :param lease_timeout: seconds a lease lasts without a heartbeat.
    :param max_deliveries: a request handed out this many times without
        being acknowledged (its worker died each time) goes to the
        dead-letter list when its last lease expires; 0: no limit. Its
        last delivery is made alone (see :meth:`lease_many`'s
        ``held_all``), so the death that dead-letters it is its own.
    :param candidates: due sites moved into the ready index per lease call,
        and sites passed over there at most per call (those where this
        worker holds its fair share, or found stale); bounds a call's work.
    :param housekeeping: expired leases and due retries handled per lease.
    :param delay_margin: a site's delay is stretched by this fraction, so that
        the jitter between a lease and its request reaching the site never
        brings two requests closer than the delay.
    :param jitter: the random variation of each site's delay
        (``DOWNLOAD_DELAY_JITTER``, 0: none): each lease of a site sets its
        next due time its pace times a factor drawn uniformly in
        [1, 1 + jitter) later, so that the delay stays the least gap for
        the whole cluster (Scrapy's own factor is [1 - jitter, 1 + jitter)).
    :param site_jitter: site -> its own jitter (``DOWNLOAD_SLOTS``).
    :param robots_gate: serve a site one request at a time until its
        robots.txt is in ``{s}:robots`` (set when robots.txt is obeyed, so
        that its Crawl-delay holds from the first request on).
    :param bloom: record fingerprints in this Bloom filter
        (:class:`~crawler.frontier.bloom.BloomFilter`) instead of the set
        ``{s}:dupefilter``.
    :param revisit_after: seconds after which a fetched request committed as
        a :class:`Revisit` is due again, unless ``{s}:revisit`` overrides it
        for its site (0: never).
    :param join_times: keep, per site in ``{s}:ready``, when it took its
        turn there (``{s}:joined``), for first in, first out across the
        shards of a crawl (:class:`~crawler.frontier.shards.FrontierShards`
        sets it with several shards; one frontier needs only its turns).
    :param replica_wait: wait for replicas after each round trip of
        writes (``FRONTIER_MIN_REPLICAS``, :mod:`crawler.frontier.replicas`);
        None: do not.
    """

    #: How long a commit marker (``{s}:sent:<holder>``) lasts, ms: a worker
    #: cut off from Redis longer than this may send a commit twice.
    MARKER_TTL_MS = 86_400_000

    def __init__(
        self,
        redis: Redis,
        spider_name: str,
        *,
        default_delay: float = 0.0,
        default_concurrency: int = 8,
        lease_timeout: float = 60.0,
        max_deliveries: int = 5,
        candidates: int = 32,
        housekeeping: int = 50,
        bloom: BloomFilter | None = None,
        delay_margin: float = 0.1,
        robots_gate: bool = False,
        jitter: float = 0.0,
        site_jitter: Mapping[str, float] | None = None,
        revisit_after: float = 0.0,
        prefix: str | None = None,
        join_times: bool = False,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self.redis = redis
        self.replica_wait = replica_wait
        self.join_times = join_times
        self.revisit_after_ms = max(0, round(revisit_after * 1000))
        self.bloom = bloom
        self.prefix = prefix or frontier_prefix(spider_name)
        self.default_delay_ms = round(default_delay * 1000)
        self.default_concurrency = default_concurrency
        self.lease_timeout_ms = int(lease_timeout * 1000)
        self.max_deliveries = max_deliveries
        self.candidates = candidates
        self.housekeeping = housekeeping
        self.delay_margin = delay_margin
        self.robots_gate = robots_gate
        self.jitter = max(0.0, jitter)
        self.site_jitter = {site: max(0.0, j) for site, j in (site_jitter or {}).items()}
        #: Each site's pace and capacity as the scripts compute them
        #: (lib.lua's site_policy), from this frontier's defaults.
        self.policy = Policy(
            delay_ms=self.default_delay_ms, margin=delay_margin,
            concurrency=default_concurrency, gate=robots_gate, jitter=self.jitter,
            site_jitter=self.site_jitter,
        )
        #: ms to wait before leasing again when every site with queued work
        #: is at its concurrency or has this worker's fair share taken, and
        #: none waits for its delay (an ack elsewhere frees a slot; the
        #: scheduler asks at once when one of its own downloads ends).
        self.recheck_ms = 1000
        self._commit = _Lua(redis, "commit.lua", lib=True)
        self._lease = _Lua(redis, "lease.lua", lib=True)
        self._extend = _Lua(redis, "extend.lua", lib=True)
        self._alive = _Lua(redis, "alive.lua", lib=True)
        self._delay = _Lua(redis, "delay.lua", lib=True)
        self._repair = _Lua(redis, "repair.lua", lib=True)
        #: KEYS of a call without a holder (protocol.shard_keys)
        self._keys = protocol.shard_keys(self.prefix)
        #: holder -> KEYS of its calls (:meth:`_holder_keys`)
        self._keys_of: dict[str, list[str]] = {}
        self._lease_header = protocol.header("lease", {
            "max_deliveries": max_deliveries, "lease_ms": self.lease_timeout_ms,
            "delay_ms": self.default_delay_ms, "cap": default_concurrency,
            "candidates": candidates, "housekeeping": housekeeping,
            "recheck_ms": self.recheck_ms, "margin": delay_margin,
            "gate": robots_gate, "join": join_times, "jitter": self.jitter,
            "jitters": self.site_jitter or None,
        })
        self._commit_header = protocol.header("commit", {
            "cap": default_concurrency, "bloom": None if bloom is None else bloom.size,
            "gate": robots_gate, "marker_ms": self.MARKER_TTL_MS,
            "revisit_ms": self.revisit_after_ms, "join": join_times,
        })
        self._extend_header = protocol.header("extend", {"lease_ms": self.lease_timeout_ms})
        self._alive_header = protocol.header("alive")
        self._delay_header = protocol.header("delay", {
            "default_ms": self.default_delay_ms, "margin": delay_margin,
        })
        self._repair_header = protocol.header("repair")
        self._scripts = [self._commit, self._lease, self._extend, self._alive]

    def load_scripts(self) -> None:
        """Load the Lua scripts into Redis (``SCRIPT LOAD``), e.g. after a restart.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        for lua in self._scripts:
            self.redis.script_load(lua.source)

    def key(self, name: str) -> str:
        """The full key of ``name``, e.g. ``key("wait") == "{s}:wait"``."""
        return self.prefix + name

    # -- writes ------------------------------------------------------------------

    def commit(self, batch: Commit, client: Any = None) -> Committed | None:
        """Apply ``batch`` in one ``commit.lua`` call (atomic; see ``lua/commit.lua``).

        :param client: a redis-py pipeline to queue the call on; this then
            returns None and :meth:`Committed.of` reads the reply.
        :raises redis.exceptions.ResponseError: the call was refused before
            it wrote anything (a key of the wrong type, a counter that is
            not a number, a Bloom bitmap of another size); the message names
            the key and the value.
        :raises ValueError: a priority outside +-``PRIORITY_LIMIT``
            (nothing is sent).
        """
        bloom = self.bloom
        holder, seq = batch.marker or ("", None)
        keys = self._keys if not holder else self._holder_keys(holder)
        shared = keys  # (copied before a Bloom bitmap is added)
        pushes: list[tuple[Any, ...]] = []
        bitmaps: dict[str, int] = {}
        for p in batch.pushes:
            spec = b""
            if bloom is not None and p.fingerprint:
                key, offsets = bloom.locate(p.fingerprint)
                index = bitmaps.get(key)
                if index is None:  # a bitmap is one of KEYS, named by its index
                    if keys is shared:
                        keys = list(keys)
                    keys.append(key)
                    index = bitmaps[key] = len(keys)
                spec = str(index).encode() + b" " + offsets
            pushes.append((
                p.fingerprint or b"", b"1" if p.dont_filter else b"0", p.site,
                _in_range(p.priority), p.data, spec,
            ))
        ops, args = protocol.payloads({
            "claim": [(batch.claim,)] if batch.claim else [],
            "push": pushes,
            "retry": [(_in_range(r.priority), r.site, r.data, max(0, int(r.delay * 1000)))
                      for r in batch.retries],
            "dead": [(d,) for d in batch.dead],
            "slot": [(i,) for i in batch.slots],
            "ack": [(i,) for i in batch.acks],
            "give": [(i,) for i in batch.givebacks],
            "revisit": [(v.fingerprint, v.site, _in_range(v.priority), v.data)
                        for v in batch.revisits],
        })
        args.insert(0, self._commit_header({"seq": seq}, ops))
        reply = self._commit(keys=keys, args=args, client=client)
        return None if client is not None else protocol.committed_of(reply)

    def _holder_keys(self, holder: str) -> list[str]:
        """:func:`protocol.shard_keys` of ``holder``'s calls, built once per
        holder (at most :data:`HOLDER_KEYS_KEPT` are kept; never modified)."""
        keys = self._keys_of.get(holder)
        if keys is None:
            if len(self._keys_of) >= HOLDER_KEYS_KEPT:
                self._keys_of.clear()
            keys = self._keys_of[holder] = protocol.shard_keys(self.prefix, holder)
        return keys

    def pipeline(self) -> Any:
        """A non-transactional pipeline to the node that holds this crawl's
        keys, which never sends a command twice.

        On one Redis server, the client's own pipeline. On a Redis Cluster,
        a pipeline of the node that serves the crawl's hash slot: redis-py's
        cluster pipeline sends a command again on its own when its reply was
        lost, which would run a lease or commit twice. A slot that moved
        answers ``MOVED`` (the call did not run); the slot map is then read
        again.
        """
        if isinstance(self.redis, StrictRedis):
            return self.redis.pipeline(transaction=False)
        cluster: Any = self.redis
        node = cluster.get_node_from_key(self.key("wait"))
        return cluster.get_redis_connection(node).pipeline(transaction=False)

    def marker_key(self, holder: str) -> str:
        """``{s}:sent:<holder>``: the sequence number of the holder's last commit."""
        return self.key("sent:" + holder)

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
        :param client: a redis-py pipeline to queue the call on; default:
            run it now.
        :returns: False when filtered as a duplicate (always False when
            queued on a pipeline).
        """
        queued = self.push_many([Push(data, site, priority, fingerprint, dont_filter)], client)
        return bool(queued and queued[0])

    def push_many(self, pushes: Sequence[Push], client: Any = None) -> list[bool]:
        """Queue encoded requests, each unless its fingerprint was seen: one
        ``commit.lua`` call, one round trip however many there are.

        Requests are handled in order, so of two with one fingerprint the
        second is filtered. In Bloom mode every bitmap is checked before
        anything is written.

        :param client: a redis-py pipeline to queue the call on (this then
            returns ``[]``).
        :returns: per request, True when queued, False when filtered.
        :raises redis.exceptions.ResponseError: a Bloom bitmap exists with
            another size than this worker's settings give.
        :raises ValueError: a priority outside +-``PRIORITY_LIMIT``
            (nothing is sent).
        """
        if not pushes:
            return []
        done = self.commit(Commit(pushes=list(pushes)), client)
        return [] if done is None else done.pushed

    def push_retry(
        self, data: bytes, *, site: str, priority: int, delay: float, client: Any = None
    ) -> None:
        """Hold an encoded request in ``{s}:retries`` for ``delay`` seconds."""
        self.commit(Commit(retries=[Retry(data, site, priority, delay)]), client)

    def ack(self, lease_ids: list[str], client: Any = None) -> int:
        """End leases; returns how many were still held (0 on a pipeline)."""
        if not lease_ids:
            return 0
        done = self.commit(Commit(acks=list(lease_ids)), client)
        return 0 if done is None else done.acked

    def release_slots(self, lease_ids: list[str], client: Any = None) -> int:
        """Free the download slots of leases whose download has ended.

        The leases stay until :meth:`ack`; a site's concurrency counts
        downloads in flight, not responses being processed. Returns how many
        slots were freed (0 when queued on a pipeline).
        """
        if not lease_ids:
            return 0
        done = self.commit(Commit(slots=list(lease_ids)), client)
        return 0 if done is None else done.freed

    def release(self, lease_ids: list[str], client: Any = None) -> None:
        """Give leases back unhandled: their requests return to the front of
        their queues at once (not counted as failed deliveries)."""
        if lease_ids:
            self.commit(Commit(givebacks=list(lease_ids)), client)

    def dead_letter(self, record: dict[str, Any], client: Any = None) -> None:
        """Append a JSON dead letter to ``{s}:dead``."""
        self.commit(Commit(dead=[json.dumps(record, default=str).encode()]), client)

    # -- leases ------------------------------------------------------------------

    def lease(self, lease_id: str) -> Lease | NotDue:
        """Lease the best due request (see ``lua/lease.lua``).

        :param lease_id: unique id for the lease, ``<holder>:<n>``; a worker
            takes at most its fair share of a site's concurrency (the
            concurrency divided among workers that leased within a lease's
            length, rounded up).
        """
        result = self.lease_many([lease_id])
        return result[0] if isinstance(result, list) else result

    @overload
    def lease_many(
        self, lease_ids: Sequence[str], *, held: int = 0, least: int | None = None,
        least_joined: int | None = None, held_all: int | None = None,
        drained_for: str | None = None,
    ) -> list[Lease] | NotDue: ...

    @overload
    def lease_many(
        self, lease_ids: Sequence[str], client: Any, *, held: int = 0, least: int | None = None,
        least_joined: int | None = None, held_all: int | None = None,
        drained_for: str | None = None,
    ) -> list[Lease] | NotDue | None: ...

    def lease_many(
        self, lease_ids: Sequence[str], client: Any = None, *, held: int = 0,
        least: int | None = None, least_joined: int | None = None,
        held_all: int | None = None, drained_for: str | None = None,
    ) -> list[Lease] | NotDue | None:
        """Lease up to ``len(lease_ids)`` due requests in one call.

        Each request is chosen as :meth:`lease` chooses one, with the
        previous ones of the call already counted against their sites'
        delay, concurrency and this worker's share; the first leases use the
        first ids. All ids must belong to one holder, and be new: ``lease.lua``
        refuses an id that exists already.

        :param client: a redis-py pipeline to queue the call on; this then
            returns None, and :meth:`leases_of` reads the reply.
        :param held: download slots the holder holds now (e.g. its leases
            not acknowledged yet): the call passes over up to that many due
            sites where the holder has its fair share, besides
            ``candidates``, to reach the next one it may lease from.
        :param least: the best priority due on the crawl's other shards, as
            the caller knows it (None: no other shard has work due, or it is
            not known): after the first lease, the call leases only requests
            of at least that priority, so that a batch does not take this
            shard's lower priorities before another shard's better ones.
        :param least_joined: with ``least``, when the first site at that
            priority on the other shards joined its shard's ready index, µs
            of the Redis clock (:attr:`Lease.head`; None: not known): after
            the first lease, the call leases a site of priority ``least``
            only when it joined this shard's ready index at that time or
            before (first in, first out across shards).
        :param held_all: leases the holder holds now on all the crawl's
            shards (None: not counted, and no request is held back as
            below; the scheduler always counts them). A request on its last chance (handed
            out before, and one death short of ``max_deliveries``) is
            leased only when this is 0, alone: the call then leases nothing
            else, and the holder should lease nothing more until it is done,
            so that a poison request dies alone and a request leased beside
            it is not dead-lettered with it. Otherwise it stays at the front
            of its queue and the reply's ``last_passed`` names its site: the
            holder should drain, then ask again holding nothing, with
            ``drained_for`` that site.
        :param drained_for: the site of a last chance the holder drained
            for (``last_passed`` of an earlier reply), or None. With
            ``held_all`` 0 the call looks at that site first, ahead of
            better priorities, and leases its request alone if it is still
            on its last chance: it was in line when it was passed over, and
            a holder that met better work first would lease that, meet the
            last chance beside it and drain again, for as long as better
            work is queued. Otherwise the site keeps its turn.
        :returns: the leases (at least one; housekeeping counts on the
            first), or :class:`NotDue` when nothing can be leased now.
        :raises ValueError: ``lease_ids`` is empty.
        :raises redis.exceptions.ResponseError: the call was refused before
            it wrote anything (a lease id that exists, a key of the wrong
            type).
        """
        if not lease_ids:
            raise ValueError("lease_many needs at least one lease id")
        reply = self._lease_call(
            holder_of(lease_ids[0]), lease_ids, held, client, least=least,
            least_joined=least_joined, held_all=held_all, drained_for=drained_for,
        )
        return None if client is not None else self.leases_of(reply, lease_ids)

    def peek(self, holder: str, client: Any) -> None:
        """Queue a ``lease.lua`` call that leases nothing on ``client`` (a
        pipeline): it moves the due sites into ``{s}:ready`` and does its
        housekeeping, and its reply (:meth:`leases_of` with no ids: a
        :class:`NotDue`) tells the best priority due, when its first site
        joined the ready index and the wait. Taking
        nothing, it needs no recovery when its reply is lost."""
        self._lease_call(holder, (), 0, client)

    def _lease_call(
        self, holder: str, lease_ids: Sequence[str], held: int, client: Any, *,
        least: int | None = None, least_joined: int | None = None,
        held_all: int | None = None, drained_for: str | None = None,
    ) -> Any:
        header = self._lease_header({
            "holder": holder, "held": max(0, held), "least": least,
            "least_us": None if least is None else least_joined,
            "held_all": None if held_all is None else max(0, held_all),
            "drained_for": drained_for or None, "seed": secrets.randbelow(2**31),
        }, {"ids": len(lease_ids)} if lease_ids else None)
        return self._lease(keys=self._keys, args=[header, *lease_ids], client=client)

    @staticmethod
    def leases_of(reply: list[Any], lease_ids: Sequence[str]) -> list[Lease] | NotDue:
        """Read ``lease.lua``'s reply to a call with ``lease_ids``
        (:func:`crawler.frontier.protocol.leases_of`)."""
        return protocol.leases_of(reply, lease_ids)

    def recover(
        self, holder: str, seq: int | None, lease_ids: Sequence[str]
    ) -> tuple[bool, list[Lease]]:
        """Find out what a call whose reply was lost did (one round trip).

        With :attr:`replica_wait`, the answer is trusted only once the
        replicas have everything the master holds
        (:meth:`~crawler.frontier.replicas.ReplicaWait.queue_after_read`).

        :param holder: the holder that sent it.
        :param seq: the sequence number of its commit, or None when it
            carried none.
        :param lease_ids: the lease ids it asked for (none if no lease).
        :returns: whether the commit ran (True when there was none), and
            the leases it took under ``lease_ids`` that are still held.
        :raises redis.exceptions.RedisError: Redis failed (still unknown);
            :exc:`~crawler.frontier.replicas.NotReplicated`: too few
            replicas to trust the answer (still unknown).
        """
        wait = self.replica_wait
        with (self.redis.pipeline(transaction=False) if wait is None
              else self.pipeline()) as pipe:
            pipe.get(self.marker_key(holder))
            if lease_ids:
                pipe.hmget(self.key("ldata"), list(lease_ids))
            if wait is not None:
                wait.queue_after_read(pipe, self.marker_key(holder), self.MARKER_TTL_MS)
            replies = pipe.execute()
        if wait is not None:
            wait.check(replies[-1])
        committed = seq is None or replies[0] == str(seq).encode()
        leases = []
        for lease_id, entry in zip(lease_ids, replies[1] if lease_ids else [], strict=True):
            parsed = _lease_entry(entry) if entry else None
            if parsed is not None:
                site, deliveries, data = parsed
                leases.append(Lease(data, site, lease_id, deliveries,
                                    state=lease_state(deliveries, self.max_deliveries)))
        return committed, leases

    def alive(self, worker: str, client: Any = None, *, check: bool = False) -> None:
        """Count ``worker`` (a holder) as live in fair shares now (at open
        and on each heartbeat; lease calls do it too), and record that it
        speaks :data:`protocol.VERSION` (``{s}:speaks``). A worker silent
        for a lease's length stops counting.

        :param client: a redis-py pipeline to queue the call on.
        :param check: (at open) refuse while another live worker speaks
            another protocol, or none (a version before it).
        :raises redis.exceptions.ResponseError: ``frontier protocol mixed``
            (with ``check``), which :func:`protocol.refusal` words as a
            configuration error."""
        options: dict[str, Any] = {"holder": worker}
        if check:
            options.update(check=1, live_ms=self.lease_timeout_ms)
        self._alive(keys=self._keys, args=[self._alive_header(options)], client=client)

    def leave(self, worker: str) -> None:
        """Stop counting ``worker`` as live (it closes): the others' fair
        shares grow at once, not a lease's length later."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(self.key("alive"), worker)
        pipe.hdel(self.key("speaks"), worker)
        pipe.execute()

    def set_delay(self, site: str, delay_ms: int | None) -> tuple[bool, int]:
        """Set ``site``'s delay override to ``delay_ms`` (None: remove it)
        and move the time its next request may start by the change of its
        pace, so that the new delay counts from its last request (see
        ``lua/delay.lua``; the pace is computed with this frontier's
        ``default_delay`` and ``delay_margin``). Idempotent.

        :returns: whether an override was removed, and the ms the site's
            next request moved by (negative: sooner). Bad values the script
            met (a Crawl-delay or slow mark that is not whole ms, say: left
            out of the pace, as the lease script does) are logged as
            warnings.
        :raises ValueError: ``delay_ms`` below 0.
        :raises redis.exceptions.ResponseError: a key of the wrong type
            (nothing was written).
        """
        if delay_ms is not None and delay_ms < 0:
            raise ValueError(f"a delay is whole ms >= 0, not {delay_ms}")
        done = protocol.delay_of(self._delay(
            keys=self._keys,
            args=[self._delay_header({"site": site, "delay_ms": delay_ms})],
        ))
        for problem in done.problems:
            logger.warning("Bad value in Redis: %s%s", problem, BAD_VALUE_HINT)
        return done.removed, done.moved

    def repair(self, kind: str, field: str) -> list[str]:
        """Repair one queue value the frontier never writes (``lua/repair.lua``,
        atomic and idempotent): ``kind`` ``qm`` (``field`` ``site\\tprio``:
        the queue's bounds rebuilt from its chunks), ``lv`` (``field`` the
        site: its priorities rebuilt from ``{s}:qm``; for both, the site is
        put back in ``{s}:wait`` when its requests were passed over),
        ``joined`` (``field`` the site: a time that is not whole µs
        deleted) or ``count`` (``field`` "": ``{s}:count`` set to 0 and
        ``{s}:prio`` deleted when no queue is left).

        :returns: what was wrong and done, a line each (empty: nothing).
        :raises redis.exceptions.ResponseError: a key of the wrong type, or
            an unknown ``kind`` (nothing was written).
        """
        return protocol.repaired_of(self._repair(
            keys=self._keys, args=[self._repair_header({"kind": kind, "field": field})],
        ))

    # -- a site's inputs: what the middlewares tell the frontier -----------------

    def robots_fetched(
        self, site: str, record: bytes, crawl_delay_ms: int | None, now_ms: int
    ) -> None:
        """``site``'s robots.txt is known: store ``record`` (``{s}:robots``:
        ``b"<fetched>\\n<body>"``), forget its outage (``{s}:robots:down``),
        set its Crawl-delay (``{s}:rdelay``; None or 0: none), let go of its
        robots.txt lock, and push its next due time to one pace from
        ``now_ms`` (never brought forward): the pace of :attr:`policy`
        with the new Crawl-delay, without jitter. The request that waited
        for robots.txt reaches the site a moment after this; its due time
        ran from its lease, before robots.txt was known.

        Two round trips (a read, then one transaction).

        :raises redis.exceptions.RedisError: Redis failed.
        """
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(self.key("delay"), site)
            pipe.hget(self.key("slow"), site)
            pipe.hget(self.key("due"), site)
            own, slow, due_before = pipe.execute()
        pace = self.policy.of(site, SiteInputs(
            delay=own, rdelay=str(crawl_delay_ms or 0), slow=slow,
        ), now_ms)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key("robots"), site, record)
            pipe.hdel(self.key("robots:down"), site)
            if crawl_delay_ms:
                pipe.hset(self.key("rdelay"), site, crawl_delay_ms)
            else:
                pipe.hdel(self.key("rdelay"), site)
            if pace.delay_ms and pace.next_due_ms > (self.policy.stored_ms(due_before) or 0):
                self._hold_site(pipe, site, pace.next_due_ms)
            pipe.delete(self.key("robots:lock:") + site)
            pipe.execute()

    def robots_down(self, site: str, down: bytes, hold_until_ms: int | None) -> None:
        """``site``'s robots.txt cannot be reached: store ``down``
        (``{s}:robots:down``), let go of its robots.txt lock, and, with
        ``hold_until_ms``, lease none of its requests before then. One
        transaction.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key("robots:down"), site, down)
            if hold_until_ms is not None:
                self._hold_site(pipe, site, hold_until_ms)
            pipe.delete(self.key("robots:lock:") + site)
            pipe.execute()

    def _hold_site(self, pipe: Any, site: str, until_ms: int) -> None:
        """Queue on ``pipe``: ``site`` is not served before ``until_ms``
        (``{s}:due``; its score in ``{s}:wait`` when it waits there)."""
        pipe.hset(self.key("due"), site, until_ms)
        pipe.zadd(self.key("wait"), {site: until_ms}, xx=True)

    def open_slot(self, slot: str, crawl_delay_ms: int | None) -> None:
        """The robots.txt of a host that download slot ``slot`` (not a host)
        serves is known: serve the slot at its full concurrency (the field
        ``"\\t<slot>"`` of ``{s}:robots``), with that host's Crawl-delay
        when it is larger than the slot's (``{s}:rdelay``).

        :raises redis.exceptions.RedisError: Redis failed.
        """
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.key("robots"), "\t" + slot, "1")
            pipe.hget(self.key("rdelay"), slot)
            _, known = pipe.execute()
        if crawl_delay_ms and crawl_delay_ms > (self.policy.stored_ms(known) or 0):
            self.redis.hset(self.key("rdelay"), slot, crawl_delay_ms)

    def slow_of(self, site: str) -> bytes | None:
        """``site``'s adaptive extra delay as stored (``{s}:slow``, ms), or None.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        value: bytes | None = self.redis.hget(self.key("slow"), site)  # type: ignore[assignment]
        return value

    def set_slow(self, site: str, delay_ms: int) -> None:
        """Set ``site``'s adaptive extra delay (``{s}:slow``) to ``delay_ms``
        (0: none); it counts in the site's pace from its next lease.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        if delay_ms > 0:
            self.redis.hset(self.key("slow"), site, delay_ms)
        else:
            self.redis.hdel(self.key("slow"), site)

    def extend(self, lease_ids: list[str]) -> int:
        """Push the deadlines of held leases ``lease_timeout`` past now.

        Leases that already expired are not revived. Returns how many were
        extended. Idempotent: safe to send again.
        """
        if not lease_ids:
            return 0
        n = self._extend(keys=self._keys, args=self._extend_args(lease_ids))
        return int(n)

    def _extend_args(self, lease_ids: Sequence[str]) -> list[Any]:
        return [self._extend_header(None, {"ids": len(lease_ids)}), *lease_ids]

    def beat(self, worker: str, lease_ids: list[str], client: Redis) -> None:
        """:meth:`alive` for ``worker``, then :meth:`extend` of ``lease_ids``,
        sent with ``client`` (a client of its own: the heartbeat thread's)
        as two script calls (a Redis that lost the scripts gets them
        loaded). Both are idempotent.

        :raises redis.exceptions.RedisError: Redis failed."""
        self._alive.script(keys=self._keys, args=[self._alive_header({"holder": worker})],
                           client=client)
        if lease_ids:
            self._extend.script(keys=self._keys, args=self._extend_args(lease_ids), client=client)

    def revisits(self) -> int:
        """Revisits scheduled and not yet due into their queues (``{s}:revisits``)."""
        return int(self.redis.zcard(self.key("revisits")))

    def pending(self) -> int:
        """Requests queued, waiting to be retried, or leased (one round trip).

        Revisits not yet due are not counted: a worker with nothing else to
        do closes on ``MAX_IDLE_TIME_BEFORE_CLOSE`` although they wait."""
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
        its queues. Reads every queue chunk (``HSCAN`` of ``{s}:qc``): not
        for a hot path.

        :returns: the problems found, by name (empty when consistent):
            ``leases`` (lease ids still held), ``lslot`` (leases holding a
            slot), ``active`` / ``wactive`` (slot counters above zero, by
            site or ``worker\tsite``), ``count`` (``{s}:count``) against
            ``queued`` (entries in the chunks of ``{s}:qc``), ``prio`` (``{s}:prio``)
            against ``queued_by_priority``, ``joined`` (sites with a join
            time in ``{s}:joined`` that are not in ``{s}:ready``: left behind).
        """
        r = self.redis
        problems: dict[str, Any] = {}
        leases = r.zrange(self.key("leases"), 0, -1)
        if leases:
            problems["leases"] = [_text(x) for x in cast("list[bytes]", leases)]
        for name in ("lslot", "active", "wactive"):
            held = {
                _text(k): _text(v)
                for k, v in r.hgetall(self.key(name)).items()
                if v != b"0"
            }
            if held:
                problems[name] = held
        by_priority: dict[str, int] = {}
        for name_, chunk in r.hscan_iter(self.key("qc"), count=1000):
            priority = _text(name_).split("\t")[1]
            by_priority[priority] = by_priority.get(priority, 0) + len(chunk_entries(chunk))
        queued = sum(by_priority.values())
        count = int(r.get(self.key("count")) or 0)
        if count != queued:
            problems["count"] = count
            problems["queued"] = queued
        counted = {_text(k): int(v) for k, v in r.hgetall(self.key("prio")).items()}
        if counted != {p: n for p, n in by_priority.items() if n}:
            problems["prio"] = counted
            problems["queued_by_priority"] = by_priority
        if r.type(self.key("joined")) == b"hash":
            ready = {_text(x) for x in cast("list[bytes]", r.zrange(self.key("ready"), 0, -1))}
            stray = sorted(
                site for x in cast("list[bytes]", r.hkeys(self.key("joined")))
                if (site := _text(x)) not in ready
            )
            if stray:
                problems["joined"] = stray
        return problems

    def clear(self) -> None:
        """Delete every key of the frontier except the dupefilter."""
        keys = list(self.redis.scan_iter(match=self.prefix.replace("{", "\\{").replace(
            "}", "\\}") + "*", count=1000))
        keep = self.key("dupefilter").encode()
        doomed = [key for key in keys if key != keep]
        for i in range(0, len(doomed), 500):
            self.redis.delete(*doomed[i : i + 500])


def chunk_entries(chunk: bytes) -> list[bytes]:
    """The entries of a queue chunk (``{s}:qc``): ``<length>:<bytes>`` one
    after another (``lua/lib.lua``).

    :raises ValueError: the chunk is not made of such entries.
    """
    out, i = [], 0
    while i < len(chunk):
        colon = chunk.index(b":", i)
        size = int(chunk[i:colon])
        if colon + 1 + size > len(chunk):
            raise ValueError(f"chunk entry of {size} bytes runs past the chunk's end")
        out.append(chunk[colon + 1 : colon + 1 + size])
        i = colon + 1 + size
    return out


def holder_of(lease_id: str) -> str:
    """The holder of a lease id ``<holder>:<n>``."""
    return lease_id.rsplit(":", 1)[0]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _lease_entry(entry: bytes) -> tuple[str, int, bytes] | None:
    """``priority\\tsite\\t#<deliveries>#request`` -> site, deliveries, request."""
    parts = entry.split(b"\t", 2)
    if len(parts) != 3:
        return None
    rest = parts[2]
    deliveries = 1
    if rest[:1] == b"#":
        count, sep, data = rest[1:].partition(b"#")
        if sep and count.isdigit():
            deliveries, rest = int(count), data
    return parts[1].decode("utf-8", "replace"), deliveries, rest


def _in_range(priority: int) -> int:
    """``priority``, checked.

    :raises ValueError: outside +-``PRIORITY_LIMIT`` (the scheduler refuses
        such requests before they reach a write).
    """
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise ValueError(
            f"priority {priority} is outside the frontier's range, "
            f"-{PRIORITY_LIMIT} to {PRIORITY_LIMIT}"
        )
    return int(priority)
