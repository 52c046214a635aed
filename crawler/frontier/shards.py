"""A crawl's frontier split into shards (``FRONTIER_SHARDS``).

Each shard is a :class:`~crawler.frontier.store.Frontier` with a key prefix
of its own, ``{<spider>:<i>}:`` (``{<spider>}:`` when there is one shard:
the keys of an unsharded crawl), so that on a Redis Cluster the shards
spread over the masters while every script call still touches one hash
slot. A site belongs to shard ``BLAKE2b-64(site) % N``
(:func:`crawler.keys.shard_of`); its queues, leases, retries, dead letters,
fingerprints, robots.txt and per-site settings live there.

On one Redis server the shards cost nothing per round trip: the scheduler
sends the commits of every shard it has writes for and one lease call in
one pipeline, as with one shard. On a cluster it sends one pipeline per
master that holds one of those shards (:meth:`FrontierShards.groups`),
never redis-py's cluster pipeline, which sends a command again when its
reply is lost.

The shard count of a crawl is recorded in ``{<spider>}:shards`` by its
first worker (:meth:`FrontierShards.check_count`): a worker started with
another ``FRONTIER_SHARDS`` would read and write other keys, so it stops
with a configuration error instead.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from redis import StrictRedis
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from crawler.config import FrontierConfig
from crawler.frontier.bloom import shard_bloom
from crawler.frontier.eviction import vanished_keys
from crawler.frontier.replicas import ReplicaWait
from crawler.frontier.slots import SitePolicy
from crawler.frontier.store import Frontier, Lease, NotDue
from crawler.keys import created_key, shard_count, shard_of, shard_prefixes, shards_key

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from redis import Redis
    from scrapy.crawler import Crawler

    from crawler.frontier.bloom import BloomFilter

__all__ = ["FrontierShards", "ShardCountError", "shard_bloom"]


class ShardCountError(ValueError):
    """A worker's ``FRONTIER_SHARDS`` differs from the crawl's recorded count."""


def node_pipelines(redis: Any, keys: Sequence[str]) -> list[tuple[Any, list[int]]]:
    """Non-transactional pipelines that reach the Redis nodes holding
    ``keys``, each with the positions in ``keys`` of the keys it reaches
    (in order): one pipeline of ``redis`` on one Redis server; on a Redis
    Cluster one per master that holds any of them, a plain pipeline of that
    node's own client, which never sends a command twice (redis-py's cluster
    pipeline sends a command again on its own when its reply was lost,
    which would run a lease or commit twice). A slot that moved answers
    ``MOVED`` in its reply (the call did not run).

    :param redis: a redis-py client, of one server or a cluster.
    :param keys: one key per call, the one that routes it.
    """
    if isinstance(redis, StrictRedis):
        return [(redis.pipeline(transaction=False), list(range(len(keys))))]
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for n, key in enumerate(keys):
        node = redis.get_node_from_key(key)
        group = by_node.get(node.name)
        if group is None:
            group = by_node[node.name] = (
                redis.get_redis_connection(node).pipeline(transaction=False), []
            )
        group[1].append(n)
    return list(by_node.values())


class FrontierShards:
    """The frontier shards of one crawl, in shard order.

    :param frontiers: one :class:`Frontier` per shard (shard ``i`` has the
        prefix ``crawler.keys.shard_prefix(spider, i, len(frontiers))``).
    :param spider: the spider's name.
    """

    def __init__(self, frontiers: Sequence[Frontier], spider: str) -> None:
        if not frontiers:
            raise ValueError("a frontier has at least one shard")
        self.frontiers = list(frontiers)
        self.spider = spider
        self.redis = self.frontiers[0].redis

    @classmethod
    def build(
        cls,
        redis: Redis,
        spider: str,
        shards: int = 1,
        *,
        bloom: BloomFilter | None = None,
        **options: Any,
    ) -> FrontierShards:
        """``shards`` frontiers of ``spider`` with the same ``options``
        (:class:`Frontier`'s keywords); each its own share of ``bloom``
        (:func:`shard_bloom`)."""
        prefixes = shard_prefixes(spider, shards)
        return cls(
            [
                Frontier(
                    redis, spider, prefix=prefix,
                    bloom=None if bloom is None else shard_bloom(bloom, prefix, len(prefixes)),
                    join_times=len(prefixes) > 1,
                    **options,
                )
                for prefix in prefixes
            ],
            spider,
        )

    @classmethod
    def from_crawler_settings(
        cls, redis: Redis, crawler: Crawler, spider: str, *, bloom: BloomFilter | None = None
    ) -> FrontierShards:
        """The shards of ``spider`` (``FRONTIER_SHARDS``) with the
        options its final settings give (:class:`~crawler.frontier.slots.SitePolicy`,
        :class:`~crawler.config.FrontierConfig`): the scheduler's frontier, and
        the one the middlewares tell a site's inputs through.

        :raises ValueError: a setting is out of range (as
            :meth:`SitePolicy.from_settings`).
        """
        settings = crawler.settings
        config = FrontierConfig.of(crawler)
        policy = SitePolicy.from_settings(settings)
        return cls.build(
            redis,
            spider,
            shard_count(settings),
            default_delay=policy.delay,
            default_concurrency=policy.concurrency,
            lease_timeout=config.lease_timeout,
            max_deliveries=config.max_deliveries,
            delay_margin=config.delay_margin,
            robots_gate=policy.robots_gate,
            jitter=policy.jitter,
            site_jitter=policy.slot_jitter,
            bloom=bloom,
            revisit_after=max(0.0, config.revisit_after),
            replica_wait=ReplicaWait.from_config(config),
        )

    def __len__(self) -> int:
        return len(self.frontiers)

    def __getitem__(self, index: int) -> Frontier:
        return self.frontiers[index]

    def __iter__(self) -> Iterator[Frontier]:
        return iter(self.frontiers)

    def index_of(self, site: str) -> int:
        """The shard of ``site``."""
        return shard_of(site, len(self.frontiers))

    def for_site(self, site: str) -> Frontier:
        """The frontier shard that holds ``site``."""
        return self.frontiers[shard_of(site, len(self.frontiers))]

    # -- round trips ---------------------------------------------------------------

    def groups(self, indices: Sequence[int]) -> list[tuple[Any, list[int]]]:
        """The pipelines that reach the shards ``indices``, each with the
        shards it reaches (in the order given): one pipeline on one Redis
        server; on a cluster one per master (:func:`node_pipelines`, which
        never sends a command twice)."""
        indices = list(indices)
        groups = node_pipelines(self.redis, [self.frontiers[i].key("wait") for i in indices])
        return [(pipe, [indices[n] for n in positions]) for pipe, positions in groups]

    def _each(self, call: Any) -> list[Any]:
        """Run ``call(frontier, pipe)`` on every shard, one pipeline per node;
        the replies in shard order. For idempotent calls only (reads,
        ``alive``, ``extend``): a node that answers ``NOSCRIPT`` (it restarted
        and keeps no scripts) gets the scripts loaded and its pipeline sent
        once more."""
        replies: dict[int, Any] = {}
        for pipe, indices in self.groups(range(len(self.frontiers))):
            for attempt in (1, 2):
                try:
                    with pipe:
                        for i in indices:
                            call(self.frontiers[i], pipe)
                        for i, reply in zip(indices, pipe.execute(), strict=True):
                            replies[i] = reply
                    break
                except NoScriptError:
                    if attempt == 2:
                        raise
                    self.load_scripts()
        return [replies[i] for i in range(len(self.frontiers))]

    # -- every shard ---------------------------------------------------------------

    def check_count(self) -> None:
        """Record the shard count in ``{<spider>}:shards``, or check it
        against the one recorded (one round trip).

        :raises ShardCountError: the crawl was started with another count,
            or (no count recorded) it has an unsharded frontier and this
            worker would shard it; the message names both values. Also
            when the recorded count is no whole number >= 1 (a key edited
            by hand).
        :raises redis.exceptions.RedisError: Redis failed.
        """
        n = len(self.frontiers)
        key = shards_key(self.spider)
        # The marker and the count in one transaction (one slot): a crawl
        # never has one without the other unless keys vanished.
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(created_key(self.spider), int(time.time() * 1000), nx=True)
        pipe.set(key, n, nx=True, get=True)
        _, old = pipe.execute()
        if old is None and n > 1:
            # Recorded now: a crawl of the time before shards has its frontier
            # under {<spider>}: (same slot as the count).
            plain = f"{{{self.spider}}}:"
            if self.redis.exists(plain + "count", plain + "leases", plain + "retries"):
                self.redis.delete(key, created_key(self.spider))
                old = b"1"
        if old is None:
            return
        text = old.decode(errors="replace") if isinstance(old, bytes) else str(old)
        if not (text.isascii() and text.isdigit() and int(text) >= 1):
            raise ShardCountError(
                f"{key} holds {text[:60]!r}, not a shard count: set it to the crawl's "
                f"FRONTIER_SHARDS (this worker's is {n}), or clear the crawl "
                f"(scrapy frontier clear {self.spider} --yes)"
            )
        if int(text) != n:
            raise ShardCountError(
                f"FRONTIER_SHARDS is {n} but the crawl of spider {self.spider!r} was started "
                f"with {int(text)} shards ({key} = {int(text)}): start every worker with "
                f"-s FRONTIER_SHARDS={int(text)} (or set it in the project's settings), or "
                f"clear the crawl (scrapy frontier clear {self.spider} --yes) to change it"
            )

    def load_scripts(self) -> None:
        """Load the Lua scripts (``SCRIPT LOAD``; on a cluster, every master)."""
        self.frontiers[0].load_scripts()

    def alive(self, holder: str, *, check: bool = False) -> None:
        """:meth:`Frontier.alive` on every shard (``check``: at open, refuse
        while a live worker speaks another protocol)."""
        self._each(lambda f, pipe: f.alive(holder, client=pipe, check=check))

    def leave(self, holder: str) -> None:
        """:meth:`Frontier.leave` on every shard (one pipeline per node).

        It also deletes the holder's commit markers (``{s}:sent:<holder>``):
        a holder is one process, and a closing process sends no commit
        after this, so no one reads them again (a killed process's expire
        after :attr:`Frontier.MARKER_TTL_MS`). Both writes are idempotent: a
        lost reply, or the call sent twice, changes nothing.

        :raises redis.exceptions.RedisError: Redis failed (on a cluster, the
            first node's error, once every node was tried).
        """
        failed: Exception | None = None
        for pipe, indices in self.groups(range(len(self.frontiers))):
            # One node down does not keep the others' fair shares counting
            # this worker until its last heartbeat is a lease's length old.
            try:
                with pipe:
                    for i in indices:
                        pipe.zrem(self.frontiers[i].key("alive"), holder)
                        pipe.hdel(self.frontiers[i].key("speaks"), holder)
                        pipe.delete(self.frontiers[i].marker_key(holder))
                    pipe.execute()
            except (RedisError, RedisClusterException) as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def pending(self) -> int:
        """Requests queued, waiting to be retried, or leased, in every shard
        (one round trip on one Redis; see :meth:`Frontier.pending`)."""

        def read(f: Frontier, pipe: Any) -> None:
            pipe.get(f.key("count"))
            pipe.zcard(f.key("retries"))
            pipe.zcard(f.key("leases"))

        total = 0
        for pipe, indices in self.groups(range(len(self.frontiers))):
            with pipe:
                for i in indices:
                    read(self.frontiers[i], pipe)
                total += sum(int(v or 0) for v in pipe.execute())
        return total

    def revisits(self) -> int:
        """Revisits scheduled and not yet due, every shard."""
        return sum(int(n) for n in self._each(lambda f, pipe: pipe.zcard(f.key("revisits"))))

    def extend(self, lease_ids: dict[int, list[str]]) -> int:
        """:meth:`Frontier.extend` of the leases of each shard (shard -> ids)."""
        return sum(self.frontiers[i].extend(ids) for i, ids in lease_ids.items() if ids)

    def lease(self, lease_id: str) -> Lease | NotDue:
        """Lease one request from the first shard that has one due (one call
        per shard at most); :class:`NotDue` with the earliest wait else."""
        waits: list[float] = []
        last: NotDue | None = None
        for frontier in self.frontiers:
            result = frontier.lease(lease_id)
            if isinstance(result, Lease):
                return result
            last = result
            if result.wait is not None:
                waits.append(result.wait)
        assert last is not None
        return dataclasses.replace(last, wait=min(waits) if waits else None)

    def audit(self) -> dict[str, Any]:
        """:meth:`Frontier.audit` of every shard; problems of shard ``i`` > 0
        are under ``"<i>:<name>"``; ``missing``: the crawl's keys that
        vanished (:meth:`missing`), so that a flushed or evicted crawl is
        not taken for a clean, empty one."""
        problems: dict[str, Any] = {}
        if missing := self.missing():
            problems["missing"] = missing
        for i, frontier in enumerate(self.frontiers):
            for name, value in frontier.audit().items():
                problems[name if i == 0 else f"{i}:{name}"] = value
        return problems

    #: A shard's keys that only a worker of the crawl writes (the operator's
    #: overrides, which may be set before the crawl starts, are not).
    IN_USE_KEYS = ("count", "qc", "leases", "retries", "dead", "alive", "wait", "dupefilter",
                   "bloom")

    def missing(self) -> list[str]:
        """The crawl's keys that vanished (evicted or flushed), by its
        marker (:func:`crawler.frontier.eviction.vanished_keys`): one
        ``EXISTS`` per shard and two for the crawl-wide keys.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        in_use = any(
            self.redis.exists(*(f.key(name) for name in self.IN_USE_KEYS))
            for f in self.frontiers
        )
        return vanished_keys(
            self.spider,
            created=bool(self.redis.exists(created_key(self.spider))),
            recorded=bool(self.redis.exists(shards_key(self.spider))),
            in_use=in_use,
        )

    def clear(self) -> None:
        """:meth:`Frontier.clear` on every shard (the dupefilters stay), and
        the recorded shard count with them (as one shard's clear always
        did: it is under that shard's prefix), so that the next crawl may
        have another."""
        for frontier in self.frontiers:
            frontier.clear()
        self.redis.delete(shards_key(self.spider))
        self.redis.delete(created_key(self.spider))
