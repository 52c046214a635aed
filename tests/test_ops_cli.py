"""Operator-facing behaviour of ``scrapy frontier`` / ``scrapy deadletters`` and
of an idle worker: unknown spiders, Redis down, ``--watch`` off a terminal,
requeued dead letters' priority, and what a worker says while it waits.

Everything runs against the real servers of ``tests/conftest.py``; the
commands run as subprocesses, as an operator runs them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import selectors
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
from scrapy import Request, Spider, signals
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.utils.test import get_crawler

from crawler.commands.deadletters import requeue
from crawler.frontier.serializer import entry_fields
from crawler.frontier.store import Frontier
from crawler.spiders.quotes import QuotesSpider
from devtools.embedded import free_port
from tests import scheduler_harness as harness

if TYPE_CHECKING:
    import redis

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable


class _Spider(Spider):
    name = "ops"


def scrapy(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``scrapy ARGS`` in the project, as an operator would."""
    return subprocess.run(
        [PYTHON, "-m", "scrapy", *args],
        cwd=ROOT,
        env={**env, "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def down_env(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """The environment with ``REDIS_URL`` on a port nothing listens on, with
    credentials in it; and the URL as the commands must show it (masked)."""
    port = free_port()
    return (
        {**env, "REDIS_URL": f"redis://ops:s3cret@127.0.0.1:{port}/0"},
        f"redis://ops:****@127.0.0.1:{port}/0",
    )


# -- unknown spiders -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["frontier", "status", "nosuch"],
        ["frontier", "status", "quotes", "nosuch", "--json"],
        ["deadletters", "list", "nosuch"],
        ["deadletters", "requeue", "nosuch"],
        ["deadletters", "purge", "nosuch"],
        ["frontier", "overrides", "nosuch"],
        ["frontier", "delay", "nosuch", "a.example", "1"],
    ],
    ids=lambda args: "-".join(a for a in args if a != "nosuch"),
)
@pytest.mark.workers
def test_unknown_spider_exits_2_naming_the_known_ones(
    env: dict[str, str], rds: redis.Redis, args: list[str]
) -> None:
    rds.rpush("{nosuch}:dead", json.dumps({"url": "https://a.example/", "request": None}))
    result = scrapy(env, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "unknown spider 'nosuch': expected one of pages, quotes" in result.stderr
    assert "Traceback" not in result.stderr
    if "--json" in args:  # the error as JSON, on stdout
        assert "unknown spider 'nosuch'" in json.loads(result.stdout)["error"]
    else:
        assert result.stdout == ""
    assert rds.llen("{nosuch}:dead") == 1  # nothing purged nor requeued


# -- Redis down ------------------------------------------------------------------------


@pytest.mark.workers
def test_status_with_redis_down_names_the_url_and_the_cause_and_exits_1(
    env: dict[str, str],
) -> None:
    env, shown = down_env(env)
    result = scrapy(env, "frontier", "status", "quotes")
    assert result.returncode == 1
    assert f"could not read Redis at {shown}: ConnectionError" in result.stderr
    assert "Connection refused" in result.stderr
    output = result.stdout + result.stderr
    assert "s3cret" not in output and "Traceback" not in output
    # No figures are shown as if the crawl were empty.
    assert "seeds waiting" not in output and "requests queued" not in output

    result = scrapy(env, "frontier", "status", "quotes", "--json")
    assert result.returncode == 1
    status = json.loads(result.stdout)
    assert status["spiders"] == {}
    assert status["errors"]["redis"].startswith(f"{shown}: ConnectionError")
    assert "redis" not in status["errors"].get("mongodb", "")
    assert "s3cret" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["deadletters", "list", "quotes"],
        ["deadletters", "requeue", "quotes"],
        ["deadletters", "purge", "quotes"],
        ["frontier", "overrides", "quotes"],
        ["frontier", "concurrency", "quotes", "a.example", "2"],
        ["frontier", "audit", "quotes"],
    ],
    ids="-".join,
)
@pytest.mark.workers
def test_other_subcommands_with_redis_down_exit_3_naming_the_url(
    env: dict[str, str], args: list[str]
) -> None:
    env, shown = down_env(env)
    result = scrapy(env, *args)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert f"Redis at {shown} failed: ConnectionError" in result.stderr
    output = result.stdout + result.stderr
    assert "s3cret" not in output and "Traceback" not in output


# -- --watch off a terminal -------------------------------------------------------------


def read_snapshots(proc: subprocess.Popen[bytes], count: int, timeout: float = 30.0) -> str:
    """Read ``proc``'s stdout until it holds ``count`` status snapshots."""
    assert proc.stdout is not None
    out = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while out.count(b"frontier status at ") < count + 1:
            # The snapshot after the count-th one has started: the count-th is whole.
            left = deadline - time.monotonic()
            assert left > 0, f"{count} snapshots not seen: {out!r}"
            if selector.select(left):
                chunk = os.read(proc.stdout.fileno(), 65536)
                assert chunk, f"the watch ended: {out!r}"
                out += chunk
    return out.decode()


def watch(env: dict[str, str], *args: str) -> str:
    """Two snapshots of ``scrapy frontier status --watch`` piped to us."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "scrapy", "frontier", "status", *args, "--watch", "--interval", "0.2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        return read_snapshots(proc, 2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.workers
def test_watch_off_a_terminal_writes_a_plain_snapshot_per_interval(
    env: dict[str, str], rds: redis.Redis
) -> None:
    rds.lpush("quotes:start_urls", "https://a.example/", "https://b.example/")
    out = watch(env, "quotes")
    snapshots = out.split("frontier status at ")[1:3]
    for snapshot in snapshots:
        assert re.search(r"seeds waiting\s*\S\s*2\s", snapshot), snapshot
    assert "\x1b" not in out  # no cursor movement, no colour


@pytest.mark.workers
def test_watch_with_redis_down_shows_the_error_at_each_refresh_and_goes_on(
    env: dict[str, str],
) -> None:
    env, shown = down_env(env)
    out = watch(env, "quotes")
    snapshots = out.split("frontier status at ")[1:3]
    for snapshot in snapshots:
        assert f"could not read Redis at {shown}: ConnectionError" in snapshot.replace("\n", " ")
    assert "s3cret" not in out and "\x1b" not in out


# -- requeued dead letters ---------------------------------------------------------------


def leased_at(rds: redis.Redis, spider: str, leases: object) -> list[tuple[int, int]]:
    """Per lease: the priority it was queued at (from its lease data) and the
    priority in its request's entry."""
    assert isinstance(leases, list), leases
    out = []
    for lease in leases:
        data = cast("bytes", rds.hget(f"{{{spider}}}:ldata", lease.lease_id))
        out.append((int(data.split(b"\t")[0]), entry_fields(lease.data).get("p", 0)))
    return sorted(out)


def test_a_requeued_dead_letter_comes_back_at_the_priority_it_was_first_scheduled_at(
    redis_url: str, rds: redis.Redis, stop_heartbeats: None
) -> None:
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider)
    # A request at priority 5 fails three times: Scrapy retries it twice,
    # at priority 4 then 3 (RETRY_PRIORITY_ADJUST -1), then gives up.
    request = Request("https://a.example/flaky", priority=5)
    for _ in range(2):
        retried = get_retry_request(request, spider=crawler.spider, reason="500")
        assert retried is not None
        request = retried
    assert (request.priority, request.meta["retry_times"]) == (3, 2)
    scheduler.dead_letter(request, "gave up after 3 attempts: 500")
    # One whose meta asks for its own adjustment (Scrapy's priority_adjust).
    own = Request("https://a.example/own", priority=1, meta={"priority_adjust": -10})
    other = get_retry_request(own, spider=crawler.spider, reason="503", priority_adjust=-10)
    assert other is not None and other.priority == -9
    scheduler.dead_letter(other, "gave up")
    assert scheduler.flush_outbox()
    frontier = Frontier(rds, "ops")
    assert requeue(frontier) == (2, 0)
    leased = frontier.lease_many(["v#1:0", "v#1:1"])
    assert leased_at(rds, "ops", leased) == [(1, 1), (5, 5)]
    assert isinstance(leased, list)
    for lease in leased:
        assert "retry_times" not in entry_fields(lease.data).get("m", {})


@pytest.mark.workers
def test_a_dead_letter_the_frontier_buried_comes_back_at_its_first_priority(
    rds: redis.Redis, env: dict[str, str],
) -> None:
    # A retried request (priority 2 -> 1, retry_times 1) whose worker died
    # with it more than FRONTIER_MAX_DELIVERIES times: lease.lua buries it.
    frontier = Frontier(rds, "quotes", max_deliveries=1)
    data = json.dumps({"u": "/x", "p": 1, "m": {"retry_times": 1, "depth": 3}}).encode()
    assert frontier.push(data, site="a.example", priority=1, fingerprint=None, dont_filter=True)
    assert isinstance(frontier.lease_many(["dies#1:0"]), list)
    rds.zadd("{quotes}:leases", {"dies#1:0": 0}, xx=True)  # it has expired
    rds.zrem("{quotes}:alive", "dies#1")  # its worker died (not seen since it leased)
    assert not isinstance(frontier.lease_many(["v#1:0"]), list)
    [record] = [json.loads(d) for d in rds.lrange("{quotes}:dead", 0, -1)]
    assert record["priority"] == 1 and record["entry"]
    result = scrapy(env, "deadletters", "requeue", "quotes")
    assert result.returncode == 0, result.stderr
    assert "requeued 1 dead letters of quotes" in result.stdout
    again = frontier.lease_many(["v#2:0"])
    assert leased_at(rds, "quotes", again) == [(2, 2)]
    assert isinstance(again, list)
    # Requeued in the current form (the dead letter held the JSON form).
    assert again[0].data == b'/x\t\t3\t{"p":2}'
    assert entry_fields(again[0].data) == {"u": "/x", "p": 2, "m": {"depth": 3}}


# -- an idle worker waiting for a dead worker's leases ----------------------------------


def test_an_idle_worker_says_which_dead_workers_leases_it_waits_for_and_until_when(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture, stop_heartbeats: None
) -> None:
    ghost = Frontier(rds, "ops", lease_timeout=30.0)
    for i in range(3):
        url = f"https://g.example/{i}"
        ghost.push(json.dumps({"u": url}).encode(), site="g.example", priority=0,
                   fingerprint=None, dont_filter=True)
    leased = ghost.lease_many(["ghost-w#dead0001:0", "ghost-w#dead0001:1", "ghost-w#dead0001:2"])
    assert isinstance(leased, list) and len(leased) == 3
    # The ghost never acks nor beats again: its last heartbeat was 12 s ago.
    seconds, micros = rds.time()
    now_ms = seconds * 1000 + micros // 1000
    rds.zadd("{ops}:alive", {"ghost-w#dead0001": now_ms - 12_000})
    leases = cast("list[tuple[bytes, float]]", rds.zrange("{ops}:leases", 0, -1, withscores=True))
    expiry = max(score for _, score in leases)
    at = datetime.fromtimestamp(expiry / 1000, UTC).strftime("%H:%M:%S UTC")

    # A worker whose heartbeats come every 20 / 3 s: 12 s of silence is a
    # heartbeat missed.
    scheduler, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_LEASE_TIMEOUT=20.0)
    assert harness.lease_all(scheduler) == []
    caplog.set_level(logging.INFO, logger="crawler.frontier.waiting")

    def told() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Waiting")]

    for _ in range(3):  # three idle ticks: one line
        assert scheduler.has_pending_requests()
    [line] = told()
    assert "Waiting for 3 leases held by worker ghost-w (holder ghost-w#dead0001" in line
    assert re.search(r"last heartbeat 1[23]s ago", line), line
    assert f"to expire at {at} (in " in line
    assert line.endswith("they will be crawled again then")
    in_s = int(re.search(r"\(in (\d+)s\)", line).group(1))  # type: ignore[union-attr]
    assert 25 <= in_s <= 30

    # A change (one of the leases comes back early) is told again, once.
    ghost.release(["ghost-w#dead0001:2"])
    for _ in range(2):
        assert scheduler.has_pending_requests()
    assert len(told()) == 2
    assert "Waiting for 2 leases held by worker ghost-w" in told()[1]


# -- the start-URL log line --------------------------------------------------------------


def test_the_seed_log_line_states_what_the_intake_does(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = get_crawler(
        QuotesSpider,
        {"REDIS_URL": redis_url, "FRONTIER_SEED_BATCH": 7, "CONCURRENT_REQUESTS": 16,
         "FRONTIER_IDLE_WAIT": 2.5},
    )
    caplog.set_level(logging.INFO)
    spider = QuotesSpider.from_crawler(crawler)
    crawler.signals.send_catch_log(signals.spider_opened, spider=spider)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("batch size" in m for m in messages), messages
    [line] = [m for m in messages if m.startswith("Reading seeds from")]
    for part in (
        "Redis list quotes:start_urls",
        "FRONTIER_SEED_BATCH=7",
        "{quotes:start_urls}:intake",
        "FRONTIER_IDLE_WAIT=2.5s",
        "encoding utf-8",
    ):
        assert part in line, line



def test_a_dead_letter_records_its_first_priority_by_the_crawls_own_adjustment(
    redis_url: str,
) -> None:
    # The crawl ran with RETRY_PRIORITY_ADJUST=-3; the requeue command runs
    # without it, and still restores the first priority.
    from crawler.commands.deadletters import requeue_push

    scheduler, _ = harness.open_scheduler(redis_url, _Spider, RETRY_PRIORITY_ADJUST=-3)
    request = Request("https://a.example/x", priority=-1, meta={"retry_times": 2})  # 5 - 2 * 3
    scheduler.dead_letter(request, "gave up")
    assert scheduler.flush_outbox()
    frontier = Frontier(scheduler.server, _Spider.name)
    [raw] = scheduler.server.lrange(frontier.key("dead"), 0, -1)
    record = json.loads(raw)
    assert record["first_priority"] == 5
    push = requeue_push(record)  # the command's default adjustment, -1
    assert push is not None and push.priority == 5
    scheduler.server.delete(frontier.key("dead"))


@pytest.mark.workers
def test_listing_no_dead_letters_says_so(env: dict[str, str]) -> None:
    """Text output says there are none; ``--json`` prints an empty array."""
    listed = scrapy(env, "deadletters", "list", "quotes")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "no dead letters of quotes"
    as_json = scrapy(env, "deadletters", "list", "quotes", "--json")
    assert as_json.returncode == 0 and as_json.stdout == "[]\n"
