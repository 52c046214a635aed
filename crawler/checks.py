"""The settings check of a crawl: :func:`validate_settings`.

It composes the configuration's own check (:mod:`crawler.config`: every
value against its row of :data:`~crawler.config.SETTINGS`, pairs out of
order) with what only the frontier can say: whether redis-py takes the
Redis options as the crawl will build its client
(:mod:`crawler.frontier.connection`), and which scrapy-redis settings the
frontier cannot honour (:func:`crawler.frontier.compat.refusals`). It sits
above both, so that the configuration imports no frontier.

``scrapy crawl``, :class:`crawler.addon.FrontierAddon` (any other way of
running a crawl), ``scrapy frontier`` and the metrics exporter call it
before they start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.connection import parse_url

from crawler.config import (
    SETTINGS,
    SettingsError,
    json_dict,
    masked_url,
    order_problems,
    parse_sentinel_url,
    row_problems,
    scrub,
    secrets_of,
    warn_unknown_settings,
)
from crawler.frontier.compat import refusals
from crawler.frontier.connection import cluster_enabled, get_redis

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["validate_settings"]


def validate_settings(settings: BaseSettings, *, warn_unknown: bool = True) -> None:
    """Check ``settings`` before a crawl starts; open no connection.

    Every setting of :data:`~crawler.config.SETTINGS` that is set is
    checked (unset always passes: its default applies); a Redis client is
    then built as the crawl will build it (no I/O on one server), so that
    options redis-py refuses are found now; then pairs of settings out of
    order (:data:`~crawler.config.ORDERED`); then the scrapy-redis settings
    the frontier cannot honour (:func:`crawler.frontier.compat.refusals`).
    A setting with a project prefix that is not in the table is logged as a
    warning (a typo, most likely) unless ``warn_unknown`` is off.

    :raises crawler.config.SettingsError: one line per bad setting, naming
        the setting, its value (credentials masked) and what is allowed.
    """
    problems = row_problems(settings)
    if not any(p.startswith(("REDIS_", "FRONTIER_REDIS_CLUSTER")) for p in problems):
        client_problem = _check_client(settings)
        if client_problem:
            problems.append(client_problem)
    if not problems:
        problems = order_problems(settings)
    if not problems:
        problems = refusals(settings)
    if problems:
        raise SettingsError(problems)
    if warn_unknown:
        warn_unknown_settings(settings)


def _check_cluster_url(settings: BaseSettings) -> str | None:
    """With ``FRONTIER_REDIS_CLUSTER``: REDIS_URL names a node, database 0."""
    url = settings.get("REDIS_URL") or ""
    if not url:
        return "FRONTIER_REDIS_CLUSTER=True: REDIS_URL must name a node of the cluster"
    try:
        db = int(parse_url(url).get("db") or 0)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError):
        return None  # REDIS_URL's own row says it
    if not db:
        return None
    return (f"REDIS_URL={masked_url(url)}: must use database 0 with FRONTIER_REDIS_CLUSTER "
            "(a cluster has no other)")


def _check_client(settings: BaseSettings) -> str | None:
    """Build the Redis client as the crawl will (no I/O on one server) to
    catch what redis-py refuses: an unknown option, a bad URL."""
    url = settings.get("REDIS_URL")
    try:
        sentinel = parse_sentinel_url(url)
    except ValueError:
        return None  # REDIS_URL's own row says it
    if sentinel is not None and cluster_enabled(settings):
        return (f"REDIS_URL={masked_url(str(url))}: names Redis Sentinels, which "
                "FRONTIER_REDIS_CLUSTER=True does not take (a cluster needs no sentinels)")
    if cluster_enabled(settings):
        return _check_cluster_url(settings)
    try:
        client = get_redis(settings)
        try:
            # redis-py takes options as they come and refuses an unknown
            # one only when it makes a connection object (no I/O yet).
            client.connection_pool.make_connection().disconnect()  # type: ignore[no-untyped-call]
        finally:
            client.close()
    except (TypeError, ValueError, ImportError, AttributeError) as exc:
        url = settings.get("REDIS_URL")
        secrets = secrets_of(url)
        try:
            params = json_dict(settings.get("REDIS_PARAMS") or {})
        except ValueError:
            params = {}
        if isinstance(params.get("password"), str):
            secrets.append(params["password"])
        error = scrub(str(exc), secrets)
        if params:
            shown = SETTINGS["REDIS_PARAMS"].shown(params)
            return f"REDIS_PARAMS={shown}: must be options redis-py takes (it says: {error})"
        return f"REDIS_URL={masked_url(str(url or ''))}: must be a URL redis-py takes ({error})"
    return None


