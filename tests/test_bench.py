"""Smoke test of the benchmark: ``python -m bench --quick`` runs end to end.

It checks that every figure is produced and the report written, never the
timings (those are the benchmark's business, not CI's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.workers
@pytest.mark.timeout(600)  # (about 220 s beside the suite; its subprocess has 600)
def test_quick_benchmark_writes_every_figure(tmp_path: Path) -> None:
    """The quick run prints a JSON summary with a row of every figure and writes the table."""
    report = tmp_path / "BENCHMARKS.md"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(report)],
        cwd=PROJECT_DIR, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout)
    figures = {row["figure"][0] for row in summary["rows"]}
    assert figures == set("abcdefghij")
    assert summary["machine"]["cores"] >= 1
    text = report.read_text()
    assert "| figure | ours | baseline |" in text
    assert text.count("\n| ") >= len(summary["rows"]) + 1


def test_variants_run_in_turn_their_order_reversed_every_other_repeat() -> None:
    """A B, B A, A B: each variant holds each position in a round as often
    (an odd repeat count leaves the first order one round ahead)."""
    from bench.crawls import in_turn

    assert list(in_turn(["a", "b"], 3)) == [
        (0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b"),
    ]
    assert [v for _, v in in_turn([1, 2, 4], 2)] == [1, 2, 4, 4, 2, 1]
    assert list(in_turn(["a"], 0)) == []


@pytest.mark.slow
@pytest.mark.workers
def test_compare_runs_a_figure_on_each_checkout_in_turn() -> None:
    """``python -m bench.compare d`` on this checkout twice (tiny sizes):
    one median per checkout, every run counted."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.compare", "d", ".", str(PROJECT_DIR), "--repeat", "2",
         "--clients", "1", "--seconds", "0.2"],
        cwd=PROJECT_DIR, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert sorted(result) == sorted([".", str(PROJECT_DIR)])
    assert all(len(r["runs"]) == 2 and r["median"] > 0 for r in result.values())


@pytest.mark.slow
@pytest.mark.workers
def test_compare_weighs_the_scripts_of_each_checkout() -> None:
    """``python -m bench.compare s``: Redis's µs per push, lease and ack."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.compare", "s", ".", "--repeat", "1", "--batch", "4",
         "--sites", "2"],
        cwd=PROJECT_DIR, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    [result] = json.loads(done.stdout).values()
    assert set(result["median"]) == {"push", "lease", "ack"}
    assert all(v > 0 for v in result["median"].values())


@pytest.mark.slow
@pytest.mark.workers
def test_compare_weighs_the_pages_spiders_requests_in_redis() -> None:
    """``python -m bench.compare m``: Redis bytes per queued request of the
    pages spider's own requests (a crawl of the quotes capture), at most 80."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.compare", "m", ".", "--repeat", "1"],
        cwd=PROJECT_DIR, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    [result] = json.loads(done.stdout).values()
    own, every = result["median"]["own"], result["median"]["all"]
    assert own["queued"] > 0 and every["queued"] > own["queued"]
    assert 0 < own["queue_hash"] <= own["all_keys"] <= 80


@pytest.mark.slow
@pytest.mark.workers
def test_compare_counts_the_same_redis_instructions_per_call_run_after_run() -> None:
    """``python -m bench.compare i``: Redis's instructions per push, lease
    and ack call under callgrind, the same within 1% in two runs."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.compare", "i", ".", "--repeat", "2", "--batch", "4"],
        cwd=PROJECT_DIR, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    [result] = json.loads(done.stdout).values()
    first, second = result["runs"]
    assert set(first) == {"push", "lease", "ack"}
    for part, n in first.items():
        assert n > 10_000
        assert abs(second[part] - n) <= n / 100, (part, n, second[part])
