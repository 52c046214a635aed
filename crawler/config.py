"""Configuration errors: the settings table, its check, and fatal errors.

A configuration error is not an outage: no backoff fixes a wrong password, a
database the user may not select, an ACL that forbids a command the crawler
needs or a setting that makes no sense. A worker that meets one says what is
wrong in one log line (credentials masked) and stops, with a non-zero exit
status (``crawler/commands/crawl.py``), instead of retrying for ever.

* **Settings.** :data:`SETTINGS` is the one table of every setting the
  project adds, and of the Scrapy and scrapy-redis settings its components
  read: name -> allowed type and range, and what it means.
  :func:`row_problems` and :func:`order_problems` check a crawler's
  settings against it; :func:`crawler.checks.validate_settings` runs them
  (with the checks only the frontier can make) before the crawl starts
  (``scrapy crawl``, and :class:`crawler.addon.FrontierAddon` for any other
  way of running a crawl) and raises :class:`SettingsError`, whose lines
  read ``FRONTIER_LEASE_TIMEOUT=-5: must be a number of seconds > 0``.

This module is the configuration layer: it imports nothing of the frontier
(``.importlinter`` declares it), the frontier and everything above import it.
* **Servers.** Components that meet a configuration error at a server
  (:mod:`crawler.frontier.connection` tells them for Redis,
  :mod:`crawler.pipelines` for MongoDB) report it with
  :func:`stop_on_config_error`: the error is logged once, the spider is
  closed with the finish reason :data:`CONFIG_ERROR_REASON`, and
  :func:`config_error_of` tells the ``crawl`` command to exit non-zero. At
  start (the scheduler or the pipeline opening) they raise
  ``CloseSpider(CONFIG_ERROR_REASON)`` instead, so the crawl never starts.
* **Credentials** never reach a log line: :func:`masked_url` hides the
  password of a URL, :func:`scrub` removes known secrets from a text.
"""

from __future__ import annotations

import difflib
import importlib
import json
import logging
import math
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit
from weakref import WeakKeyDictionary

from pymongo.errors import PyMongoError
from pymongo.uri_parser import parse_uri
from redis.connection import parse_url
from scrapy.exceptions import CloseSpider
from scrapy.settings import BaseSettings, default_settings
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import load_object

from crawler.hashtags import intake_base
from crawler.overrides import parse_download_slots, parse_site_settings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = [
    "CONFIG_ERROR_REASON",
    "SCRAPYS",
    "SETTINGS",
    "ConfigurationError",
    "FrontierConfig",
    "Setting",
    "SettingsError",
    "close_at_open",
    "config_error_of",
    "is_unset",
    "masked_url",
    "order_problems",
    "row_problems",
    "scrub",
    "setting_value",
    "stop_on_config_error",
    "warn_unknown_settings",
    "worker_id",
]

#: The finish reason (stat ``finish_reason``) of a crawl stopped by a
#: configuration error.
CONFIG_ERROR_REASON = "config_error"
#: Prefixes of the project's own settings (a name with one of them that is
#: not in :data:`SETTINGS` is warned about: a typo, most likely).
OWN_PREFIXES = ("FRONTIER_", "MONGO_", "METRICS_", "LOG_JSON_", "WARC_")

#: First words of setting names whose near misses (``FRONTEIR``, ``MONGOO``)
#: are warned about as typos.
_TYPO_WORDS = ("FRONTIER", "MONGO", "METRICS", "REDIS")

_MASK = "****"
#: Query parameters of a URL whose values are secrets.
_SECRET_PARAM = re.compile(r"pass|secret|token|key|credential", re.IGNORECASE)


class ConfigurationError(Exception):
    """The crawl cannot run as configured; retrying will not help.

    ``str(error)`` is the message to log: one line per problem, no secrets.
    """


class SettingsError(ConfigurationError, ValueError):
    """Settings that :func:`validate_settings` refused.

    :ivar problems: one line per bad setting, e.g. ``FRONTIER_SEED_BATCH=0:
        must be a whole number >= 1``.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# -- credentials ---------------------------------------------------------------


def masked_url(url: str) -> str:
    """``url`` with its password (and secret query values) replaced by ``****``.

    ``redis://user:secret@host:6379/0`` gives ``redis://user:****@host:6379/0``;
    ``mongodb://u:p@h1,h2/?authSource=admin`` gives
    ``mongodb://u:****@h1,h2/?authSource=admin``. The user name stays (it
    tells which ACL user or database user is meant). Works on any
    ``scheme://[user[:password]@]hosts...`` text, several hosts included
    (RFC 3986 userinfo, the last ``@`` of the authority ends it).
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return _MASK
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{_MASK}@{hosts}" if colon else f"{user}@{hosts}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAM.search(k) for k, _ in pairs):
            query = urlencode(
                [(k, _MASK if _SECRET_PARAM.search(k) else v) for k, v in pairs], safe="*:,"
            )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


#: ``REDIS_URL``'s scheme for Redis Sentinels (:func:`parse_sentinel_url`).
SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelUrl:
    """A ``redis+sentinel://`` URL, parsed (:func:`parse_sentinel_url`).

    :ivar hosts: the sentinels, ``(host, port)``, in the URL's order.
    :ivar service: the name the sentinels monitor the master under.
    :ivar db: the database number on the master.
    :ivar username: the ACL user (None: the default user).
    :ivar password: for the sentinels and the master alike (None: none).
    """

    hosts: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_sentinel_url(url: object) -> SentinelUrl | None:
    """Parse ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``.

    The port defaults to 26379 (Sentinel's), the database to 0; the user
    name and password are percent-decoded.

    :returns: None when ``url`` is not of that scheme (another URL, or None).
    :raises ValueError: a ``redis+sentinel`` URL without a host or a service
        name, with a port or database that is not a number, or with more
        path than ``/service/db``; the message carries no password.
    """
    if not isinstance(url, str) or not url.lower().startswith(SENTINEL_SCHEME + "://"):
        return None
    rest = url[len(SENTINEL_SCHEME) + 3 :]
    authority, _, path = rest.partition("/")
    path, _, _query = path.partition("?")
    userinfo, at, hostlist = authority.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon and secret else None
    hosts: list[tuple[str, int]] = []
    for item in (i.strip() for i in hostlist.split(",")):
        if item.startswith("["):  # an IPv6 address
            host, _, tail = item[1:].partition("]")
            port = tail.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if not host:
            raise ValueError("a sentinel without a host (host:port[,host:port...])")
        if port and not port.isdigit():
            raise ValueError(f"the sentinel port {port!r} is not a number")
        hosts.append((host, int(port) if port else 26379))
    parts = [unquote(p) for p in path.split("/")] if path else []
    if parts and parts[-1] == "":
        parts.pop()
    if not parts or not parts[0]:
        raise ValueError("no service name (redis+sentinel://host:port/service_name/db)")
    if len(parts) > 2:
        raise ValueError("too much path (redis+sentinel://host:port/service_name/db)")
    db = parts[1] if len(parts) == 2 else "0"
    if not db.isdigit():
        raise ValueError(f"the database {db!r} is not a number (.../service_name/DB)")
    return SentinelUrl(tuple(hosts), parts[0], int(db), username, password)


def secrets_of(url: str | None) -> list[str]:
    """The passwords (and secret query values) a URL carries, to :func:`scrub`."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
        found += [v for k, v in parse_qsl(parts.query) if _SECRET_PARAM.search(k) and v]
    except ValueError:
        return []
    return [s for s in found if s]


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every secret in ``secrets`` replaced by ``****``.

    For messages of other libraries, which may quote what they were given.
    Secrets shorter than 4 characters are left alone (they would mangle
    the text, and libraries' messages do not quote them anyway).
    """
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) >= 4 and secret != _MASK:
            text = text.replace(secret, _MASK)
    return text


def worker_id(settings: BaseSettings) -> str:
    """This worker's id: ``FRONTIER_WORKER_ID``, or ``<hostname>:<pid>``
    when it is empty (its default)."""
    return str(setting_value(settings, "FRONTIER_WORKER_ID")) or (
        f"{socket.gethostname()}:{os.getpid()}"
    )


# -- fatal configuration errors ------------------------------------------------

_errors: WeakKeyDictionary[Crawler, list[str]] = WeakKeyDictionary()
_stopping: WeakKeyDictionary[Crawler, bool] = WeakKeyDictionary()


def config_error_of(crawler: Crawler) -> str | None:
    """The (first) configuration error reported for ``crawler``, or None."""
    errors = _errors.get(crawler)
    return errors[0] if errors else None


def report_config_error(crawler: Crawler, message: str) -> None:
    """Log ``message`` (one line, level ERROR) and record it for ``crawler``.

    A message reported before for ``crawler`` is not logged again (each
    component that meets the error reports it); another one is (Redis and
    MongoDB may both be misconfigured: both are said at once).
    """
    errors = _errors.setdefault(crawler, [])
    if message not in errors:
        errors.append(message)
        logger.error("Configuration error: %s", message, extra={"spider": crawler.spider})


def close_at_open(crawler: Crawler, message: str) -> CloseSpider:
    """Report ``message`` met while the crawl opens, and return the
    ``CloseSpider(config_error)`` to raise: Scrapy closes the spider once
    its start-up is done, and the other components do not ask again."""
    report_config_error(crawler, message)
    _stopping[crawler] = True
    return CloseSpider(CONFIG_ERROR_REASON)


def stop_on_config_error(crawler: Crawler, message: str) -> bool:
    """Report ``message`` (:func:`report_config_error`) and close the spider
    with the finish reason :data:`CONFIG_ERROR_REASON`.

    Safe to call from any component on the reactor thread, while the crawl
    runs or closes (the close is scheduled, not run inside the caller), as
    often as it meets the error.

    :returns: whether this call asked for the close (False: an earlier one
        did).
    """
    report_config_error(crawler, message)
    if _stopping.get(crawler):
        return False
    _stopping[crawler] = True
    try:
        engine: Any = crawler.engine
    except RuntimeError:  # no engine yet
        return True
    close = getattr(engine, "close_spider_async", None)
    if close is not None and getattr(engine, "spider", None) is not None:
        deferred_from_coro(close(reason=CONFIG_ERROR_REASON))
    return True


# -- the settings table ----------------------------------------------------------


class _Invalid(ValueError):
    """A value a :class:`Kind` refuses; ``detail`` says more than ``allowed``
    (``whole``: it says all, in place of "must be <allowed>")."""

    def __init__(self, detail: str = "", *, whole: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.whole = whole or detail.startswith("must ")


@dataclass(frozen=True)
class Kind:
    """What values a setting takes.

    :ivar allowed: how the error message words it, after "must be".
    :ivar check: raises ``ValueError`` / ``TypeError`` for a bad value (an
        :class:`_Invalid` with a detail when "must be ..." is not enough).
        None (unset) is never checked: Scrapy's getters read it as the
        component's default.
    :ivar nullable: None is the setting's default (a value worked out at
        start), so the text ``None`` means unset too (:func:`is_unset`).
    """

    allowed: str
    check: Callable[[Any], object]
    nullable: bool = False


#: Texts that mean "unset" for a setting whose default is None: what
#: ``-s NAME=None`` (or ``-s NAME=``) gives, since ``-s`` values are text.
_UNSET_TEXTS = frozenset({"", "none"})


def is_unset(settings: BaseSettings, name: str) -> bool:
    """Whether ``name`` is unset: None, or the text ``None`` (any case) or
    empty, so that ``-s FRONTIER_SHARDS=None`` asks for the default as
    leaving it out does. For settings whose default is None (``nullable``)."""
    value = settings.get(name)
    return value is None or (isinstance(value, str) and value.strip().lower() in _UNSET_TEXTS)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def number(
    kind: type[int] | type[float],
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    unit: str = "",
    nullable: bool = False,
) -> Kind:
    """A whole number (``int``) or a number (``float``) within a range.

    Accepts what Scrapy's ``getint`` / ``getfloat`` read (numbers and their
    text, as ``-s`` gives them), but neither bools, NaN, infinities, nor
    (for ``int``) fractions, which ``getint`` would truncate silently.
    ``nullable`` says, in the message, that None (unset) means a default;
    the text ``None`` is unset too (:func:`is_unset`, checked before).
    """
    what = "a whole number" if kind is int else "a number"
    if unit:
        what += f" of {unit}"
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    allowed = f"{what} {' and '.join(bounds)}".strip()
    if nullable:
        allowed += " (or None)"

    def check(value: Any) -> None:
        if _is_bool(value) or isinstance(value, (list, dict, tuple, set)):
            raise _Invalid()
        parsed = float(value)  # ValueError / TypeError for text that is no number
        if not math.isfinite(parsed):
            raise _Invalid()
        if kind is int:
            if isinstance(value, str):
                int(value.strip())  # "2.5" is no whole number
            elif parsed != int(parsed):
                raise _Invalid()
        if low is not None and (parsed < low or (low_open and parsed == low)):
            raise _Invalid()
        if high is not None and (parsed > high or (high_open and parsed == high)):
            raise _Invalid()

    return Kind(allowed, check, nullable)


def _check_bool(value: Any) -> None:
    BaseSettings({"X": value}).getbool("X")  # Scrapy's own reading: ValueError if not


FLAG = Kind("True or False (also 1/0, true/false)", _check_bool)


def false_only(why: str) -> Kind:
    """A flag the crawler only works with off."""

    def check(value: Any) -> None:
        _check_bool(value)
        if BaseSettings({"X": value}).getbool("X"):
            raise _Invalid(f"must be False: {why}")

    return Kind("False", check)


def text(*, empty: bool = False, check: Callable[[str], object] | None = None,
         allowed: str = "") -> Kind:
    """A string (non-empty unless ``empty``), checked further by ``check``."""
    words = allowed or ("a string" if empty else "a non-empty string")

    def check_text(value: Any) -> None:
        if not isinstance(value, str) or (not empty and not value.strip()):
            raise _Invalid()
        if check is not None:
            check(value)

    return Kind(words, check_text)


def json_dict(value: Any) -> dict[Any, Any]:
    """What Scrapy's ``getdict`` reads: a dict, or a JSON object as text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _Invalid(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if isinstance(value, Mapping):
        return dict(value)
    try:  # a BaseSettings (Scrapy keeps dict settings as such)
        return dict(value.copy_to_dict())
    except AttributeError:
        raise _Invalid() from None


def dictionary(check: Callable[[dict[Any, Any]], object] | None = None,
               allowed: str = "a dict, or a JSON object") -> Kind:
    """A dict (a JSON object when given as text), checked further by ``check``."""

    def check_dict(value: Any) -> None:
        parsed = json_dict(value)
        if check is not None:
            check(parsed)

    return Kind(allowed, check_dict)


def _check_list_of_statuses(value: Any) -> None:
    items = value.split(",") if isinstance(value, str) else list(value)
    for item in items:
        status = int(str(item).strip())
        if not 100 <= status <= 599:
            raise _Invalid()


def _check_object_path(value: Any) -> None:
    if not isinstance(value, str):
        if callable(value):
            return
        raise _Invalid()
    try:
        load_object(value)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise _Invalid(f"cannot be imported ({exc})") from None


def _check_serializer(value: Any) -> None:
    if isinstance(value, str):
        try:
            value = importlib.import_module(value)
        except ImportError as exc:
            raise _Invalid(f"cannot be imported ({exc})") from None
    if not (callable(getattr(value, "loads", None)) and callable(getattr(value, "dumps", None))):
        raise _Invalid("must be a module (or object) with loads() and dumps()")


def _format_check(field: str) -> Callable[[str], object]:
    def check(value: str) -> None:
        try:
            value % {field: "x"}
        except (KeyError, ValueError, TypeError) as exc:
            raise _Invalid(
                f"must be a key template with at most %({field})s in it ({exc!r})"
            ) from None

    return check


def _check_dir_place(value: str) -> None:
    """Refuse a directory path that cannot be written in: the closest part
    of it that exists is no directory, or this process may not write in it.
    Nothing is created (a spill directory is made only when needed, which
    is too late to learn that it cannot be)."""
    path = Path(value).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise _Invalid(f"{path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise _Invalid(f"this process may not write in {path}")


def _check_seed_key(value: str) -> None:
    _format_check("name")(value)
    try:
        intake_base(value % {"name": "spider"})
    except ValueError as exc:
        raise _Invalid(str(exc)) from None


def _site_check(kind: str) -> Callable[[dict[Any, Any]], object]:
    def check(value: dict[Any, Any]) -> None:
        try:
            parse_site_settings(kind, value)  # type: ignore[arg-type]
        except ValueError as exc:
            raise _Invalid(f"{exc}") from None

    return check


def _check_download_slots(value: dict[Any, Any]) -> None:
    try:
        parse_download_slots(value)
    except ValueError as exc:
        raise _Invalid(f"{exc}") from None


def _check_redis_url(value: str) -> None:
    try:
        if parse_sentinel_url(value) is not None:
            return
    except ValueError as exc:
        raise _Invalid(f"not a Redis Sentinel URL ({exc})") from None
    try:
        parse_url(value)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError) as exc:
        raise _Invalid(f"not a Redis URL ({exc})") from None
    parts = urlsplit(value)
    path = parts.path.lstrip("/")
    if parts.scheme in ("redis", "rediss") and path and not path.isdigit():
        # redis-py ignores a path that is not a number: database 0, maybe
        # another crawl's.
        raise _Invalid(f"the database {path!r} is not a number (redis://host:port/DB)")


def _check_mongo_uri(value: str) -> None:
    if value.startswith("mongodb+srv://"):
        return  # parsing resolves DNS: the pipeline finds out when it opens
    try:
        parse_uri(value)  # strict: an unknown or bad option is an error here
    except (PyMongoError, ValueError) as exc:
        raise _Invalid(f"not a MongoDB URI pymongo accepts ({exc})") from None


def _check_mongo_name(what: str, bad: str) -> Callable[[str], object]:
    def check(value: str) -> None:
        if any(ch in value for ch in bad) or "\x00" in value or len(value.encode()) > 63:
            raise _Invalid(
                f"must be a MongoDB {what} name: at most 63 bytes, none of {bad!r}"
            )

    return check


def _check_dead_collection(value: str) -> None:
    _check_mongo_name("collection", "$")(value)
    if value.startswith("system."):
        raise _Invalid("must not start with 'system.'")


_REDIS_NUMERIC_PARAMS = ("socket_timeout", "socket_connect_timeout", "health_check_interval")


def _check_redis_params(params: dict[Any, Any]) -> None:
    """Values redis-py would only refuse at the first connection."""
    for key in _REDIS_NUMERIC_PARAMS:
        if key in params and params[key] is not None:
            try:
                number(float, 0, low_open=key != "health_check_interval").check(params[key])
            except (ValueError, TypeError):
                raise _Invalid(
                    f"{key} must be a number of seconds > 0 (or null)", whole=True
                ) from None
    for key in ("db", "port"):
        if key in params:
            try:
                number(int, 0).check(params[key])
            except (ValueError, TypeError):
                raise _Invalid(f"{key} must be a whole number >= 0", whole=True) from None
    if params.get("decode_responses"):
        raise _Invalid("decode_responses must be false: the frontier reads bytes", whole=True)


@dataclass(frozen=True)
class Setting:
    """One row of :data:`SETTINGS`: what a setting takes and what it means.

    :ivar kind: the allowed values (:class:`Kind`).
    :ivar meaning: one line, for the docs and the error.
    :ivar secret: the value may carry credentials (masked in messages).
    :ivar default: the value when unset, for the project's own settings
        (the one place it is written; :class:`FrontierConfig` reads it);
        :data:`SCRAPYS` for Scrapy's and scrapy-redis's settings, whose
        defaults are theirs (``scrapy.settings.default_settings``,
        ``scrapy_redis.defaults``).
    """

    kind: Kind
    meaning: str
    secret: bool = False
    default: Any = None

    #: The display of a value in an error line.
    MAX_SHOWN: ClassVar[int] = 200

    def shown(self, value: Any) -> str:
        """``value`` as the error line shows it (masked when secret)."""
        if isinstance(value, str) and self.secret:
            if "://" in value:
                shown = masked_url(value)
            else:
                try:
                    shown = _masked_json(json_dict(value))
                except ValueError:
                    shown = _MASK if _SECRET_PARAM.search(value) else value
        elif isinstance(value, str):
            shown = value
        elif self.secret and isinstance(value, Mapping):
            shown = _masked_json(dict(value))
        elif self.secret:
            shown = _MASK
        else:
            try:
                shown = json.dumps(value, default=repr)
            except (TypeError, ValueError):
                shown = repr(value)
        if shown == "":
            shown = "''"
        return shown if len(shown) <= self.MAX_SHOWN else shown[: self.MAX_SHOWN] + "..."


def _masked_json(value: dict[Any, Any]) -> str:
    """A dict as JSON, the values of secret keys (``password``, ...) masked."""
    masked = {k: _MASK if _SECRET_PARAM.search(str(k)) else v for k, v in value.items()}
    return json.dumps(masked, default=repr)


#: :attr:`Setting.default` of a setting that is Scrapy's or scrapy-redis's:
#: its default is theirs.
SCRAPYS: Any = type("ScrapysDefault", (), {"__repr__": lambda self: "SCRAPYS"})()


def _s(kind: Kind, meaning: str, *, secret: bool = False, default: Any = SCRAPYS) -> Setting:
    return Setting(kind, meaning, secret, default)


_ANY = Kind("any value", lambda value: None)
_SECONDS_POS = number(float, 0, low_open=True, unit="seconds")
_SECONDS = number(float, 0, unit="seconds")
_COUNT_POS = number(int, 1)
_COUNT = number(int, 0)

#: Every setting the project adds, and the Scrapy and scrapy-redis settings
#: its components read: name -> :class:`Setting`. ``tests/test_config_errors.py``
#: checks that every setting read in ``crawler/`` is here.
SETTINGS: dict[str, Setting] = {
    # --- connections
    "REDIS_URL": _s(text(check=_check_redis_url, allowed="a redis://, rediss://, unix:// or "
                                                      "redis+sentinel:// URL"),
                    "the Redis server (a Redis Cluster node, or Redis Sentinels) of the crawl",
                    secret=True),
    "REDIS_HOST": _s(text(), "Redis host when REDIS_URL is not set (scrapy-redis)"),
    "REDIS_PORT": _s(number(int, 1, 65535), "Redis port when REDIS_URL is not set (scrapy-redis)"),
    "REDIS_DB": _s(_COUNT, "Redis database number, over REDIS_URL's (scrapy-redis)"),
    "REDIS_PARAMS": _s(dictionary(_check_redis_params, "a dict, or a JSON object, of redis-py "
                                  "client options"),
                       "redis-py client options, merged over the project's fail-fast timeouts",
                       secret=True),
    "REDIS_ENCODING": _s(text(check="".encode, allowed="a text encoding"),
                         "encoding of text sent to Redis (scrapy-redis)"),
    "REDIS_DECODE_RESPONSES": _s(false_only("the frontier reads bytes"),
                                 "decode Redis replies (scrapy-redis); must stay off"),
    "REDIS_START_URLS_KEY": _s(text(check=_check_seed_key), "the seed list, %(name)s is the "
                               "spider's name (scrapy-redis)"),
    "REDIS_START_URLS_AS_SET": _s(FLAG, "read seeds from a set instead of a list "
                                  "(scrapy-redis)"),
    "REDIS_START_URLS_AS_ZSET": _s(FLAG, "read seeds from a sorted set (scrapy-redis); "
                                   "refused when on (crawler.frontier.compat)"),
    "FRONTIER_REDIS_CLUSTER": _s(FLAG, "REDIS_URL names a node of a Redis Cluster",
        default=False),
    "FRONTIER_ALLOW_EVICTION": _s(FLAG, "run on a Redis that may evict keys, accepting lost "
                                  "work (default False: refused)",
        default=False),
    "MONGO_URI": _s(text(check=_check_mongo_uri, allowed="a mongodb:// or mongodb+srv:// URI"),
                    "the MongoDB server that stores the items (unset: no MongoDB pipeline)",
                    secret=True, default=None),
    "MONGO_DATABASE": _s(text(check=_check_mongo_name("database", '/\\. "$')),
                         "the MongoDB database of the items",
        default="crawler"),
    # --- scrapy-redis components (their names)
    "SCHEDULER_PERSIST": _s(FLAG, "keep the frontier when a worker closes"),
    "SCHEDULER_FLUSH_ON_START": _s(FLAG, "delete the frontier when a worker starts"),
    "SCHEDULER_QUEUE_KEY": _s(text(check=_format_check("spider")), "prefix of the frontier's "
                              "keys, %(spider)s is the spider's name"),
    "SCHEDULER_QUEUE_CLASS": _s(Kind("an importable class path", _check_object_path),
                                "the frontier queue class"),
    "SCHEDULER_DUPEFILTER_KEY": _s(text(check=_format_check("spider")),
                                   "the dupefilter's key, %(spider)s is the spider's name"),
    "SCHEDULER_SERIALIZER": _s(Kind("a module path with loads() and dumps()",
                                    _check_serializer), "how requests are stored (JSON if unset)"),
    "DUPEFILTER_CLASS": _s(Kind("an importable class path", _check_object_path),
                           "the dupefilter class"),
    "DUPEFILTER_DEBUG": _s(FLAG, "log every filtered duplicate"),
    "MAX_IDLE_TIME_BEFORE_CLOSE": _s(number(int, 0, unit="seconds"),
                                     "idle seconds before a worker closes (0: never)"),
    # scrapy-redis's, not used by the frontier (docs/scrapy-redis.md: What our components
    # change in scrapy-redis 0.9.1); listed so that they are not taken for typos
    **{name: _s(_ANY, "scrapy-redis's; " + why) for name, why in (
        ("REDIS_ITEMS_KEY", "its RedisPipeline's list"),
        ("REDIS_ITEMS_SERIALIZER", "its RedisPipeline's serializer"),
        ("REDIS_START_URLS_BATCH_SIZE", "deprecated, not read by 0.9.1"),
        ("REDIS_CONCURRENT_REQUESTS", "a defaults.py name, not read"),
        ("REDIS_CLS", "a defaults.py name; REDIS_PARAMS['redis_cls'] is read"),
        ("SCHEDULER_DUPEFILTER_CLASS", "ignored, as scrapy-redis ignores it"),
        ("SCHEDULER_IDLE_BEFORE_CLOSE", "ignored: the scheduler never blocks on Redis"),
        ("STATS_KEY", "its RedisStatsCollector's key"),
        ("DUPEFILTER_KEY", "a defaults.py name, not read"),
        ("PIPELINE_KEY", "a defaults.py name, not read"),
    )},
    # --- Scrapy's, as our components read them
    "DOWNLOAD_TIMEOUT": _s(_SECONDS_POS, "seconds a download may take"),
    "DOWNLOAD_MAXSIZE": _s(_COUNT, "largest response body, bytes (0: no limit)"),
    "DOWNLOAD_DELAY": _s(_SECONDS, "seconds between two requests to a site (the whole cluster)"),
    "DOWNLOAD_DELAY_JITTER": _s(number(float, 0), "each gap between two requests to a site "
                                "is drawn in [1, 1 + this) x its delay (the whole cluster)"),
    "RANDOMIZE_DOWNLOAD_DELAY": _s(FLAG, "deprecated by Scrapy: DOWNLOAD_DELAY_JITTER 0.5 or 0"),
    "CONCURRENT_REQUESTS": _s(_COUNT_POS, "downloads at once in one worker"),
    "CONCURRENT_REQUESTS_PER_DOMAIN": _s(_COUNT_POS, "downloads at once per site (the whole "
                                         "cluster)"),
    "DOWNLOAD_SLOTS": _s(dictionary(_check_download_slots, "a dict of slot -> {'delay': "
                                    "seconds >= 0, 'concurrency': whole number >= 1}"),
                         "per download slot delay and concurrency (the whole cluster)"),
    "DOWNLOADER_MIDDLEWARES": _s(dictionary(), "downloader middlewares, by class path "
                                 "(which robots.txt middleware is enabled)"),
    "DOWNLOADER": _s(Kind("an importable class path", _check_object_path),
                     "each worker's downloader (the add-on sets the frontier's)"),
    "SCHEDULER": _s(Kind("an importable class path", _check_object_path),
                    "the scheduler (ours switches the frontier on: scrapy crawl checks "
                    "these settings then)"),
    "ADDONS": _s(dictionary(), "add-ons, by class path (crawler.addon.FrontierAddon "
                 "switches the frontier on)"),
    "ITEM_PIPELINES": _s(dictionary(), "item pipelines, by class path (which collections "
                         "scrapy frontier status counts)"),
    "ROBOTSTXT_OBEY": _s(FLAG, "obey robots.txt"),
    "RETRY_ENABLED": _s(FLAG, "retry failed downloads"),
    "RETRY_TIMES": _s(_COUNT, "retries of a failed download"),
    "RETRY_HTTP_CODES": _s(Kind("a list of HTTP status codes (100-599)", _check_list_of_statuses),
                           "statuses that are retried"),
    "RETRY_PRIORITY_ADJUST": _s(number(int), "priority change of a retried request"),
    "RETRY_GIVE_UP_LOG_LEVEL": _s(_ANY, "log level of Scrapy's 'Gave up retrying' line "
                                  "(the frontier's default: DEBUG, the dead letter's WARNING "
                                  "says it; set it to have Scrapy's line back)"),
    "DEPTH_LIMIT": _s(_COUNT, "most link hops from a seed (0: no limit)"),
    "LOG_ENABLED": _s(FLAG, "log at all"),
    # --- frontier
    "FRONTIER_DELAY": _s(number(float, 0, unit="seconds", nullable=True),
                         "seconds between requests to a site; None: DOWNLOAD_DELAY",
        default=None),
    "FRONTIER_CONCURRENCY": _s(number(int, 1, nullable=True),
                               "downloads at once per site; None: CONCURRENT_REQUESTS_PER_DOMAIN",
        default=None),
    "FRONTIER_DELAY_MARGIN": _s(number(float, 0), "fraction a site's delay is stretched by",
        default=0.1),
    "FRONTIER_SITE_DELAYS": _s(dictionary(_site_check("delay"),
                                          "a dict of site -> seconds >= 0"),
                               "per-site delays",
        default={}),
    "FRONTIER_SITE_CONCURRENCY": _s(dictionary(_site_check("conc"),
                                               "a dict of site -> whole number >= 1"),
                                    "per-site concurrency",
        default={}),
    "FRONTIER_ROBOTS_TTL": _s(_SECONDS_POS, "seconds a stored robots.txt is used",
        default=86400.0),
    "FRONTIER_ROBOTS_LOCK_SECONDS": _s(number(float, 1, unit="seconds"),
                                       "seconds a worker's lock on fetching "
                                       "a robots.txt lives unless renewed",
        default=10.0),
    "FRONTIER_ROBOTS_RETRY_BASE": _s(_SECONDS_POS, "seconds before robots.txt is fetched "
                                     "again after it was unreachable (doubling after that)",
        default=2.0),
    "FRONTIER_ROBOTS_RETRY_MAX": _s(_SECONDS_POS, "longest wait between two fetches of an "
                                    "unreachable robots.txt",
        default=300.0),
    "FRONTIER_ADAPTIVE_ENABLED": _s(FLAG, "slow a site down on 429/503 and slow responses",
        default=True),
    "FRONTIER_ADAPTIVE_START": _s(_SECONDS_POS, "first extra delay of a slowed site",
        default=1.0),
    "FRONTIER_ADAPTIVE_MAX": _s(_SECONDS_POS, "largest extra delay of a slowed site",
        default=60.0),
    "FRONTIER_ADAPTIVE_LATENCY": _s(_SECONDS_POS, "latency that counts as slow",
        default=5.0),
    "FRONTIER_LEASE_TIMEOUT": _s(_SECONDS_POS, "seconds a lease lasts without a heartbeat",
        default=60.0),
    "FRONTIER_MAX_DELIVERIES": _s(_COUNT, "deliveries before a request is dead-lettered "
                                  "(0: no limit)",
        default=5),
    "FRONTIER_SEED_BATCH": _s(_COUNT_POS, "most seeds moved into the frontier at once",
        default=1000),
    "FRONTIER_LEASE_BATCH": _s(_COUNT_POS, "most requests one lease call takes",
        default=16),
    "FRONTIER_LOCAL_SEEN": _s(_COUNT, "fingerprints a worker remembers (0: off)",
        default=100_000),
    "FRONTIER_OUTBOX_DELAY": _s(_SECONDS, "seconds writes wait for the next lease call",
        default=0.05),
    "FRONTIER_MIN_REPLICAS": _s(_COUNT, "replicas that must acknowledge writes (WAIT)",
        default=0),
    "FRONTIER_MIN_REPLICAS_TIMEOUT": _s(_SECONDS_POS, "seconds writes wait for "
                                        "FRONTIER_MIN_REPLICAS replicas",
        default=1.0),
    "FRONTIER_IDLE_WAIT": _s(_SECONDS_POS, "seconds an idle worker blocks on the seed list",
        default=1.0),
    "FRONTIER_RETRY_BACKOFF_BASE": _s(_SECONDS, "seconds before the first retry",
        default=1.0),
    "FRONTIER_RETRY_BACKOFF_MAX": _s(_SECONDS, "longest wait before a retry",
        default=60.0),
    "FRONTIER_RETRY_JITTER": _s(number(float, 0, 1), "fraction a retry's wait is stretched by",
        default=0.1),
    "FRONTIER_RETRY_AFTER_MAX": _s(_SECONDS, "longest Retry-After obeyed",
        default=600.0),
    "FRONTIER_REVISIT_AFTER": _s(_SECONDS, "seconds after its fetch a page is requested again, "
                                 "conditionally (0: never)",
        default=0.0),
    "FRONTIER_SITE_REVISITS": _s(dictionary(_site_check("revisit"),
                                            "a dict of site -> seconds >= 0"),
                                 "per-site revisit intervals",
        default={}),
    "FRONTIER_STAY_ON_SEED_HOSTS": _s(FLAG, "follow links only on the seeds' hosts",
        default=True),
    "FRONTIER_SHARDS": _s(number(int, 1, 256, nullable=True),
                          "shards of the crawl's frontier, each its own Redis Cluster slot "
                          "(every worker of a crawl the same); None: 16 on a cluster, else 1",
        default=None),
    "FRONTIER_FIFO_SLACK": _s(_SECONDS, "seconds a sharded crawl's "
                              "first in, first out across shards may be off by",
        default=0.0),
    "FRONTIER_BLOOM_CAPACITY": _s(_COUNT_POS, "URLs the Bloom filter is sized for "
                                  "(all shards together)",
        default=10_000_000),
    "FRONTIER_BLOOM_ERROR_RATE": _s(number(float, 0, 1, low_open=True, high_open=True),
                                    "false-positive rate of the Bloom filter",
        default=0.001),
    # --- operations
    "FRONTIER_STATS_ENABLED": _s(FLAG, "keep cluster-wide stats and heartbeats in Redis",
        default=True),
    "FRONTIER_HEARTBEAT_INTERVAL": _s(_SECONDS_POS, "seconds between a worker's heartbeats",
        default=5.0),
    "FRONTIER_CLOCK_SKEW_WARN": _s(_SECONDS, "seconds of offset to the servers' clock "
                                   "that are logged as a warning",
        default=2.0),
    "FRONTIER_CONTROL_INTERVAL": _s(_SECONDS_POS, "seconds between two reads of the "
                                    "crawl's state (pause, resume, stop)",
        default=1.0),
    "FRONTIER_WORKER_TIMEOUT": _s(_SECONDS_POS, "seconds after which a silent worker is dead "
                                  "for the status",
        default=30.0),
    "FRONTIER_WORKER_ID": _s(text(empty=True), "this worker's id (empty: host:pid)",
        default=""),
    "FRONTIER_STATUS_MAX_PRIORITIES": _s(_COUNT_POS, "priorities the status reports per spider",
        default=100),
    "FRONTIER_HOUSEKEEPING_INTERVAL": _s(_SECONDS, "seconds between two housekeeping runs "
                                         "of a worker (0: none)",
        default=30.0),
    "FRONTIER_HOUSEKEEPING_BATCH": _s(_COUNT_POS, "sites looked at per housekeeping run, "
                                       "over all shards",
        default=200),
    "FRONTIER_WORKER_FORGET_AFTER": _s(_SECONDS, "seconds after its last heartbeat that a "
                                       "worker's record is removed",
        default=86400.0),
    "FRONTIER_DEAD_LETTERS_MAX": _s(_COUNT, "newest dead letters kept, all shards "
                                     "(0: no cap)",
        default=100_000),
    "FRONTIER_SITE_FORGET_AFTER": _s(_SECONDS, "seconds without work after which a site's "
                                     "state is deleted",
        default=3600.0),
    "METRICS_HOST": _s(text(), "address the Prometheus exporter binds",
        default="127.0.0.1"),
    "METRICS_PORT": _s(number(int, 1, 65535), "port of the Prometheus exporter",
        default=9410),
    "LOG_JSON_ENABLED": _s(FLAG, "log JSON lines",
        default=False),
    # --- MongoDB pipeline
    "MONGO_BATCH_SIZE": _s(_COUNT_POS, "documents per bulk write",
        default=500),
    "MONGO_FLUSH_INTERVAL": _s(_SECONDS_POS, "seconds before a partial batch is written",
        default=0.25),
    "MONGO_SPILL_AFTER": _s(_COUNT, "waiting documents before they spill to a file",
        default=10_000),
    "MONGO_SPILL_DIR": _s(text(check=_check_dir_place, allowed="a directory the worker can "
                               "create and write in"), "directory of the spill files",
        default="spill"),
    "MONGO_DEAD_COLLECTION": _s(text(check=_check_dead_collection),
                                "collection of items MongoDB rejects",
        default="dead_items"),
    "MONGO_ITEM_IDS_ENABLED": _s(FLAG, "derive the _id of items without a key",
        default=True),
    # --- WARC archive (crawler.warc)
    "DEFAULT_REQUEST_HEADERS": _s(dictionary(), "headers of every request (a revisit is "
                                  "stored without those left at these values)"),
    "USER_AGENT": _s(text(empty=True), "User-Agent header (named in the warcinfo records)"),
    "WARC_DIR": _s(text(empty=True), "directory of the WARC files (empty: none written)",
        default=""),
    "WARC_MAX_SIZE": _s(number(int, 1, unit="bytes"), "bytes after which a WARC file is "
                        "closed and the next one started",
        default=1_000_000_000),
}


def _problem(name: str, row: Setting, value: Any, exc: BaseException) -> str:
    """One error line: the setting, its value and what is allowed."""
    detail = exc.detail if isinstance(exc, _Invalid) else ""
    line = f"{name}={row.shown(value)}: "
    if isinstance(exc, _Invalid) and exc.whole:
        return line + detail
    line += f"must be {row.kind.allowed}"
    return f"{line} ({detail})" if detail else line


#: Pairs of settings (least, most) whose first must not exceed the second.
ORDERED: tuple[tuple[str, str], ...] = (
    ("FRONTIER_ROBOTS_RETRY_BASE", "FRONTIER_ROBOTS_RETRY_MAX"),
    ("FRONTIER_RETRY_BACKOFF_BASE", "FRONTIER_RETRY_BACKOFF_MAX"),
    ("FRONTIER_ADAPTIVE_START", "FRONTIER_ADAPTIVE_MAX"),
    ("FRONTIER_HEARTBEAT_INTERVAL", "FRONTIER_WORKER_TIMEOUT"),
    ("FRONTIER_WORKER_TIMEOUT", "FRONTIER_WORKER_FORGET_AFTER"),
)


def order_problems(settings: BaseSettings) -> list[str]:
    """One line per pair of :data:`ORDERED` out of order (each value alone
    passed its row's check)."""
    out = []
    for low, high in ORDERED:
        a = float(setting_value(settings, low))
        b = float(setting_value(settings, high))
        if a > b:
            out.append(f"{low}={a:g} and {high}={b:g}: {low} must not exceed {high}")
    return out


def row_problems(settings: BaseSettings) -> list[str]:
    """One error line per setting of :data:`SETTINGS` whose value its row
    refuses; unset ones (None, or the text ``None`` where the default is
    None) always pass.

    :returns: lines such as ``FRONTIER_SEED_BATCH=0: must be a whole number
        >= 1`` (credentials masked), in the table's order; empty: all pass.
    """
    problems = []
    for name, row in SETTINGS.items():
        value = settings.get(name)
        if value is None:  # unset: the default of the table (or Scrapy's)
            continue
        if row.kind.nullable and is_unset(settings, name):
            continue
        try:
            row.kind.check(value)
        except (ValueError, TypeError, LookupError) as exc:
            problems.append(_problem(name, row, value, exc))
    return problems


def warn_unknown_settings(settings: BaseSettings) -> None:
    """Log a WARNING for each setting of ``settings`` that looks like one
    of the project's but is none (:func:`is_unknown`), naming the nearest
    known setting."""
    for name in settings:
        if isinstance(name, str) and is_unknown(name):
            near = difflib.get_close_matches(name, SETTINGS, n=1, cutoff=0.6)
            logger.warning("Unknown setting %s (not one of the project's): a typo?%s", name,
                           f" The nearest known setting is {near[0]}." if near else "")


def is_unknown(name: str) -> bool:
    """Whether ``name`` looks like one of the project's settings but is
    none: it has one of :data:`OWN_PREFIXES` or ``REDIS_`` (the settings
    scrapy-redis reads are in :data:`SETTINGS`), or its
    first word is a near miss of one of :data:`_TYPO_WORDS` (``FRONTEIR_``);
    and it is not in :data:`SETTINGS` nor one of Scrapy's settings."""
    if name in SETTINGS or hasattr(default_settings, name):
        return False
    if name.startswith((*OWN_PREFIXES, "REDIS_")):
        return True
    word = name.split("_", 1)[0]
    return "_" in name and word not in _TYPO_WORDS and bool(
        difflib.get_close_matches(word, _TYPO_WORDS, n=1, cutoff=0.8)
    )


# -- the typed configuration -----------------------------------------------------


def setting_value(settings: BaseSettings, name: str) -> Any:
    """The value of the project's own setting ``name`` in ``settings``, typed
    as its row of :data:`SETTINGS` says: the row's default when unset (None,
    or, where the default is None, the text ``None`` or empty), else the
    value read as the default's type (``getbool``, ``getint``,
    ``getfloat``, ``getdict``, or text).

    Values are read as Scrapy's getters read them; their checks are
    :func:`row_problems`' (a worker refuses bad ones before it starts).

    :raises KeyError: ``name`` is not in :data:`SETTINGS` or is Scrapy's
        or scrapy-redis's (read those with Scrapy's getters: their
        defaults are theirs).
    """
    row = SETTINGS[name]
    default = row.default
    if default is SCRAPYS:
        raise KeyError(f"{name} is Scrapy's or scrapy-redis's: read it with Scrapy's getters")
    value = settings.get(name)
    if value is None or (row.kind.nullable and is_unset(settings, name)):
        return dict(default) if isinstance(default, dict) else default
    read: Callable[[str], Any]
    if isinstance(default, bool):
        read = settings.getbool
    elif isinstance(default, dict):
        read = settings.getdict
    elif isinstance(default, int) or (
        default is None and row.kind.allowed.startswith("a whole")
    ):
        read = settings.getint
    elif isinstance(default, float) or row.kind.allowed.startswith("a number"):
        read = settings.getfloat
    else:  # text
        read = lambda _name: str(value)  # noqa: E731
    return read(name)


def _c(name: str) -> Any:
    """A :class:`FrontierConfig` field for the setting ``name``: its default
    is the row's (:attr:`Setting.default`)."""
    default = SETTINGS[name].default
    meta = {"setting": name}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class FrontierConfig:
    """The project's own settings, read once and typed.

    Built with :meth:`from_settings` (or :meth:`of`, once per crawler);
    each field is one setting of :data:`SETTINGS`, named in its metadata
    (``dataclasses.fields(FrontierConfig)[i].metadata["setting"]``), with
    the row's default. Seconds are floats, counts ints; a field whose
    default is None (``delay``, ``concurrency``, ``shards``) is None when
    unset: the component works it out (``DOWNLOAD_DELAY``,
    ``CONCURRENT_REQUESTS_PER_DOMAIN``, 16 on a cluster or 1).

    Scrapy's and scrapy-redis's settings are not here: they are read with
    Scrapy's getters, with their own defaults.
    """

    # connections
    redis_cluster: bool = _c("FRONTIER_REDIS_CLUSTER")
    allow_eviction: bool = _c("FRONTIER_ALLOW_EVICTION")
    mongo_uri: str | None = _c("MONGO_URI")
    mongo_database: str = _c("MONGO_DATABASE")
    # politeness
    delay: float | None = _c("FRONTIER_DELAY")
    concurrency: int | None = _c("FRONTIER_CONCURRENCY")
    delay_margin: float = _c("FRONTIER_DELAY_MARGIN")
    site_delays: dict[str, Any] = field(
        default_factory=dict, metadata={"setting": "FRONTIER_SITE_DELAYS"}
    )
    site_concurrency: dict[str, Any] = field(
        default_factory=dict, metadata={"setting": "FRONTIER_SITE_CONCURRENCY"}
    )
    robots_ttl: float = _c("FRONTIER_ROBOTS_TTL")
    robots_lock_seconds: float = _c("FRONTIER_ROBOTS_LOCK_SECONDS")
    robots_retry_base: float = _c("FRONTIER_ROBOTS_RETRY_BASE")
    robots_retry_max: float = _c("FRONTIER_ROBOTS_RETRY_MAX")
    adaptive_enabled: bool = _c("FRONTIER_ADAPTIVE_ENABLED")
    adaptive_start: float = _c("FRONTIER_ADAPTIVE_START")
    adaptive_max: float = _c("FRONTIER_ADAPTIVE_MAX")
    adaptive_latency: float = _c("FRONTIER_ADAPTIVE_LATENCY")
    # leases, batches, writes
    lease_timeout: float = _c("FRONTIER_LEASE_TIMEOUT")
    max_deliveries: int = _c("FRONTIER_MAX_DELIVERIES")
    seed_batch: int = _c("FRONTIER_SEED_BATCH")
    lease_batch: int = _c("FRONTIER_LEASE_BATCH")
    local_seen: int = _c("FRONTIER_LOCAL_SEEN")
    outbox_delay: float = _c("FRONTIER_OUTBOX_DELAY")
    min_replicas: int = _c("FRONTIER_MIN_REPLICAS")
    min_replicas_timeout: float = _c("FRONTIER_MIN_REPLICAS_TIMEOUT")
    idle_wait: float = _c("FRONTIER_IDLE_WAIT")
    # retries, revisits, scope
    retry_backoff_base: float = _c("FRONTIER_RETRY_BACKOFF_BASE")
    retry_backoff_max: float = _c("FRONTIER_RETRY_BACKOFF_MAX")
    retry_jitter: float = _c("FRONTIER_RETRY_JITTER")
    retry_after_max: float = _c("FRONTIER_RETRY_AFTER_MAX")
    revisit_after: float = _c("FRONTIER_REVISIT_AFTER")
    site_revisits: dict[str, Any] = field(
        default_factory=dict, metadata={"setting": "FRONTIER_SITE_REVISITS"}
    )
    stay_on_seed_hosts: bool = _c("FRONTIER_STAY_ON_SEED_HOSTS")
    # scale
    shards: int | None = _c("FRONTIER_SHARDS")
    fifo_slack: float = _c("FRONTIER_FIFO_SLACK")
    bloom_capacity: int = _c("FRONTIER_BLOOM_CAPACITY")
    bloom_error_rate: float = _c("FRONTIER_BLOOM_ERROR_RATE")
    # operations
    stats_enabled: bool = _c("FRONTIER_STATS_ENABLED")
    heartbeat_interval: float = _c("FRONTIER_HEARTBEAT_INTERVAL")
    clock_skew_warn: float = _c("FRONTIER_CLOCK_SKEW_WARN")
    control_interval: float = _c("FRONTIER_CONTROL_INTERVAL")
    worker_timeout: float = _c("FRONTIER_WORKER_TIMEOUT")
    worker_id: str = _c("FRONTIER_WORKER_ID")
    status_max_priorities: int = _c("FRONTIER_STATUS_MAX_PRIORITIES")
    housekeeping_interval: float = _c("FRONTIER_HOUSEKEEPING_INTERVAL")
    housekeeping_batch: int = _c("FRONTIER_HOUSEKEEPING_BATCH")
    worker_forget_after: float = _c("FRONTIER_WORKER_FORGET_AFTER")
    dead_letters_max: int = _c("FRONTIER_DEAD_LETTERS_MAX")
    site_forget_after: float = _c("FRONTIER_SITE_FORGET_AFTER")
    metrics_host: str = _c("METRICS_HOST")
    metrics_port: int = _c("METRICS_PORT")
    log_json_enabled: bool = _c("LOG_JSON_ENABLED")
    # MongoDB pipeline
    mongo_batch_size: int = _c("MONGO_BATCH_SIZE")
    mongo_flush_interval: float = _c("MONGO_FLUSH_INTERVAL")
    mongo_spill_after: int = _c("MONGO_SPILL_AFTER")
    mongo_spill_dir: str = _c("MONGO_SPILL_DIR")
    mongo_dead_collection: str = _c("MONGO_DEAD_COLLECTION")
    mongo_item_ids_enabled: bool = _c("MONGO_ITEM_IDS_ENABLED")
    # WARC archive
    warc_dir: str = _c("WARC_DIR")
    warc_max_size: int = _c("WARC_MAX_SIZE")

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> FrontierConfig:
        """Read every field from ``settings`` (:func:`setting_value`).

        No check is made here: the worker checks its settings before it
        starts (:func:`crawler.checks.validate_settings`).

        :raises ValueError: a value Scrapy's getters cannot read as its
            type (a setting that was never checked).
        """
        return cls(**{
            f.name: setting_value(settings, f.metadata["setting"]) for f in fields(cls)
        })

    @classmethod
    def of(cls, crawler: Crawler) -> FrontierConfig:
        """The configuration of ``crawler``: read once its settings are
        frozen (as they are from the crawl's start), then the same object
        for every component; read again each call before that."""
        settings = crawler.settings
        if not settings.frozen:
            return cls.from_settings(settings)
        config = _configs.get(crawler)
        if config is None:
            config = _configs[crawler] = cls.from_settings(settings)
        return config

    @property
    def worker(self) -> str:
        """This worker's id: :attr:`worker_id`, or ``<hostname>:<pid>``."""
        return self.worker_id or f"{socket.gethostname()}:{os.getpid()}"


_configs: WeakKeyDictionary[Crawler, FrontierConfig] = WeakKeyDictionary()
