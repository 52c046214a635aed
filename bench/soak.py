"""``python -m bench.soak``: a seeded soak of the frontier under faults.

It starts its own ``redis-server`` and SecantusDB (``devtools.embedded``;
``$MONGO_URI`` instead when set), replays the quotes.toscrape.com capture on
127.0.0.1 with 300 ms per response, and puts a fault proxy
(:class:`tests.faultproxy.FaultProxy`) between the workers and Redis that
loses about one Redis reply in 150: Redis runs the command, the worker never
hears back. Three ``scrapy crawl pages`` workers (``FRONTIER_CONCURRENCY=2``
for the site, short leases) crawl the site from ``/``; every 6 seconds one
of them, chosen at random, is killed with SIGKILL and started again under
the same ``FRONTIER_WORKER_ID``. Two more faults come once per round, each
when a number of pages drawn from the seed is stored:

- a failover: Redis has a replica; its master's writes are paused until
  the replica has them all (``WAIT``), the replica is promoted, the old
  master made its replica, and the proxy's new connections go to the new
  master (a managed "primary endpoint"); connections opened before still
  reach the demoted master, which answers writes ``READONLY``
  (``--no-failover``: none);
- a forced stop: one worker gets SIGTERM, then SIGTERM again once Scrapy's
  graceful stop began, and is started again under the same id
  (``--no-forced-stop``: none).

A round passes when, once the workers have closed on their own:

- MongoDB holds every page of the capture once (213 documents in ``pages``);
- the frontier is clean: the audit of every shard
  (``FrontierShards.audit()``, ``--shards`` sets ``FRONTIER_SHARDS``,
  default 1) finds nothing leased, no download slot taken, a pending count
  equal to what is queued, nothing queued, and every shard's dead-letter
  list (``{pages}:dead``, ``{pages:<i>}:dead``) is empty;
- the site is not stuck: a new worker fetches a new seed of the same site
  within ``--fresh-within`` seconds (2) of its push, the faults switched off.

Every random choice (which replies are lost, which worker is killed) comes
from ``--seed``, printed first, so a failing seed can be run again (timings
still vary from run to run). With ``--duration`` rounds follow one another
until that many seconds have passed, each on a fresh frontier and database.
Exit status: 0 when every round passed, 1 otherwise, with a summary of what
failed; ``--keep-logs`` keeps the workers' logs (they are kept anyway on
failure, and their folder printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import pymongo
import redis

from bench.workers import PROJECT_DIR, wait_blocked
from crawler.frontier.shards import FrontierShards
from devtools.embedded import MongoServer, RedisServer
from devtools.replay import ReplayServer, default_warc_path
from tests.faultproxy import FaultProxy

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["main"]

SPIDER = "pages"
#: HTML pages of the quotes capture: what the pages spider stores.
EXPECTED_PAGES = 213


@dataclass
class Options:
    seed: int
    duration: float
    kill_interval: float
    loss: float
    mode: Literal["drop", "hold"]
    latency: float
    workers: int
    concurrency: int
    lease_timeout: float
    idle: int
    round_timeout: float
    fresh_within: float
    keep_logs: bool
    shards: int = 1
    failover: bool = True
    forced_stop: bool = True


@dataclass
class Round:
    """What one crawl of the site under faults came to."""

    number: int
    seconds: float = 0.0
    stored: int = 0
    kills: int = 0
    lost: int = 0
    failovers: int = 0
    forced_stops: int = 0
    fresh_delay: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def line(self) -> str:
        fresh = "-" if self.fresh_delay is None else f"{self.fresh_delay:.2f}s"
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(self.problems)
        return (
            f"round {self.number}: {self.stored}/{EXPECTED_PAGES} pages stored in "
            f"{self.seconds:.1f}s, {self.kills} workers killed, {self.forced_stops} forced "
            f"stops, {self.failovers} failovers, {self.lost} Redis replies lost, new seed "
            f"fetched after {fresh}: {verdict}"
        )


class Workers:
    """The round's worker processes, by id, restartable under the same id."""

    def __init__(self, env: dict[str, str], logs: Path, settings: dict[str, object]) -> None:
        self.env, self.logs, self.settings = env, logs, settings
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: list[tuple[str, int]] = []  # (worker id, code) of those not killed
        self.starts = 0
        self._reaped: set[int] = set()
        self._stopped: set[int] = set()  # pids stopped by force: their exit is theirs
        self.log_of: dict[str, Path] = {}

    def start(self, worker: str, **settings: object) -> subprocess.Popen[bytes]:
        self.starts += 1
        log = self.logs / f"{worker}-{self.starts}.log"
        self.log_of[worker] = log
        args = [sys.executable, "-m", "scrapy", "crawl", SPIDER, "-s", f"LOG_FILE={log}"]
        for name, value in {**self.settings, "FRONTIER_WORKER_ID": worker, **settings}.items():
            args += ["-s", f"{name}={value}"]
        proc = subprocess.Popen(
            args, cwd=PROJECT_DIR, env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        self.procs[worker] = proc
        return proc

    def kill(self, worker: str) -> None:
        proc = self.procs[worker]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def force_stop(self, worker: str, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGTERM again once Scrapy's graceful stop began
        (Ctrl-C twice, scrapyd's "cancel" twice); wait for the exit.

        :raises RuntimeError: the worker did not exit within ``timeout``.
        """
        proc, log = self.procs[worker], self.log_of[worker]
        self._stopped.add(proc.pid)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if log.exists() and "shutting down gracefully" in log.read_text():
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.02)
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"worker {worker} still running {timeout:.0f}s after "
                               "two SIGTERMs") from None

    def running(self) -> list[str]:
        alive = []
        for worker, proc in self.procs.items():
            code = proc.poll()
            if code is None:
                alive.append(worker)
            elif proc.pid not in self._reaped:
                self._reaped.add(proc.pid)
                if code != -signal.SIGKILL and proc.pid not in self._stopped:
                    self.exits.append((worker, code))
        return alive

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Crawl the quotes capture with three workers while Redis replies "
        "are lost and workers are killed; check that nothing was lost.",
    )
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of every random choice (default: a random one, printed)")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="run rounds until this many seconds have passed (default 0: "
                        "one round)")
    parser.add_argument("--kill-interval", type=float, default=6.0,
                        help="seconds between two SIGKILLs (default 6; 0: no kills)")
    parser.add_argument("--loss", type=float, default=150.0,
                        help="lose the reply to about one client write in N (default 150; "
                        "0: no losses)")
    parser.add_argument("--mode", choices=("drop", "hold"), default="drop",
                        help="a lost reply closes the connection (drop) or is held past "
                        "the worker's socket timeout (hold)")
    parser.add_argument("--latency", type=float, default=0.3,
                        help="seconds per response of the site (default 0.3)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2,
                        help="FRONTIER_CONCURRENCY: downloads at once from the site")
    parser.add_argument("--lease-timeout", type=float, default=3.0,
                        help="FRONTIER_LEASE_TIMEOUT (default 3)")
    parser.add_argument("--idle", type=int, default=4,
                        help="MAX_IDLE_TIME_BEFORE_CLOSE of the workers (default 4)")
    parser.add_argument("--round-timeout", type=float, default=300.0,
                        help="a round whose workers have not closed by then fails")
    parser.add_argument("--fresh-within", type=float, default=2.0,
                        help="a new seed must be fetched within this many seconds")
    parser.add_argument("--shards", type=int, default=1,
                        help="FRONTIER_SHARDS of the workers (default 1)")
    parser.add_argument("--no-failover", action="store_true",
                        help="no failover of Redis in a round")
    parser.add_argument("--no-forced-stop", action="store_true",
                        help="no forced stop (SIGTERM twice) of a worker in a round")
    parser.add_argument("--keep-logs", action="store_true")
    ns = parser.parse_args(argv)
    if ns.shards < 1:
        parser.error("--shards must be at least 1")
    seed = ns.seed if ns.seed is not None else random.SystemRandom().randrange(1, 2**31)
    return Options(
        seed=seed, duration=ns.duration, kill_interval=ns.kill_interval, loss=ns.loss,
        mode=ns.mode, latency=ns.latency, workers=ns.workers, concurrency=ns.concurrency,
        lease_timeout=ns.lease_timeout, idle=ns.idle, round_timeout=ns.round_timeout,
        fresh_within=ns.fresh_within, keep_logs=ns.keep_logs, shards=ns.shards,
        failover=not ns.no_failover, forced_stop=not ns.no_forced_stop,
    )


@contextlib.contextmanager
def _mongo() -> Iterator[str]:
    uri = os.environ.get("MONGO_URI")
    if uri:
        yield uri
        return
    with MongoServer() as server:
        yield server.uri


def _env(redis_url: str, mongo_uri: str, database: str) -> dict[str, str]:
    env = dict(os.environ, REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=database,
               PYTHONUNBUFFERED="1")
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return env


class RedisPair:
    """A ``redis-server`` master and its replica; :meth:`fail_over` swaps
    their roles."""

    def __init__(self, master: RedisServer, replica: RedisServer) -> None:
        self.master, self.replica = master, replica
        self.clients = {s.url: redis.Redis.from_url(s.url) for s in (master, replica)}

    @property
    def rds(self) -> redis.Redis:
        """A client of the master now."""
        return self.clients[self.master.url]

    @staticmethod
    def _address(server: RedisServer) -> tuple[str, int]:
        parts = urlsplit(server.url)
        return parts.hostname or "127.0.0.1", parts.port or 6379

    def _wait(self, client: redis.Redis, key: str, value: str, what: str) -> None:
        deadline = time.monotonic() + 10
        while client.info("replication").get(key) != value:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} within 10 s")
            time.sleep(0.02)

    def replicate(self) -> None:
        """Make the replica follow the master; wait until it is in sync."""
        replica = self.clients[self.replica.url]
        replica.replicaof(*self._address(self.master))
        self._wait(replica, "master_link_status", "up", "the replica did not sync")

    def fail_over(self) -> None:
        """Pause the master's writes until the replica has every write it
        acknowledged (``WAIT``), promote the replica, make the old master
        its replica: a managed failover, no acknowledged write lost."""
        old, new = self.clients[self.master.url], self.clients[self.replica.url]
        old.client_pause(10_000, all=False)
        try:
            if old.execute_command("WAIT", 1, 5000) != 1:
                raise RuntimeError("the replica did not acknowledge the master's writes")
            new.replicaof("NO", "ONE")
            old.replicaof(*self._address(self.replica))
        finally:
            old.client_unpause()
        self.master, self.replica = self.replica, self.master
        self._wait(old, "role", "slave", "the old master was not demoted")

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


@dataclass
class Soak:
    """The servers of a soak, shared by its rounds."""

    opts: Options
    rng: random.Random
    site: ReplayServer
    proxy: FaultProxy
    pair: RedisPair
    mongo: pymongo.MongoClient[dict[str, Any]]
    mongo_uri: str
    logs: Path

    @property
    def rds(self) -> redis.Redis:
        """A client of the master now (the failover moves it)."""
        return self.pair.rds

    def run_round(self, number: int) -> Round:
        """Crawl the site from scratch under faults, then check it all."""
        result = Round(number)
        self.rds.flushdb()
        self.site.clear_hits()
        database = f"soak_{self.opts.seed}_{number}"
        self.mongo.drop_database(database)
        workers = Workers(
            _env(self.proxy.url, self.mongo_uri, database), self.logs, self._settings()
        )
        lost_before = self.proxy.lost
        started = time.monotonic()
        try:
            self._crawl(result, workers, self.mongo[database]["pages"])
        finally:
            workers.stop_all()
            self.proxy.stop_losing()
        result.seconds = time.monotonic() - started
        result.lost = self.proxy.lost - lost_before
        result.stored = self.mongo[database]["pages"].count_documents({})
        self._check(result, workers)
        self.mongo.drop_database(database)
        return result

    def _settings(self) -> dict[str, object]:
        opts = self.opts
        settings: dict[str, object] = {
            "FRONTIER_CONCURRENCY": opts.concurrency,
            "FRONTIER_LEASE_TIMEOUT": opts.lease_timeout,
            "MAX_IDLE_TIME_BEFORE_CLOSE": opts.idle,
            "FRONTIER_SHARDS": opts.shards,
            "TELNETCONSOLE_ENABLED": "False",
            "LOG_LEVEL": "INFO",
        }
        if opts.mode == "hold":  # held replies time out after 1.5 s, not 10
            settings["REDIS_PARAMS"] = json.dumps(
                {"socket_timeout": 1.5, "socket_connect_timeout": 1.5}
            )
        return settings

    def _crawl(self, result: Round, workers: Workers, pages: Any) -> None:
        """Seed, start the workers, kill one every interval while pages are
        missing, fail Redis over and stop a worker by force once each when
        their drawn number of pages is stored, and wait until the workers
        all have closed for idleness."""
        opts, rng = self.opts, self.rng
        ids = [f"w{i + 1}" for i in range(opts.workers)]
        self.rds.lpush(f"{SPIDER}:start_urls", self.site.url_for("/"))
        if opts.loss > 0:
            self.proxy.lose_randomly(
                opts.loss, seed=rng.randrange(2**31), mode=opts.mode, hold=10.0
            )
        # (drawn before the crawl: the same seed, the same faults)
        failover_at = rng.randrange(30, 150) if opts.failover else None
        stop_at = rng.randrange(30, 150) if opts.forced_stop else None
        stop_victim = ids[rng.randrange(len(ids))]
        started = time.monotonic()
        for worker in ids:
            workers.start(worker)
        next_kill = started + opts.kill_interval
        while running := workers.running():
            wanted = failover_at is not None or stop_at is not None
            stored = pages.count_documents({}) if wanted else 0
            if failover_at is not None and stored >= failover_at:
                failover_at = None
                self.pair.fail_over()
                self.proxy.switch_upstream(self.pair.master.url)
                result.failovers += 1
            if stop_at is not None and stored >= stop_at and stop_victim in running:
                stop_at = None
                try:
                    workers.force_stop(stop_victim)
                except RuntimeError as exc:
                    result.problems.append(str(exc))
                    return
                result.forced_stops += 1
                workers.start(stop_victim)
            now = time.monotonic()
            if now - started > opts.round_timeout:
                result.problems.append(
                    f"workers {running} still running after {opts.round_timeout:.0f}s"
                )
                return
            if opts.kill_interval > 0 and now >= next_kill:
                next_kill = now + opts.kill_interval
                victim = ids[rng.randrange(len(ids))]
                if victim in running and pages.count_documents({}) < EXPECTED_PAGES:
                    workers.kill(victim)
                    result.kills += 1
                    workers.start(victim)
            time.sleep(0.1)

    def _check(self, result: Round, workers: Workers) -> None:
        rds = self.rds
        bad_exits = [(w, c) for w, c in workers.exits if c != 0]
        if bad_exits:
            result.problems.append(f"workers exited with errors: {bad_exits}")
        if result.stored != EXPECTED_PAGES:
            result.problems.append(f"{result.stored} pages stored, not {EXPECTED_PAGES}")
        shards = FrontierShards.build(rds, SPIDER, self.opts.shards)
        audit = shards.audit()
        if audit:
            result.problems.append(f"frontier audit: {audit}")
        dead = [entry for shard in shards for entry in rds.lrange(shard.key("dead"), 0, -1)]
        if dead:
            result.problems.append(f"{len(dead)} dead letters, first: {dead[0][:300]!r}")
        recorded = int(rds.get(f"{{{SPIDER}}}:shards") or 0)
        if recorded != self.opts.shards:
            result.problems.append(f"{{{SPIDER}}}:shards is {recorded}, not {self.opts.shards}")
        seeds = rds.llen(f"{SPIDER}:start_urls")
        if seeds:
            result.problems.append(f"{seeds} seeds left in {SPIDER}:start_urls")
        result.fresh_delay = self._fresh_seed_delay(result.number, workers)
        if result.fresh_delay is None:
            result.problems.append("the new seed was not fetched (the site is stuck)")
        elif result.fresh_delay > self.opts.fresh_within:
            result.problems.append(
                f"the new seed waited {result.fresh_delay:.2f}s "
                f"(more than {self.opts.fresh_within}s)"
            )

    def _fresh_seed_delay(self, number: int, workers: Workers) -> float | None:
        """Seconds from pushing a new seed of the site to its download, with
        a fresh, idle worker and no fault; None when it never came."""
        proc = workers.start("fresh", MAX_IDLE_TIME_BEFORE_CLOSE=60)
        try:
            wait_blocked(self.rds, 1, [proc], timeout=30)
            path = f"/?soak={self.opts.seed}-{number}"
            pushed = time.monotonic()
            self.rds.lpush(f"{SPIDER}:start_urls", self.site.url_for(path))
            deadline = pushed + max(10.0, 3 * self.opts.fresh_within)
            while time.monotonic() < deadline:
                for hit in self.site.hits():
                    if hit.path == path:
                        return hit.started - pushed
                time.sleep(0.02)
            return None
        except RuntimeError:  # the worker exited, or never became idle
            return None
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _quiet(site: ReplayServer) -> None:
    """Do not print a traceback for each response a killed worker never read
    (the standard library's HTTP server prints them on stderr)."""
    httpd = getattr(site, "_httpd", None)
    if httpd is not None:
        httpd.handle_error = lambda request, client_address: None


def main(argv: list[str] | None = None) -> int:
    """Run the soak; returns the exit status (0: every round passed)."""
    opts = _parse(argv)
    print(f"soak seed {opts.seed}", flush=True)
    if opts.shards > 1:
        print(f"FRONTIER_SHARDS={opts.shards}", flush=True)
    rng = random.Random(opts.seed)  # noqa: S311 - reproducible faults, not secrets
    warc = default_warc_path()
    if not warc.is_file():
        print(f"FAIL: the WARC capture is missing: {warc}", flush=True)
        return 1
    logs = Path(tempfile.mkdtemp(prefix="soak-logs-"))
    rounds: list[Round] = []
    started = time.monotonic()
    with (
        RedisServer(appendonly=False) as redis_server,
        RedisServer(appendonly=False) as replica_server,
        _mongo() as mongo_uri,
        ReplayServer(warc, host="127.0.0.1", latency=opts.latency) as site,
        FaultProxy(redis_server.url, record=10_000) as proxy,
    ):
        _quiet(site)
        pair = RedisPair(redis_server, replica_server)
        pair.replicate()
        soak = Soak(opts, rng, site, proxy, pair, pymongo.MongoClient(mongo_uri), mongo_uri, logs)
        try:
            while not rounds or time.monotonic() - started < opts.duration:
                result = soak.run_round(len(rounds) + 1)
                rounds.append(result)
                print(result.line(), flush=True)
        finally:
            soak.mongo.close()
            pair.close()
    failed = [r for r in rounds if not r.passed]
    rerun = f"python -m bench.soak --seed {opts.seed}" + (
        f" --shards {opts.shards}" if opts.shards > 1 else ""
    )
    if failed:
        print(f"FAIL: {len(failed)} of {len(rounds)} rounds failed (seed {opts.seed}; "
              f"re-run: {rerun}); worker logs in {logs}", flush=True)
        for r in failed:
            print("  " + r.line(), flush=True)
        return 1
    print(f"PASS: {len(rounds)} rounds, {sum(r.kills for r in rounds)} workers killed, "
          f"{sum(r.forced_stops for r in rounds)} forced stops, "
          f"{sum(r.failovers for r in rounds)} failovers, "
          f"{sum(r.lost for r in rounds)} Redis replies lost, nothing lost "
          f"(seed {opts.seed})", flush=True)
    if opts.keep_logs:
        print(f"worker logs in {logs}", flush=True)
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
