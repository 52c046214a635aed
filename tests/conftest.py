"""Shared pytest fixtures: real Redis, MongoDB and HTTP servers, no mocks.

Session-scoped servers are started once and stopped at the end of the run;
function-scoped fixtures give each test a clean view of them:

- ``redis_server`` (session): a private :class:`~devtools.embedded.RedisServer`.
- ``redis_url`` (function): its URL (db 0); ``FLUSHDB`` after each test.
- ``mongo_uri`` (session): ``$MONGO_URI`` if set, else a private
  :class:`~devtools.embedded.MongoServer`.
- ``mongo_db`` (function): a fresh database name ``test_<8 hex>``, dropped
  after the test.
- ``replay_server`` (session): the quotes.toscrape.com capture replayed on
  127.0.0.1 (skipped when the WARC file is missing).
- ``site_factory`` (function): ``site_factory(pages, **kwargs)`` starts a
  :class:`~devtools.replay.SiteServer`; all are stopped after the test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from typing import Any, cast

import pymongo
import pytest
import redis

from devtools.embedded import MongoServer, RedisServer
from devtools.replay import Page, ReplayServer, SiteServer, default_warc_path
from tests import tiers
from tests.cluster import RedisClusterServers
from tests.workers import worker_env

SiteFactory = Callable[..., SiteServer]

tiers.install()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test the tier marks of the fixtures it uses (tests.tiers)."""
    tiers.mark_by_fixtures(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """Record the running test, so that the processes it starts are checked
    against its marks (tests.tiers)."""
    tiers.set_current(item)
    try:
        return (yield)
    finally:
        tiers.set_current(None)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server (no persistence) for the whole test session."""
    with RedisServer(appendonly=False) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """URL of the session's Redis (db 0); the db is flushed after the test."""
    yield redis_server.url
    if redis_server.running:
        client = redis.Redis.from_url(redis_server.url)
        try:
            client.flushdb()
        finally:
            client.close()


@pytest.fixture(scope="session")
def mongo_uri() -> Iterator[str]:
    """``$MONGO_URI`` when set, else the URI of a private SecantusDB server."""
    env_uri = os.environ.get("MONGO_URI")
    if env_uri:
        yield env_uri
        return
    with MongoServer() as server:
        yield server.uri


@pytest.fixture
def mongo_db(mongo_uri: str) -> Iterator[str]:
    """Name of a fresh database (``test_<8 hex>``), dropped after the test."""
    name = f"test_{uuid.uuid4().hex[:8]}"
    yield name
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        mongo_uri, serverSelectionTimeoutMS=5000
    )
    try:
        client.drop_database(name)
    finally:
        client.close()


@pytest.fixture(scope="session")
def replay_server() -> Iterator[ReplayServer]:
    """The default WARC capture served on 127.0.0.1 for the whole session.

    Tests that use it should call ``replay_server.clear_hits()`` first if
    they count requests.
    """
    warc = default_warc_path()
    if not warc.is_file():
        pytest.skip(f"WARC capture not found at {warc} (set $CRAWLER_SITES_WARC)")
    with ReplayServer(warc, host="127.0.0.1") as server:
        yield server


@pytest.fixture
def site_factory() -> Iterator[SiteFactory]:
    """A factory ``(pages=None, **kwargs) -> SiteServer`` of started servers.

    Keyword arguments go to :class:`SiteServer` (``handler``, ``host``,
    ``port``, ``latency``).  Every server made is stopped after the test.
    """
    servers: list[SiteServer] = []

    def make(pages: Mapping[str, Page] | None = None, **kwargs: Any) -> SiteServer:
        server = SiteServer(pages, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


# --- Redis Cluster (issue 5) -------------------------------------------------


@pytest.fixture(scope="session")
@tiers.gives("cluster")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A real three-master Redis Cluster on loopback ports, for the session."""
    with RedisClusterServers(masters=3) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterServers) -> Iterator[str]:
    """URL of one node of the session's cluster; every master is flushed after."""
    yield redis_cluster.url
    redis_cluster.flushall()


@pytest.fixture
def env(redis_url: str, mongo_uri: str, mongo_db: str) -> dict[str, str]:
    """The environment of worker processes and commands: this test's servers."""
    return worker_env(redis_url, mongo_uri, mongo_db)


@pytest.fixture
def db(mongo_uri: str, mongo_db: str) -> Iterator[Any]:
    """This test's MongoDB database (timezone-aware datetimes)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_uri, tz_aware=True)
    yield client[mongo_db]
    client.close()


@pytest.fixture
def rds(redis_url: str) -> Iterator[redis.Redis]:
    """A client of this test's Redis."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def stop_heartbeats() -> Iterator[None]:
    """Stop the heartbeats of schedulers opened with tests.scheduler_harness."""
    yield
    from tests.scheduler_harness import stop_opened

    stop_opened()


#: Drives ``lib.lua``'s queues (``q_push``/``q_pop``/``q_best``) from ARGV:
#: ``push|front site prio data``, ``pop site prio``, ``best site``; returns
#: each op's result ("parked" for a push to a damaged queue, "damaged" for a
#: pop of one) and, last, the problems reported, then the damaged values
#: met ("damaged <kind> <field>").
_QUEUE_DRIVER = """
K.qm, K.qc, K.lv, K.dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
K.retries, K.retryat, K.now = KEYS[5], KEYS[6], 0
local out = {}
local i = 1
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'push' or op == 'front' then
    local why, parked = q_push(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], op == 'front')
    out[#out + 1] = why or (parked and 'parked') or 'ok'
    i = i + 4
  elseif op == 'pop' then
    local data, empty, broken = q_pop(ARGV[i + 1], ARGV[i + 2], function(chunk, why)
      redis.call('RPUSH', K.dead, why)
    end)
    out[#out + 1] = data or '<nil>'
    out[#out + 1] = (broken and 'damaged') or (empty and 'empty') or 'more'
    i = i + 3
  elseif op == 'best' then
    out[#out + 1] = q_best(ARGV[i + 1]) or '<nil>'
    i = i + 2
  end
end
for j = 1, #damaged, 2 do
  problems[#problems + 1] = 'damaged ' .. damaged[j] .. ' ' .. damaged[j + 1]
end
out[#out + 1] = problems
return out
"""

#: Runs ``repair.lua`` on the keys of ``queue_lib`` (``{t}:...``).
_REPAIR_DRIVER = """
K.qm, K.qc, K.lv, K.wait, K.ready, K.due, K.joined = unpack(KEYS, 1, 7)
"""


@pytest.fixture
def queue_lib(rds: redis.Redis) -> Iterator[Callable[..., list[Any]]]:
    """``lib.lua``'s queues in keys ``{t}:qm``, ``{t}:qc``, ``{t}:lv`` (and
    ``{t}:deadq`` for what they dead-letter), driven directly: call it with
    ops (see ``_QUEUE_DRIVER``); the keys are deleted afterwards."""
    lib = resources.files("crawler.frontier").joinpath("lua/lib.lua").read_text()
    script = rds.register_script(lib + "\n" + _QUEUE_DRIVER)
    keys = ["{t}:qm", "{t}:qc", "{t}:lv", "{t}:deadq", "{t}:retries", "{t}:retryat"]

    def text(x: Any) -> Any:
        if isinstance(x, list):
            return [text(y) for y in x]
        return x.decode() if isinstance(x, bytes) else x

    def call(*args: Any) -> list[Any]:
        return cast("list[Any]", text(script(keys=keys, args=list(args))))

    yield call
    rds.delete(*keys, "{t}:wait", "{t}:ready", "{t}:due", "{t}:joined")


@pytest.fixture
def queue_repair(rds: redis.Redis) -> Callable[[str, str], list[str]]:
    """``repair.lua`` (what ``scrapy frontier audit --repair`` and a worker
    run on a damaged queue value) on ``queue_lib``'s keys: call it with
    ``kind, field``; returns its lines (what it found and did)."""
    folder = resources.files("crawler.frontier").joinpath("lua")
    source = folder.joinpath("lib.lua").read_text() + "\n" + _REPAIR_DRIVER + \
        folder.joinpath("repair.lua").read_text()
    script = rds.register_script(source)
    keys = ["{t}:qm", "{t}:qc", "{t}:lv", "{t}:wait", "{t}:ready", "{t}:due", "{t}:joined"]

    def call(kind: str, field: str) -> list[str]:
        from crawler.frontier import protocol

        reply = script(keys=keys, args=[protocol.header("repair")({"kind": kind,
                                                                   "field": field})])
        return protocol.repaired_of(reply)

    return call
