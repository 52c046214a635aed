"""Run every figure, write ``BENCHMARKS.md`` and print a JSON summary."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import cluster_fig, compare, crawls, frontier_figs, mongo_fig
from bench.workers import PROJECT_DIR
from devtools.cluster import RedisClusterServers
from devtools.embedded import MongoServer, RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["main"]

#: Sizes of the full run and of ``--quick``.
SIZES: dict[str, dict[str, Any]] = {
    "full": {"pages": 5000, "per_worker": 160, "delay": 1.0, "memory_n": 100_000,
             "ops_seconds": 2.0, "items": 2000, "tries": 20, "idle": 10.0, "sites": 10_000,
             "due_sites": 100_000, "prefill": 20_000, "shard_cost": True},
    "quick": {"pages": 200, "per_worker": 30, "delay": 0.15, "memory_n": 2000,
              "ops_seconds": 0.5, "items": 100, "tries": 2, "idle": 1.0, "sites": 1000,
              "due_sites": 5000, "prefill": 2000, "shard_cost": False},
}

_HEADER = """# Benchmarks

Written by `python -m bench` (the numbers below are from its last full run;
do not edit them by hand). Rerun from the project directory with

    .venv/bin/python -m bench              # full run, 5 repeats, ~25 minutes
    .venv/bin/python -m bench --repeat 3   # fewer repeats
    .venv/bin/python -m bench --quick      # tiny smoke run (tests/test_bench.py)

`python -m bench.compare a|d CHECKOUT...` runs figure a or d on several
checkouts of the project in turn (medians; see `bench/compare.py`): how a
figure's change is traced to a commit. `python -m bench.compare s ...`
weighs the scripts alone: Redis's own µs per push, lease and ack;
`python -m bench.compare m ...` Redis's bytes per queued request of the
`pages` spider's own requests, from a crawl of a replayed capture.

It starts its own `redis-server`, SecantusDB (`devtools.embedded`) and HTTP
sites (`bench/sites.py`, an asyncio server: the threaded
`devtools.replay.SiteServer` costs as much CPU per page as the worker it
serves). Each figure is a median of the repeats, ours against the baseline
run side by side in the same invocation. How each figure is measured is in
the docstrings of `bench/crawls.py`, `bench/frontier_figs.py` and
`bench/mongo_fig.py`; the notes below the table summarise them.
"""


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _row(
    figure: str, values: tuple[float, float], unit: str, target: str, passed: bool | None
) -> dict[str, Any]:
    ours, base = values
    ratio = ours / base if base else float("nan")
    return {"figure": figure, "ours": ours, "baseline": base, "unit": unit,
            "ratio": ratio, "target": target,
            "pass": passed}


def _ops(url: str, repeat: int, seconds: float) -> dict[str, list[float]]:
    """Figure d's runs: ours and stock, 1 and 4 clients, in turn
    (:func:`crawls.in_turn`: the order reversed every other repeat)."""
    ops: dict[str, list[float]] = {}
    variants = [(kind, clients) for kind in ("ours", "stock") for clients in (1, 4)]
    for _, (kind, clients) in crawls.in_turn(variants, repeat):
        ops.setdefault(f"{kind}-{clients}", []).append(
            frontier_figs.frontier_ops(url, kind, clients, seconds)
        )
    return ops


def _mongo_runs(items: int, repeat: int) -> list[dict[str, Any]]:
    """Figure e's runs, against ``$MONGO_URI`` (a real mongod) when set, else
    an embedded SecantusDB."""
    with contextlib.ExitStack() as stack:
        uri = os.environ.get("MONGO_URI") or stack.enter_context(MongoServer()).uri
        return [mongo_fig.mongo_items(uri, items, i) for i in range(repeat)]


def _ops_rows(ops: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Figure d's rows from :func:`_ops`'s runs."""
    rows = []
    for clients in (1, 4):
        ours, base = _median(ops[f"ours-{clients}"]), _median(ops[f"stock-{clients}"])
        rows.append(_row(f"d. frontier ops/s, {clients} client{'s' if clients > 1 else ''}",
                         (ours, base), "ops/s",
                         "ours >= 30,000" if clients == 4 else "(info)",
                         ours >= 30_000 if clients == 4 else None))
    return rows


def _memory_rows(c: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Figure c's rows from :func:`frontier_figs.redis_memory`'s result."""
    rows = [
        _row(f"c. Redis bytes per queued request ({n:,} requests)",
             (c["ours"]["queued_bytes"], c["stock"]["queued_bytes"]), "bytes",
             "ours <= 80", c["ours"]["queued_bytes"] <= 80),
        _row("c. Redis bytes per seen URL, exact set",
             (c["ours"]["seen_bytes"], c["stock"]["seen_bytes"]), "bytes", "(info)", None),
    ]
    bloom = c["bloom"]
    if bloom.get("status") == "measured":
        rows.append(_row("c. Redis bytes per seen URL, Bloom filter (0.1% FP)",
                         (bloom["seen_bytes"], c["stock"]["seen_bytes"]), "bytes",
                         "ours <= 2", bloom["seen_bytes"] <= 2))
    else:
        rows.append(_row(f"c. Bloom filter bytes per URL: {bloom.get('status')}",
                         (float("nan"), c["stock"]["seen_bytes"]), "bytes",
                         "ours <= 2", None))
    return rows


#: Figure c on the pages spider's requests, in a process of its own (a
#: Scrapy crawl runs a reactor, once per process).
_PAGES_MEMORY = (
    "import json, sys\n"
    "from bench.pages_memory import pages_request_memory\n"
    "print(json.dumps(pages_request_memory(sys.argv[1])))\n"
)


def _pages_figure(url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Figure c on the requests a crawl of the quotes capture by the
    ``pages`` spider schedules (:mod:`bench.pages_memory`): bytes per
    request it yields, in all and in the queue's chunk hash alone, and per
    request scheduled, redirects included. ``MEMORY USAGE`` is exact: one
    run.

    :raises RuntimeError: the run failed (its stderr's tail in the message).
    """
    done = subprocess.run([sys.executable, "-c", _PAGES_MEMORY, url], cwd=PROJECT_DIR,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the pages memory figure failed:\n{done.stderr[-3000:]}")
    m = json.loads(done.stdout.strip().splitlines()[-1])
    own, every = m["own"], m["all"]
    nan = float("nan")
    rows = [
        _row(f"c. Redis bytes per queued request, pages spider's own requests (a crawl of "
             f"the quotes capture, {own['queued']:,} queued), all keys",
             (own["all_keys"], nan), "bytes", "ours <= 80", own["all_keys"] <= 80),
        _row("c. the same, the queue's chunk hash alone", (own["queue_hash"], nan), "bytes",
             "(info)", None),
        _row("c. the same, every request the crawl schedules (redirects included), all keys",
             (every["all_keys"], nan), "bytes", "(info)", None),
    ]
    return m, rows


def _cpu_figure(
    url: str, log_dir: Path, size: dict[str, Any], repeat: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Figure g: two workers against one on figure a's CPU-bound site."""
    g = crawls.cpu_scaling(url, log_dir, pages=size["pages"], repeat=repeat)
    one, two = _median(g["rates"][1]), _median(g["rates"][2])
    row = _row(f"g. crawl pages/s, 2 workers vs 1, {size['pages']}-page CPU-bound "
               "site (2 cores)", (two, one), "pages/s", ">= 1.8",
               two / one >= 1.8 if one else None)
    return g, [row]


def _due_sites_figure(size: dict[str, Any], repeat: int) -> tuple[
    dict[str, Any], list[dict[str, Any]]
]:
    """Figure j: lease and ack ops/s on a frontier of ``due_sites`` due sites
    against 100 sites holding as many requests
    (:func:`frontier_figs.lease_ops_on_due_sites`), medians of the repeats."""
    with RedisServer() as server:
        runs = [
            frontier_figs.lease_ops_on_due_sites(
                server.url, size["due_sites"], size["ops_seconds"]
            )
            for _ in range(repeat)
        ]
    many = _median([r["sites"]["ops_per_s"] for r in runs])
    few = _median([r["baseline"]["ops_per_s"] for r in runs])
    row = _row(f"j. lease+ack ops/s, {size['due_sites']:,} due sites vs 100 sites "
               "(as many requests)", (many, few), "ops/s", ">= 0.8",
               many / few >= 0.8 if few else None)
    return {"runs": runs}, [row]


def _replicas_figure(size: dict[str, Any], repeat: int) -> tuple[
    dict[str, Any], list[dict[str, Any]]
]:
    """Figure d with ``FRONTIER_MIN_REPLICAS=1`` against 0: ours, 4 clients,
    on a master with one replica (both variants, in turn), ``WAIT 1`` at
    the end of each pipeline with 1 (:func:`frontier_figs.frontier_ops`)."""
    runs: dict[int, list[float]] = {0: [], 1: []}
    with RedisServer() as master, RedisServer(
        args=["--replicaof", master.host, str(master.port)]
    ) as replica:
        compare.wait_in_sync(replica)
        for _, n in crawls.in_turn([0, 1], repeat):
            runs[n].append(frontier_figs.frontier_ops(
                master.url, "ours", 4, size["ops_seconds"], min_replicas=n
            ))
    row = _row("d. frontier ops/s, 4 clients, FRONTIER_MIN_REPLICAS=1 vs 0 (one replica)",
               (_median(runs[1]), _median(runs[0])), "ops/s", "(info)", None)
    return {"runs": runs}, [row]


def _site_rows(i: dict[str, Any]) -> list[dict[str, Any]]:
    """Figure i's rows from :func:`frontier_figs.bytes_per_site`'s result
    (no baseline: the stock scheduler keeps no per-site state)."""
    nan = float("nan")
    sites = f"{i['sites']:,} sites"
    rows = [
        _row(f"i. Redis bytes per site with work (1 request queued, robots.txt; {sites})",
             (i["with_work"], nan), "bytes", "(info)", None),
        _row("i. Redis bytes per finished site, before housekeeping",
             (i["finished"], nan), "bytes", "(info)", None),
        _row("i. Redis bytes per finished site, after housekeeping"
             + (f" ({i['not_forgotten']} not forgotten)" if i["not_forgotten"] else ""),
             (i["forgotten"], nan), "bytes", "(info)", None),
    ]
    return rows


#: Figure h: clients, the cluster's shards, sites the requests spread over.
H_CLIENTS, H_SHARDS, H_SITES = 4, 12, 120


def _ceiling(run: dict[str, Any]) -> float:
    """The ops/s a run's Redis would allow at one full core on its busiest
    node: its ops/s over that node's CPU share."""
    busiest = max(run["redis_cpu"])
    return float(run["ops_s"] / busiest) if busiest > 0 else float("nan")


def _cluster_figure(
    size: dict[str, Any], repeat: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Figure h's runs and rows: a three-master cluster with
    ``FRONTIER_SHARDS=12`` against one plain Redis with 1 shard (see
    :mod:`bench.cluster_fig`), and, on one plain Redis, 8 shards against 1 on
    figure d's requests (10 sites; not with ``--quick``); the four runs in
    turn, the order reversed every other repeat (:func:`crawls.in_turn`)."""
    seconds, prefill = size["ops_seconds"], size["prefill"]
    raw: dict[str, Any] = {"cluster": [], "one": [], "shards_1": [], "shards_8": []}
    with contextlib.ExitStack() as stack:
        cluster: RedisClusterServers | None = None
        try:
            cluster = stack.enter_context(RedisClusterServers(masters=3))
        except RuntimeError as exc:  # no redis-cli, or the cluster would not form
            raw["error"] = str(exc)
        plain = stack.enter_context(RedisServer())
        one = {"url": plain.url, "node_urls": [plain.url], "cluster": False,
               "clients": H_CLIENTS, "seconds": seconds, "prefill": prefill}
        runs: dict[str, Callable[[], dict[str, Any]]] = {}
        if cluster is not None:
            nodes = [node.url for node in cluster.nodes]
            runs["cluster"] = functools.partial(
                cluster_fig.sharded_ops, cluster.url, nodes, cluster=True,
                shards=H_SHARDS, clients=H_CLIENTS, seconds=seconds, sites=H_SITES,
                prefill=prefill,
            )
        runs["one"] = functools.partial(cluster_fig.sharded_ops, **one, shards=1, sites=H_SITES)
        if size["shard_cost"]:
            for shards in (1, 8):
                runs[f"shards_{shards}"] = functools.partial(
                    cluster_fig.sharded_ops, **one, shards=shards, sites=10
                )
        for _, key in crawls.in_turn(list(runs), repeat):
            raw[key].append(runs[key]())
    ops = {k: _median([r["ops_s"] for r in v]) for k, v in raw.items() if isinstance(v, list)}
    ratio = ops["cluster"] / ops["one"] if ops["one"] else float("nan")
    cost = ops["shards_8"] / ops["shards_1"] if raw["shards_1"] else float("nan")
    rows = [
        _row(f"h. frontier ops/s, 3-master cluster vs one node, {H_CLIENTS} clients "
             f"({H_SHARDS} shards vs 1, {H_SITES} sites)", (ops["cluster"], ops["one"]),
             "ops/s", ">= 2.5", ratio >= 2.5 if cluster is not None else None),
        _row("h. CPU during the cluster run, cores: clients (sum) vs the 3 masters (sum)",
             (_median([sum(r["client_cpu"]) for r in raw["cluster"]]),
              _median([sum(r["redis_cpu"]) for r in raw["cluster"]])), "cores", "(info)", None),
        _row("h. CPU during the one-node run, cores: clients (sum) vs the node",
             (_median([sum(r["client_cpu"]) for r in raw["one"]]),
              _median([sum(r["redis_cpu"]) for r in raw["one"]])), "cores", "(info)", None),
        _row("h. ops/s when Redis is the bottleneck (ops/s over the busiest node's CPU "
             "share), 3-master cluster vs one node",
             (_median([_ceiling(r) for r in raw["cluster"]]),
              _median([_ceiling(r) for r in raw["one"]])), "ops/s", "(info)", None),
        _row(f"h. frontier ops/s on one plain Redis, FRONTIER_SHARDS=8 vs 1, {H_CLIENTS} "
             "clients, figure d's requests", (ops["shards_8"], ops["shards_1"]), "ops/s",
             ">= 0.95", cost >= 0.95 if raw["shards_1"] else None),
    ]
    return raw, rows


def _timed(
    name: str,
    figure: Callable[[], tuple[Any, list[dict[str, Any]]]],
    raw: dict[str, Any],
    rows: list[dict[str, Any]],
    timings: dict[str, float],
) -> None:
    """Run ``figure`` (its raw measurements and rows), timed, into the summary."""
    t = time.monotonic()
    raw[name], more = figure()
    rows.extend(more)
    timings[name] = time.monotonic() - t


def run(quick: bool, repeat: int, log_dir: Path) -> dict[str, Any]:
    """Run all figures; return the summary (rows plus raw measurements)."""
    size = SIZES["quick" if quick else "full"]
    raw: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    with RedisServer() as redis_srv:
        url = redis_srv.url

        t = time.monotonic()
        raw["a"] = a = crawls.crawl_throughput(url, log_dir, pages=size["pages"], repeat=repeat)
        ours, base = _median(a["ours"]), _median(a["baseline"])
        rows.append(_row(f"a. crawl pages/s, 1 worker, {size['pages']}-page CPU-bound site "
                         "(vs Scrapy in-memory scheduler)", (ours, base), "pages/s",
                         ">= 1.0", ours / base >= 1.0))  # (issue 13 raised it from 0.95)
        timings["a"] = time.monotonic() - t

        t = time.monotonic()
        raw["b"] = b = crawls.scaling_throughput(
            url, log_dir, pages_per_worker=size["per_worker"], delay=size["delay"],
            repeat=repeat,
        )
        one = _median(b["rates"][1])
        for workers in (2, 4):
            many = _median(b["rates"][workers])
            target = ">= 3.5" if workers == 4 else "(info)"
            rows.append(_row(
                f"b. crawl pages/s, {workers} workers vs 1, {int(size['delay'] * 1000)} ms "
                "per response", (many, one), "pages/s", target,
                many / one >= 3.5 if workers == 4 else None,
            ))
        timings["b"] = time.monotonic() - t

        t = time.monotonic()
        raw["c"] = c = frontier_figs.redis_memory(url, size["memory_n"])
        rows += _memory_rows(c, size["memory_n"])
        timings["c"] = time.monotonic() - t

        _timed("c_pages", lambda: _pages_figure(url), raw, rows, timings)

        t = time.monotonic()
        raw["d"] = ops = _ops(url, repeat, size["ops_seconds"])
        rows += _ops_rows(ops)
        timings["d"] = time.monotonic() - t
        _timed("d_replicas", lambda: _replicas_figure(size, repeat), raw, rows, timings)

        t = time.monotonic()
        runs = _mongo_runs(size["items"], repeat)
        raw["e"] = runs
        ours = _median([r["ours"] for r in runs])
        base = _median([r["baseline"] for r in runs])
        rows.append(_row(f"e. MongoDB items/s ({size['items']} page items)", (ours, base),
                         "items/s", ">= 5", ours / base >= 5))
        bound = _median([r["bound"] for r in runs])
        rows.append(_row("e. bare insert_many (500 per call, same unique index) vs insert_one:"
                         " the server's bound on ours", (bound, base), "items/s", "(info)", None))
        timings["e"] = time.monotonic() - t

        _timed("g", lambda: _cpu_figure(url, log_dir, size, repeat), raw, rows, timings)

        t = time.monotonic()
        raw["f"] = {
            kind: crawls.seed_pickup(url, log_dir, tries=size["tries"], idle=size["idle"],
                                     stock=kind == "stock")
            for kind in ("ours", "stock")
        }
        f_ours, f_stock = raw["f"]["ours"], raw["f"]["stock"]
        rows.append(_row(f"f. seed pickup latency of an idle worker, median of {size['tries']}",
                         (f_ours["median_ms"], f_stock["median_ms"]), "ms",
                         "ours <= 100 ms", f_ours["median_ms"] <= 100))
        timings["f"] = time.monotonic() - t

        t = time.monotonic()
        raw["i"] = site = frontier_figs.bytes_per_site(url, size["sites"])
        rows += _site_rows(site)
        timings["i"] = time.monotonic() - t
    _timed("h", lambda: _cluster_figure(size, repeat), raw, rows, timings)
    _timed("j", lambda: _due_sites_figure(size, repeat), raw, rows, timings)
    return {"rows": rows, "raw": raw, "seconds": timings}


def _machine() -> dict[str, Any]:
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(pages / 2**30, 1),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "versions": {name: version(name) for name in
                     ("scrapy", "scrapy-redis", "redis", "pymongo", "twisted", "SecantusDB")},
    }


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def write_markdown(path: Path, summary: dict[str, Any]) -> None:
    """Write ``BENCHMARKS.md``: header, machine, table and notes."""
    m = summary["machine"]
    lines = [_HEADER, f"## Last run: {summary['date']}", "",
             f"Command: `{summary['command']}` ({summary['repeat']} repeats, "
             f"{summary['total_seconds']:.0f} s)", "",
             f"Machine: {m['cores']} cores, {m['memory_gib']} GiB RAM, {m['cpu']}, "
             f"Python {m['python']}; "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".", "",
             "| figure | ours | baseline | unit | ratio | target | result |",
             "|---|---:|---:|---|---:|---|---|"]
    for r in summary["rows"]:
        result = {True: "pass", False: "**FAIL**", None: "-"}[r["pass"]]
        lines.append(f"| {r['figure']} | {_fmt(r['ours'])} | {_fmt(r['baseline'])} | "
                     f"{r['unit']} | {_fmt(r['ratio'])} | {r['target']} | {result} |")
    lines += ["", "## How each figure is measured", "", _NOTES]
    path.write_text("\n".join(lines) + "\n")


_NOTES = """\
- **a.** One `scrapy crawl bench_links` worker (`bench/spiders.py`: follows
  every link, yields no items, so the scheduler's cost is not hidden behind
  item handling) on `devtools.replay.generated_site` served by `FastSite`.
  Baseline: the same spider and settings with
  `SCHEDULER=scrapy.core.scheduler.Scheduler` and
  `DUPEFILTER_CLASS=scrapy.dupefilters.RFPDupeFilter`. `CONCURRENT_REQUESTS`
  and `_PER_DOMAIN` 16. Pages/s counted at the site between the 10th and
  90th percentile of response times (start-up and tail excluded). One
  uncounted in-memory crawl first; then the runs alternate, the order
  reversed every other repeat (ours, in-memory; in-memory, ours; ...), as
  in b, d and g: on this machine the first crawl of a process was the
  slowest, and the variant always first in its pair lost every pair
  (`bench/crawls.py`).
- **b.** 1, 2, 4 workers on a hub page linking to 160 pages per worker, each
  response held 1 s (`--quick`: 30 pages, 150 ms); 16 requests at once per
  worker, cluster-wide `FRONTIER_CONCURRENCY=64`; same steady-rate measure.
  Baseline: 1 worker.
- **c.** 100,000 distinct requests (~70-character URLs on 10 hosts,
  callback `parse_item`, `meta={"depth": 2}`), pushed with our `commit.lua`
  (entries `path<TAB>callback<TAB>depth`, `crawler/frontier/serializer.py`)
  vs scrapy-redis `PriorityQueue` (pickle) + `RFPDupeFilter`. `used_memory`
  delta minus the seen set's `MEMORY USAGE` per request; the seen set's
  `MEMORY USAGE` per URL. `MEMORY USAGE` leaves out what jemalloc rounds up
  the set's 24-byte entries to (32 bytes), so about 8 bytes per request of
  the queued figure are the seen set's. The Bloom filter
  (`crawler.frontier.bloom.BloomDupeFilter`, capacity = the number of URLs,
  0.1% error rate) by `used_memory` delta. The `pages` rows:
  `bench/pages_memory.py` crawls the quotes.toscrape.com capture with the
  `pages` spider (project settings, replayed by `devtools.replay`), copies
  every request the engine schedules (after the spider middlewares: depth,
  `seed_hosts`, Referer), and queues the distinct ones 20 times over
  through `LeasedPriorityQueue.push` on an empty Redis; the figure is the
  exact `MEMORY USAGE` of every key (and of `{pages}:qc`, the queue's
  chunks) per queued request, for the requests the spider yields and for
  every scheduled one (the redirects carry the redirect middleware's meta
  and the default headers). `python -m bench.compare m OLD NEW` weighs it
  on two checkouts.
- **d.** Separate client processes started together, each for 2 s: cycles
  of 16 enqueues (encode + fingerprint), the acks of the previous cycle's
  leases and one lease of up to 16 requests (plus decoding), sent as the
  scheduler sends them: one pipeline with one `commit.lua` call (pushes
  and acks) and one `lease.lua` call, one round trip. Every push, lease and
  ack counts as one op. Stock: the stock scheduler's calls, `SADD` then
  `ZADD` per enqueue (one op), one `MULTI` `ZRANGE`/`ZREMRANGEBYRANK` per
  pop (one op). The `FRONTIER_MIN_REPLICAS` row: ours, 4 clients, on a
  master with one replica (loopback), each pipeline ending with `WAIT 1
  1000` against none, in turn (`python -m bench.compare d .
  --min-replicas 0 1` runs the same pair alone).
- **e.** 2,000 `PageItem`s (~1 KB) through `MongoPipeline.process_item`
  (batched unordered inserts under the unique key index, upserts for keys
  stored already, 1,000 items in flight) vs the documented
  `insert_one(ItemAdapter(item).asdict())` per item, fresh database each.
  The second row is the bound the server sets on ours: the same documents
  in bare unordered `insert_many` calls of 500 under the same unique index
  (no upserts, no pipeline, connection and index untimed). When its ratio
  is under 5, no pipeline keeping that index can meet the goal on that
  server: SecantusDB's unique index costs it most of its time per document.
- **f.** One real worker idle for 10 s, then 20 seeds `LPUSH`-ed one at a
  time (random 0.2-1.0 s pauses); latency from the push to the request's
  arrival at the site. Stock: a scrapy-redis `RedisSpider` with its own
  scheduler, queue and dupefilter (`bench/stock_settings.py`).
- **g.** Two `bench_links` workers against one, with our frontier, on figure
  a's CPU-bound site and settings (`FRONTIER_CONCURRENCY=32`, so each of
  two workers' fair share is the 16 one worker runs); same steady-rate
  measure. The workers, the site server and Redis share the machine's
  cores.
- **h.** `bench/cluster_fig.py`: 4 client processes run figure d's cycle,
  sent as the sharded scheduler sends it through `FrontierShards` (one
  `commit.lua` call per shard with writes, the lease on the next shard in
  turn, one pipeline per Redis node, the lease's last; a shard with
  nothing due is followed by the next), on requests spread over 120
  sites: a three-master Redis Cluster (`devtools.cluster`, one
  `redis-server` per master on this machine) with `FRONTIER_SHARDS=12`
  against one plain `redis-server` with 1 shard, 20,000 requests
  prefilled. The CPU rows are the clients' `process_time` and the
  nodes' `INFO cpu` over the window, in cores: the clients and the masters
  share the machine's cores, so on a small machine the ratio is bounded by
  the cores there are (the clients' encoding and decoding cost more CPU per
  op than Redis's scripts), not by Redis. The "Redis is the bottleneck" row
  divides each run's ops/s by its busiest node's CPU share: the rate each
  setup would reach with clients on other cores, until its busiest node
  runs at one full core. The last row:
  figure d's requests (10 sites) on one plain Redis with 8 shards against
  1, same clients. The four runs go in turn, the order reversed every other
  repeat, as in a.
- **i.** `bench.frontier_figs.bytes_per_site`: 10,000 sites (`--quick`:
  1,000), each with one queued request and its robots.txt as the robots
  middleware stores it (compact: the rules of the group for our agent);
  `used_memory` delta per site with that work queued, after every request
  was leased and acknowledged (a finished site: its due time, robots.txt
  and the like remain), and after the housekeeping
  (`crawler/frontier/housekeeping.py`, `FRONTIER_SITE_FORGET_AFTER=0`)
  forgot the finished sites. No baseline: scrapy-redis keeps no per-site
  state.
- **j.** `bench.frontier_figs.lease_ops_on_due_sites`: 100,000 sites
  (`--quick`: 5,000) with one request each, all due; one client leases up
  to 16 requests per call and acks them in its next (one pipeline of
  `commit.lua` and `lease.lua`) for 2 s. Baseline: the same requests on
  100 sites. The ratio shows that a lease's work does not grow with the
  number of due sites (the lease looks at the top of `{s}:ready`, not at
  every due site).
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench``."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 repeat")
    parser.add_argument("--repeat", type=int, default=None, help="repeats (default 5)")
    parser.add_argument("--output", type=Path, default=PROJECT_DIR / "BENCHMARKS.md",
                        help="Markdown file to write (default: BENCHMARKS.md)")
    args = parser.parse_args(argv)
    repeat = args.repeat or (1 if args.quick else 5)
    started = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    try:
        summary = run(args.quick, repeat, log_dir)
    finally:
        if os.environ.get("BENCH_KEEP_LOGS"):
            sys.stderr.write(f"worker logs kept in {log_dir}\n")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
    summary.update(
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command="python -m bench" + (" --quick" if args.quick else "")
        + (f" --repeat {args.repeat}" if args.repeat else ""),
        repeat=repeat, quick=args.quick, machine=_machine(),
        total_seconds=time.monotonic() - started,
    )
    write_markdown(args.output, summary)
    json.dump(summary, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0
