"""The scheduler's session on its own (:mod:`crawler.frontier.session`,
:mod:`crawler.frontier.backoff`), against a real Redis, through the fault
proxy where a reply is lost or Redis is cut off: one round trip for the
outbox and a lease, no call sent twice, a lost reply found out before
anything else, scripts Redis forgot loaded again, refusals, outages and
configuration errors told apart."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from scrapy import Spider
from scrapy.utils.test import get_crawler

from crawler.frontier.backoff import OUTAGE_BACKOFF_CAP
from crawler.frontier.connection import get_redis
from crawler.frontier.outbox import Op, Outbox
from crawler.frontier.session import Session
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Committed, Lease, NotDue, Push
from tests.faultproxy import FaultProxy
from tests.scheduler_harness import reactor_loop

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

pytestmark = pytest.mark.faults

LUA = Path(__file__).resolve().parent.parent / "crawler" / "frontier" / "lua"
HOLDER = "sess-worker#0001"


class _Spider(Spider):
    name = "sess"


class _Host:
    """The scheduler's side of the session: records what it is told."""

    def __init__(self) -> None:
        self.commits: list[tuple[int, list[Op], Committed | None]] = []
        self.found: list[Lease] = []
        self.passed: list[tuple[Lease | NotDue, int]] = []
        self.forgotten: list[int] = []
        self.seen_forgotten = 0
        self.woken = 0

    def lease_options(self, shard: int) -> dict[str, Any]:
        return {"held_all": 0}

    def committed(self, shard: int, ops: list[Op], reply: Committed | None) -> None:
        self.commits.append((shard, ops, reply))

    def leases_found(self, leases: list[Lease]) -> None:
        self.found.extend(leases)

    def passed_over(self, result: Lease | NotDue, shard: int) -> None:
        self.passed.append((result, shard))

    def forget_shard(self, shard: int) -> None:
        self.forgotten.append(shard)

    def forget_seen(self) -> None:
        self.seen_forgotten += 1

    def wake(self) -> None:
        self.woken += 1


@pytest.fixture
def proxy(redis_url: str, rds: redis.Redis) -> Iterator[FaultProxy]:
    rds.script_flush()
    with FaultProxy(redis_url) as fault_proxy:
        yield fault_proxy


def _session(url: str, **settings: Any) -> tuple[Session, _Host, Any]:
    """A session of one shard through ``url``, its host, and its crawler."""
    reactor_loop()
    crawler = get_crawler(_Spider, {
        "REDIS_URL": url,
        "REDIS_PARAMS": {"socket_timeout": 0.5, "socket_connect_timeout": 2},
        **settings,
    })
    crawler.stats.open_spider()
    server = get_redis(crawler.settings)
    host = _Host()
    outbox = Outbox(60.0, flush=lambda: True, resume_at=lambda: 0.0)
    session = Session(server, crawler, HOLDER, outbox, host)
    session.shards = FrontierShards.build(server, "sess", 1)
    session.shards.load_scripts()
    return session, host, crawler


def _push(outbox: Outbox, path: str, fingerprint: bytes) -> None:
    push = Push(f"https://a.example/{path}".encode(), "a.example", 0, fingerprint, False)
    outbox.write("pushes", item=push, shard=0)


def _queued(rds: redis.Redis) -> int:
    return int(rds.get("{sess}:count") or 0)


def test_one_round_trip_commits_the_outbox_then_leases_what_it_queued(
    redis_url: str, rds: redis.Redis
) -> None:
    session, host, _crawler = _session(redis_url)
    _push(session.outbox, "1", b"f1")
    leased = session.exchange([f"{HOLDER}:0"], 0)
    assert isinstance(leased, list) and [lease.data for lease in leased] == [
        b"https://a.example/1"
    ]
    assert not session.outbox
    [(shard, ops, reply)] = host.commits
    assert shard == 0 and [op.item.fingerprint for op in ops] == [b"f1"]
    assert reply is not None and reply.pushed == [True]
    assert session.seq == 1 and session.in_doubt is None
    assert session.exchange(None) is True  # nothing to send: sent
    assert session.outbox.writes() == 0


def test_a_lost_reply_is_found_out_before_anything_else_and_no_call_runs_twice(
    proxy: FaultProxy, rds: redis.Redis
) -> None:
    session, host, crawler = _session(proxy.url)
    lease = (LUA / "lease.lua").read_text()
    commit = (LUA / "commit.lua").read_text()
    _push(session.outbox, "1", b"f1")
    rule = proxy.lose_replies(script=lease)
    ids = [f"{HOLDER}:0", f"{HOLDER}:1"]
    assert session.exchange(ids, 0) is None
    assert rule.acted == 1
    doubt = session.in_doubt
    assert doubt is not None and doubt.seq == 1 and doubt.lease_ids == ids
    assert crawler.stats.get_value("frontier/redis/in_doubt") == 1
    assert session.outbox.writes() == 1  # not known to be in
    assert session.down_until > time.monotonic()
    session.down_until = 0.0
    commits = len(proxy.commands(script=commit))
    assert session.exchange(None) is True  # the doubt resolved first, nothing resent
    assert len(proxy.commands(script=commit)) == commits
    assert session.in_doubt is None and not session.outbox
    assert host.forgotten == [0]
    assert [(shard, reply) for shard, _, reply in host.commits] == [(0, None)]
    assert [lease.data for lease in host.found] == [b"https://a.example/1"]
    assert _queued(rds) == 0 and rds.zcard("{sess}:leases") == 1
    assert session.backoff == 0.0


def test_scripts_redis_forgot_are_loaded_and_the_calls_sent_once_more(
    redis_url: str, rds: redis.Redis
) -> None:
    session, host, _ = _session(redis_url)
    _push(session.outbox, "1", b"f1")
    rds.script_flush()
    assert session.exchange(None) is True
    assert host.seen_forgotten == 1  # (Redis may be older than what this worker saw)
    assert _queued(rds) == 1 and not session.outbox


def test_a_refused_call_keeps_its_writes_and_waits_without_an_outage(
    redis_url: str, rds: redis.Redis
) -> None:
    session, _, crawler = _session(redis_url)
    rds.set("{sess}:dupefilter", "not a set")
    _push(session.outbox, "1", b"f1")
    assert session.exchange(None) is None
    assert crawler.stats.get_value("frontier/redis/refused") == 1
    assert crawler.stats.get_value("frontier/redis/outages") is None
    assert session.outbox.writes() == 1 and session.in_doubt is None
    assert not session.unreachable and session.backoff == 0.5
    assert session.exchange(None) is None  # within the pause: not sent
    assert crawler.stats.get_value("frontier/redis/refused") == 1
    session.down_until = 0.0
    assert session.exchange(None) is None
    assert session.backoff == 1.0  # doubled
    rds.delete("{sess}:dupefilter")
    session.down_until = 0.0
    assert session.exchange(None) is True and session.backoff == 0.0
    assert _queued(rds) == 1


def test_an_outage_doubles_the_pause_once_counted_and_an_answer_ends_it(
    proxy: FaultProxy, rds: redis.Redis
) -> None:
    session, host, crawler = _session(proxy.url)
    _push(session.outbox, "1", b"f1")
    with proxy.outage():
        assert session.exchange(None) is None
        assert session.unreachable and session.backoff == 0.5
        assert session.in_doubt is not None  # (sent or not: not known)
        assert host.seen_forgotten == 1
        session.down_until = 0.0
        assert session.exchange(None) is None  # the doubt cannot be resolved yet
        assert session.backoff == 1.0
        for _ in range(10):
            session.outage(ConnectionError("gone"))
        assert session.backoff == OUTAGE_BACKOFF_CAP
    assert crawler.stats.get_value("frontier/redis/outages") == 1
    session.down_until = 0.0
    assert session.exchange(None) is True
    assert not session.unreachable and session.backoff == 0.0
    assert _queued(rds) == 1


def test_a_configuration_error_gives_the_writes_up_and_sends_nothing_more(
    redis_url: str, rds: redis.Redis
) -> None:
    user, password = "parts-no-scripts", "parts-secret-pw"
    rds.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"],
        commands=["+@all", "-evalsha", "-eval"],
    )
    try:
        parts = urlsplit(redis_url)
        url = urlunsplit(parts._replace(
            netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"
        ))
        session, host, crawler = _session(url)
        _push(session.outbox, "1", b"f1")
        session.outbox.write("after_commit", done=lambda: pytest.fail("given up"))
        assert session.exchange(None) is None
        assert session.config_stopped and session.unreachable
        assert not session.outbox and session.in_doubt is None
        assert session.down_until - time.monotonic() > 60
        assert crawler.stats.get_value("frontier/redis/refused") is None
        assert host.seen_forgotten == 1
    finally:
        rds.acl_deluser(user)
    assert _queued(rds) == 0
