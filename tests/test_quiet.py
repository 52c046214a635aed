"""Quiet when healthy, loud when not (issue 31).

A clean crawl with defaults logs no WARNING or ERROR, in this project and in
a fresh ``scrapy startproject`` project with the add-on switched on; a crawl
that cannot make progress says so in one line and ends at its idle limit.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from crawler.frontier.stuck import RobotsWait, Stuck
from devtools.replay import Page
from tests.workers import PROJECT_DIR, crawl, start_worker, wait_workers

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import redis

    from tests.conftest import SiteFactory

HTML = [("Content-Type", "text/html")]

#: A log line at WARNING or above (Scrapy's default log format), or a traceback.
_LOUD = re.compile(r"^\S+ \S+ \[[^\]]+\] (WARNING|ERROR|CRITICAL): |^Traceback ", re.MULTILINE)


def loud_lines(log: str) -> list[str]:
    """The log's WARNING, ERROR and CRITICAL lines and tracebacks."""
    return [m.group(0) + log[m.end():].split("\n", 1)[0] for m in _LOUD.finditer(log)]


def small_site() -> dict[str, Page]:
    """``/`` links to two pages; robots.txt is not there (404: no rules)."""
    return {
        "/": Page(200, HTML, b'<title>home</title><a href="/a">a</a> <a href="/b">b</a>'),
        "/a": Page(200, HTML, b'<title>a</title><a href="/">home</a>'),
        "/b": Page(200, HTML, b"<title>b</title>"),
    }


@pytest.fixture
def silent_site() -> Iterator[str]:
    """``http://127.0.0.1:<port>``: accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.workers
def test_a_clean_crawl_of_this_project_with_defaults_logs_no_warning(
    env: dict[str, str], rds: redis.Redis, site_factory: SiteFactory, db: object,
    tmp_path: Path,
) -> None:
    site = site_factory(small_site())
    rds.lpush("pages:start_urls", site.url_for("/"))

    [worker] = crawl("pages", env, tmp_path)

    assert worker.returncode == 0, worker.log[-3000:]
    assert worker.stats.get("response_received_count", 0) >= 3, worker.log[-3000:]
    assert loud_lines(worker.log) == []


#: A spider of a fresh project: seeds from Redis, every page an item, links followed.
_SPIDER = '''
from crawler.frontier.spider import FrontierSpider


class SiteSpider(FrontierSpider):
    name = "site"

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        yield from response.follow_all(css="a")
'''


@pytest.mark.workers
def test_a_clean_crawl_of_a_fresh_startproject_project_with_the_addon_logs_no_warning(
    redis_url: str, rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path,
) -> None:
    """The template's settings.py kept whole (DEBUG logs, ROBOTSTXT_OBEY,
    DOWNLOAD_DELAY 1), the add-on line added; the package on PYTHONPATH.
    Only the telnet console is off: workers of other tests race for its
    ports, and the loser logs an ERROR that is not the crawl's."""
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in {"SCRAPY_SETTINGS_MODULE", "MONGO_URI", "MONGO_DATABASE"}}
    subprocess.run([sys.executable, "-m", "scrapy", "startproject", "demo"], cwd=tmp_path,
                   env=env, check=True, capture_output=True, timeout=120)
    project = tmp_path / "demo"
    settings = project / "demo" / "settings.py"
    template = settings.read_text()
    assert "\nADDONS = {}\n" in template
    settings.write_text(
        template.replace("\nADDONS = {}\n", '\nADDONS = {"crawler.addon.FrontierAddon": 0}\n'))
    (project / "demo" / "spiders" / "site.py").write_text(_SPIDER)
    site = site_factory(small_site())
    rds.lpush("site:start_urls", site.url_for("/"))
    log = tmp_path / "demo.log"
    env |= {"PYTHONPATH": str(PROJECT_DIR), "REDIS_URL": redis_url,
            "MAX_IDLE_TIME_BEFORE_CLOSE": "3"}

    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy", "crawl", "site", "-O", str(tmp_path / "items.jsonl"),
         "-s", f"LOG_FILE={log}", "-s", "TELNETCONSOLE_ENABLED=False"],
        cwd=project, env=env,
    )
    [worker] = wait_workers([proc], [log])

    assert worker.returncode == 0, worker.log[-3000:]
    items = (tmp_path / "items.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["url"].rsplit("/", 1)[1] for line in items) == ["", "a", "b"]
    assert " DEBUG: " in worker.log  # the template's log level: everything shown
    assert loud_lines(worker.log) == []
    assert "MAINT_NOTIFICATIONS" not in worker.log


@pytest.mark.workers
def test_a_robots_txt_that_never_answers_does_not_keep_an_idle_limited_worker_open(
    env: dict[str, str], rds: redis.Redis, silent_site: str, tmp_path: Path,
) -> None:
    """Three seeds of a host that accepts connections and never answers,
    MAX_IDLE_TIME_BEFORE_CLOSE 5: the worker gives the robots.txt fetch up
    at its idle limit and closes, leaving the three requests in Redis, with
    one line that says what waits and why."""
    seeds = [f"{silent_site}/", f"{silent_site}/a", f"{silent_site}/b"]
    rds.lpush("pages:start_urls", *seeds)
    log = tmp_path / "w.log"
    started = time.monotonic()

    [worker] = wait_workers(
        [start_worker("pages", env, log, {"MAX_IDLE_TIME_BEFORE_CLOSE": 5})], [log], timeout=90)

    took = worker.ended - started
    assert worker.returncode == 0, worker.log[-3000:]
    # 5 s idle, plus the worker's start-up and close (a few seconds)
    assert took < 5 + 15, took
    site = silent_site.split("//", 1)[1]
    [line] = [s for s in loud_lines(worker.log) if "Closing after 5s idle" in s]
    assert f"3 requests of 1 site wait in Redis: robots.txt did not answer for {site} " \
           "(1 failed attempt; next try in" in line, line
    assert "Nothing is lost" in line
    assert "Traceback" not in worker.log
    # Nothing lost: the three requests wait in Redis, none leased, none dead.
    waiting = int(rds.get("{pages}:count") or 0) + rds.zcard("{pages}:retries")
    assert waiting == 3
    assert rds.zcard("{pages}:leases") == 0
    assert rds.llen("{pages}:dead") == 0
    assert rds.hget("{pages}:robots:down", site) is not None


@pytest.mark.workers
def test_a_seed_that_never_answers_without_robots_txt_is_one_dead_letter_line(
    env: dict[str, str], rds: redis.Redis, silent_site: str, tmp_path: Path,
) -> None:
    rds.lpush("pages:start_urls", f"{silent_site}/")
    settings = {"ROBOTSTXT_OBEY": False, "DOWNLOAD_TIMEOUT": 1,
                "FRONTIER_RETRY_BACKOFF_BASE": 0.2, "MAX_IDLE_TIME_BEFORE_CLOSE": 2}

    [worker] = crawl("pages", env, tmp_path, settings=settings)

    assert worker.returncode == 0, worker.log[-3000:]
    assert "Traceback" not in worker.log
    [line] = loud_lines(worker.log)
    assert f"WARNING: Dead letter for {silent_site}/: gave up after 3 attempts: " in line, line
    assert "scrapy deadletters requeue pages" in line
    [record] = [json.loads(x) for x in rds.lrange("{pages}:dead", 0, -1)]
    assert record["reason"].startswith("gave up after 3 attempts: ")
    assert "\n" not in record["reason"]


def test_what_waits_is_said_in_one_line() -> None:
    stuck = Stuck(requests=4, sites={"a.example", "b.example"},
                  robots=[RobotsWait("a.example", 3, 130.0)], next_due=7200.0)
    assert stuck.describe() == (
        "4 requests of 2 sites wait in Redis: robots.txt did not answer for a.example "
        "(3 failed attempts; next try in 2 min); the next other request is due in 2 h"
    )
    many = Stuck(requests=5, sites={f"s{i}" for i in range(5)},
                 robots=[RobotsWait(f"s{i}", 1, 2.0) for i in range(5)])
    assert many.describe(shown=2).endswith(
        "s1 (1 failed attempt; next try in 2 s) and 3 more sites")
    other = Stuck(requests=1, sites={"c.example"}, robots=[RobotsWait("c.example", 0, 0.0)])
    assert other.describe() == (
        "1 request of 1 site waits in Redis: robots.txt did not answer for c.example "
        "(another worker's fetch has not answered)")


def test_a_redis_outage_is_said_again_every_30_s_while_probes_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from crawler.frontier import health

    monkeypatch.setattr(health, "STILL_DOWN_EVERY", 0.0)
    told: list[tuple[float, str]] = []
    said = threading.Event()

    def ping() -> None:
        raise RedisConnectionError("Connection refused")

    def still_down(seconds: float, exc: BaseException) -> None:
        told.append((seconds, str(exc)))
        said.set()

    probe = health.RedisHealth(ping, lambda: None, still_down=still_down)
    probe.probe()
    assert not said.wait(0.1)  # no outage yet: a failed probe says nothing
    probe.failed()
    time.sleep(health.PROBE_INTERVAL)
    probe.probe()
    assert said.wait(5)
    assert told[0][1] == "Connection refused" and told[0][0] >= 0
    probe.recovered()
    said.clear()
    time.sleep(health.PROBE_INTERVAL)
    probe.probe()
    assert not said.wait(1)  # recovered: nothing more to say
