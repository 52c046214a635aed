"""The main job, end to end: ``python -m devtools.demo`` (``make demo``).

Runs a distributed crawl of quotes.toscrape.com with N ``scrapy crawl``
worker processes sharing one Redis frontier, then prints what MongoDB holds.

* Redis: ``$REDIS_URL`` when set, else an embedded ``redis-server`` on a free
  port (:class:`devtools.embedded.RedisServer`).
* MongoDB: ``$MONGO_URI`` when set, else an embedded SecantusDB server
  (:class:`devtools.embedded.MongoServer`).
* Site: https://quotes.toscrape.com/ when it answers within a few seconds;
  otherwise (no network) the capture ``../shared/sites/...warc.gz`` replayed
  on 127.0.0.1 (:class:`devtools.replay.ReplayServer`).

Workers close after ``--idle`` seconds with nothing to do
(``MAX_IDLE_TIME_BEFORE_CLOSE``). Their logs go to files in a temporary
folder, whose path is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pymongo
import redis

from devtools.embedded import MongoServer, RedisServer
from devtools.replay import ReplayServer, default_warc_path

LIVE_SITE = "https://quotes.toscrape.com/"
PROJECT_DIR = Path(__file__).resolve().parent.parent


def site_is_reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether ``url`` answers HTTP 200 within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def run_workers(
    spider: str, count: int, env: dict[str, str], log_dir: Path, idle: int
) -> list[int]:
    """Run ``count`` ``scrapy crawl`` processes together; return their exit codes."""
    procs = []
    for i in range(count):
        log = log_dir / f"worker-{i + 1}.log"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "scrapy", "crawl", spider,
                    "-s", f"MAX_IDLE_TIME_BEFORE_CLOSE={idle}",
                    "-s", f"LOG_FILE={log}",
                ],
                cwd=PROJECT_DIR,
                env=env,
            )
        )
    return [p.wait() for p in procs]


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--idle", type=int, default=5,
                        help="seconds idle before a worker closes (5)")
    parser.add_argument("--replay", action="store_true",
                        help="replay the capture even if the live site answers")
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        redis_url = os.environ.get("REDIS_URL")
        if not redis_url:
            redis_url = stack.enter_context(RedisServer()).url
            print(f"Started an embedded redis-server at {redis_url}")
        mongo_uri = os.environ.get("MONGO_URI")
        if not mongo_uri:
            mongo_uri = stack.enter_context(MongoServer()).uri
            print(f"Started an embedded MongoDB-compatible server at {mongo_uri}")
        database = os.environ.get("MONGO_DATABASE", "crawler")

        if not args.replay and site_is_reachable(LIVE_SITE):
            seed = LIVE_SITE
        else:
            warc = default_warc_path()
            site = stack.enter_context(ReplayServer(warc))
            seed = site.url + "/"
            print(f"{LIVE_SITE} is not reachable: replaying {warc} at {seed}")

        client: redis.Redis = redis.Redis.from_url(redis_url)
        client.lpush("quotes:start_urls", seed)
        client.close()
        print(f"Seeded quotes:start_urls with {seed}")

        env = dict(os.environ, REDIS_URL=redis_url, MONGO_URI=mongo_uri,
                   MONGO_DATABASE=database)
        log_dir = Path(tempfile.mkdtemp(prefix="crawler-demo-"))
        print(f"Running {args.workers} workers; logs in {log_dir}")
        codes = run_workers("quotes", args.workers, env, log_dir, args.idle)

        mongo: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_uri)
        db = mongo[database]
        quotes = db.quotes.count_documents({})
        authors = db.authors.count_documents({})
        example = db.quotes.find_one({}, {"_id": 0, "text": 1, "author": 1})
        mongo.close()
        if example:
            print(f"For example: {example['text']} ({example['author']})")
        print(f"Stored {quotes} quotes and {authors} authors in MongoDB database "
              f"{database!r}")
        if any(codes):
            print(f"Workers exited with {codes}; see {log_dir}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
