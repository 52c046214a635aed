"""Configuration errors are not outages (issue 12, case 4), settings are
checked before the crawl starts, and REDIS_PARAMS is merged, not replaced.

Real servers throughout: the session's redis-server (ACL users made and
deleted here), small redis-servers of this module's own started with
``--requirepass``, the session's MongoDB server (SecantusDB, or ``$MONGO_URI``)
for refused credentials, and a SecantusDB of this module's own started with
``--auth`` for a user without the right to write, and the session's Redis
Cluster for a node reached without FRONTIER_REDIS_CLUSTER. The exit paths
are real ``scrapy crawl`` processes: bad settings (a WARC_DIR or
MONGO_SPILL_DIR that cannot be written among them) and the wrong kind of
Redis for FRONTIER_REDIS_CLUSTER each stop a worker in one line.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
import redis
from pymongo.errors import ServerSelectionTimeoutError
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy import Spider, signals
from scrapy.exceptions import CloseSpider
from scrapy.settings import Settings, default_settings
from scrapy.utils.project import get_project_settings
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

import tests.scheduler_harness as harness
from crawler.addon import FrontierAddon
from crawler.checks import validate_settings
from crawler.commands.crawl import Command as CrawlCommand
from crawler.config import (
    CONFIG_ERROR_REASON,
    OWN_PREFIXES,
    SCRAPYS,
    SETTINGS,
    ConfigurationError,
    FrontierConfig,
    SettingsError,
    config_error_of,
    masked_url,
)
from crawler.extensions import ClusterStats
from crawler.frontier.connection import FAIL_FAST_PARAMS, config_error, get_redis
from crawler.frontier.housekeeping import FrontierHousekeeping
from crawler.frontier.slots import SitePolicy
from crawler.frontier.spider import FrontierSpider
from crawler.items import QuoteItem
from crawler.keys import CLUSTER_SHARDS, shard_count
from crawler.metrics import StatusCollector
from crawler.pipelines import MongoPipeline, mongo_config_error
from crawler.status import StatusReader
from devtools.embedded import MongoServer, RedisServer, free_port
from devtools.replay import Page
from tests.cluster import free_cluster_port
from tests.waiting import wait_for
from tests.workers import PROJECT_DIR, crawl, start_worker, wait_workers, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.conftest import SiteFactory

pytestmark = pytest.mark.usefixtures("stop_heartbeats")

HTML = [("Content-Type", "text/html")]

#: How long a misconfigured worker may take to exit, seconds ("within
#: seconds"; Scrapy's start-up is most of it on a busy machine).
EXIT_WITHIN = 20.0


class _Spider(FrontierSpider):
    name = "config_test"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None


# -- servers of this module ------------------------------------------------------


class PasswordRedisServer(RedisServer):
    """A redis-server whose default user needs ``password`` (``--requirepass``)."""

    def __init__(self, password: str, port: int | None = None) -> None:
        self.password = password
        super().__init__(port=port, appendonly=False)

    def _command(self) -> list[str]:
        return [*super()._command(), "--requirepass", self.password]

    def client(self) -> redis.Redis:
        return redis.Redis(
            host=self.host, port=self.port, password=self.password, socket_timeout=2,
            retry=Retry(NoBackoff(), 0),
        )

    def _probe(self, pid: int) -> bool:
        client = self.client()
        try:
            return int(client.info("server").get("process_id", -1)) == pid
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()


class PasswordClusterNode(PasswordRedisServer):
    """One Redis Cluster node (no slots: a refused login comes first), on a
    port Redis accepts for a cluster node (55535 at most)."""

    def __init__(self, password: str) -> None:
        super().__init__(password, port=free_cluster_port())

    def _command(self) -> list[str]:
        return [*super()._command(), "--cluster-enabled", "yes",
                "--cluster-config-file", str(self.data_dir / "nodes.conf")]


class AuthMongoServer(MongoServer):
    """SecantusDB with ``--auth`` (SCRAM-SHA-256 and roles enforced), with
    users made first: SecantusDB takes users only while auth is off."""

    ADMIN = ("admin", "admin-secret-1")

    def __init__(self) -> None:
        self.auth = False
        super().__init__()

    def _command(self) -> list[str]:
        return [*super()._command(), "--auth"] if self.auth else super()._command()

    def uri_for(self, user: str, password: str) -> str:
        return f"mongodb://{user}:{password}@{self.host}:{self.port}/?directConnection=true"

    def _probe(self, pid: int) -> bool:
        if not self.auth:
            return super()._probe(pid)
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            self.uri_for(*self.ADMIN), serverSelectionTimeoutMS=500, connectTimeoutMS=500
        )
        try:
            status = client.admin.command("serverStatus")
            return status.get("pid") is None or int(str(status["pid"])) == pid
        except pymongo.errors.PyMongoError:
            return False
        finally:
            client.close()

    def start_with_users(self, users: dict[str, tuple[str, list[dict[str, str]]]]) -> None:
        """Start without auth, create the admin and ``users`` (name ->
        password, roles), restart with ``--auth``."""
        self.start()
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(self.uri)
        try:
            name, password = self.ADMIN
            client.admin.command("createUser", name, pwd=password, roles=["root"])
            for user, (pwd, roles) in users.items():
                client.admin.command("createUser", user, pwd=pwd, roles=roles)
        finally:
            client.close()
        self.stop()
        self.auth = True
        self.start()


@pytest.fixture
def password_redis() -> Iterator[PasswordRedisServer]:
    with PasswordRedisServer("right-secret-" + uuid.uuid4().hex[:8]) as server:
        yield server


@pytest.fixture(scope="module")
def auth_mongo() -> Iterator[AuthMongoServer]:
    server = AuthMongoServer()
    try:
        server.start_with_users(
            {"reader": ("reader-secret-1", [{"role": "read", "db": "crawl_items"}])}
        )
        yield server
    finally:
        server.close()


@pytest.fixture
def acl_user(redis_server: RedisServer) -> Iterator[Any]:
    """``make(rules)`` creates an ACL user with those rules on the session's
    Redis and returns its URL; every user made is deleted after the test."""
    admin = redis.Redis.from_url(redis_server.url)
    made: list[str] = []

    def make(*rules: str) -> str:
        name = f"cfg-{uuid.uuid4().hex[:8]}"
        admin.acl_setuser(name, enabled=True, passwords=["+user-secret-1"], reset=True)
        admin.execute_command("ACL", "SETUSER", name, *rules)
        made.append(name)
        return f"redis://{name}:user-secret-1@{redis_server.host}:{redis_server.port}/0"

    yield make
    for name in made:
        admin.acl_deluser(name)
    admin.close()


def with_credentials(uri: str, user: str, password: str) -> str:
    """``uri`` (``mongodb://[userinfo@]hosts/...``) with these credentials."""
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://{user}:{password}@{rest.rpartition('@')[2]}"


def log_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "] ERROR:" in line or "] CRITICAL:" in line]


# -- settings: the table and its check ---------------------------------------------


def test_the_project_settings_pass_the_check() -> None:
    validate_settings(get_project_settings())


BAD_SETTINGS = [
    ("FRONTIER_LEASE_TIMEOUT", "-5", "FRONTIER_LEASE_TIMEOUT=-5: must be a number of seconds > 0"),
    ("FRONTIER_LEASE_TIMEOUT", "0", "FRONTIER_LEASE_TIMEOUT=0: must be a number of seconds > 0"),
    ("FRONTIER_LEASE_TIMEOUT", "inf", "FRONTIER_LEASE_TIMEOUT=inf: must be a number of seconds"),
    ("FRONTIER_LEASE_BATCH", "abc", "FRONTIER_LEASE_BATCH=abc: must be a whole number >= 1"),
    ("FRONTIER_LEASE_BATCH", "2.5", "FRONTIER_LEASE_BATCH=2.5: must be a whole number >= 1"),
    ("FRONTIER_SEED_BATCH", "0", "FRONTIER_SEED_BATCH=0: must be a whole number >= 1"),
    ("DOWNLOAD_DELAY", "abc", "DOWNLOAD_DELAY=abc: must be a number of seconds >= 0"),
    ("DOWNLOAD_DELAY", "-1", "DOWNLOAD_DELAY=-1: must be a number of seconds >= 0"),
    ("MAX_IDLE_TIME_BEFORE_CLOSE", "abc", "MAX_IDLE_TIME_BEFORE_CLOSE=abc: must be a whole number"),
    ("CONCURRENT_REQUESTS", "0", "CONCURRENT_REQUESTS=0: must be a whole number >= 1"),
    ("FRONTIER_MAX_DELIVERIES", "-1", "FRONTIER_MAX_DELIVERIES=-1: must be a whole number >= 0"),
    ("FRONTIER_RETRY_JITTER", "nan", "FRONTIER_RETRY_JITTER=nan: must be a number >= 0 and <= 1"),
    ("FRONTIER_BLOOM_ERROR_RATE", "1", "FRONTIER_BLOOM_ERROR_RATE=1: must be a number > 0 and < 1"),
    ("FRONTIER_STATS_ENABLED", "maybe", "FRONTIER_STATS_ENABLED=maybe: must be True or False"),
    ("FRONTIER_HEARTBEAT_INTERVAL", "-1", "FRONTIER_HEARTBEAT_INTERVAL=-1: must be a number of"),
    ("FRONTIER_DELAY", "-1", "FRONTIER_DELAY=-1: must be a number of seconds >= 0"),
    ("FRONTIER_CONCURRENCY", "0", "FRONTIER_CONCURRENCY=0: must be a whole number >= 1"),
    ("METRICS_PORT", "70000", "METRICS_PORT=70000: must be a whole number >= 1 and <= 65535"),
    ("MONGO_BATCH_SIZE", "-3", "MONGO_BATCH_SIZE=-3: must be a whole number >= 1"),
    ("MONGO_DATABASE", "a.b", "MONGO_DATABASE=a.b: must be a MongoDB database name"),
    ("FRONTIER_SITE_DELAYS", '{"example.com": "2s"}', "FRONTIER_SITE_DELAYS="),
    ("FRONTIER_SITE_CONCURRENCY", "[1, 2]", "FRONTIER_SITE_CONCURRENCY=[1, 2]: must be a dict"),
    ("REDIS_PARAMS", '{"db": 1', 'REDIS_PARAMS={"db": 1: must be a dict, or a JSON object'),
    ("REDIS_PARAMS", '{"socket_timeout": "x"}',
     'REDIS_PARAMS={"socket_timeout": "x"}: socket_timeout must be a number of seconds > 0'),
    ("REDIS_PARAMS", '{"no_such_option": 1}', "REDIS_PARAMS="),
    ("REDIS_URL", "http://localhost/0", "REDIS_URL=http://localhost/0: must be a redis://"),
    ("MONGO_URI", "mongodb://h/?authMechanism=BOGUS", "MONGO_URI=mongodb://h/?authMechanism="),
    ("SCHEDULER_QUEUE_KEY", "%(nope)s", "SCHEDULER_QUEUE_KEY=%(nope)s: must be a key template"),
    ("DUPEFILTER_CLASS", "no.such.Filter", "DUPEFILTER_CLASS=no.such.Filter: must be an import"),
    ("REDIS_START_URLS_AS_ZSET", "True", "REDIS_START_URLS_AS_ZSET=True: not supported"),
    ("SCHEDULER_SERIALIZER", "scrapy_redis.picklecompat",
     "SCHEDULER_SERIALIZER=scrapy_redis.picklecompat: not supported (it unpickles"),
    ("SCHEDULER_QUEUE_CLASS", "scrapy_redis.queue.LifoQueue",
     "SCHEDULER_QUEUE_CLASS=scrapy_redis.queue.LifoQueue: not supported"),
    ("RETRY_HTTP_CODES", "500,abc", "RETRY_HTTP_CODES=500,abc: must be a list of HTTP status"),
    ("REDIS_URL", "redis://127.0.0.1:6379/abc", "REDIS_URL=redis://127.0.0.1:6379/abc: "),
    ("DOWNLOAD_TIMEOUT", "abc", "DOWNLOAD_TIMEOUT=abc: must be a number of seconds > 0"),
]


@pytest.mark.parametrize(("name", "value", "line"), BAD_SETTINGS)
def test_a_bad_value_is_refused_in_one_line_naming_setting_value_and_what_is_allowed(
    name: str, value: str, line: str
) -> None:
    settings = get_project_settings()
    settings.set(name, value, priority="cmdline")
    with pytest.raises(SettingsError) as refused:
        validate_settings(settings)
    assert len(refused.value.problems) == 1, refused.value.problems
    [problem] = refused.value.problems
    assert problem.startswith(line), problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    ("name", "value"),
    [("FRONTIER_MAX_DELIVERIES", "0"), ("DOWNLOAD_DELAY", "2.5"), ("FRONTIER_LEASE_BATCH", " 4 "),
     ("FRONTIER_STATS_ENABLED", "false"), ("FRONTIER_REDIS_CLUSTER", "0"),
     ("REDIS_PARAMS", '{"db": 1, "socket_timeout": 3}'), ("FRONTIER_SITE_DELAYS", {"a.example": 2}),
     ("DUPEFILTER_CLASS", "crawler.frontier.bloom.BloomDupeFilter"), ("FRONTIER_DELAY", None),
     ("SCHEDULER_SERIALIZER", "json"), ("MONGO_URI", "mongodb+srv://u:p@cluster.example/"),
     ("REDIS_START_URLS_AS_SET", "True"),
     ("SCHEDULER_QUEUE_CLASS", "scrapy_redis.queue.PriorityQueue"),
     ("DUPEFILTER_CLASS", "scrapy_redis.dupefilter.RFPDupeFilter")],
)
def test_good_values_pass(name: str, value: Any) -> None:
    settings = get_project_settings()
    settings.set(name, value, priority="cmdline")
    validate_settings(settings)


@pytest.mark.parametrize("text", ["None", "none", "", " NONE "])
def test_none_given_as_text_asks_for_the_default_of_a_setting_whose_default_is_none(
    text: str,
) -> None:
    """``-s FRONTIER_SHARDS=None`` gives the text "None": it means unset, as
    leaving the setting out does, for every setting whose default is None;
    the add-on then works out the defaults it would have."""
    settings = get_project_settings()
    settings.set("DOWNLOAD_DELAY", 1.5, priority="cmdline")
    settings.set("CONCURRENT_REQUESTS_PER_DOMAIN", 3, priority="cmdline")
    for name in ("FRONTIER_SHARDS", "FRONTIER_DELAY", "FRONTIER_CONCURRENCY"):
        settings.set(name, text, priority="cmdline")
    validate_settings(settings)
    assert shard_count(settings) == 1
    settings.set("FRONTIER_REDIS_CLUSTER", True, priority="cmdline")
    assert shard_count(settings) == CLUSTER_SHARDS
    FrontierAddon().update_settings(settings)
    policy = SitePolicy.from_settings(settings)
    assert (policy.delay, policy.concurrency) == (1.5, 3)


def test_none_as_text_is_still_refused_where_the_default_is_not_none() -> None:
    settings = get_project_settings()
    settings.set("FRONTIER_LEASE_BATCH", "None", priority="cmdline")
    with pytest.raises(SettingsError) as refused:
        validate_settings(settings)
    assert refused.value.problems[0].startswith("FRONTIER_LEASE_BATCH=None: must be a whole")


def test_every_bad_setting_is_reported_at_once() -> None:
    settings = get_project_settings()
    for name, value, _ in BAD_SETTINGS[:6]:
        settings.set(name, value, priority="cmdline")
    with pytest.raises(SettingsError) as refused:
        validate_settings(settings)
    assert sorted(p.split("=")[0] for p in refused.value.problems) == [
        "FRONTIER_LEASE_BATCH", "FRONTIER_LEASE_TIMEOUT", "FRONTIER_SEED_BATCH"
    ]


def test_an_unknown_setting_of_ours_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    settings = get_project_settings()
    settings.set("FRONTIER_LEASE_TIMOUT", "5", priority="cmdline")  # sic
    validate_settings(settings)
    assert "Unknown setting FRONTIER_LEASE_TIMOUT (not one of the project's)" in caplog.text


def test_credentials_never_appear_in_a_bad_setting_line() -> None:
    settings = get_project_settings()
    settings.set("REDIS_URL", "http://user:redis-secret-9@h/0", priority="cmdline")
    settings.set("MONGO_URI", "mongodb://u:mongo-secret-9@h/?bogusOption=1", priority="cmdline")
    settings.set("REDIS_PARAMS", {"password": "params-secret-9", "bogus": 1}, priority="cmdline")
    with pytest.raises(SettingsError) as refused:
        validate_settings(settings)
    text = str(refused.value)
    assert "REDIS_URL=http://user:****@h/0" in text
    assert "MONGO_URI=mongodb://u:****@h/" in text
    assert "secret-9" not in text


def test_a_worker_settings_error_in_redis_params_names_the_option(redis_url: str) -> None:
    settings = get_project_settings()
    settings.set("REDIS_URL", redis_url, priority="cmdline")
    settings.set("REDIS_PARAMS", '{"password": "pw-secret-9", "no_such_option": 1}', "cmdline")
    with pytest.raises(SettingsError) as refused:
        validate_settings(settings)
    [problem] = refused.value.problems
    assert "no_such_option" in problem
    assert '"password": "****"' in problem
    assert "pw-secret-9" not in problem


def test_the_addon_checks_the_settings_for_any_way_of_running_a_crawl() -> None:
    settings = get_project_settings()
    settings.set("FRONTIER_SEED_BATCH", "0", priority="cmdline")
    with pytest.raises(SettingsError, match="FRONTIER_SEED_BATCH=0"):
        FrontierAddon().update_settings(settings)


def test_the_crawl_command_reports_a_configuration_error_of_the_crawl_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    command = CrawlCommand()
    command._bad_setting = False
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_future()
        task.set_exception(SettingsError(["FRONTIER_SEED_BATCH=0: must be a whole number >= 1"]))
        command._crawl_done(task)
    finally:
        loop.close()
    assert command._bad_setting
    assert [r.getMessage() for r in caplog.records] == [
        "Bad setting: FRONTIER_SEED_BATCH=0: must be a whole number >= 1"
    ]


@pytest.mark.parametrize(
    ("url", "shown"),
    [("redis://:pw-1234@h:6379/0", "redis://:****@h:6379/0"),
     ("redis://user:pw-1234@h/0", "redis://user:****@h/0"),
     ("mongodb://u:p%40ss@h1:1,h2:2/?authSource=admin", "mongodb://u:****@h1:1,h2:2/?authSource=admin"),
     ("redis://h/0?password=pw-1234", "redis://h/0?password=****"),
     ("redis://h:6379/0", "redis://h:6379/0")],
)
def test_urls_are_shown_with_their_password_masked(url: str, shown: str) -> None:
    assert masked_url(url) == shown


#: Calls that read a setting: ``<...settings>.get*("NAME"`` and ``settings["NAME"]``.
_GETTERS = {"get", "getint", "getfloat", "getbool", "getlist", "getdict", "getdictorlist",
            "getwithbase", "getpriority", "set"}
#: Names of ours (and scrapy-redis's) anywhere in crawler/, e.g. in a tuple read in a loop.
_OUR_NAME = re.compile(r"^(FRONTIER|MONGO|METRICS|LOG_JSON|REDIS|SCHEDULER)_[A-Z0-9_]+$")
#: Environment variables that share a prefix but are no settings.
_NOT_SETTINGS = {"REDIS_SERVER_BIN"}


def _settings_read_in_crawler() -> set[str]:
    names: set[str] = set()
    for path in (PROJECT_DIR / "crawler").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            target: ast.expr | None = None
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _GETTERS and node.args
                    and ast.unparse(node.func.value).endswith("settings")):
                target = node.args[0]
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("settings"):
                target = node.slice
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                names.add(target.value)
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and _OUR_NAME.match(node.value)):
                names.add(node.value)
        if path.name == "settings.py" and path.parent.name == "crawler":
            for stmt in tree.body:
                targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else (
                    stmt.targets if isinstance(stmt, ast.Assign) else [])
                names.update(t.id for t in targets if isinstance(t, ast.Name)
                             and t.id.isupper() and not hasattr(default_settings, t.id))
    return {name for name in names if name.isupper()} - _NOT_SETTINGS


def test_every_setting_read_in_crawler_is_in_the_validation_table() -> None:
    read = _settings_read_in_crawler()
    assert {"FRONTIER_LEASE_BATCH", "DOWNLOAD_DELAY", "SCHEDULER_QUEUE_KEY",
            "MONGO_URI", "CONCURRENT_REQUESTS"} <= read  # the scan finds them
    missing = sorted(read - set(SETTINGS))
    assert missing == [], f"add these settings to crawler.config.SETTINGS: {missing}"


# -- defaults: one table, read once ---------------------------------------------------

#: The page whose table explains each setting of ours, with its default.
SETTINGS_PAGE = PROJECT_DIR / "docs" / "reference" / "settings.md"
SETTINGS_HEADING = "\n## What each setting of ours does\n"


def _own_settings() -> dict[str, Any]:
    """The project's own settings of the table, with their defaults."""
    return {name: row.default for name, row in SETTINGS.items()
            if row.default is not SCRAPYS}


def test_every_setting_of_ours_has_its_default_in_the_table_and_a_field_in_the_config() -> None:
    own = _own_settings()
    ours_by_prefix = {name for name in SETTINGS if name.startswith(OWN_PREFIXES)}
    assert ours_by_prefix <= set(own), sorted(ours_by_prefix - set(own))
    fields = {f.metadata["setting"]: f.name for f in dataclasses.fields(FrontierConfig)}
    assert set(fields) == set(own)
    defaults = FrontierConfig()
    assert {name: getattr(defaults, field) for name, field in fields.items()} == own
    assert FrontierConfig.from_settings(Settings()) == defaults


def _string_constants(trees: list[ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = "text"`` of every module (a setting's name
    kept in a constant, e.g. ``ALLOW_EVICTION_SETTING``)."""
    out: dict[str, str] = {}
    for tree in trees:
        for stmt in tree.body:
            if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                out.update((t.id, stmt.value.value) for t in stmt.targets
                           if isinstance(t, ast.Name))
    return out


def _reads_with_a_default_at_the_read() -> list[str]:
    """``<x>.get*(NAME, default)`` in crawler/ where NAME (written out, or a
    module constant) is a setting of :data:`SETTINGS` or Scrapy's: one
    ``path:line: call`` each. ``os.environ`` reads are no settings."""
    paths = sorted((PROJECT_DIR / "crawler").rglob("*.py"))
    trees = [ast.parse(path.read_text(), str(path)) for path in paths]
    constants = _string_constants(trees)
    found = []
    for path, tree in zip(paths, trees, strict=True):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _GETTERS - {"set"} and node.args):
                continue
            if ast.unparse(node.func.value).endswith("environ"):
                continue
            first = node.args[0]
            name = (first.value if isinstance(first, ast.Constant) else
                    constants.get(first.id) if isinstance(first, ast.Name) else None)
            if not isinstance(name, str) or not (
                name in SETTINGS or hasattr(default_settings, name)
            ):
                continue
            if len(node.args) > 1 or any(k.arg == "default" for k in node.keywords):
                where = path.relative_to(PROJECT_DIR)
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_setting_is_read_with_a_default_written_at_the_read() -> None:
    # Ours come from crawler.config (FrontierConfig, setting_value), whose
    # defaults are the table's; Scrapy's and scrapy-redis's from the
    # settings object, whose defaults are theirs.
    assert _reads_with_a_default_at_the_read() == []


def _readme_defaults() -> dict[str, str]:
    """Setting -> the default the settings page's table gives, as
    written (the first backticked word of the default cell that is the
    setting's by position)."""
    text = SETTINGS_PAGE.read_text()
    section = text[text.index(SETTINGS_HEADING):]
    if "\n## " in section[1:]:
        section = section[: section.index("\n## ", 1)]
    found: dict[str, str] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        names_cell, default_cell = line.split(" | ")[:2]
        names = re.findall(r"`([A-Z][A-Z0-9_]+)`", names_cell)
        shown = re.findall(r"`([^`]*)`", default_cell)
        assert len(shown) >= len(names), line
        found.update(zip(names, shown[: len(names)], strict=True))
    return found


def test_the_docs_settings_table_gives_every_setting_of_ours_with_the_table_s_default() -> None:
    readme = _readme_defaults()
    own = _own_settings()
    assert sorted(set(own) - set(readme)) == []
    for name, default in own.items():
        shown = readme[name]
        try:
            value = ast.literal_eval(shown)
        except (ValueError, SyntaxError):
            value = shown  # text written bare: `spill`, `127.0.0.1`
        assert value == default, f"settings page: {name} = {shown}, SETTINGS: {default!r}"
    # Scrapy's own settings the table names keep Scrapy's defaults.
    for name in set(readme) & {"DOWNLOAD_DELAY", "CONCURRENT_REQUESTS_PER_DOMAIN"}:
        assert ast.literal_eval(readme[name]) == getattr(default_settings, name)


@pytest.mark.parametrize(
    ("name", "given", "field", "read"),
    [("FRONTIER_LEASE_BATCH", " 4 ", "lease_batch", 4),
     ("FRONTIER_LEASE_TIMEOUT", "2.5", "lease_timeout", 2.5),
     ("FRONTIER_STATS_ENABLED", "false", "stats_enabled", False),
     ("FRONTIER_SHARDS", "None", "shards", None),
     ("FRONTIER_SHARDS", "4", "shards", 4),
     ("FRONTIER_DELAY", "0.5", "delay", 0.5),
     ("FRONTIER_SITE_DELAYS", '{"a.example": 2}', "site_delays", {"a.example": 2}),
     ("MONGO_SPILL_DIR", "/tmp/x", "mongo_spill_dir", "/tmp/x"),
     ("METRICS_PORT", "9500", "metrics_port", 9500)],
)
def test_the_config_reads_a_setting_given_as_text_as_its_default_s_type(
    name: str, given: str, field: str, read: Any
) -> None:
    settings = Settings()
    settings.set(name, given, priority="cmdline")
    assert getattr(FrontierConfig.from_settings(settings), field) == read


def test_the_config_is_read_once_per_crawler_once_its_settings_are_frozen() -> None:
    crawler = get_crawler(Spider, {"FRONTIER_LEASE_BATCH": 7})
    crawler.settings.freeze()
    config = FrontierConfig.of(crawler)
    assert config.lease_batch == 7
    assert FrontierConfig.of(crawler) is config


# -- REDIS_PARAMS: merged, not replaced ----------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [('{"db": 1, "password": "x"}', {"db": 1, "password": "x", **FAIL_FAST_PARAMS}),
     ({"socket_timeout": 3}, {"socket_timeout": 3, "socket_connect_timeout": 2}),
     ({}, FAIL_FAST_PARAMS)],
)
def test_redis_params_are_merged_over_the_fail_fast_timeouts(
    given: Any, expected: dict[str, Any]
) -> None:
    settings = Settings({"REDIS_URL": "redis://127.0.0.1:1", "REDIS_PARAMS": given})
    kwargs = get_redis(settings).connection_pool.connection_kwargs
    assert {k: kwargs.get(k) for k in expected} == expected
    assert kwargs["retry"].get_retries() == 0  # never resent, whatever REDIS_PARAMS says


def test_the_seed_client_of_the_spider_gets_the_merged_params_too(redis_url: str) -> None:
    scheduler, crawler = harness.open_scheduler(
        redis_url, _Spider, REDIS_PARAMS='{"socket_timeout": 3}'
    )
    for client in (scheduler.server, crawler.spider.server):
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (3, 2)
        assert kwargs["retry"].get_retries() == 0


# -- Redis: credentials, databases and ACLs ------------------------------------------


def _closed_at_open(crawler: Any) -> bool:
    """Whether the spider_opened signal now asks to close with config_error."""
    results = crawler.signals.send_catch_log(
        signals.spider_opened, spider=crawler.spider, dont_log=CloseSpider
    )
    return any(getattr(getattr(r, "value", None), "reason", None) == CONFIG_ERROR_REASON
               for _, r in results)


@pytest.mark.parametrize(
    ("rules", "cause"),
    [(("~*", "&*", "+@all", "-evalsha", "-evalsha_ro"), "no permissions to run the 'evalsha'"),
     (("~other:*", "&*", "+@all"), "no permissions to access one of the keys"),
     (("~*", "&*", "+@all", "-select"), "no permissions to run the 'select' command")],
)
def test_an_acl_that_forbids_what_the_crawler_needs_stops_it_at_open(
    acl_user: Any, rules: tuple[str, ...], cause: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = acl_user(*rules)
    if "-select" in rules:
        url = url[: -1] + "1"  # database 1: redis-py sends SELECT
    _scheduler, crawler = harness.open_scheduler(url, _Spider)
    message = config_error_of(crawler)
    assert message is not None and cause in message.lower(), message
    assert "user-secret-1" not in caplog.text
    assert crawler.stats.get_value("frontier/redis/outages") is None  # not an outage
    assert _closed_at_open(crawler)


def test_a_database_the_server_lacks_stops_the_crawl_at_open(redis_server: RedisServer) -> None:
    url = f"redis://{redis_server.host}:{redis_server.port}/99"  # 16 databases by default
    _scheduler, crawler = harness.open_scheduler(url, _Spider)
    message = config_error_of(crawler)
    assert message is not None and "DB index is out of range" in message, message
    assert _closed_at_open(crawler)


def test_an_outage_is_still_an_outage() -> None:
    _scheduler, crawler = harness.open_scheduler("redis://127.0.0.1:1/0", _Spider)
    assert config_error_of(crawler) is None
    assert crawler.stats.get_value("frontier/redis/outages") == 1
    assert not _closed_at_open(crawler)


def _periodic_write(component: str, url: str) -> tuple[Any, Any, Any]:
    """The crawler, the errback and the write of a component that writes to
    Redis in a thread now and then (cluster stats, housekeeping)."""
    crawler = get_crawler(_Spider, {"REDIS_URL": url})
    crawler.spider = crawler._create_spider()
    if component == "housekeeping":
        keeper = FrontierHousekeeping.from_crawler(crawler)
        return crawler, keeper._failed, keeper.housekeeper.run
    stats = ClusterStats.from_crawler(crawler)
    return crawler, stats._sent_failed, lambda: stats._write({"a": 1}, {}, False)


@pytest.mark.parametrize(("component", "retrying", "failed"), [
    ("housekeeping", "Frontier housekeeping failed (will retry): ",
     "Frontier housekeeping failed: "),
    ("stats", "Could not send cluster stats to Redis (will retry): ", "Cluster stats failed: "),
])
def test_periodic_writers_tell_a_configuration_error_an_outage_and_a_bug_apart(
    component: str, retrying: str, failed: str, redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Both go through one helper (report_redis_failure): a configuration
    error stops the crawl, an outage is retried, anything else is logged
    with its traceback. The Redis errors are real ones."""
    def failure_of(write: Any) -> Failure:
        try:
            write()
        except Exception:
            return Failure()
        raise AssertionError("the write did not fail")

    # An outage: nothing listens there.
    crawler, errback, write = _periodic_write(component, "redis://127.0.0.1:1/0")
    with caplog.at_level("WARNING"):
        errback(failure_of(write))
    [warning] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warning.getMessage().startswith(retrying) and warning.exc_info is None
    assert config_error_of(crawler) is None

    # A configuration error: a database the server lacks.
    caplog.clear()
    crawler, errback, write = _periodic_write(
        component, f"redis://{redis_server.host}:{redis_server.port}/99"
    )
    errback(failure_of(write))
    message = config_error_of(crawler)
    assert message is not None and "DB index is out of range" in message, message
    assert not [r for r in caplog.records if r.getMessage().startswith((retrying, failed))]

    # A bug: logged as an error, with its traceback.
    caplog.clear()
    crawler, errback, _ = _periodic_write(component, redis_server.url)

    def bug() -> None:
        raise ValueError("a bug")

    errback(failure_of(bug))
    [error] = [r for r in caplog.records if r.getMessage().startswith(failed)]
    assert error.levelname == "ERROR" and error.exc_info is not None
    assert error.getMessage() == failed + "a bug"
    assert config_error_of(crawler) is None


def _rejected_evalsha(admin: redis.Redis) -> int:
    return int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("rejected_calls", 0))


def test_an_acl_revoked_mid_crawl_stops_the_crawl_instead_of_retrying(
    acl_user: Any, redis_server: RedisServer
) -> None:
    url = acl_user("~*", "&*", "+@all")
    scheduler, crawler = harness.open_scheduler(url, _Spider)
    closed: list[str] = []

    async def close_spider_async(*, reason: str) -> None:
        closed.append(reason)

    crawler.engine.spider = crawler.spider
    crawler.engine.close_spider_async = close_spider_async
    name = url.split("//")[1].split(":")[0]
    admin = redis.Redis.from_url(redis_server.url)
    try:
        admin.execute_command("ACL", "SETUSER", name, "-evalsha", "-evalsha_ro")
        before = _rejected_evalsha(admin)
        assert scheduler.next_request() is None
        assert scheduler.next_request() is None  # no second attempt: no backoff loop
        scheduler.heartbeats.beat()  # nor from the heartbeat
        after = _rejected_evalsha(admin)
    finally:
        admin.close()
    asyncio.get_event_loop().run_until_complete(asyncio.sleep(0))
    assert closed == [CONFIG_ERROR_REASON]
    message = config_error_of(crawler)
    assert message is not None and "evalsha" in message
    assert after - before == 1
    assert crawler.stats.get_value("frontier/redis/outages") is None


@pytest.mark.cluster
def test_a_cluster_that_refuses_the_password_is_a_configuration_error() -> None:
    with PasswordClusterNode("cluster-secret-4") as node:
        url = f"redis://:wrong-secret-4@{node.host}:{node.port}/0"
        settings = Settings({"FRONTIER_REDIS_CLUSTER": True, "REDIS_URL": url})
        with pytest.raises(ConfigurationError) as refused:
            get_redis(settings)
    message = str(refused.value)
    assert message.startswith(f"Redis at redis://:****@{node.host}:{node.port}/0: authentication")
    assert "secret-4" not in message


def test_redis_errors_are_told_apart(password_redis: PasswordRedisServer) -> None:
    """The classification on real replies: which errors are configuration errors."""
    def error_of(**kwargs: Any) -> Exception:
        client = redis.Redis(host=password_redis.host, port=password_redis.port,
                             socket_connect_timeout=1, retry=Retry(NoBackoff(), 0), **kwargs)
        try:
            client.ping()
        except redis.exceptions.RedisError as exc:
            return exc
        finally:
            client.close()
        raise AssertionError("no error")

    assert "authentication failed" in (config_error(error_of(password="wrong")) or "")
    assert "authentication failed" in (config_error(error_of()) or "")  # NOAUTH
    assert "authentication failed" in (config_error(error_of(username="x", password="y")) or "")
    down = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.exceptions.ConnectionError) as refused:
        down.ping()
    assert config_error(refused.value) is None  # down: an outage
    assert config_error(redis.exceptions.ResponseError("WRONGTYPE Operation")) is None


# -- MongoDB -----------------------------------------------------------------------


def test_a_refusal_quoted_by_a_server_selection_timeout_is_a_configuration_error() -> None:
    # Once a login failed, pymongo marks the server unknown: the next calls
    # time out selecting it, quoting the refusal (seen against SecantusDB).
    quoted = ("authentication failed, full error: {'ok': 0.0, 'errmsg': 'authentication "
              "failed', 'code': 18, 'codeName': 'AuthenticationFailed'}, Timeout: 5.0s")
    assert "authentication failed" in (mongo_config_error(ServerSelectionTimeoutError(quoted))
                                       or "")
    refused = "127.0.0.1:1: [Errno 111] Connection refused, Timeout: 5.0s"
    assert mongo_config_error(ServerSelectionTimeoutError(refused)) is None


class _MongoSpider(Spider):
    name = "config_mongo_test"


def run_async(coro: Any) -> Any:
    """Run ``coro`` on a loop of its own (the current loop, the reactor's,
    stays current for the scheduler tests)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def _pipeline(uri: str, database: str, tmp_path: Path) -> MongoPipeline:
    crawler = get_crawler(_MongoSpider, {"MONGO_URI": uri, "MONGO_DATABASE": database,
                                         "MONGO_SPILL_DIR": str(tmp_path)})
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    return MongoPipeline.from_crawler(crawler)


def test_refused_mongodb_credentials_stop_the_crawl_at_open(
    mongo_uri: str, mongo_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # SecantusDB, like mongod, checks credentials given in the URI even
    # without --auth: an unknown user is refused (code 18).
    uri = with_credentials(mongo_uri, "nosuch-user", "mongo-secret-7")
    pipeline = _pipeline(uri, mongo_db, tmp_path)
    with pytest.raises(CloseSpider) as closed:
        run_async(pipeline.open_spider())
    assert closed.value.reason == CONFIG_ERROR_REASON
    message = config_error_of(pipeline.crawler)
    assert message is not None and "authentication failed" in message
    assert "nosuch-user:****@" in message
    assert "mongo-secret-7" not in caplog.text


def test_an_option_pymongo_refuses_stops_the_crawl_at_open(
    mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    host = mongo_uri.split("://")[1].split("/", maxsplit=1)[0].rpartition("@")[2]
    uri = f"mongodb://someone@{host}/?authMechanism=SCRAM-SHA-256"  # no password
    pipeline = _pipeline(uri, mongo_db, tmp_path)
    with pytest.raises(CloseSpider):
        run_async(pipeline.open_spider())
    message = config_error_of(pipeline.crawler)
    assert message is not None and "pymongo refuses" in message and "password" in message


def test_a_user_who_may_not_write_spills_the_items_and_stops_the_crawl(
    auth_mongo: AuthMongoServer, tmp_path: Path
) -> None:
    pipeline = _pipeline(auth_mongo.uri_for("reader", "reader-secret-1"), "crawl_items", tmp_path)
    item = QuoteItem(text="t", author="a", tags=[], url="u")

    async def go() -> None:
        await pipeline.open_spider()  # logging in works: the user exists
        await asyncio.wait_for(pipeline.process_item(item), timeout=20)
        await pipeline.close_spider()

    run_async(go())
    message = config_error_of(pipeline.crawler)
    assert message is not None and "not authorized" in message, message
    assert "readWrite" in message and "reader-secret-1" not in message
    [spill] = list(tmp_path.glob("*.jsonl"))
    [row] = [json.loads(line) for line in spill.read_text().splitlines()]
    assert row["doc"]["text"] == "t"
    assert pipeline.crawler.stats.get_value("mongo/retries") is None  # no backoff loop


# -- real `scrapy crawl` processes -------------------------------------------------


def run_worker(env: dict[str, str], tmp_path: Path, **settings: object) -> tuple[int, str, float]:
    """Run one ``scrapy crawl quotes``; return its exit status, log and seconds."""
    log = tmp_path / f"worker-{time.monotonic_ns()}.log"
    started = time.monotonic()
    proc = start_worker("quotes", env, log, {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, **settings})
    [worker] = wait_workers([proc], [log], timeout=60)
    return worker.returncode, worker.log, worker.ended - started


@pytest.mark.workers
def test_bad_settings_exit_2_with_one_line_each_and_no_traceback(
    tmp_path: Path, mongo_uri: str
) -> None:
    env = worker_env("redis://127.0.0.1:1/0", mongo_uri, "unused")  # nothing is reached
    status, log, _ = run_worker(
        env, tmp_path, FRONTIER_LEASE_TIMEOUT=-5, FRONTIER_LEASE_BATCH="abc",
        DOWNLOAD_DELAY="abc", MAX_IDLE_TIME_BEFORE_CLOSE="abc", FRONTIER_SEED_BATCH=0,
    )
    assert status == 2, log[-3000:]
    errors = log_errors(log)
    assert len(errors) == 5, errors
    for expected in ("FRONTIER_LEASE_TIMEOUT=-5: must be a number of seconds > 0",
                     "FRONTIER_LEASE_BATCH=abc: must be a whole number >= 1",
                     "DOWNLOAD_DELAY=abc: must be a number of seconds >= 0",
                     "MAX_IDLE_TIME_BEFORE_CLOSE=abc: must be a whole number of seconds >= 0",
                     "FRONTIER_SEED_BATCH=0: must be a whole number >= 1"):
        assert any(line.endswith(expected) for line in errors), (expected, errors)
    assert "Traceback" not in log and "Spider opened" not in log


@pytest.mark.workers
def test_a_wrong_redis_password_exits_non_zero_within_seconds(
    password_redis: PasswordRedisServer, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    url = f"redis://:wrong-secret-5@{password_redis.host}:{password_redis.port}/0"
    status, log, took = run_worker(worker_env(url, mongo_uri, mongo_db), tmp_path)
    assert status == 1, log[-3000:]
    assert took < EXIT_WITHIN
    [error] = log_errors(log)
    assert "Redis at redis://:****@" in error and "authentication failed" in error, error
    assert "wrong-secret-5" not in log and password_redis.password not in log
    assert "'finish_reason': 'config_error'" in log
    assert "Traceback" not in log and "trying again" not in log


@pytest.mark.workers
def test_a_redis_password_changed_mid_crawl_stops_the_worker(
    password_redis: PasswordRedisServer, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    url = f"redis://:{password_redis.password}@{password_redis.host}:{password_redis.port}/0"
    log = tmp_path / "rotated.log"
    proc = start_worker("quotes", worker_env(url, mongo_uri, mongo_db), log,
                        {"MAX_IDLE_TIME_BEFORE_CLOSE": 0})  # would wait for seeds for ever
    admin = password_redis.client()
    try:

        def crawling() -> bool:  # its first heartbeat
            assert proc.poll() is None, log.read_text()[-3000:]
            return bool(admin.hlen("{quotes}:workers"))

        wait_for(crawling, 60, "the worker's first heartbeat", 0.05)
        admin.config_set("requirepass", "rotated-secret-6")
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal")  # not this connection
        rotated = time.monotonic()
        [worker] = wait_workers([proc], [log], timeout=60)
    finally:
        admin.close()
        if proc.poll() is None:
            proc.kill()
    assert worker.returncode == 1, worker.log[-3000:]
    assert worker.ended - rotated < EXIT_WITHIN
    errors = log_errors(worker.log)
    assert len(errors) == 1 and "authentication failed" in errors[0], errors
    assert "rotated-secret-6" not in worker.log and password_redis.password not in worker.log
    assert "'finish_reason': 'config_error'" in worker.log


@pytest.mark.workers
def test_refused_mongodb_credentials_exit_non_zero_within_seconds(
    redis_url: str, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    uri = with_credentials(mongo_uri, "nosuch-user", "mongo-secret-8")
    status, log, took = run_worker(worker_env(redis_url, uri, mongo_db), tmp_path)
    assert status == 1, log[-3000:]
    assert took < EXIT_WITHIN
    [error] = log_errors(log)
    assert "MongoDB at mongodb://nosuch-user:****@" in error, error
    assert "authentication failed" in error
    assert "mongo-secret-8" not in log and "Traceback" not in log


def test_an_acl_that_forbids_a_command_inside_the_scripts_stops_the_crawl(
    acl_user: Any,
) -> None:
    # Redis answers a plain error (not NOPERM) when a script runs a command
    # the user may not: "The user executing the script can't run this command".
    url = acl_user("~*", "&*", "+@all", "-zadd")
    _scheduler, crawler = harness.open_scheduler(url, _Spider)
    message = config_error_of(crawler)
    assert message is not None and "scripts run" in message, message
    assert crawler.stats.get_value("frontier/redis/outages") is None
    assert crawler.stats.get_value("frontier/redis/refused") is None  # no retry loop
    assert _closed_at_open(crawler)


@pytest.mark.workers
@pytest.mark.workers
def test_a_warc_dir_that_cannot_be_written_is_a_bad_setting(
    env: dict[str, str], rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    """WARC_DIR under a regular file: one line naming the setting, exit 2,
    nothing crawled (not one ERROR and a crawl without an archive that
    exits 0)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    site = site_factory({"/": Page(200, HTML, b"<html><title>t</title><body></body></html>")})
    rds.lpush("pages:start_urls", site.url_for("/"))
    [worker] = crawl("pages", env, tmp_path, settings={
        "WARC_DIR": blocker / "warc", "FRONTIER_SHARDS": 3})
    assert worker.returncode == 2, worker.log[-3000:]
    assert f"Bad setting: WARC_DIR='{blocker / 'warc'}': must be a directory" in worker.log
    assert "Traceback" not in worker.log, worker.log[-3000:]
    assert site.hits() == []


@pytest.mark.workers
@pytest.mark.workers
def test_a_spill_dir_that_cannot_be_made_is_a_bad_setting(
    env: dict[str, str], tmp_path: Path
) -> None:
    """MONGO_SPILL_DIR under a regular file: one line, exit 2 at start (not
    found only when MongoDB is down and items have to spill, those items
    then lost with the OSError)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    [worker] = crawl("pages", env, tmp_path, settings={"MONGO_SPILL_DIR": blocker / "spill"})
    assert worker.returncode == 2, worker.log[-3000:]
    assert (
        f"Bad setting: MONGO_SPILL_DIR={blocker / 'spill'}: must be a directory the worker "
        f"can create and write in ({blocker} is not a directory)"
    ) in worker.log, worker.log[-3000:]
    assert "Traceback" not in worker.log


@pytest.mark.workers
@pytest.mark.workers
def test_the_cluster_switch_on_a_single_redis_is_a_configuration_error(
    env: dict[str, str], rds: redis.Redis, tmp_path: Path
) -> None:
    """FRONTIER_REDIS_CLUSTER=1 with REDIS_URL at one Redis server: one line,
    exit 1 (not asyncio's "Task exception was never retrieved" and a
    traceback)."""
    rds.lpush("pages:start_urls", "http://127.0.0.1:9/")
    [worker] = crawl("pages", {**env, "FRONTIER_REDIS_CLUSTER": "1"}, tmp_path)
    assert worker.returncode == 1, worker.log[-3000:]
    assert "Traceback" not in worker.log, worker.log[-3000:]
    assert "Configuration error: Redis at redis://127.0.0.1:" in worker.log
    assert "FRONTIER_REDIS_CLUSTER is on but the server is no Redis Cluster node" in worker.log


@pytest.mark.workers
@pytest.mark.cluster
@pytest.mark.workers
def test_a_cluster_node_without_the_cluster_switch_is_a_configuration_error(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    """REDIS_URL at a node of a Redis Cluster, FRONTIER_REDIS_CLUSTER unset:
    the node's MOVED is no outage; the worker stops within seconds, exit 1
    (not "Redis unreachable" with backoff for ever)."""
    env = worker_env(redis_cluster_url, mongo_uri, mongo_db)
    env.pop("FRONTIER_REDIS_CLUSTER", None)
    started = time.monotonic()
    [worker] = crawl("pages", env, tmp_path, timeout=60)
    assert worker.returncode == 1, worker.log[-3000:]
    assert worker.ended - started < 20
    assert "Traceback" not in worker.log, worker.log[-3000:]
    assert "the server is a node of a Redis Cluster (it answered MOVED/ASK" in worker.log, (
        worker.log[-3000:])


@pytest.mark.parametrize(
    ("low", "high"),
    [("FRONTIER_ROBOTS_RETRY_BASE", "FRONTIER_ROBOTS_RETRY_MAX"),
     ("FRONTIER_RETRY_BACKOFF_BASE", "FRONTIER_RETRY_BACKOFF_MAX"),
     ("FRONTIER_ADAPTIVE_START", "FRONTIER_ADAPTIVE_MAX"),
     ("FRONTIER_HEARTBEAT_INTERVAL", "FRONTIER_WORKER_TIMEOUT")],
)
def test_two_settings_out_of_order_are_refused_in_one_line(low: str, high: str) -> None:
    settings = get_project_settings()
    settings.set(low, "10", priority="cmdline")
    settings.set(high, "5", priority="cmdline")
    with pytest.raises(SettingsError) as refused:
        validate_settings(settings)
    assert refused.value.problems == [f"{low}=10 and {high}=5: {low} must not exceed {high}"]


@pytest.mark.workers
def test_a_bad_metrics_port_in_the_environment_is_a_settings_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "quotes"], check=False, cwd=PROJECT_DIR,
        env={**os.environ, "METRICS_PORT": "abc"}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "METRICS_PORT='abc'" in result.stderr or "METRICS_PORT=abc" in result.stderr, (
        result.stderr[-2000:]
    )
    assert "Traceback" not in result.stderr


@pytest.mark.workers
def test_the_metrics_exporter_refuses_a_bad_port_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "crawler.metrics"], check=False, cwd=PROJECT_DIR,
        env={**os.environ, "METRICS_PORT": "abc"}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Bad setting: METRICS_PORT=abc: must be a whole number" in result.stderr, (
        result.stderr[-2000:]
    )
    assert "Traceback" not in result.stderr


@pytest.mark.workers
def test_an_unknown_spider_exits_2_naming_the_project_s_spiders() -> None:
    """No traceback (Scrapy's ``KeyError``), no server contacted."""
    closed = f"redis://:a-secret-7@127.0.0.1:{free_port()}/0"
    result = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "quotez"], check=False, cwd=PROJECT_DIR,
        env={**os.environ, "REDIS_URL": closed}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "unknown spider 'quotez': expected one of pages, quotes" in result.stderr, (
        result.stderr[-2000:]
    )
    assert "Traceback" not in result.stderr


def test_the_metrics_exporter_logs_a_server_it_cannot_read_once_password_masked(
    password_redis: PasswordRedisServer, mongo_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://:wrong-secret-9@{password_redis.host}:{password_redis.port}/0"
    settings = Settings({"REDIS_URL": url, "MONGO_URI": mongo_uri})
    reader = StatusReader.from_settings(settings, ["quotes"])
    collector = StatusCollector(reader)
    try:
        with caplog.at_level("INFO", logger="crawler.metrics"):
            for _ in range(3):
                up = {s.labels["server"]: s.value for s in next(iter(collector.collect())).samples}
                assert up["redis"] == 0
            reader.redis.close()
            reader.redis = redis.Redis.from_url(
                f"redis://:{password_redis.password}@{password_redis.host}:{password_redis.port}/0"
            )
            list(collector.collect())
    finally:
        reader.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "crawler.metrics"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("could not read Redis: redis://:****@"), lines
    assert "AuthenticationError" in lines[0], lines
    assert lines[1] == "Redis can be read again"
    assert "wrong-secret-9" not in caplog.text


@pytest.mark.parametrize(("name", "nearest"), [
    ("FRONTIER_LEASE_TIMEOUT_SECS", "FRONTIER_LEASE_TIMEOUT"),
    ("FRONTEIR_DELAY", "FRONTIER_DELAY"),
    ("MONGO_URL", "MONGO_URI"),
    ("REDIS_HOSTNAME", "REDIS_HOST"),
])
def test_a_misspelled_setting_is_warned_about_in_one_line_naming_the_nearest(
    caplog: pytest.LogCaptureFixture, name: str, nearest: str
) -> None:
    settings = get_project_settings()
    settings.set(name, "5", priority="cmdline")
    with caplog.at_level(logging.WARNING, logger="crawler.config"):
        validate_settings(settings)
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert lines == [f"Unknown setting {name} (not one of the project's): a typo? "
                     f"The nearest known setting is {nearest}."]


@pytest.mark.parametrize("name", [
    "REDIS_ITEMS_KEY", "SCHEDULER_IDLE_BEFORE_CLOSE", "LOG_LEVEL", "MY_OWN_SETTING",
    "WARN_LEVEL",
])
def test_settings_of_scrapy_scrapy_redis_or_the_user_are_not_warned_about(
    caplog: pytest.LogCaptureFixture, name: str
) -> None:
    settings = get_project_settings()
    settings.set(name, "5", priority="cmdline")
    with caplog.at_level(logging.WARNING, logger="crawler.config"):
        validate_settings(settings)
    assert [r for r in caplog.records if "Unknown setting" in r.getMessage()] == []
