"""Acceptance of issue 6 on real servers: scrapyd, Redis, MongoDB, the replayed site.

A scrapyd with authentication is started on a free port from
``deploy/scrapyd.conf``, the project is deployed with ``deploy/cluster.py``
(scrapyd-client), two ``quotes`` jobs are scheduled through scrapyd's JSON
API, and the crawl's results are checked in MongoDB, in Redis, in
``scrapy frontier status --json`` and on the metrics endpoint.
"""

from __future__ import annotations

import configparser
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from devtools.embedded import free_port
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

    from devtools.replay import ReplayServer

pytestmark = [pytest.mark.workers, pytest.mark.slow]


ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable
SCRAPY = [PYTHON, "-m", "scrapy"]
USER, PASSWORD = "crawler-test", "s3cret-test-password"


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Scrapyd:
    """A scrapyd started from deploy/scrapyd.conf, with auth, in ``home``."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.auth = (USER, PASSWORD)
        config = configparser.ConfigParser()
        config.read(ROOT / "deploy" / "scrapyd.conf")
        config.set("scrapyd", "poll_interval", "0.5")
        with (home / "scrapyd.conf").open("w") as fh:
            config.write(fh)
        self.env = {
            **env,
            "SCRAPYD_USERNAME": USER,
            "SCRAPYD_PASSWORD": PASSWORD,
            "SCRAPYD_HTTP_PORT": str(self.port),
        }
        self.env.pop("PYTHONPATH", None)
        self.log = (home / "scrapyd.out").open("wb")
        # cwd is outside the project: jobs import the crawler from the egg.
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "scrapyd", "--pidfile="],
            cwd=home,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, endpoint: str, **params: str) -> dict[str, Any]:
        response = requests.get(f"{self.url}/{endpoint}", params=params, auth=self.auth, timeout=10)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"scrapyd exited: {(self.home / 'scrapyd.out').read_text()[-2000:]}")
        try:
            return self.get("daemonstatus.json")["status"] == "ok"
        except requests.RequestException:
            return False

    def job_log(self, spider: str, job: str) -> str:
        path = self.home / "logs" / "crawler" / spider / f"{job}.log"
        return path.read_text()[-3000:] if path.exists() else "<no log>"

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


@pytest.fixture
def scrapyd(tmp_path: Path, env: dict[str, str]) -> Iterator[Scrapyd]:
    server = Scrapyd(tmp_path, env)
    try:
        wait_for(server.ready, 30, "scrapyd to answer")
        yield server
    finally:
        server.stop()


def status_json(env: dict[str, str], *spiders: str) -> dict[str, Any]:
    result = subprocess.run(
        [*SCRAPY, "frontier", "status", *spiders, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_two_scrapyd_jobs_crawl_the_site_once_and_status_and_metrics_agree(
    scrapyd: Scrapyd, env: dict[str, str], replay_server: ReplayServer
) -> None:
    redis_url, mongo_uri, mongo_db = env["REDIS_URL"], env["MONGO_URI"], env["MONGO_DATABASE"]
    # Without credentials scrapyd refuses every request.
    anonymous = requests.get(f"{scrapyd.url}/daemonstatus.json", timeout=10)
    assert anonymous.status_code == 401
    wrong = requests.get(f"{scrapyd.url}/listprojects.json", auth=(USER, "nope"), timeout=10)
    assert wrong.status_code == 401

    deploy_env = {**env, "SCRAPYD_USERNAME": USER, "SCRAPYD_PASSWORD": PASSWORD}
    deployed = subprocess.run(
        [PYTHON, "deploy/cluster.py", "--node", scrapyd.url, "deploy", "--version", "r1"],
        cwd=ROOT,
        env=deploy_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert deployed.returncode == 0, deployed.stderr + deployed.stdout
    assert PASSWORD not in deployed.stdout + deployed.stderr
    assert scrapyd.get("listprojects.json")["projects"] == ["crawler"]
    assert set(scrapyd.get("listspiders.json", project="crawler")["spiders"]) >= {"quotes"}

    seeded = subprocess.run(
        [*SCRAPY, "seed", "quotes", replay_server.url_for("/")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stderr

    jobs = []
    for _ in range(2):
        response = requests.post(
            f"{scrapyd.url}/schedule.json",
            data=[
                ("project", "crawler"),
                ("spider", "quotes"),
                ("setting", f"REDIS_URL={redis_url}"),
                ("setting", f"MONGO_URI={mongo_uri}"),
                ("setting", f"MONGO_DATABASE={mongo_db}"),
                ("setting", "MAX_IDLE_TIME_BEFORE_CLOSE=3"),
                ("setting", "FRONTIER_HEARTBEAT_INTERVAL=1"),
            ],
            auth=scrapyd.auth,
            timeout=10,
        )
        response.raise_for_status()
        assert response.json()["status"] == "ok", response.text
        jobs.append(response.json()["jobid"])

    client: redis.Redis = redis.Redis.from_url(redis_url)
    mongo: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_uri)
    db = mongo[mongo_db]
    try:
        # During the crawl: once a worker has a heartbeat, the status reports
        # it, and its monotonic counts lie between two direct readings.
        def has_worker() -> bool:
            return bool(client.hlen("{quotes}:workers")) or finished() == 2

        def finished() -> int:
            listed = scrapyd.get("listjobs.json", project="crawler")
            return sum(1 for job in listed["finished"] if job["id"] in jobs)

        wait_for(has_worker, 60, "a worker heartbeat")
        seen_before = client.scard("{quotes}:dupefilter")
        during = status_json(env, "quotes")["spiders"]["quotes"]
        seen_after = client.scard("{quotes}:dupefilter")
        assert seen_before <= during["seen"] <= seen_after
        if finished() < 2:
            assert during["workers_live"] >= 1
            assert {w["job"] for w in during["workers"]} <= set(jobs)

        wait_for(lambda: finished() == 2, 120, "both jobs to finish", interval=0.5)
        listed = scrapyd.get("listjobs.json", project="crawler")
        logs = "\n".join(scrapyd.job_log("quotes", job) for job in jobs)

        assert db.quotes.count_documents({}) == 100, logs
        assert db.authors.count_documents({}) == 50, logs
        assert not listed["running"] and not listed["pending"]

        # After the crawl: the status matches Redis and MongoDB exactly.
        after = status_json(env, "quotes")
        quotes = after["spiders"]["quotes"]
        assert after["errors"] == {}
        assert quotes["seeds"] == client.llen("quotes:start_urls") == 0
        assert quotes["queued"] == int(client.get("{quotes}:count") or 0) == 0
        assert quotes["seen"] == client.scard("{quotes}:dupefilter") > 0
        assert quotes["items"] == {"authors": 50, "quotes": 100}
        assert after["items"]["quotes"] == 100 and after["items"]["authors"] == 50
        stats = {k.decode(): int(v) for k, v in client.hgetall("{quotes}:stats").items()}
        assert quotes["stats"] == stats
        assert stats["workers/started"] == 2 and stats["workers/finished"] == 2
        assert stats["finish_reason/finished"] == 2
        assert stats["item_scraped_count/authors"] >= 50
        assert stats["response_received_count"] >= 10 + 50  # list pages, author pages
        # Each job's worker keeps its closed record, with its final figures.
        assert len(quotes["workers"]) == client.hlen("{quotes}:workers") == 2
        assert {w["job"] for w in quotes["workers"]} == set(jobs)
        assert not any(w["live"] for w in quotes["workers"]) and quotes["state"] == "finished"
        assert sum(w["items"] for w in quotes["workers"]) == 150
        assert sum(w["pages"] for w in quotes["workers"]) == stats["response_received_count"]

        # The metrics endpoint serves the same numbers.
        metrics = scrape_metrics(env)
        assert metrics[("crawler_up", (("server", "redis"),))] == 1
        assert metrics[("crawler_up", (("server", "mongodb"),))] == 1
        assert metrics[("crawler_urls_seen", (("spider", "quotes"),))] == quotes["seen"]
        assert metrics[("crawler_requests_queued", (("spider", "quotes"),))] == 0
        assert metrics[("crawler_items_stored", (("collection", "quotes"),))] == 100
        assert metrics[("crawler_items_stored", (("collection", "authors"),))] == 50
        assert (
            metrics[("crawler_pages_crawled_total", (("spider", "quotes"),))]
            == stats["response_received_count"]
        )
    finally:
        client.close()
        mongo.close()


def scrape_metrics(env: dict[str, str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Run the exporter, scrape it once, parse the text with prometheus-client."""
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "crawler.metrics", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def scrape() -> str | None:
            try:
                response = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
            except requests.ConnectionError:
                return None
            return response.text if response.ok else None

        text = wait_for(scrape, 30, "the metrics endpoint")
    finally:
        stop_process(proc)
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples
