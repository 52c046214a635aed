"""Redis instructions per push, lease and ack call, counted by callgrind.

:mod:`bench.script_cost` times the scripts with Redis's own clock, which a
busy machine moves by 10 to 50% from run to run. This counts the
instructions Redis executes instead (``valgrind --tool=callgrind``): the
same for the same code and calls whatever else the machine does, so a
change of a few percent in what a call costs shows in one run.

:func:`call_instructions` runs against a ``redis-server`` started under
callgrind (:func:`callgrind_redis`): ``cycles`` commits of ``batch`` new
requests, then ``cycles`` lease calls of ``batch`` requests each followed by
the commits of their acks, on ``sites`` sites; the counters are zeroed
before each of the three series of calls and dumped after it
(``callgrind_control``), so only Redis's work for those calls is counted
(its network handling included; the server runs ``--hz 1`` so that its
timer adds next to nothing). ``python -m bench.compare i CHECKOUT...`` runs it in each
checkout (this file's source, as for figure ``s``: only APIs every version
has).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from crawler.frontier.store import Commit, Frontier, NotDue, Push

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["call_instructions", "callgrind_redis"]


@contextlib.contextmanager
def callgrind_redis(timeout: float = 60.0) -> Iterator[tuple[str, int, Path]]:
    """A ``redis-server`` on a free local port, run by ``valgrind
    --tool=callgrind`` with nothing saved to disk.

    :returns: (its URL, valgrind's pid, the folder of its dumps).
    :raises RuntimeError: valgrind, callgrind_control or redis-server is
        missing, or the server did not answer within ``timeout`` seconds.
    """
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found: figure i needs valgrind (apt install valgrind)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="callgrind-redis-"))
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/redis.%p.out",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--hz", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server under callgrind did not start") from None
                time.sleep(0.2)
        client.close()
        yield url, proc.pid, folder
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


def call_instructions(
    redis_url: str, pid: int, folder: str | Path, *, batch: int = 16, cycles: int = 100,
    sites: int = 1,
) -> dict[str, float]:
    """Instructions Redis executes per push, lease and ack call.

    :param pid: valgrind's pid (:func:`callgrind_redis`).
    :param folder: where its dumps go.
    :returns: ``{"push": n, "lease": n, "ack": n}``, instructions per call
        of ``batch`` requests (the mean of ``cycles`` calls).
    """
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    frontier = Frontier(client, "costbench", default_concurrency=100_000)
    frontier.load_scripts()
    dumps = Path(folder)

    def measured(call: Callable[[], object]) -> int:
        subprocess.run(["callgrind_control", "-z", str(pid)], capture_output=True, check=True)
        call()
        subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
        latest = max(dumps.glob("redis.*.out.*"), key=lambda p: p.stat().st_mtime_ns)
        for line in latest.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no totals in {latest}")

    n = batch * cycles
    pushes = [
        Push(f"/catalog/item-{i:07d}.html?ref=list\tparse_item\t2".encode(),
             f"www.example-shop{i % sites}.com", 0, f"fp{i:012d}".encode(), False)
        for i in range(n + batch)
    ]
    # one unmeasured call first: the scripts and keys exist before counting
    frontier.commit(Commit(pushes=pushes[n:], marker=("warm", 0)))
    push = measured(lambda: [
        frontier.commit(Commit(pushes=pushes[c * batch : (c + 1) * batch], marker=("bench", c)))
        for c in range(cycles)
    ])
    held: list[list[str]] = []

    def take() -> None:
        for c in range(cycles):
            result = frontier.lease_many([f"bench#0:{c * batch + j}" for j in range(batch)])
            held.append([] if isinstance(result, NotDue) else [x.lease_id for x in result])

    lease = measured(take)
    ack = measured(lambda: [
        frontier.commit(Commit(acks=ids, marker=("ack", c))) for c, ids in enumerate(held)
    ])
    client.flushdb()
    client.close()
    return {"push": push / cycles, "lease": lease / cycles, "ack": ack / cycles}
