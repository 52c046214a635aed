"""``scrapy frontier status`` and the metrics exporter read what Redis and MongoDB hold.

The frontier is filled through :class:`crawler.frontier.store.Frontier` (real
Redis, real MongoDB) with every kind of key the status knows, so each figure
is checked against a known value; the crawl-driven checks are in
``test_ops_scrapyd.py``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from crawler.commands.frontier import render
from crawler.frontier.bloom import BloomFilter
from crawler.frontier.store import Frontier, Lease
from crawler.metrics import StatusCollector
from crawler.status import StatusReader
from devtools.embedded import free_port
from devtools.replay import Page
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable


def body(url: str) -> bytes:
    """A request as the frontier stores it (compact JSON)."""
    return f'{{"u":"{url}"}}'.encode()


def push(frontier: Frontier, url: str, site: str, priority: int) -> None:
    """Queue ``url`` unfiltered, as the scheduler does for a request."""
    assert frontier.push(
        body(url), site=site, priority=priority, fingerprint=None, dont_filter=True
    )


def keeps_prio(redis_url: str, spider: str = "quotes") -> bool:
    """Whether the frontier keeps ``{<spider>}:prio`` (priority -> requests
    queued): the status reads queued_by_priority from it, and reports it as
    unknown (None) for a frontier that does not keep it."""
    client: redis.Redis = redis.Redis.from_url(redis_url)
    try:
        return bool(client.exists(f"{{{spider}}}:prio"))
    finally:
        client.close()


def queued_count(redis_url: str, spider: str = "quotes") -> int:
    """``GET {<spider>}:count``: what the frontier says it holds."""
    client: redis.Redis = redis.Redis.from_url(redis_url)
    try:
        return int(client.get(f"{{{spider}}}:count") or 0)
    finally:
        client.close()


@pytest.fixture
def filled(redis_url: str, mongo_uri: str, mongo_db: str) -> dict[str, Any]:
    """A frontier and item store with known contents."""
    now = time.time()
    client: redis.Redis = redis.Redis.from_url(redis_url)
    mongo: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_uri)
    try:
        client.lpush("quotes:start_urls", *[f"https://s{i}.example/" for i in range(3)])
        frontier = Frontier(client, "quotes")
        # Three leases, named <worker id>:<n>: two held by worker n1:1, one by
        # n2:7. They are queued and leased before anything else is queued, so
        # the leases take exactly these.
        for i in range(3):
            push(frontier, f"https://l.example/{i}", "l.example", 0)
        for lease_id in ("n1:1:1", "n1:1:2", "n2:7:1"):
            assert isinstance(frontier.lease(lease_id), Lease)
        # Queued: 14 requests on three sites (one with a port), priorities
        # 100: 1, 5: 2, 2: 3, 1: 3, 0: 5.
        for i in range(10):
            push(frontier, f"https://q.example/{i}", "q.example", i % 3)
        push(frontier, "https://q.example/urgent", "q.example", 100)
        push(frontier, "https://a.example/1", "a.example", 5)
        push(frontier, "https://a.example/2", "a.example", 5)
        push(frontier, "https://b.example:8080/", "b.example:8080", 0)
        frontier.push_retry(body("https://q.example/later"), site="q.example", priority=0, delay=60)
        # Dead letters: an undecodable frontier entry and two requests given up on.
        frontier.dead_letter(
            {"url": None, "reason": "undecodable frontier entry", "attempts": 0, "entry": "x"}
        )
        for url in ("https://q.example/a", "https://q.example/b"):
            frontier.dead_letter({"url": url, "reason": "r", "attempts": 3, "request": None})
        client.sadd("{quotes}:dupefilter", *[os.urandom(20) for _ in range(25)])
        client.hset(
            "{quotes}:workers",
            mapping={
                "n1:1": json.dumps(
                    {
                        "pid": 1,
                        "host": "n1",
                        "job": "j1",
                        "started": now - 100,
                        "last_heartbeat": now - 1,
                        "pages": 40,
                        "items": 30,
                        "pages_per_minute": 120.0,
                    }
                ),
                "n2:7": json.dumps(
                    {
                        "pid": 7,
                        "host": "n2",
                        "job": None,
                        "started": now - 900,
                        "last_heartbeat": now - 600,
                        "pages": 5,
                        "items": 1,
                        "pages_per_minute": 0.0,
                    }
                ),
            },
        )
        client.hset(
            "{quotes}:stats",
            mapping={
                "response_received_count": 45,
                "item_scraped_count": 31,
                "item_scraped_count/quotes": 31,
                "mongo/added/quotes": 12,  # the documents quotes added
            },
        )
        db = mongo[mongo_db]
        db.quotes.insert_many([{"text": f"q{i}", "author": "a"} for i in range(12)])
        db.authors.insert_many([{"name": f"a{i}"} for i in range(4)])
    finally:
        client.close()
        mongo.close()
    return {"now": now}


@pytest.mark.workers
def test_status_json_reports_every_figure_redis_and_mongodb_hold(
    filled: dict[str, Any], env: dict[str, str], redis_url: str
) -> None:
    result = subprocess.run(
        [PYTHON, "-m", "scrapy", "frontier", "status", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["errors"] == {}
    assert set(status["spiders"]) == {"pages", "quotes"}  # from the spider loader
    quotes = status["spiders"]["quotes"]
    assert quotes["seeds"] == 3
    assert quotes["queued"] == queued_count(redis_url) == 14
    if keeps_prio(redis_url):
        assert quotes["queued_by_priority"] == {"100": 1, "5": 2, "2": 3, "1": 3, "0": 5}
        assert list(quotes["queued_by_priority"]) == ["100", "5", "2", "1", "0"]
    else:  # never counted by SCAN: unknown
        assert quotes["queued_by_priority"] is None
    assert quotes["started"] is True
    # One shard: its keys are the flat ones of "keys", as before shards.
    [shard_keys] = quotes["shard_keys"]
    assert (shard_keys["prefix"], shard_keys["count"]) == ("{quotes}:", quotes["keys"]["count"])
    assert quotes["seen"] == 25
    assert quotes["leases"] == 3
    assert quotes["leases_by_worker"] == {"n1:1": 2, "n2:7": 1}
    assert quotes["retries"] == 1
    assert quotes["dead_letters"] == 3
    assert quotes["items"] == {"quotes": 12}
    assert quotes["stats"]["response_received_count"] == 45
    assert quotes["workers_live"] == 1
    live, stale = quotes["workers"]
    assert (live["id"], live["live"], live["pages_per_minute"], live["job"]) == (
        "n1:1",
        True,
        120.0,
        "j1",
    )
    assert (stale["id"], stale["live"]) == ("n2:7", False)
    # Only the collections the spiders wrote (authors: no spider's stats name it).
    assert status["items"] == {"quotes": 12}
    assert quotes["state"] == "running"  # a live worker, work left
    pages = status["spiders"]["pages"]
    assert (pages["queued"], pages["leases"], pages["retries"], pages["dead_letters"]) == (
        0,
        0,
        0,
        0,
    )
    assert (pages["queued_by_priority"], pages["seen"], pages["leases_by_worker"]) == ({}, 0, {})
    assert pages["started"] is False  # no key of it in Redis


@pytest.mark.workers
def test_status_table_names_each_figure(
    filled: dict[str, Any], env: dict[str, str], redis_url: str
) -> None:
    result = subprocess.run(
        [PYTHON, "-m", "scrapy", "frontier", "status", "quotes"],
        cwd=ROOT,
        env={**env, "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for text in (
        "seeds waiting",
        "requests queued",
        "by priority 100: 1, 5: 2, 2: 3, 1: 3, 0: 5"
        if keeps_prio(redis_url)
        else "by priority unknown",
        "requests leased",
        "retries waiting",
        "dead letters",
        "URLs seen",
        "items in quotes",
        "live workers",
        "n1:1",
        "120",
    ):
        assert text in result.stdout


@pytest.mark.workers
def test_status_reports_an_unreachable_mongodb_and_still_reads_redis(
    filled: dict[str, Any], env: dict[str, str], redis_url: str
) -> None:
    env = {**env, "MONGO_URI": f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=500"}
    result = subprocess.run(
        [PYTHON, "-m", "scrapy", "frontier", "status", "quotes", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    status = json.loads(result.stdout)
    assert "mongodb" in status["errors"] and "redis" not in status["errors"]
    assert status["spiders"]["quotes"]["queued"] == queued_count(redis_url) == 14


@pytest.mark.workers
def test_metrics_endpoint_serves_the_status_figures(
    filled: dict[str, Any], env: dict[str, str], redis_url: str
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "crawler.metrics", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def scrape() -> requests.Response | None:
            try:
                return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
            except requests.ConnectionError:
                if proc.poll() is not None:
                    pytest.fail(f"exporter exited: {proc.stderr.read()!r}")  # type: ignore[union-attr]
                return None

        response = wait_for(scrape, 30, "the exporter to answer", 0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.returncode == 0
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("crawler_up", server="redis") == 1
    assert value("crawler_up", server="mongodb") == 1
    assert value("crawler_seeds_waiting", spider="quotes") == 3
    assert value("crawler_requests_queued", spider="quotes") == 14
    if keeps_prio(redis_url):
        assert value("crawler_requests_queued_by_priority", spider="quotes", priority="2") == 3
    else:
        assert not any(n == "crawler_requests_queued_by_priority" for n, _ in samples)
    assert value("crawler_spider_started", spider="quotes") == 1
    assert value("crawler_spider_started", spider="pages") == 0
    assert value("crawler_dead_letters_trimmed_total", spider="quotes", key="{quotes}:dead") == 0
    assert value("crawler_requests_leased", spider="quotes") == 3
    assert value("crawler_requests_leased_by_worker", spider="quotes", worker="n1:1") == 2
    assert value("crawler_retries_waiting", spider="quotes") == 1
    assert value("crawler_dead_letters", spider="quotes", key="{quotes}:dead") == 3
    assert value("crawler_urls_seen", spider="quotes") == 25
    assert value("crawler_items_stored", collection="quotes") == 12
    assert value("crawler_workers_live", spider="quotes") == 1
    assert value("crawler_worker_pages_per_minute", spider="quotes", worker="n1:1") == 120
    assert ("crawler_worker_pages", (("spider", "quotes"), ("worker", "n2:7"))) not in samples
    assert value("crawler_pages_crawled_total", spider="quotes") == 45
    assert value("crawler_items_scraped_total", spider="quotes") == 31
    assert value("crawler_stats_total", spider="quotes", stat="item_scraped_count/quotes") == 31


def test_exporter_binds_loopback_by_default() -> None:
    from crawler import settings

    assert settings.METRICS_HOST == "127.0.0.1" or os.environ.get("METRICS_HOST")


def test_queued_by_priority_stops_at_the_limit(redis_url: str) -> None:
    client: redis.Redis = redis.Redis.from_url(redis_url)
    frontier = Frontier(client, "x")
    for i in range(10):
        push(frontier, f"https://x{i % 2}.example/{i}", f"x{i % 2}.example", i)

    def read(**kwargs: Any) -> dict[str, Any]:
        spiders = StatusReader(client, None, "unused", ["x", "nothing"], **kwargs).read().spiders
        return {
            name: (s.queued, s.queued_by_priority, s.queued_by_priority_truncated)
            for name, s in spiders.items()
        }

    try:
        if not keeps_prio(redis_url, "x"):
            # A frontier without {x}:prio: unknown, never counted with SCAN.
            assert read()["x"] == (10, None, False)
            assert read()["nothing"] == (0, {}, False)
            return
        limited = read(max_priorities=3)
        assert limited["x"] == (queued_count(redis_url, "x"), {9: 1, 8: 1, 7: 1}, True)
        assert limited["x"][0] == 10
        assert read()["x"] == (10, {p: 1 for p in range(9, -1, -1)}, False)
        assert list(read()["x"][1]) == list(range(9, -1, -1))
        assert read()["nothing"] == (0, {}, False)
    finally:
        client.close()


@pytest.mark.parametrize("max_bits", [2**32, 4096], ids=["one-bitmap", "sharded"])
def test_urls_seen_is_unknown_with_the_bloom_dupefilter(redis_url: str, max_bits: int) -> None:
    client: redis.Redis = redis.Redis.from_url(redis_url)
    bloom = BloomFilter.for_capacity("{b}:bloom", 1000, 0.01, max_bits=max_bits)
    assert (bloom.shards > 1) == (max_bits == 4096)
    frontier = Frontier(client, "b", bloom=bloom)
    for i in range(50):
        url = f"https://b.example/{i}"
        assert frontier.push(
            body(url), site="b.example", priority=0, fingerprint=os.urandom(20), dont_filter=False
        )
    assert not client.exists("{b}:dupefilter")
    reader = StatusReader(client, None, "unused", ["b", "nothing"])
    try:
        status = reader.read()
        assert status.spiders["b"].seen is None
        assert status.spiders["b"].queued == 50
        assert status.spiders["nothing"].seen == 0  # neither a set nor a Bloom filter
        assert status.as_dict()["spiders"]["b"]["seen"] is None
        samples = [
            sample
            for family in StatusCollector(reader).collect()
            for sample in family.samples
            if sample.name == "crawler_urls_seen"
        ]
        assert [s.labels["spider"] for s in samples] == ["nothing"]
        console = Console(width=160, record=True, file=io.StringIO())
        console.print(render(status))
        assert "unknown" in console.export_text()
    finally:
        reader.close()


def test_worker_records_that_are_not_json_are_skipped_not_unpickled(
    redis_url: str, mongo_uri: str
) -> None:
    client: redis.Redis = redis.Redis.from_url(redis_url)
    client.hset("{quotes}:workers", "evil", b"\x80\x04\x95pickle")
    reader = StatusReader(
        client, pymongo.MongoClient(mongo_uri, connect=False), "unused", ["quotes"]
    )
    try:
        assert reader.read().spiders["quotes"].workers == []
    finally:
        reader.close()


@pytest.mark.workers
def test_json_logs_put_worker_spider_and_job_on_every_line(
    site_factory: Any, env: dict[str, str]
) -> None:
    site = site_factory({"/": Page(200, [("Content-Type", "text/html")], b"<html></html>")})
    subprocess.run(
        [PYTHON, "-m", "scrapy", "seed", "quotes", site.url_for("/")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=True,
        timeout=60,
    )
    result = subprocess.run(
        [
            PYTHON,
            "-m",
            "scrapy",
            "crawl",
            "quotes",
            "-a",
            "_job=job-42",
            "-s",
            "MAX_IDLE_TIME_BEFORE_CLOSE=1",
        ],
        cwd=ROOT,
        env={**env, "LOG_JSON_ENABLED": "1", "FRONTIER_WORKER_ID": "w-test"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert len(records) > 5
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record)
        assert record["worker"] == "w-test"
    assert all(r["spider"] == "quotes" for r in records[5:])
    assert any(r["message"] == "Spider opened" and r["job"] == "job-42" for r in records)
    assert any("Dumping Scrapy stats" in r["message"] for r in records)
