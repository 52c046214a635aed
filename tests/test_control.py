"""Crawl control: ``scrapy frontier pause|resume|stop`` across every worker.

The two acceptance crawls run two real ``scrapy crawl quotes`` workers
against the quotes capture (300 ms per response, per-site concurrency 2) and
follow the issue's timeline (pause after 6 s, resume 14 s later; stop after
6 s); the whole quotes crawl is 263 fetches, about 40 s at two at a time,
so they take about 70 s and 55 s. The other tests run the command as an
operator does, read the status and metrics, or drive the extension's
decisions on a stub engine.
"""

from __future__ import annotations

import io
import logging
import re
import subprocess
import time
from collections import Counter
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from rich.console import Console
from scrapy import Spider
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure
from warcio.archiveiterator import ArchiveIterator

from crawler.commands.frontier import render
from crawler.control import PAUSED, RUNNING, STOPPED, CrawlControl, read_state, write_state
from crawler.metrics import StatusCollector
from crawler.status import StatusReader
from devtools.replay import default_warc_path, load_warc
from tests.test_ops_cli import PYTHON, ROOT, down_env, scrapy
from tests.waiting import wait_for
from tests.workers import start_worker, wait_workers

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import redis

    from devtools.replay import SiteServer
    from tests.conftest import SiteFactory

#: Settings of the acceptance crawls' workers (a test may add its own, e.g.
#: an archive directory).
CRAWL: dict[str, object] = {
    "FRONTIER_CONCURRENCY": 2,
    "MAX_IDLE_TIME_BEFORE_CLOSE": 2,
}
#: Seconds the state may take to reach every worker (the issue's bound).
REACTION = 2.0


@pytest.fixture
def quotes_site(site_factory: SiteFactory) -> SiteServer:
    """The quotes capture, each response 300 ms late."""
    warc = default_warc_path()
    if not warc.is_file():
        pytest.skip(f"WARC capture not found at {warc}")
    return site_factory(load_warc(warc), latency=0.3)


class Pool:
    """The worker processes of one test, with their logs."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        self.env, self.tmp_path = env, tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, **settings: object) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"quotes-{len(self.logs)}.log"
        proc = start_worker("quotes", self.env, log, {**CRAWL, **settings})
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def wait(self, first: int = 0, timeout: float = 60.0) -> list[Any]:
        """Wait for the workers started from the ``first``-th on."""
        return wait_workers(self.procs[first:], self.logs[first:], timeout=timeout)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()


@pytest.fixture
def pool(env: dict[str, str], tmp_path: Path) -> Iterator[Pool]:
    workers = Pool(env, tmp_path)
    yield workers
    workers.kill_all()


def control(env: dict[str, str], rds: redis.Redis, command: str) -> float:
    """Run ``scrapy frontier COMMAND quotes``.

    :returns: the :func:`time.monotonic` at which the test saw the command's
        write in Redis (within 20 ms of it).
    """
    wanted = {"pause": b"paused", "stop": b"stopped", "resume": None}[command]
    proc = subprocess.Popen(
        [PYTHON, "-m", "scrapy", "frontier", command, "quotes"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
    )
    wait_for(lambda: rds.get("{quotes}:control") == wanted, timeout=30, what=command)
    written = time.monotonic()
    assert proc.wait(timeout=30) == 0
    return written


# -- acceptance: two workers -------------------------------------------------------------


@pytest.mark.workers
def test_pause_stops_every_worker_fetching_until_resume(
    quotes_site: SiteServer, pool: Pool, env: dict[str, str], rds: redis.Redis, db: Any,
    tmp_path: Path,
) -> None:
    warc_dir = tmp_path / "warc"
    rds.lpush("quotes:start_urls", quotes_site.url_for("/"))
    workers = [pool.start(WARC_DIR=warc_dir), pool.start(WARC_DIR=warc_dir)]
    wait_for(lambda: len(quotes_site.hits()) >= 20, 60, "the crawl to be under way")
    paused = control(env, rds, "pause")
    before = len(quotes_site.hits())
    workers.append(pool.start(WARC_DIR=warc_dir))  # a worker started while paused starts paused
    time.sleep(14)  # the pause under test lasts 14 s

    # The workers are up (a paused crawl is not idle) and none started a
    # fetch from 2 s after the pause on.
    assert [w.poll() for w in workers] == [None, None, None]
    late = [h for h in quotes_site.hits() if h.started >= paused + REACTION]
    assert late == [], [h.path for h in late]
    resumed = control(env, rds, "resume")
    finished = pool.wait(timeout=120)

    assert [w.returncode for w in finished] == [0, 0, 0], [w.log[-2000:] for w in finished]
    assert 0 < before < 100, "the crawl was under way when paused"
    assert any(h.started >= resumed for h in quotes_site.hits())
    assert db.quotes.count_documents({}) == 100
    assert db.authors.count_documents({}) == 50
    assert [p for p, n in Counter(h.path for h in quotes_site.hits()).items() if n > 1] == []
    assert all("crawl quotes is paused" in w.log for w in finished)
    assert rds.zcard("{quotes}:leases") == 0
    # Every URL fetched has a response record in the workers' WARC files.
    archived = set()
    for path in warc_dir.iterdir():
        with path.open("rb") as fh:
            archived |= {
                urlsplit(r.rec_headers.get_header("WARC-Target-URI")).path
                for r in ArchiveIterator(fh) if r.rec_type == "response"
            }
    assert {urlsplit(h.path).path for h in quotes_site.hits()} <= archived


@pytest.mark.workers
def test_stop_ends_every_worker_and_a_later_worker_finishes_after_resume(
    quotes_site: SiteServer, pool: Pool, env: dict[str, str], rds: redis.Redis, db: Any
) -> None:
    rds.lpush("quotes:start_urls", quotes_site.url_for("/"))
    pool.start()
    pool.start()
    wait_for(lambda: len(quotes_site.hits()) >= 20, 60, "the crawl to be under way")
    stopped = control(env, rds, "stop")
    finished = pool.wait(timeout=20)

    assert [w.returncode for w in finished] == [0, 0], [w.log[-2000:] for w in finished]
    assert all(w.ended - stopped < 20 for w in finished)
    assert all("'finish_reason': 'stopped'" in w.log for w in finished)
    assert db.quotes.count_documents({}) < 100
    # Every lease was acknowledged or given back (deadline 0), none left to
    # expire; the frontier still holds the rest of the crawl.
    assert [s for _, s in rds.zrange("{quotes}:leases", 0, -1, withscores=True) if s > 0] == []
    assert int(rds.get("{quotes}:count") or 0) > 0
    hits = len(quotes_site.hits())

    # A worker started while the crawl is stopped does not crawl.
    [idle] = wait_workers([pool.start()], [pool.logs[-1]], timeout=30)
    assert idle.returncode == 0
    assert "crawl quotes is stopped; `scrapy frontier resume quotes` to continue" in idle.log
    assert len(quotes_site.hits()) == hits

    control(env, rds, "resume")
    pool.start()
    [last] = pool.wait(first=3, timeout=120)

    assert last.returncode == 0, last.log[-2000:]
    assert db.quotes.count_documents({}) == 100
    assert db.authors.count_documents({}) == 50
    assert Counter(h.path for h in quotes_site.hits())["/"] == 1
    # Every fetch the site served was received by a worker: the stopped
    # workers let their downloads in flight finish.
    received = sum(w.stats.get("downloader/response_count", 0) for w in [*finished, idle, last])
    assert received == len(quotes_site.hits())


# -- the command ---------------------------------------------------------------------------


@pytest.mark.workers
def test_control_commands_set_the_state(env: dict[str, str], rds: redis.Redis) -> None:
    result = scrapy(env, "frontier", "pause", "quotes")
    assert result.returncode == 0, result.stderr
    assert "crawl quotes: paused (was running; {quotes}:control) by " in result.stdout
    assert rds.get("{quotes}:control") == b"paused"
    assert scrapy(env, "frontier", "stop", "quotes").returncode == 0
    assert rds.get("{quotes}:control") == b"stopped"
    result = scrapy(env, "frontier", "resume", "quotes")
    assert result.returncode == 0
    assert "crawl quotes: running (was stopped; {quotes}:control)" in result.stdout
    assert rds.exists("{quotes}:control") == 0
    rds.set("{quotes}:control", "halted")  # a malformed value is overwritten
    result = scrapy(env, "frontier", "pause", "quotes")
    assert "(was a bad value 'halted';" in result.stdout
    assert rds.get("{quotes}:control") == b"paused"


def test_status_and_metrics_show_the_state(rds: redis.Redis) -> None:
    write_state(rds, "quotes", PAUSED)
    write_state(rds, "pages", STOPPED)
    reader = StatusReader(rds, None, "unused", ["quotes", "pages", "other"])
    status = reader.read()
    assert {n: s.state for n, s in status.spiders.items()} == {
        "quotes": "paused", "pages": "stopped", "other": "idle",
    }
    data = status.as_dict()["spiders"]["quotes"]
    assert (data["state"], data["control"], data["state_bad_value"]) == ("paused", "paused", None)
    assert data["keys"]["control"] == "{quotes}:control"
    samples = {
        (s.labels["spider"], s.labels["state"]): s.value
        for family in StatusCollector(reader).collect()
        for s in family.samples
        if s.name == "crawler_state"
    }
    assert [k for k, v in samples.items() if v == 1.0] == [
        ("quotes", "paused"), ("pages", "stopped"), ("other", "idle"),
    ]
    assert len(samples) == 15
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(render(status))
    assert re.search(r"state\s+│\s+paused\s+│ \{quotes\}:control", console.export_text())

    # A malformed value: shown as such, counted as running (as workers take it).
    rds.set("{quotes}:control", "halted")
    quotes = reader.read().spiders["quotes"]
    assert (quotes.control, quotes.state_bad_value) == ("running", "halted")
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(render(reader.read()))
    assert "finished (BAD value 'halted')" in console.export_text()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["pause", "nosuch"], 2, "unknown spider 'nosuch': expected one of pages, quotes"),
        (["stop"], 2, "expected: stop SPIDER"),
        (["resume", "quotes", "pages"], 2, "expected: resume SPIDER"),
        (["pause", "quotes", "--unset"], 2,
         "--unset is not an option of scrapy frontier pause (see scrapy frontier pause --help)"),
        (["stop", "quotes"], 3, "Redis at {shown} failed: ConnectionError"),
    ],
    ids=["unknown-spider", "no-spider", "two-spiders", "unset", "redis-down"],
)
@pytest.mark.workers
def test_control_command_exit_statuses(
    env: dict[str, str], rds: redis.Redis, args: list[str], code: int, message: str
) -> None:
    shown = ""
    if code == 3:
        env, shown = down_env(env)
    result = scrapy(env, "frontier", *args)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert message.format(shown=shown) in result.stderr
    assert "Traceback" not in result.stderr and "s3cret" not in result.stderr
    assert rds.keys("*:control") == []  # nothing written


# -- the worker's side: reading the state and acting on it ------------------------------------


def test_read_state_of_every_value(rds: redis.Redis) -> None:
    assert read_state(rds, "quotes") == (RUNNING, None)
    for state in (PAUSED, STOPPED):
        write_state(rds, "quotes", state)
        assert read_state(rds, "quotes") == (state, state.encode())
    write_state(rds, "quotes", RUNNING)
    assert rds.exists("{quotes}:control") == 0
    rds.set("{quotes}:control", "PAUSED")  # exact words only
    assert read_state(rds, "quotes") == (None, b"PAUSED")
    rds.delete("{quotes}:control")
    rds.rpush("{quotes}:control", "paused")
    assert read_state(rds, "quotes") == (None, b"WRONGTYPE")
    with pytest.raises(ValueError, match="unknown crawl state 'halted'"):
        write_state(rds, "quotes", "halted")  # type: ignore[arg-type]


class _Quotes(Spider):
    name = "quotes"


class _Engine:
    """Records what the extension asks of Scrapy's engine."""

    def __init__(self) -> None:
        self.paused = False
        self.calls: list[str] = []
        self.spider = object()
        self._slot = SimpleNamespace(nextcall=SimpleNamespace(schedule=lambda: None))

    def pause(self) -> None:
        self.paused = True
        self.calls.append("pause")

    def unpause(self) -> None:
        self.paused = False
        self.calls.append("unpause")

    def close_spider_async(self, *, reason: str) -> None:  # recorded at the call
        self.calls.append(f"close:{reason}")


def test_the_extension_pauses_resumes_and_stops_once_and_takes_bad_values_as_running(
    rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = get_crawler(_Quotes)
    crawler.stats.open_spider()  # type: ignore[union-attr]
    engine = _Engine()
    crawler.engine = engine  # type: ignore[assignment]
    ext = CrawlControl(crawler, rds, "quotes", 1.0)
    steps: list[tuple[Any, bytes | None]] = [
        (PAUSED, b"paused"), (PAUSED, b"paused"), (None, b"halted"), (None, b"halted"),
        (PAUSED, b"paused"), (RUNNING, None), (STOPPED, b"stopped"), (RUNNING, None),
    ]
    for state, raw in steps:
        ext._apply(state, raw)
    assert engine.calls == ["pause", "unpause", "pause", "unpause", "close:stopped"]
    assert not engine.paused
    bad = [r for r in caplog.records if "holds 'halted'" in r.getMessage()]
    assert len(bad) == 1  # logged once
    assert crawler.stats.get_value("control/paused") == 2  # type: ignore[union-attr]


def test_the_extension_keeps_its_state_through_an_outage_and_stops_on_a_config_error(
    rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="crawler.control")
    crawler = get_crawler(_Quotes)
    crawler.stats.open_spider()  # type: ignore[union-attr]
    engine = _Engine()
    crawler.engine = engine  # type: ignore[assignment]
    ext = CrawlControl(crawler, rds, "quotes", 1.0)
    ext._apply(PAUSED, b"paused")
    for _ in range(3):
        ext._failed(Failure(RedisConnectionError("Connection refused")))
    assert (ext.state, engine.paused) == (PAUSED, True)  # the last state read holds
    assert len([r for r in caplog.records if "keeping the crawl paused" in r.getMessage()]) == 1
    ext._read((RUNNING, None))
    assert (ext.state, engine.paused) == (RUNNING, False)
    assert any("Redis reachable again" in r.getMessage() for r in caplog.records)

    ext._failed(Failure(AuthenticationError("invalid username-password pair")))
    assert engine.calls[-1] == "close:config_error"
