"""A Redis that may evict the crawl's keys: refused at start, watched while
the crawl runs.

The frontier keeps its queues, leases, counters and dupefilter in Redis and
trusts that Redis keeps every key it wrote. A ``maxmemory-policy`` other
than ``noeviction`` (``allkeys-lru``, a common default of a Redis shared
with a cache) lets Redis delete them when memory runs short: requests,
leases and fingerprints are lost without a word.

``FRONTIER_ALLOW_EVICTION`` (default False)
    Run on a Redis whose ``maxmemory-policy`` is not ``noeviction``,
    accepting that work may be lost: one WARNING at start, one WARNING when
    keys are evicted, and the crawl goes on. Without it (the default) such
    a policy is a configuration error at start (one line naming the policy
    and the fix; the crawl stops, ``scrapy crawl`` exits with status 1), and
    during the crawl a policy changed away from ``noeviction``, or keys
    evicted (``INFO stats``'s ``evicted_keys`` rising since the worker
    started), stops the crawl in the same way: no more leases, one ERROR
    line saying what happened and what to do.

The policy is read with ``CONFIG GET maxmemory-policy``, or from ``INFO
memory`` (``maxmemory_policy``) when ``CONFIG`` is not allowed (managed
Redis services rename or forbid it). On a Redis Cluster every master is
read. The scheduler checks at open (:meth:`EvictionWatch.start`) and after
each heartbeat, in a thread (:meth:`EvictionWatch.watch`), so the reactor
never waits for it; what it finds stops leasing (:attr:`EvictionWatch.evicted`)
and closes the spider with the reason ``config_error``.

Collaborators: the crawl's Redis client and its crawler (stats,
:func:`crawler.config.stop_on_config_error`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from redis.cluster import RedisCluster
from redis.exceptions import ResponseError
from twisted.internet.threads import deferToThread

from crawler.config import stop_on_config_error
from crawler.frontier.backoff import UNREACHABLE
from crawler.keys import created_key, shards_key

if TYPE_CHECKING:
    from redis import Redis
    from scrapy.crawler import Crawler
    from twisted.python.failure import Failure

logger = logging.getLogger(__name__)
#: The scheduler's logger: a failed check logs as the scheduler does.
scheduler_logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = [
    "ALLOW_EVICTION_SETTING",
    "NOEVICTION",
    "EvictionWatch",
    "evicted_keys",
    "eviction_policy",
    "missing_message",
    "policy_refusal",
    "vanished_keys",
]

#: The one ``maxmemory-policy`` under which Redis never deletes a key to
#: free memory (a write is refused instead: an outage the worker waits out).
NOEVICTION = "noeviction"
#: The policy of a Redis that answers neither ``CONFIG GET`` nor ``INFO``
#: (an ACL forbids both): not refused, as nothing says it evicts; warned about.
UNKNOWN = "unknown"
#: The setting by which an operator accepts a Redis that may evict.
ALLOW_EVICTION_SETTING = "FRONTIER_ALLOW_EVICTION"


def _nodes(client: Redis) -> list[Any]:
    """The clients of the servers that hold the crawl's keys: ``client``
    itself, or on a Redis Cluster one client per master."""
    if isinstance(client, RedisCluster):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _policy_of(node: Any) -> str:
    try:
        reply = node.config_get("maxmemory-policy")
    except ResponseError:  # CONFIG renamed or forbidden (managed Redis, an ACL)
        reply = {}
    for name, value in (reply or {}).items():
        if _text(name) == "maxmemory-policy" and value:
            return _text(value)
    try:
        return _text(node.info("memory").get("maxmemory_policy", UNKNOWN))
    except ResponseError:  # INFO forbidden too (an ACL): cannot tell
        return UNKNOWN


def eviction_policy(client: Redis) -> str:
    """The ``maxmemory-policy`` of the crawl's Redis: ``noeviction`` when
    every server has it, else the first other one found (on a Redis
    Cluster, of any master), or ``unknown`` when a server answers neither
    ``CONFIG GET`` nor ``INFO``.

    :raises redis.exceptions.RedisError: Redis failed (down, a timeout, an
        ACL that forbids ``INFO`` too).
    """
    policies = [_policy_of(node) for node in _nodes(client)]
    return next((p for p in policies if p not in (NOEVICTION, UNKNOWN)),
                UNKNOWN if UNKNOWN in policies else NOEVICTION)


def evicted_keys(client: Redis) -> int | None:
    """Keys evicted since the server started (``INFO stats``'s
    ``evicted_keys``; on a Redis Cluster the sum over the masters), or
    None when ``INFO`` is forbidden (an ACL).

    :raises redis.exceptions.RedisError: Redis failed.
    """
    try:
        return sum(int(node.info("stats").get("evicted_keys", 0)) for node in _nodes(client))
    except ResponseError:
        return None


def vanished_keys(spider: str, *, created: bool, recorded: bool, in_use: bool) -> list[str]:
    """The crawl's keys that vanished (evicted, flushed, or Redis restarted
    without persistence), judged by its marker ``{<spider>}:created``.

    A worker writes the marker and the shard count ``{<spider>}:shards``
    in one transaction when it opens, before any other key of the
    frontier, and ``scrapy frontier clear`` deletes them with the rest:
    so a fresh crawl, and a cleared one, never has one without the other,
    nor frontier keys or live workers without the marker.

    :param created: whether ``{<spider>}:created`` exists.
    :param recorded: whether ``{<spider>}:shards`` exists.
    :param in_use: whether any key the workers write to the frontier exists
        (queues, counters, leases, retries, dead letters, dupefilter,
        liveness), or a worker of the crawl is live.
    :returns: the missing keys' names, empty when nothing says keys vanished.
    """
    if created and not recorded:
        return [shards_key(spider)]
    if not created and (recorded or in_use):
        return [created_key(spider)]
    return []


def missing_message(spider: str, missing: list[str]) -> str:
    """The one line that reports ``missing`` (:func:`vanished_keys`)."""
    return (
        f"structures missing: {', '.join(missing)} of the crawl of {spider!r} "
        "(evicted or flushed?): its queues, leases and dupefilter may be incomplete"
    )


def policy_refusal(policy: str, where: str) -> str:
    """The one line that refuses ``policy`` at start, naming the fix."""
    return (
        f"Redis at {where} has maxmemory-policy {policy}: it may evict the crawl's queues, "
        f"leases and dupefilter, losing work silently. Set it to {NOEVICTION} (CONFIG SET "
        f"maxmemory-policy {NOEVICTION}, or the server's or managed service's configuration), "
        f"or set {ALLOW_EVICTION_SETTING}=True to accept losing work"
    )


class EvictionWatch:
    """What the crawl's Redis may have evicted since the worker started.

    :meth:`start` and :meth:`check` make blocking Redis calls:
    :meth:`watch` runs :meth:`check` in a thread.

    :param client: the crawl's Redis client.
    :param where: where Redis is, for messages (password masked).
    :param allowed: ``FRONTIER_ALLOW_EVICTION``: evictions are warned
        about, not stopped for.
    :param crawler: the crawl's crawler, stopped by :meth:`checked` (None:
        :meth:`checked` only records what it was told).
    :ivar evicted: why leasing stopped: Redis evicted keys or may evict
        them (the crawl is closing); None while it has not.
    """

    def __init__(self, client: Redis, where: str, *, allowed: bool,
                 crawler: Crawler | None = None) -> None:
        self.client = client
        self.where = where
        self.allowed = allowed
        self.crawler = crawler
        #: ``evicted_keys`` when first read (None: not read yet).
        self.baseline: int | None = None
        self._warned = 0
        self.evicted: str | None = None
        #: The check running in a thread (:meth:`watch`).
        self._call: Any = None
        self.spider: Any = None

    def start(self) -> str | None:
        """Read the policy and the eviction count at start.

        :returns: the configuration error to stop on (a policy other than
            ``noeviction`` without ``FRONTIER_ALLOW_EVICTION``), or None;
            with it allowed, one WARNING is logged instead.
        :raises redis.exceptions.RedisError: Redis failed.
        """
        policy = eviction_policy(self.client)
        self.baseline = evicted_keys(self.client)
        if policy == NOEVICTION:
            return None
        if policy == UNKNOWN:
            logger.warning(
                "Redis at %s answers neither CONFIG GET nor INFO (its user's ACL): cannot tell "
                "whether it may evict the crawl's keys; make sure its maxmemory-policy is %s",
                self.where, NOEVICTION,
            )
            return None
        if not self.allowed:
            return policy_refusal(policy, self.where)
        logger.warning(
            "Redis at %s has maxmemory-policy %s and %s=True: keys it evicts (queued "
            "requests, leases, fingerprints) are lost work, crawled again or never",
            self.where, policy, ALLOW_EVICTION_SETTING,
        )
        return None

    def check(self) -> str | None:
        """Read the policy and the eviction count again (2 round trips per
        server; blocking: run it in a thread).

        :returns: the ERROR line to stop the crawl on, or None: the policy
            is no longer ``noeviction``, or keys were evicted since
            :meth:`start` (or since the first check, when Redis was down
            at start). With ``FRONTIER_ALLOW_EVICTION`` nothing stops the
            crawl: evictions are logged at WARNING once per rise.
        :raises redis.exceptions.RedisError: Redis failed.
        """
        policy = eviction_policy(self.client)
        evicted = evicted_keys(self.client)
        if evicted is None:
            lost = 0
        else:
            if self.baseline is None or evicted < self.baseline:  # first read, or a restart
                self.baseline = evicted
            lost = evicted - self.baseline
        if self.allowed:
            if lost > self._warned:
                self._warned = lost
                logger.warning(
                    "Redis at %s evicted %d keys since this worker started (maxmemory-policy "
                    "%s, %s=True): work may be lost", self.where, lost, policy,
                    ALLOW_EVICTION_SETTING,
                )
            return None
        fix = (
            f"set maxmemory-policy {NOEVICTION} (CONFIG SET maxmemory-policy {NOEVICTION}), "
            "then check the crawl with `scrapy frontier status` and seed again what was lost"
        )
        if lost > 0:
            return (
                f"Redis at {self.where} evicted {lost} keys during the crawl (maxmemory-policy "
                f"{policy}): the frontier's queues, leases or dupefilter may be lost; leasing "
                f"stopped. {fix[0].upper()}{fix[1:]}"
            )
        if policy not in (NOEVICTION, UNKNOWN):
            return (
                f"Redis at {self.where} changed its maxmemory-policy to {policy} during the "
                f"crawl: it may evict the frontier's keys; leasing stopped. {fix[0].upper()}"
                f"{fix[1:]}, or set {ALLOW_EVICTION_SETTING}=True to accept losing work"
            )
        return None

    def watch(self) -> None:
        """Run :meth:`check` in a thread, one check at a time, unless leasing
        stopped already; :meth:`checked` handles the answer."""
        if self._call is not None or self.evicted is not None:
            return
        self._call = deferToThread(self.check)
        self._call.addCallbacks(self.checked, self._check_failed)

    def checked(self, message: str | None) -> None:
        """Stop leasing when ``message`` (from :meth:`check`) says Redis
        evicted keys or may evict them: :attr:`evicted` set,
        ``frontier/evicted`` set to 1, one ERROR line (``Configuration
        error: ...``) and the spider closed with the reason
        ``config_error`` (its leases given back, ``scrapy crawl`` exits
        with status 1)."""
        self._call = None
        if message is None or self.evicted is not None:
            return
        self.evicted = message
        if self.crawler is not None:
            if self.crawler.stats is not None:
                self.crawler.stats.set_value("frontier/evicted", 1)
            stop_on_config_error(self.crawler, message)

    def _check_failed(self, failure: Failure) -> None:
        """A failed check: Redis being down is the heartbeat's to report
        (the next beat checks again); anything else is logged."""
        self._call = None
        if isinstance(failure.value, UNREACHABLE):
            scheduler_logger.debug("Eviction check failed: %s", failure.value,
                                   extra={"spider": self.spider})
            return
        scheduler_logger.error(
            "Eviction check failed: %s", failure.getErrorMessage(),
            exc_info=failure.value, extra={"spider": self.spider},
        )
