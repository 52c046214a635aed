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

``REDIS_URL`` may name Redis Sentinels instead of a server (redis-py has no
URL scheme for them)::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]

The client (:func:`sentinel_client`) asks the sentinels, in turn, for the
master of ``service_name`` whenever it opens a connection, and on a
failover its pooled connections are dropped (:func:`drop_connections`), so
the next call reaches the master the sentinels name by then. The password
(and user name) is sent to the sentinels and to the master alike: give the
sentinels ``requirepass`` and the master ``requirepass`` with the same
password, or none to either. The sentinels are asked no more than
``SENTINEL MASTERS``; no command is sent to a replica.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from redis.backoff import NoBackoff
from redis.cluster import ClusterPipeline, RedisCluster
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelManagedConnection
from scrapy.utils.misc import load_object
from scrapy_redis import connection as scrapy_redis_connection
from scrapy_redis import defaults

from crawler.config import (
    ConfigurationError,
    SentinelUrl,
    masked_url,
    parse_sentinel_url,
    scrub,
    secrets_of,
    setting_value,
    stop_on_config_error,
)
from crawler.frontier.protocol import refusal

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = [
    "FAIL_FAST_PARAMS",
    "NOT_RUN",
    "NO_MASTER",
    "FrontierRedisCluster",
    "cluster_enabled",
    "config_error",
    "config_error_message",
    "drop_connections",
    "get_redis",
    "is_no_master",
    "no_retries",
    "redis_params",
    "report_redis_failure",
    "sentinel_client",
]

#: The project's redis-py client options, between scrapy-redis's defaults
#: (30 s timeouts) and ``REDIS_PARAMS``: fail fast when Redis is down (the
#: scheduler then waits with backoff) instead of blocking the worker for 30
#: seconds. ``REDIS_PARAMS`` is merged over them, not instead of them: its
#: keys win, these fill the rest. Seconds.
FAIL_FAST_PARAMS: dict[str, Any] = {"socket_connect_timeout": 2, "socket_timeout": 10}


class _NoMaintNotice(logging.Filter):
    """Drops redis-py's DEBUG line ``Failed to enable maintenance
    notifications: unknown subcommand 'MAINT_NOTIFICATIONS'``, logged on
    every new connection to a server without them (any Redis before Redis
    8's, and open-source Redis: a Redis Enterprise feature; redis-py
    issue #3852). It asks nothing of the user; redis-py's other records of
    ``redis.connection`` pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to enable maintenance notifications")


logging.getLogger("redis.connection").addFilter(_NoMaintNotice())


#: Replies of a server that is no master (or not yet one): ``READONLY``
#: (a replica, such as a demoted master that an endpoint no longer names
#: but that pooled connections still reach), ``LOADING`` (a server loading
#: its data set after a restart or a full resynchronisation: redis-py raises
#: it as a ``ConnectionError``), ``MASTERDOWN`` (a replica that lost its
#: master). Nothing was written: a replica refuses a script's first write,
#: which aborts it (scripts are atomic, and ours go on after no failed
#: write), and a loading server runs nothing. A failover, to wait out as an
#: outage, never a refusal (see :func:`is_no_master`).
NO_MASTER = (ReadOnlyError, BusyLoadingError, MasterDownError)
#: Replies that say a call did not run and may be sent again at once: a
#: script Redis forgot (``NOSCRIPT``), a slot that moved or is moving
#: (``MOVED``, ``ASK``, ``TRYAGAIN``), a cluster that is not serving yet
#: (``CLUSTERDOWN``), a server that is no master (``READONLY``,
#: ``MASTERDOWN``: :data:`NO_MASTER`). Any other reply to a call whose reply
#: was lost leaves it in doubt: it may have run.
NOT_RUN = (NoScriptError, AskError, TryAgainError, ClusterDownError, ReadOnlyError)
#: Replies of a Redis Cluster that is not serving a slot yet (``CLUSTERDOWN``:
#: a master restarted and not back in the cluster, or every slot once one is
#: marked failed; ``TRYAGAIN``: a slot being moved): an outage to wait out,
#: although redis-py raises them as a ``ResponseError``.
CLUSTER_BUSY = (ClusterDownError, TryAgainError)


def is_no_master(exc: BaseException) -> bool:
    """Whether ``exc`` says the server is no master: :data:`NO_MASTER`, or
    a blocked call cut off because the server changed role (``UNBLOCKED
    ... instance state changed``, raised by redis-py as a plain
    ``ResponseError``). Such a call wrote nothing; the pooled connections
    may reach a demoted master (:func:`drop_connections`)."""
    if isinstance(exc, NO_MASTER):
        return True
    text = str(exc).lower()
    return isinstance(exc, ResponseError) and (
        text.startswith("unblocked") and "instance state changed" in text
    )


def drop_connections(server: Any) -> None:
    """Close every pooled connection of the redis-py client ``server`` (a
    ``Redis``, or a ``RedisCluster``: all its nodes' pools), so that the
    next call connects again through the configured address, resolving its
    host name again. After a failover behind one endpoint (a managed
    "primary endpoint", a DNS name, a proxy), connections opened before it
    may still reach the demoted master. No I/O but closing sockets; never
    raises for a client without pools."""
    pool = getattr(server, "connection_pool", None)
    if pool is not None:
        pool.disconnect()
        return
    nodes = getattr(server, "nodes_manager", None)
    if nodes is not None:
        for node in list(getattr(nodes, "nodes_cache", {}).values()):
            client = getattr(node, "redis_connection", None)
            if client is not None:
                client.connection_pool.disconnect()


def cluster_enabled(settings: BaseSettings) -> bool:
    """Whether ``REDIS_URL`` names a Redis Cluster (``FRONTIER_REDIS_CLUSTER``)."""
    return bool(setting_value(settings, "FRONTIER_REDIS_CLUSTER"))


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
    its own (:func:`no_retries`), and ``REDIS_PARAMS`` is merged over the
    project's :data:`FAIL_FAST_PARAMS` (its keys win).

    Sentinels (``REDIS_URL`` ``redis+sentinel://...``): the master of
    their service (:func:`sentinel_client`).

    Standalone (the default): built as scrapy-redis's
    ``get_redis_from_settings`` builds it (:func:`redis_params`), which
    honours ``REDIS_URL``, ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``,
    ``REDIS_PARAMS`` (``redis_cls`` included) and ``REDIS_ENCODING``.

    With ``FRONTIER_REDIS_CLUSTER``: a :class:`FrontierRedisCluster` built
    from ``REDIS_URL`` and ``REDIS_PARAMS`` over the same defaults
    (``redis_cls`` is ignored). It serves every command the project sends, so
    it is typed as :class:`redis.Redis`.

    :raises ValueError: cluster mode without ``REDIS_URL``.
    :raises redis.exceptions.RedisError: cluster mode and no node answers.
    :raises crawler.config.ConfigurationError: cluster mode and the nodes
        refuse the configuration (:func:`config_error`: a wrong password,
        say); the message is the one line to log (password masked).
    """
    sentinel = parse_sentinel_url(settings.get("REDIS_URL"))
    if sentinel is not None:
        return sentinel_client(sentinel, settings)
    if not cluster_enabled(settings):
        params = redis_params(settings)
        if isinstance(params.get("redis_cls"), str):
            params["redis_cls"] = load_object(params["redis_cls"])
        client = cast("Redis", scrapy_redis_connection.get_redis(**params))
        _no_retries(client.connection_pool.connection_kwargs)
        return client
    url = settings.get("REDIS_URL")
    if not url:
        raise ValueError("FRONTIER_REDIS_CLUSTER needs REDIS_URL (any node of the cluster)")
    params = _merged_params(settings)
    params.pop("redis_cls", None)
    _no_retries(params)
    if encoding := settings.get("REDIS_ENCODING"):
        params["encoding"] = encoding
    if settings.get("REDIS_DECODE_RESPONSES"):
        params["decode_responses"] = True
    try:
        return cast("Redis", FrontierRedisCluster.from_url(url, **params))
    except (RedisError, RedisClusterException) as exc:
        message = config_error_message(exc, settings)
        if message is None:
            raise
        raise ConfigurationError(message) from None


class FrontierSentinelConnection(SentinelManagedConnection):
    """A connection to the master that the sentinels name, which reports
    ``READONLY`` as the server said it.

    redis-py's own turns ``READONLY`` into a ``ConnectionError`` ("The
    previous master is now a slave"), which would leave the call in doubt
    (it did not run: a replica refuses a script's first write) and, inside
    a pipeline, lose the replies of the calls before it. Here the reply
    stays a :class:`~redis.exceptions.ReadOnlyError` (:data:`NO_MASTER`),
    and the callers drop the pooled connections (:func:`drop_connections`):
    the next connection asks the sentinels again.
    """

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """The server's reply, ``READONLY`` included, as any connection's."""
        return super(SentinelManagedConnection, self).read_response(*args, **kwargs)


class FrontierSentinels(Sentinel):
    """redis-py's :class:`~redis.sentinel.Sentinel` whose "no master" error
    is one short line: each sentinel's address and what it answered (redis-py
    quotes every client's whole configuration), no credentials."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """The master's address as the first sentinel that knows it up says.

        :raises redis.sentinel.MasterNotFoundError: none does (down,
            refusing the credentials, or knowing no master up).
        """
        answers: list[str] = []
        for n, sentinel in enumerate(self.sentinels):
            options = sentinel.connection_pool.connection_kwargs
            where = f"{options.get('host')}:{options.get('port')}"
            try:
                masters: dict[str, Any] = sentinel.sentinel_masters()  # type: ignore[assignment]
            except (RedisConnectionError, RedisTimeoutError) as exc:
                answers.append(f"{where}: {type(exc).__name__}: {exc}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                # (the sentinel that answered is asked first next time)
                self.sentinels[0], self.sentinels[n] = sentinel, self.sentinels[0]
                return str(state["ip"]), int(state["port"])
            answers.append(f"{where}: no master of {service_name!r} up")
        raise MasterNotFoundError(
            f"no sentinel names a master of {service_name!r} ({'; '.join(answers)})"
        )


def sentinel_client(url: SentinelUrl, settings: BaseSettings) -> Redis:
    """A client of the master of ``url.service`` that the sentinels
    ``url.hosts`` name; no I/O until its first call.

    Options as for one server (``REDIS_PARAMS`` over
    :data:`FAIL_FAST_PARAMS`, no retries; ``REDIS_ENCODING``,
    ``REDIS_DECODE_RESPONSES``), with the URL's database, user name and
    password. The sentinels get the same socket timeouts, user name and
    password, and no retries either.
    """
    params = _merged_params(settings)
    for name in ("redis_cls", "url", "host", "port"):
        params.pop(name, None)
    _no_retries(params)
    if encoding := settings.get("REDIS_ENCODING"):
        params["encoding"] = encoding
    if settings.get("REDIS_DECODE_RESPONSES"):
        params["decode_responses"] = True
    params["db"] = url.db
    if url.username:
        params["username"] = url.username
    if url.password:
        params["password"] = url.password
    sentinel_kwargs: dict[str, Any] = {
        k: v for k, v in params.items() if k.startswith("socket_") or k in ("username", "password")
    }
    sentinel_kwargs["retry"] = no_retries()
    sentinels = FrontierSentinels(  # type: ignore[no-untyped-call]
        list(url.hosts), sentinel_kwargs=sentinel_kwargs
    )
    return cast("Redis", sentinels.master_for(  # type: ignore[no-untyped-call]
        url.service, connection_class=FrontierSentinelConnection, **params
    ))


def _merged_params(settings: BaseSettings) -> dict[str, Any]:
    """scrapy-redis's defaults, then :data:`FAIL_FAST_PARAMS`, then ``REDIS_PARAMS``."""
    return {**defaults.REDIS_PARAMS, **FAIL_FAST_PARAMS, **settings.getdict("REDIS_PARAMS")}


def redis_params(settings: BaseSettings) -> dict[str, Any]:
    """The keyword arguments of a standalone client for ``settings``.

    scrapy-redis's ``get_redis_from_settings`` replaces the project's
    timeouts when ``REDIS_PARAMS`` is given at all (``-s REDIS_PARAMS='{"db":
    1}'`` would bring back its 30 s); here ``REDIS_PARAMS`` is merged over
    scrapy-redis's defaults and :data:`FAIL_FAST_PARAMS` (its keys win, they
    fill the rest), then ``REDIS_URL``, ``REDIS_HOST``, ``REDIS_PORT``,
    ``REDIS_DB``, ``REDIS_ENCODING`` and ``REDIS_DECODE_RESPONSES`` apply
    when set, as scrapy-redis applies them, and redis-py's retries are off.

    :returns: options for ``scrapy_redis.connection.get_redis`` (``url``
        and ``redis_cls`` included when given).
    :raises ValueError: ``REDIS_PARAMS`` is text that is no JSON object.
    """
    params = _merged_params(settings)
    for source, dest in scrapy_redis_connection.SETTINGS_PARAMS_MAP.items():
        if value := settings.get(source):
            params[dest] = value
    _no_retries(params)
    return params


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


# -- configuration errors ------------------------------------------------------

#: Words of Redis replies (lowercase) that say the database asked for does
#: not exist or cannot be selected.
_DB_ERRORS = ("db index is out of range", "invalid db index", "select is not allowed")
#: Words of a cluster client's error (it wraps the node's reply in text)
#: that say the credentials were refused.
_AUTH_WORDS = ("wrongpass", "noauth", "invalid username-password", "invalid password",
               "authentication required")


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during (5 at most)."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(out) < 5 and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


_AUTH_HINT = "check the user name and password in REDIS_URL (or REDIS_PARAMS)"


def _cause(error: BaseException) -> str | None:
    """The configuration error ``error`` itself says, or None (see
    :func:`config_error`)."""
    text = str(error)
    lower = text.lower()
    mismatch = refusal(text) if isinstance(error, ResponseError) else None
    causes: list[tuple[bool, str]] = [
        (mismatch is not None, str(mismatch)),
        (isinstance(error, AuthenticationError), f"authentication failed ({text}): {_AUTH_HINT}"),
        (isinstance(error, AuthorizationError),
         f"not authorized ({text}): check the Redis user's ACL"),
        (isinstance(error, NoPermissionError),
         f"the Redis user's ACL forbids what the crawler needs ({text}): it runs Lua scripts "
         "(EVALSHA, SCRIPT LOAD) and reads and writes the keys of its crawl ({<spider>}:*, "
         "<spider>:start_urls and its intake keys)"),
        (isinstance(error, ResponseError) and "user executing the script can't run" in lower,
         f"the Redis user's ACL forbids a command the crawler's scripts run ({text}): "
         "allow it to the user"),
        (isinstance(error, ResponseError) and any(w in lower for w in _DB_ERRORS),
         f"database not available ({text}): check the database number of REDIS_URL (or "
         "REDIS_DB); a Redis Cluster has database 0 only (FRONTIER_REDIS_CLUSTER=1)"),
        (isinstance(error, ResponseError) and lower.startswith("unknown command"),
         f"the server lacks a command the crawler needs ({text}): it needs Redis 6.2 or "
         "later, with no command renamed"),
        (isinstance(error, RedisClusterException) and any(w in lower for w in _AUTH_WORDS),
         f"authentication failed ({text}): {_AUTH_HINT}"),
        # (a sentinel that refuses the password: no sentinel named a master)
        (isinstance(error, MasterNotFoundError) and any(w in lower for w in _AUTH_WORDS),
         f"the sentinels refused the credentials ({text}): {_AUTH_HINT} (the sentinels "
         "and the master take the same password)"),
        (isinstance(error, RedisClusterException) and "cluster mode is not enabled" in lower,
         f"FRONTIER_REDIS_CLUSTER is on but the server is no Redis Cluster node ({text}): "
         "unset FRONTIER_REDIS_CLUSTER for one Redis server, or point REDIS_URL at a node "
         "of the cluster"),
    ]
    return next((cause for matches, cause in causes if matches), None)


def config_error(exc: BaseException) -> str | None:
    """What a Redis error says is wrong with the configuration, or None.

    A configuration error is one that no wait fixes (unlike an outage, a
    timeout or a script's refusal of a bad key): credentials refused
    (redis-py's ``AuthenticationError``, although a ``ConnectionError``:
    ``WRONGPASS``, ``NOAUTH``, AUTH sent to a server without a password), a
    user not authorized, an ACL that forbids a command or a key the crawler
    needs (``NOPERM``, a ``NoPermissionError``), a database the server does
    not have or does not allow (``DB index is out of range``, ``invalid DB
    index``, ``SELECT`` on a cluster node), a command the server does not
    know (renamed, or a Redis older than 6.2), a frontier script that
    refuses the protocol version of this worker's calls
    (:func:`crawler.frontier.protocol.refusal`: workers of two versions on
    one crawl). ``exc`` and the errors it was raised from or during are
    looked at.

    :returns: one line naming the cause and what to check (no secret: the
        servers' replies carry none), or None for anything else.
    """
    return next((c for e in _chain(exc) if (c := _cause(e)) is not None), None)


def _cluster_node_cause(exc: BaseException) -> str | None:
    """The cause to tell when a client for one Redis server (no
    ``FRONTIER_REDIS_CLUSTER``) met a node of a Redis Cluster: its ``MOVED``
    (or ``ASK``) for a key of another node, which no wait fixes; or None."""
    moved = next((e for e in _chain(exc) if isinstance(e, AskError)), None)
    if moved is None:
        return None
    return (
        f"the server is a node of a Redis Cluster (it answered MOVED/ASK {moved}): set "
        "FRONTIER_REDIS_CLUSTER=1 in the environment, so that the worker uses a cluster client"
    )


def redis_location(settings: BaseSettings) -> str:
    """Where the crawl's Redis is, for messages: ``REDIS_URL`` with its
    password masked, or ``REDIS_HOST:REDIS_PORT``."""
    url = settings.get("REDIS_URL")
    if url:
        return masked_url(str(url))
    # scrapy-redis reads REDIS_HOST/REDIS_PORT when REDIS_URL is not set
    # (redis-py's defaults: localhost, 6379).
    host = settings.get("REDIS_HOST") or "localhost"
    return f"redis://{host}:{settings.get('REDIS_PORT') or 6379}"


def config_error_message(exc: BaseException, settings: BaseSettings) -> str | None:
    """The one log line for a configuration error of Redis (None: ``exc`` is
    none, see :func:`config_error`): where Redis is (password masked), the
    cause, and that the worker stops. Known secrets are scrubbed from it."""
    cause = config_error(exc)
    if cause is None and not cluster_enabled(settings):
        cause = _cluster_node_cause(exc)
    if cause is None:
        return None
    secrets = secrets_of(settings.get("REDIS_URL"))
    try:
        password = settings.getdict("REDIS_PARAMS").get("password")
    except ValueError:
        password = None
    if isinstance(password, str) and password:
        secrets.append(password)
    message = f"Redis at {redis_location(settings)}: {cause}; this is no outage: stopping"
    return scrub(message, secrets)


def report_redis_failure(
    crawler: Crawler,
    failure: Any,
    log: logging.Logger,
    *,
    retrying: str,
    failed: str,
    extra: dict[str, Any] | None = None,
    server: Any = None,
) -> None:
    """Handle the failure of a periodic Redis call that a component runs in a
    thread (cluster stats, housekeeping): the errback of its Deferred.

    - a configuration error of Redis (:func:`config_error_message`: a wrong
      password, an ACL) stops the crawl (:func:`crawler.config.stop_on_config_error`):
      no retry fixes it;
    - any other Redis error (a ``RedisError``, or a cluster client's
      ``RedisClusterException``: Redis down, a timeout, a refusal) is an
      outage the next run retries: one warning, ``log.warning(retrying,
      error)``; a server that is no master (:func:`is_no_master`: a
      failover) is one too, and the pooled connections of ``server`` are
      dropped (:func:`drop_connections`), so that the next run reaches the
      master that the configured address names now;
    - anything else is a bug: ``log.error(failed, message)`` with the
      traceback.

    :param failure: the failure (a Twisted :class:`~twisted.python.failure.Failure`).
    :param log: the component's logger (its records keep the component's name).
    :param retrying: the warning's format, with one ``%s`` for the error,
        e.g. ``"Frontier housekeeping failed (will retry): %s"``.
    :param failed: the error's format, with one ``%s`` for the message.
    :param extra: the log records' ``extra`` (e.g. ``{"spider": spider}``).
    :param server: the component's redis-py client (None: none to drop).
    """
    message = config_error_message(failure.value, crawler.settings)
    if message is not None:
        # (once, whichever component meets it first)
        stop_on_config_error(crawler, message)
        return
    if failure.check(RedisError, RedisClusterException):
        if server is not None and is_no_master(failure.value):
            drop_connections(server)
        log.warning(retrying, failure.value, extra=extra)
        return
    log.error(
        failed,
        failure.getErrorMessage(),
        exc_info=(failure.type, failure.value, failure.getTracebackObject()),
        extra=extra,
    )
