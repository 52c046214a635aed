"""Smoke test of the benchmark: ``python -m bench --quick`` runs end to end.

It checks that every figure is produced and the report written, never the
timings (those are the benchmark's business, not CI's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent


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
