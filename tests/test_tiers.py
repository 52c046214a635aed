"""The suite's tiers (tests/tiers.py): a test cannot sit in the fast tier by
mistake. A test that starts a worker process or a cluster node without its
mark fails, naming the mark; a fixture that gives a mark gives it to every
test that uses it; the marks are the ones registered in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from typing import TYPE_CHECKING

import pytest

from tests import tiers
from tests.workers import PROJECT_DIR

if TYPE_CHECKING:
    from pathlib import Path

_INNER = '''
import subprocess, sys
import pytest
from tests import tiers

@pytest.fixture
@tiers.gives("cluster")
def a_cluster():
    return "cluster"

@pytest.fixture
def through(a_cluster):
    return a_cluster

def test_uses_a_cluster_through_another_fixture(through):
    pass

def test_unmarked_starts_a_worker():
    subprocess.run([sys.executable, "-m", "scrapy", "version"], check=True)

@pytest.mark.workers
def test_marked_starts_a_worker():
    subprocess.run([sys.executable, "-m", "scrapy", "version"], check=True,
                   capture_output=True)

def test_unmarked_starts_git():
    subprocess.run(["git", "--version"], check=True, capture_output=True)
'''


@pytest.mark.parametrize(("argv", "needed"), [
    (["/venv/bin/python", "-m", "scrapy", "crawl", "pages"], "workers"),
    ([sys.executable, "-m", "scrapy", "frontier", "status"], "workers"),
    ([sys.executable, "-m", "bench.compare", "d"], "workers"),
    ([sys.executable, "-m", "scrapyd", "--pidfile="], "workers"),
    ([sys.executable, "-m", "crawler.metrics"], "workers"),
    ([sys.executable, "deploy/cluster.py", "deploy"], "workers"),
    (["sh", "/x/deploy/scrapyd-node", "/tmp/n"], "workers"),
    (["/venv/bin/scrapy", "seed", "quotes"], "workers"),
    (["redis-server", "--port", "7000", "--cluster-enabled", "yes"], "cluster"),
    (["redis-server", "--port", "7000"], None),
    ([sys.executable, "-m", "secantus", "--port", "1"], None),
    (["git", "show", "HEAD:README.md"], None),
])
def test_each_kind_of_process_needs_its_mark(argv: list[str], needed: str | None) -> None:
    found = tiers._needs(argv)
    assert (found[0] if found else None) == needed


def test_the_fast_tier_refuses_an_unmarked_worker_and_leaves_out_cluster_fixtures(
    tmp_path: Path,
) -> None:
    """Run as the fast tier runs (``-m "not workers and not cluster and not
    slow"``): the test that starts ``scrapy`` unmarked fails, naming the mark;
    the marked one, and the one using a fixture that gives ``cluster``
    (through another fixture), are deselected; one starting git runs."""
    inner = tmp_path / "test_inner.py"
    inner.write_text(_INNER)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-p", "no:randomly",
         "--rootdir", str(PROJECT_DIR), "-c", str(PROJECT_DIR / "pyproject.toml"),
         "-m", " and ".join(f"not {m}" for m in tiers.NOT_FAST), str(inner)],
        cwd=PROJECT_DIR, capture_output=True, text=True, timeout=120, check=False,
    )
    out = done.stdout + done.stderr
    # (git passes; the marked worker and the cluster user are deselected)
    assert "1 failed, 1 passed, 2 deselected" in out, out
    assert "test_unmarked_starts_a_worker starts a `python -m scrapy` process: " \
        "mark it @pytest.mark.workers" in out, out


def test_the_tier_marks_are_the_registered_ones() -> None:
    config = tomllib.loads((PROJECT_DIR / "pyproject.toml").read_text())
    registered = dict(
        line.split(": ", 1) for line in config["tool"]["pytest"]["ini_options"]["markers"]
    )
    assert registered == tiers.MARKS
