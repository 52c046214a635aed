"""A graceful stop during a MongoDB outage ends, its items in the spill file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pymongo
import pytest
import redis

from devtools.embedded import MongoServer
from devtools.replay import default_warc_path, load_warc
from tests.waiting import wait_for
from tests.workers import PROJECT_DIR, start_worker, worker_env

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import SiteFactory

pytestmark = [pytest.mark.workers, pytest.mark.faults]

#: The bound docs/stopping.md states for a stop during a MongoDB outage (s).
STOP_BOUND = 15.0


def test_a_stop_during_a_mongodb_outage_spills_and_ends(
    site_factory: SiteFactory, redis_url: str, tmp_path: Path
) -> None:
    site = site_factory(load_warc(default_warc_path()), latency=0.05)
    spill = tmp_path / "spill"
    log = tmp_path / "quotes.log"
    with MongoServer() as server:
        env = worker_env(redis_url, server.uri, "outage")
        redis.Redis.from_url(redis_url).lpush("quotes:start_urls", site.url_for("/"))
        proc = start_worker("quotes", env, log, {
            "MONGO_SPILL_DIR": spill, "MAX_IDLE_TIME_BEFORE_CLOSE": 60,
            "CONCURRENT_REQUESTS": 2,
        })
        try:
            wait_for(lambda: len(site.hits()) >= 5, 30, "the crawl to start")
            server.stop()
            wait_for(lambda: "MongoDB unreachable or failing" in log.read_text(), 30,
                     "items to wait for MongoDB")
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
            took = time.monotonic() - stopped_at
        finally:
            if proc.poll() is None:
                proc.kill()
        print(f"the worker exited {took:.1f} s after SIGINT")
        assert took < STOP_BOUND, took
        files = list(spill.glob("*.jsonl"))
        rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
        assert rows, log.read_text()[-3000:]
        server.start()
        for f in files:
            subprocess.run([sys.executable, "-m", "scrapy", "loadspill", str(f)],
                           cwd=PROJECT_DIR, env=env, check=True, timeout=60)
        db = pymongo.MongoClient(server.uri)["outage"]
        for row in rows:
            key = row["key"]
            assert db[row["collection"]].count_documents(
                {k: row["doc"][k] for k in key}) == 1, row
