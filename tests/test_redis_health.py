"""During a Redis outage, a probe from a thread of its own tells when Redis
answers again; one probe at a time, however often the reactor asks."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest
import redis as redis_lib
from scrapy import Request

import tests.scheduler_harness as harness
from crawler.frontier.health import RedisHealth, redis_answered
from crawler.frontier.spider import FrontierSpider
from tests.test_config_errors import password_redis  # noqa: F401 (a fixture)
from tests.test_faults import proxy  # noqa: F401 (a fixture)
from tests.waiting import wait_for

if TYPE_CHECKING:
    from tests.faultproxy import FaultProxy
    from tests.test_config_errors import PasswordRedisServer

pytestmark = pytest.mark.faults


def probes() -> int:
    return sum(t.name == "frontier-redis-probe" for t in threading.enumerate())


def test_a_probe_held_by_a_silent_redis_is_the_only_one_and_ends_the_outage_once_answered(
    proxy: FaultProxy,  # noqa: F811
) -> None:
    client = redis_lib.Redis.from_url(proxy.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    answers: list[None] = []
    health = RedisHealth(client.ping, lambda: answers.append(None))
    health.failed()
    proxy.lose_replies(times=10**9, mode="hold", hold=600)
    for _ in range(20):
        health.probe()
    assert probes() == 1  # (held by the proxy: no second one while it waits)
    wait_for(lambda: probes() == 0, 5, "the held probe to time out")
    assert health.failing
    assert not health.answered
    proxy.stop_losing()
    wait_for(lambda: health.probe() or health.answered, 5, "a probe to be answered", 0.1)
    assert health.failing  # (until a real call succeeds: recovered())
    health.recovered()
    assert not health.failing
    assert not answers  # (called on a running reactor only)
    client.close()


def test_a_probe_that_redis_refuses_ends_the_outage_so_the_calls_meet_the_refusal(
    password_redis: PasswordRedisServer,  # noqa: F811
) -> None:
    """A password rotated during an outage: the probe's refusal is an
    answer, so the frontier's calls go ahead and stop the worker with a
    configuration error instead of waiting for a probe that never passes."""
    client = redis_lib.Redis(host=password_redis.host, port=password_redis.port,
                             password="not-the-password", socket_timeout=1.0)
    answers: list[None] = []
    health = RedisHealth(client.ping, lambda: answers.append(None))
    health.failed()
    health.probe()
    wait_for(lambda: health.answered, 5, "the refused probe to count as an answer")
    assert redis_answered(redis_lib.AuthenticationError("invalid password"))
    assert redis_answered(redis_lib.ResponseError("NOPERM"))
    assert not redis_answered(redis_lib.ConnectionError("Connection refused"))
    assert not redis_answered(redis_lib.TimeoutError("Timeout reading from socket"))


def test_an_outage_met_by_any_component_forgets_the_local_fingerprints(redis_url: str) -> None:
    """Redis back from an older snapshot (a restart, a failover to a lagging
    replica) may reach the scheduler's own calls without an error, when only
    another component (the seed reader, the robots.txt middleware) met the
    closed connection: the worker forgets its local fingerprints all the
    same, so a request queued before and lost with the rollback is queued
    again, not dropped as a duplicate."""

    class _Spider(FrontierSpider):
        name = "health_rollback_test"

    scheduler, _ = harness.open_scheduler(redis_url, _Spider)
    assert scheduler.enqueue_request(Request("https://a.example/p1"))
    assert scheduler.flush_outbox()
    rds = redis_lib.Redis.from_url(redis_url)
    shard = scheduler.queue.shards[0]
    rds.delete(shard.key("dupefilter"), shard.key("count"), shard.key("qm"), shard.key("qc"),
               shard.key("lv"), shard.key("wait"), shard.key("ready"), shard.key("due"))
    scheduler.redis_health.failed()  # (what note_redis_failure does for the seed reader)
    scheduler.redis_health.recovered()
    assert scheduler.enqueue_request(Request("https://a.example/p1"))
    assert scheduler.flush_outbox()
    assert int(rds.get(shard.key("count")) or 0) == 1
