"""``scrapy frontier status`` answers as fast beside a million foreign keys.

Acceptance of issue 13: the status (and the metrics exporter, which reads
through the same :class:`crawler.status.StatusReader`) reads counters and
known keys only. The same crawl is written into databases 0 and 1 of a
private redis-server, and database 1 also gets 1,000,000 keys of "another
application"; the status is read from each, alternately, and the medians
must be within 150 ms of each other (for the command run as a process,
whose time is mostly Python starting, the fastest runs). ``INFO
commandstats`` shows that no ``SCAN`` or ``KEYS`` was sent.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from crawler.frontier.store import Frontier, Lease
from crawler.status import StatusReader
from devtools.embedded import RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable

FOREIGN_KEYS = 1_000_000
#: Seconds the reading may take longer beside the foreign keys.
TOLERANCE = 0.150

#: Writes ``other:<i>`` for i in [ARGV[1], ARGV[2]]: another application's keys.
POPULATE = """
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  redis.call('SET', 'other:' .. i, 'v')
end
return 1
"""


def fill_crawl(client: redis.Redis, beat: float) -> None:
    """A crawl of spider ``quotes`` with keys of every kind the status reads."""
    client.lpush("quotes:start_urls", "https://s.example/")
    frontier = Frontier(client, "quotes")
    for i in range(200):
        site = f"s{i % 40}.example"
        assert frontier.push(
            f'{{"u":"https://{site}/{i}"}}'.encode(), site=site, priority=i % 5,
            fingerprint=None, dont_filter=True,
        )
    assert isinstance(frontier.lease("w1#n:1"), Lease)
    frontier.dead_letter({"url": "https://s0.example/x", "reason": "r", "attempts": 3})
    client.hset("{quotes}:stats", mapping={"response_received_count": 5})
    client.hset(
        "{quotes}:workers",
        "w1",
        json.dumps({"pid": 1, "host": "h", "last_heartbeat": beat, "pages": 5}),
    )


def crowd(srv: RedisServer, fill: Callable[[redis.Redis, float], None]) -> tuple[str, str]:
    """Write the same crawl (``fill(client, heartbeat time)``) into databases
    0 and 1 of ``srv``, and :data:`FOREIGN_KEYS` keys of another
    application into database 1. Returns the two databases' URLs."""
    base = srv.url.rsplit("/", 1)[0]
    beat = time.time()
    for db in (0, 1):
        client: redis.Redis = redis.Redis.from_url(f"{base}/{db}")
        try:
            fill(client, beat)
            if db == 1:
                script = client.register_script(POPULATE)
                step = 200_000
                for start in range(1, FOREIGN_KEYS + 1, step):
                    script(args=[start, start + step - 1])
                assert client.dbsize() > FOREIGN_KEYS
        finally:
            client.close()
    return f"{base}/0", f"{base}/1"


def commands(client: redis.Redis, name: str) -> int:
    """Calls of ``name`` the server has run (``INFO commandstats``)."""
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """This module's own redis-server: db 0 the crawl alone, db 1 the crawl
    and a million foreign keys."""
    with RedisServer(appendonly=False) as srv:
        alone_url, _ = crowd(srv, fill_crawl)
        yield srv
        client = redis.Redis.from_url(alone_url)
        try:
            client.flushall()  # this module's own server only
        finally:
            client.close()


def urls(server: RedisServer) -> tuple[str, str]:
    base = server.url.rsplit("/", 1)[0]
    return f"{base}/0", f"{base}/1"


def timed(run: Any) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def test_status_reader_is_as_fast_beside_a_million_foreign_keys(server: RedisServer) -> None:
    alone_url, crowded_url = urls(server)
    clients = [redis.Redis.from_url(u) for u in (alone_url, crowded_url)]
    readers = [StatusReader(c, None, "unused", ["quotes", "pages"]) for c in clients]
    try:
        scans_before = commands(clients[0], "scan") + commands(clients[0], "keys")
        results = [r.read().as_dict() for r in readers]
        for result in results:
            result.pop("time")
            for spider in result["spiders"].values():
                for worker in spider["workers"]:
                    worker.pop("age")
        assert results[0] == results[1]  # the same figures either way
        quotes = results[1]["spiders"]["quotes"]
        assert (quotes["queued"], quotes["leases"], quotes["dead_letters"]) == (199, 1, 1)
        assert results[1]["spiders"]["pages"]["started"] is False
        times: list[list[float]] = [[], []]
        for _ in range(7):  # alternately, so that load on the machine hits both
            for i, reader in enumerate(readers):
                times[i].append(timed(reader.read))
        alone, crowded = (statistics.median(t) for t in times)
        assert crowded - alone < TOLERANCE, (alone, crowded)
        assert commands(clients[0], "scan") + commands(clients[0], "keys") == scans_before
    finally:
        for reader in readers:
            reader.close()


@pytest.mark.workers
def test_status_command_reads_no_keyspace_beside_a_million_foreign_keys(
    server: RedisServer, env: dict[str, str]
) -> None:
    """The real command, beside a million foreign keys: the same answer, and
    no SCAN or KEYS sent. Its time is the reader's (compared above, median
    against median) plus Python starting Scrapy, 1-2 s that other jobs on a
    busy machine stretch by seconds: timing whole processes here measured
    the machine's load, not the command."""
    alone_url, crowded_url = urls(server)
    client: redis.Redis = redis.Redis.from_url(alone_url)
    scans_before = commands(client, "scan") + commands(client, "keys")

    def status(url: str) -> dict[str, Any]:
        result = subprocess.run(
            [PYTHON, "-m", "scrapy", "frontier", "status", "--json"],
            cwd=ROOT, env={**env, "REDIS_URL": url}, capture_output=True, text=True,
            timeout=60, check=False,
        )
        assert result.returncode == 0, result.stderr
        answer: dict[str, Any] = json.loads(result.stdout)
        return answer

    try:
        alone, crowded = status(alone_url), status(crowded_url)
        assert crowded["spiders"]["quotes"]["queued"] == 199
        assert alone["spiders"]["quotes"]["queued"] == 199
        assert commands(client, "scan") + commands(client, "keys") == scans_before
    finally:
        client.close()
