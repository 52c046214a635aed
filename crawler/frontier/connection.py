"""Redis clients for every component: one Redis server, or a Redis Cluster.

:func:`get_redis` is the project's one client factory (scheduler,
dupefilters, spider seeds, cluster stats, ``scrapy seed`` and
``scrapy frontier status``). It reads scrapy-redis's settings (``REDIS_URL``,
``REDIS_PARAMS``, ...) and one of ours:

``FRONTIER_REDIS_CLUSTER`` (default False, environment variable of the same
name)
    ``REDIS_URL`` names one node of a Redis Cluster, e.g.
    ``redis://10.0.0.1:7000/0`` (database 0 only, as the cluster has no
    other); the client discovers the others. redis-py has no URL scheme for
    a cluster, hence the switch. Every key that one script or transaction
    touches shares the hash tag ``{<spider>}``, so it lives in one slot; the
    seed list ``<spider>:start_urls`` lives in another slot and is only ever
    touched alone.

redis-py's :class:`~redis.cluster.RedisCluster` runs Lua scripts, and its
pipelines run ``MULTI``/``EXEC`` when every key is in one slot, but it
refuses ``EVALSHA`` inside a pipeline, which the scheduler's outbox needs
(``Frontier.push(client=pipe)``). :class:`FrontierRedisCluster` lifts that:
its pipelines queue registered scripts and, like redis-py's standalone
pipelines, make sure every node has them (``SCRIPT EXISTS``, then
``SCRIPT LOAD``) before they send the batch, so a transaction never stops
half-way on ``NOSCRIPT``.

Unlike a standalone client, a cluster client connects when it is built (it
reads the slot map), so with ``FRONTIER_REDIS_CLUSTER`` on, building a
component needs the cluster to be up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from redis.backoff import NoBackoff
from redis.cluster import ClusterPipeline, RedisCluster
from redis.retry import Retry
from scrapy_redis import defaults
from scrapy_redis.connection import get_redis_from_settings

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script
    from scrapy.settings import BaseSettings

__all__ = ["FrontierRedisCluster", "cluster_enabled", "get_redis", "no_retries"]


def cluster_enabled(settings: BaseSettings) -> bool:
    """Whether ``REDIS_URL`` names a Redis Cluster (``FRONTIER_REDIS_CLUSTER``)."""
    return settings.getbool("FRONTIER_REDIS_CLUSTER", False)


def no_retries() -> Retry:
    """A redis-py retry policy that never sends a command again.

    redis-py (6+) resends a command, a pipeline or a ``MULTI`` transaction
    after a connection error or a timeout, up to three times by default
    (scrapy-redis's defaults add ``retry_on_timeout``). When the first one
    ran and only its reply was lost, a resent lease or commit script runs
    twice. Every client of the project turns that off: the frontier finds
    out what ran instead (``FrontierScheduler``), and the other callers wait
    out outages with their own backoff.
    """
    return Retry(NoBackoff(), 0)


def get_redis(settings: BaseSettings) -> Redis:
    """A redis-py client for ``settings``; no I/O for a standalone server.

    Whatever ``REDIS_PARAMS`` says, the client never resends a command on
    its own (:func:`no_retries`).

    Standalone (the default): scrapy-redis's ``get_redis_from_settings``,
    which honours ``REDIS_URL``, ``REDIS_HOST``/``REDIS_PORT``,
    ``REDIS_PARAMS`` (``redis_cls`` included) and ``REDIS_ENCODING``.

    With ``FRONTIER_REDIS_CLUSTER``: a :class:`FrontierRedisCluster` built
    from ``REDIS_URL`` and ``REDIS_PARAMS`` over scrapy-redis's defaults
    (``redis_cls`` is ignored). It serves every command the project sends, so
    it is typed as :class:`redis.Redis`.

    :raises ValueError: cluster mode without ``REDIS_URL``.
    :raises redis.exceptions.RedisError: cluster mode and no node answers.
    """
    if not cluster_enabled(settings):
        client = cast("Redis", get_redis_from_settings(settings))
        _no_retries(client.connection_pool.connection_kwargs)
        return client
    url = settings.get("REDIS_URL")
    if not url:
        raise ValueError("FRONTIER_REDIS_CLUSTER needs REDIS_URL (any node of the cluster)")
    params: dict[str, Any] = {**defaults.REDIS_PARAMS, **settings.getdict("REDIS_PARAMS")}
    params.pop("redis_cls", None)
    _no_retries(params)
    if encoding := settings.get("REDIS_ENCODING"):
        params["encoding"] = encoding
    if settings.get("REDIS_DECODE_RESPONSES"):
        params["decode_responses"] = True
    return cast("Redis", FrontierRedisCluster.from_url(url, **params))


def _no_retries(params: dict[str, Any]) -> None:
    params.pop("retry_on_timeout", None)
    params.pop("retry_on_error", None)
    params["retry"] = no_retries()


class FrontierRedisCluster(RedisCluster):
    """A :class:`~redis.cluster.RedisCluster` whose pipelines run Lua scripts.

    Scripts made with :meth:`register_script` can be called with a pipeline
    of this client as ``client=`` (queued as ``EVALSHA``), in a
    ``MULTI``/``EXEC`` transaction too when all their keys share one slot.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: SHA1 -> source of every script registered on this client.
        self.script_sources: dict[str, bytes | str | memoryview[int]] = {}

    def register_script(self, script: bytes | str | memoryview[int]) -> Script:
        """Register a Lua script (no I/O) and remember its source for pipelines."""
        registered: Script = super().register_script(script)
        self.script_sources[registered.sha] = registered.script
        return registered

    def pipeline(self, transaction: bool | None = None, shard_hint: Any = None) -> Any:
        """A :class:`ScriptingClusterPipeline` (``transaction=True``: one slot)."""
        pipe = super().pipeline(  # type: ignore[no-untyped-call]
            transaction=transaction, shard_hint=shard_hint
        )
        # redis-py builds the pipeline from the client's internals; only the
        # class changes (it adds methods, no state beyond two attributes).
        pipe.__class__ = ScriptingClusterPipeline
        pipe.script_owner = self
        pipe.queued_scripts = set()
        return pipe

    def ensure_scripts(self, shas: set[str]) -> None:
        """Load the scripts ``shas`` on every primary that lacks them.

        One ``SCRIPT EXISTS`` per primary, and one ``SCRIPT LOAD`` per
        primary and missing script (after a restart or a failover).
        """
        ordered = [sha for sha in shas if sha in self.script_sources]
        if not ordered:
            return
        present = self.script_exists(*ordered)  # all primaries, ANDed
        for sha, here in zip(ordered, present, strict=True):
            if not here:
                self.script_load(self.script_sources[sha])


class ScriptingClusterPipeline(ClusterPipeline):
    """A :class:`~redis.cluster.ClusterPipeline` that accepts ``EVALSHA``.

    Made only by :meth:`FrontierRedisCluster.pipeline`.
    """

    script_owner: FrontierRedisCluster
    queued_scripts: set[str]

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """Queue a script call (redis-py's cluster pipeline refuses it)."""
        self.queued_scripts.add(sha)
        return self.execute_command(  # type: ignore[no-untyped-call]
            "EVALSHA", sha, numkeys, *keys_and_args
        )

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Load the queued scripts where missing, then send the pipeline."""
        if self.queued_scripts:
            self.script_owner.ensure_scripts(self.queued_scripts)
            self.queued_scripts = set()
        result: list[Any] = super().execute(raise_on_error)
        return result
