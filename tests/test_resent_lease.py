"""Held-back cases for the resent lease after a NOSCRIPT commit (6d6d76b)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scrapy import Request

from crawler.frontier.luasource import script_source
from tests import scheduler_harness as harness
from tests.test_shards_faults import _open, _Spider, proxy  # noqa: F401

if TYPE_CHECKING:
    import redis

    from crawler.frontier.scheduler import FrontierScheduler
    from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.usefixtures("stop_heartbeats")

LUA = Path(__file__).resolve().parent.parent / "crawler" / "frontier" / "lua"


def _forget_all_but_lease(rds: redis.Redis) -> None:
    rds.script_flush()
    rds.script_load(script_source("lease.lua"))


def _arrange(via: FaultProxy, rds: redis.Redis, shards: int) -> FrontierScheduler:
    """A scheduler through ``via`` that found every shard empty, with one
    request in its outbox, and Redis holding only the lease script."""
    scheduler, _ = harness.open_scheduler(
        via.url, _Spider, FRONTIER_SHARDS=shards, CONCURRENT_REQUESTS=4,
        REDIS_PARAMS={"socket_timeout": 0.5, "socket_connect_timeout": 2},
    )
    assert scheduler.next_request() is None
    assert scheduler.enqueue_request(Request("https://late.example/a"))
    _forget_all_but_lease(rds)
    return scheduler


@pytest.mark.parametrize("mode", ["drop", "hold"])
@pytest.mark.parametrize("shards", [1, 3])
def test_resent_lease_whose_reply_is_lost(
    proxy: FaultProxy, rds: redis.Redis, mode: str, shards: int  # noqa: F811
) -> None:
    scheduler = _arrange(proxy, rds, shards)
    lease = (LUA / "lease.lua").read_text()
    commit = (LUA / "commit.lua").read_text()
    # the first lease (nothing due) passes; the second (the resent one) is lost
    rule = proxy.lose_replies(script=lease, skip=1, mode=mode, hold=3)
    before_l = len(proxy.commands(script=lease))
    before_c = len(proxy.commands(script=commit))
    assert scheduler.next_request() is None
    assert rule.acted == 1
    assert len(proxy.commands(script=lease)) - before_l == 2
    assert len(proxy.commands(script=commit)) - before_c == 2  # NOSCRIPT + resent
    doubt = scheduler.session.in_doubt
    assert doubt is not None and doubt.lease_ids
    scheduler.session.down_until = 0.0
    request = harness.wait_for_request(scheduler, 3.0)
    assert request.url == "https://late.example/a"
    assert not scheduler.outbox.ops and scheduler.session.in_doubt is None
    harness.finish(scheduler, request)
    assert scheduler.next_request() is None
    assert scheduler.queue.shards.audit() == {}


@pytest.mark.parametrize("shards", [1, 3])
def test_resent_lease_loops_once(
    proxy: FaultProxy, rds: redis.Redis, shards: int  # noqa: F811
) -> None:
    """A commit that meets NOSCRIPT twice: the lease is sent twice, no more."""
    scheduler = _arrange(proxy, rds, shards)
    lease = (LUA / "lease.lua").read_text()
    commit = (LUA / "commit.lua").read_text()
    # after the first lease's reply, the scripts are forgotten again... once loaded,
    # flush again so that the resent commit meets NOSCRIPT too
    orig = scheduler.queue.shards.load_scripts

    def load_then_forget() -> None:
        orig()
        _forget_all_but_lease(rds)

    scheduler.queue.shards.load_scripts = load_then_forget  # type: ignore[method-assign]
    before_l = len(proxy.commands(script=lease))
    before_c = len(proxy.commands(script=commit))
    result = scheduler.next_request()
    assert len(proxy.commands(script=lease)) - before_l == 2
    assert len(proxy.commands(script=commit)) - before_c == 2
    assert result is None
    assert scheduler.outbox.ops and scheduler.session.in_doubt is None
    scheduler.queue.shards.load_scripts = orig  # type: ignore[method-assign]
    request = harness.wait_for_request(scheduler, 3.0)
    assert request.url == "https://late.example/a"
    harness.finish(scheduler, request)
    assert scheduler.queue.shards.audit() == {}


def test_lease_noscript_while_commits_ran(
    proxy: FaultProxy, rds: redis.Redis  # noqa: F811
) -> None:
    scheduler = _open(proxy.url)
    assert scheduler.next_request() is None
    assert scheduler.enqueue_request(Request("https://late.example/a"))
    rds.script_flush()
    rds.script_load(script_source("commit.lua"))
    commit = (LUA / "commit.lua").read_text()
    before_c = len(proxy.commands(script=commit))
    request = harness.wait_for_request(scheduler, 3.0)
    assert request.url == "https://late.example/a"
    assert len(proxy.commands(script=commit)) - before_c == 1
    harness.finish(scheduler, request)
    assert scheduler.queue.shards.audit() == {}


def test_commit_of_another_shard_not_run_does_not_resend_lease(
    proxy: FaultProxy, rds: redis.Redis  # noqa: F811
) -> None:
    """Writes for every shard, all commits meet NOSCRIPT, lease of one shard
    finds nothing: all handed out, each commit at most twice, lease at most twice."""
    scheduler = _open(proxy.url)
    assert scheduler.next_request() is None
    urls = [f"https://s{i}.example/a" for i in range(12)]
    for u in urls:
        assert scheduler.enqueue_request(Request(u))
    _forget_all_but_lease(rds)
    lease = (LUA / "lease.lua").read_text()
    before_l = len(proxy.commands(script=lease))
    got = [scheduler.next_request()]
    assert got[0] is not None
    assert len(proxy.commands(script=lease)) - before_l <= 2
    while len(got) < len(urls):
        got.append(harness.wait_for_request(scheduler, 3.0))
    assert sorted(r.url for r in got) == sorted(urls)
    for r in got:
        harness.finish(scheduler, r)
    assert scheduler.queue.shards.audit() == {}
