"""``python -m bench.compare``: one figure on several checkouts, side by side.

Where ``python -m bench`` compares our frontier with a baseline, this
compares versions of ours: a figure is run on each checkout in turn (each
with its own code: ``git worktree add /tmp/old <commit>`` makes one), the
runs alternated so that a noisy machine weighs on all of them alike, and the
medians printed. It is how a change of a figure is traced to a commit.

Figures:

* ``a``: :func:`bench.crawls.crawl_throughput` with one repeat per run
  (an uncounted warm-up crawl, then ours, then Scrapy's in-memory
  scheduler: a baseline per run); the ratio is ours over the median of
  every in-memory run.
* ``d``: :func:`bench.frontier_figs.frontier_ops` (ours, ``--clients``
  processes for ``--seconds``).
* ``s``: :func:`bench.script_cost.script_cost`, Redis's time in the
  scripts per push, lease and ack (µs, ``INFO commandstats``; ``--batch``
  requests per call, ``--sites`` sites): less noisy than a/d, which time
  the client too. This checkout's ``bench/script_cost.py`` is run in each
  checkout (only APIs every version has), so older ones need not have it.
* ``i``: :func:`bench.call_cost.call_instructions`, the instructions
  Redis executes per push, lease and ack call (``--batch`` requests per
  call, ``--sites`` sites), counted by callgrind on a ``redis-server`` run
  under ``valgrind`` (:func:`bench.call_cost.callgrind_redis`, started for
  this figure instead of the plain one): the same from run to run whatever
  the machine's load, so one run per checkout tells a change of 1%. This
  checkout's ``bench/call_cost.py`` is run in each checkout, as for ``s``.
* ``m``: :func:`bench.pages_memory.pages_request_memory`, Redis bytes per
  queued request of the ``pages`` spider's own requests (and of every
  request it schedules, redirects included) as a crawl of the
  quotes.toscrape.com capture yields them (``--warc`` for another
  capture); this checkout's ``bench/pages_memory.py`` is run in each
  checkout, as for ``s``. The medians are per part and figure.

Usage::

    git worktree add /tmp/old f04eb31
    python -m bench.compare d /tmp/old . --repeat 5

``--min-replicas 0 1`` (figure ``d``): each checkout is run once per value,
with ``FRONTIER_MIN_REPLICAS``'s ``WAIT N`` at the end of each pipeline
(:func:`bench.frontier_figs.frontier_ops`), against a server with one
replica (started for every value, 0 included, so that only the ``WAIT``
differs); the results are keyed ``<checkout> min_replicas=<N>``.

Prints one line per run, then a JSON object: ``{checkout: {"runs": [...],
"median": x}}`` (pages/s or ops/s; for ``a`` also ``"memory"`` and
``"ratio"``). Each checkout's code is run with this interpreter, from its
own directory; one ``redis-server`` is started for all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench.call_cost import callgrind_redis
from devtools.embedded import RedisServer
from devtools.replay import default_warc_path

__all__ = ["main", "wait_in_sync"]

#: What a run executes in a checkout (its own bench code): prints one JSON value.
_RUN = {
    "a": (
        "import json, sys, tempfile, pathlib\n"
        "from bench.crawls import crawl_throughput\n"
        "r = crawl_throughput(sys.argv[1], pathlib.Path(tempfile.mkdtemp()),"
        " pages=int(sys.argv[2]), repeat=1)\n"
        "print(json.dumps([r['ours'][0], r['baseline'][0]]))\n"
    ),
    "d": (
        "import json, sys\n"
        "from bench.frontier_figs import frontier_ops\n"
        "n = int(sys.argv[7])\n"
        "print(json.dumps(frontier_ops(sys.argv[1], 'ours', int(sys.argv[3]),"
        " float(sys.argv[4]), **({'min_replicas': n} if n else {}))))\n"
    ),
}


def _source(figure: str) -> str:
    if figure == "i":
        return (Path(__file__).with_name("call_cost.py").read_text() + "\n"
                "import json, sys\n"
                "print(json.dumps(call_instructions(sys.argv[1], int(sys.argv[9]), sys.argv[10],"
                " batch=int(sys.argv[5]), sites=int(sys.argv[6]))))\n")
    if figure == "m":
        return (Path(__file__).with_name("pages_memory.py").read_text() + "\n"
                "import json, sys\n"
                "print(json.dumps(pages_request_memory(sys.argv[1], sys.argv[8])))\n")
    if figure != "s":
        return _RUN[figure]
    return (Path(__file__).with_name("script_cost.py").read_text() + "\n"
            "import json, sys\n"
            "print(json.dumps(script_cost(sys.argv[1], batch=int(sys.argv[5]),"
            " sites=int(sys.argv[6]))))\n")


def _run(
    figure: str, checkout: Path, redis_url: str, opts: argparse.Namespace, min_replicas: int = 0
) -> Any:
    """One run of ``figure`` in ``checkout``; its JSON output.

    :raises RuntimeError: the run failed (its stderr's tail in the message).
    """
    args = [sys.executable, "-c", _source(figure), redis_url, str(opts.pages),
            str(opts.clients), str(opts.seconds), str(opts.batch), str(opts.sites),
            str(min_replicas), str(opts.warc.resolve()), *opts.callgrind]
    done = subprocess.run(args, cwd=checkout, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{figure} in {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _server(stack: contextlib.ExitStack, opts: argparse.Namespace) -> str:
    """Start the server every run uses (figure i: under callgrind, its pid
    and dump folder put in ``opts.callgrind``; with ``--min-replicas``, a
    replica beside it, in sync); its URL."""
    opts.callgrind = []
    if opts.figure == "i":
        url, pid, folder = stack.enter_context(callgrind_redis())
        opts.callgrind = [str(pid), str(folder)]
        return url
    server = stack.enter_context(RedisServer())
    if opts.min_replicas is not None:
        replica = stack.enter_context(RedisServer(
            args=["--replicaof", server.host, str(server.port)]))
        wait_in_sync(replica)
    return server.url


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 on success."""
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=sorted([*_RUN, "i", "m", "s"]))
    parser.add_argument("checkouts", nargs="+", type=Path, help="project directories")
    parser.add_argument("--repeat", type=int, default=5, help="runs per checkout (default 5)")
    parser.add_argument("--pages", type=int, default=5000, help="a: site size (default 5000)")
    parser.add_argument("--clients", type=int, default=4, help="d: processes (default 4)")
    parser.add_argument("--seconds", type=float, default=2.0, help="d: seconds (default 2.0)")
    parser.add_argument("--batch", type=int, default=16,
                        help="s, i: requests per call (default 16)")
    parser.add_argument("--sites", type=int, default=1, help="s, i: sites (default 1)")
    parser.add_argument("--warc", type=Path, default=default_warc_path(),
                        help="m: the capture crawled (default: the quotes.toscrape.com one)")
    parser.add_argument("--min-replicas", type=int, nargs="+", default=None, metavar="N",
                        help="d: FRONTIER_MIN_REPLICAS values to run side by side "
                             "(the server gets one replica)")
    opts = parser.parse_args(argv)
    variants: list[tuple[str, Path, int]] = [
        (str(c) if opts.min_replicas is None else f"{c} min_replicas={n}", c, n)
        for c in opts.checkouts for n in (opts.min_replicas or [0])
    ]
    if opts.min_replicas is not None and (opts.figure != "d" or max(opts.min_replicas) > 1):
        parser.error("--min-replicas: figure d only, values 0 or 1 (one replica)")
    runs: dict[str, list[Any]] = {name: [] for name, _, _ in variants}
    with contextlib.ExitStack() as stack:
        url = _server(stack, opts)
        for i in range(opts.repeat):
            for name, checkout, n in variants:
                value = _run(opts.figure, checkout.resolve(), url, opts, n)
                runs[name].append(value)
                print(f"run {i + 1} {name}: {value}", file=sys.stderr, flush=True)
    out: dict[str, dict[str, Any]] = {}
    if opts.figure == "a":
        memory = statistics.median(m for values in runs.values() for _, m in values)
        for name, values in runs.items():
            ours = statistics.median(o for o, _ in values)
            out[name] = {"runs": values, "median": ours,
                         "memory": statistics.median(m for _, m in values),
                         "ratio": round(ours / memory, 3)}
    elif opts.figure in ("s", "i"):
        for name, values in runs.items():
            out[name] = {"runs": values, "median": {
                part: statistics.median(v[part] for v in values) for part in values[0]}}
    elif opts.figure == "m":
        for name, values in runs.items():
            out[name] = {"runs": values, "median": {
                part: {k: statistics.median(v[part][k] for v in values) for k in values[0][part]}
                for part in values[0]}}
    else:
        out = {name: {"runs": values, "median": statistics.median(values)}
               for name, values in runs.items()}
    print(json.dumps(out, indent=1))
    return 0


def wait_in_sync(replica: RedisServer, timeout: float = 30.0) -> None:
    """Wait until ``replica`` is in sync with its master.

    :raises RuntimeError: not within ``timeout`` seconds.
    """
    client = redis.Redis(host=replica.host, port=replica.port)
    deadline = time.monotonic() + timeout
    try:
        while client.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replica did not sync within {timeout:g}s")
            time.sleep(0.05)
    finally:
        client.close()


if __name__ == "__main__":
    raise SystemExit(main())
