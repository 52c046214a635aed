"""A delay override changed while a site waits (``lua/delay.lua``): the new
delay counts from the site's last request, either way. Before, a site
waiting out an hour's delay kept waiting after ``--unset``, and a raised
delay began only after the next request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from redis.exceptions import ResponseError

from crawler.frontier.store import Frontier, Lease, NotDue
from crawler.keys import site_prefix
from tests.test_overrides import frontier as cli

if TYPE_CHECKING:
    import redis

HOUR_MS = 3_600_000


def _frontier(rds: redis.Redis, **kwargs: object) -> Frontier:
    f = Frontier(rds, "pages", **{"default_concurrency": 4, **kwargs})  # type: ignore[arg-type]
    f.load_scripts()
    return f


def _push(f: Frontier, *paths: str) -> None:
    for path in paths:
        url = "https://a.example" + path
        assert f.push(url.encode(), site="a.example", priority=0, fingerprint=url.encode(),
                      dont_filter=False)


def _lease_one(f: Frontier, n: int) -> Lease | NotDue:
    result = f.lease_many([f"w#1:{n}"])
    if isinstance(result, list):
        [lease] = result
        f.ack([lease.lease_id])
        return lease
    return result


def _now_ms(rds: redis.Redis) -> int:
    seconds, micros = rds.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_site_waiting_out_a_long_delay_is_served_at_once_when_it_is_removed(
    rds: redis.Redis,
) -> None:
    f = _frontier(rds)
    assert f.set_delay("a.example", HOUR_MS) == (False, 0)
    _push(f, "/1", "/2")
    assert isinstance(_lease_one(f, 0), Lease)
    waiting = _lease_one(f, 1)
    assert isinstance(waiting, NotDue) and waiting.wait is not None and waiting.wait > 3500

    removed, moved = f.set_delay("a.example", None)

    assert removed and -3_960_000 <= moved < -3_950_000  # its pace, an hour plus 10%
    assert not rds.hexists("{pages}:delay", "a.example")
    lease = _lease_one(f, 2)
    assert isinstance(lease, Lease) and lease.data == b"https://a.example/2"
    assert f.set_delay("a.example", None) == (False, 0)  # again: nothing to move


def test_a_lowered_delay_counts_from_the_last_request_and_a_raised_one_holds_it_longer(
    rds: redis.Redis,
) -> None:
    f = _frontier(rds, delay_margin=0.0)
    f.set_delay("a.example", HOUR_MS)
    _push(f, "/1", "/2")
    _lease_one(f, 0)
    leased_at = int(rds.hget("{pages}:due", "a.example") or 0) - HOUR_MS

    # Lowered to 60 s: due 60 s after the last request, not an hour.
    assert f.set_delay("a.example", 60_000)[1] == 60_000 - HOUR_MS
    assert int(rds.hget("{pages}:due", "a.example") or 0) == leased_at + 60_000
    assert rds.zscore("{pages}:wait", "a.example") == leased_at + 60_000
    assert f.set_delay("a.example", 60_000) == (False, 0)  # idempotent

    # Raised to 2 hours: due 2 hours after it.
    assert f.set_delay("a.example", 2 * HOUR_MS)[1] == 2 * HOUR_MS - 60_000
    assert rds.zscore("{pages}:wait", "a.example") == leased_at + 2 * HOUR_MS
    waiting = _lease_one(f, 1)
    assert isinstance(waiting, NotDue) and waiting.wait is not None and waiting.wait > 7000


def test_a_raised_delay_holds_a_site_already_due(rds: redis.Redis) -> None:
    """Due again (its 1 s delay passed) and in the ready index: raised to
    an hour, it waits an hour from its last request."""
    f = _frontier(rds, delay_margin=0.0)
    f.set_delay("a.example", 0)
    _push(f, "/1", "/2")
    _lease_one(f, 0)
    due = int(rds.hget("{pages}:due", "a.example") or 0)
    assert due <= _now_ms(rds)
    assert f.set_delay("a.example", HOUR_MS)[1] == HOUR_MS
    waiting = _lease_one(f, 1)
    assert isinstance(waiting, NotDue) and waiting.wait is not None and waiting.wait > 3500
    assert rds.zscore("{pages}:wait", "a.example") == due + HOUR_MS


def test_a_lowered_delay_never_brings_a_site_before_now_or_moves_one_long_due(
    rds: redis.Redis,
) -> None:
    f = _frontier(rds)
    rds.hset("{pages}:delay", "a.example", HOUR_MS)
    long_ago = _now_ms(rds) - 10 * HOUR_MS
    rds.hset("{pages}:due", "a.example", long_ago)
    assert f.set_delay("a.example", 0) == (False, 0)
    assert int(rds.hget("{pages}:due", "a.example") or 0) == long_ago

    soon = _now_ms(rds) + 1000  # (a robots.txt outage's hold, say: shorter than the pace)
    rds.hset("{pages}:delay", "a.example", HOUR_MS)
    rds.hset("{pages}:due", "a.example", soon)
    _, moved = f.set_delay("a.example", None)
    assert -1000 <= moved <= 0
    assert _now_ms(rds) - 100 <= int(rds.hget("{pages}:due", "a.example") or 0) <= soon


def test_the_pace_counts_the_crawl_delay_and_the_slow_delay_and_bad_values_are_ignored(
    rds: redis.Redis,
) -> None:
    f = _frontier(rds, delay_margin=0.0, default_delay=0.5)
    rds.hset("{pages}:rdelay", "a.example", 10_000)  # robots.txt Crawl-delay: 10 s
    rds.hset("{pages}:slow", "a.example", 250)
    rds.hset("{pages}:delay", "a.example", "2s")  # by hand: workers use the default
    rds.hset("{pages}:due", "a.example", _now_ms(rds) + 5000)
    # max(60 s, 10 s) + 0.25 against max(0.5 s, 10 s) + 0.25: 50 s later
    assert f.set_delay("a.example", 60_000) == (False, 50_000)


def test_a_key_of_the_wrong_type_refuses_the_call_and_writes_nothing(rds: redis.Redis) -> None:
    f = _frontier(rds)
    rds.set("{pages}:wait", "x")
    with pytest.raises(ResponseError, match=r"\{pages\}:wait holds a string"):
        f.set_delay("a.example", 0)
    assert not rds.exists("{pages}:delay")
    with pytest.raises(ValueError, match="whole ms >= 0"):
        f.set_delay("a.example", -1)


@pytest.mark.workers
def test_the_command_says_how_far_the_sites_next_request_moved(
    redis_url: str, rds: redis.Redis,
) -> None:
    f = _frontier(rds)
    f.set_delay("a.example", HOUR_MS)
    _push(f, "/1", "/2")
    _lease_one(f, 0)

    done = cli(redis_url, "delay", "pages", "a.example", "--unset")

    assert done.returncode == 0, done.stderr
    assert "removed the delay override of a.example from {pages}:delay" in done.stdout
    assert "a.example's next request moved 39" in done.stdout
    assert "s sooner: the delay counts from its last one" in done.stdout
    assert isinstance(_lease_one(f, 1), Lease)


@pytest.mark.workers
def test_bad_values_in_the_pace_are_reported_by_the_command(
    redis_url: str, rds: redis.Redis,
) -> None:
    """A Crawl-delay or slow mark that is not whole ms is left out of the
    pace, as the lease script does, and the command says so."""
    rds.hset("{pages}:rdelay", "a.example", "10s")
    rds.hset("{pages}:slow", "a.example", "-5")
    rds.hset("{pages}:due", "a.example", _now_ms(rds) + 5000)

    done = cli(redis_url, "delay", "pages", "a.example", "60", "-s", "FRONTIER_DELAY_MARGIN=0",
               "-s", "FRONTIER_DELAY=0")

    assert done.returncode == 0, done.stderr
    assert 'Bad value in Redis: {pages}:rdelay a.example = "10s" ignored' in done.stderr
    assert 'Bad value in Redis: {pages}:slow a.example = "-5" ignored' in done.stderr
    assert "a.example's next request moved 60 s later" in done.stdout, done.stdout


@pytest.mark.workers
def test_a_resent_delay_call_moves_nothing_twice_and_a_sharded_crawl_moves_its_shard(
    redis_url: str, rds: redis.Redis,
) -> None:
    """delay.lua sent again after a lost reply moves the due time once; on a
    crawl of 2 shards the command moves the due time in the site's shard."""
    f = Frontier(rds, "pages", default_concurrency=4, delay_margin=0.0)
    f.load_scripts()
    seconds, micros = rds.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    rds.hset("{pages}:due", "a.example", now + 50_000)
    assert f.set_delay("a.example", 60_000) == (False, 60_000)
    assert f.set_delay("a.example", 60_000) == (False, 0)  # resent: idempotent
    prefix = site_prefix("pages", "b.example", 2)
    rds.set("{pages}:shards", 2)
    rds.hset(prefix + "due", "b.example", now + 50_000)
    done = cli(redis_url, "delay", "pages", "b.example", "60", "-s", "FRONTIER_SHARDS=2",
               "-s", "FRONTIER_DELAY_MARGIN=0", "-s", "FRONTIER_DELAY=0")
    assert done.returncode == 0, done.stderr
    assert rds.hget(prefix + "delay", "b.example") == b"60000"
    assert int(rds.hget(prefix + "due", "b.example") or 0) == now + 110_000, done.stdout
