"""Scrapy 2.19's own scheduler tests, run against the frontier's scheduler.

Scrapy's source distribution carries its tests. This test downloads it with
pip (cached under ``$XDG_CACHE_HOME/frontier-tests``, ``~/.cache`` by
default), extracts ``tests/test_scheduler.py`` and
``tests/test_scheduler_base.py`` with what they import from Scrapy's
``tests`` package, and runs them in a pytest subprocess with our plugin,
``tests/scrapy_suite/frontier_scrapy_suite.py``: the tests build
:class:`~crawler.frontier.scheduler.FrontierScheduler` against this test's
Redis, with an engine that acknowledges what it took. Every test passes
except those listed in the plugin's ``EXPECTED_DIFFERENCES`` (xfail, strict),
which docs/scrapy-scheduler-differences.md explains.

Skipped, with the reason, only when pip cannot reach the package index.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.scrapy_suite.frontier_scrapy_suite import EXPECTED_DIFFERENCES, REDIS_URL_ENV

pytestmark = [pytest.mark.slow, pytest.mark.workers]

#: The Scrapy release whose tests run (EXPECTED_DIFFERENCES names its tests).
SCRAPY_VERSION = "2.19.0"
#: The test files run, inside the sdist.
SUITE = ("tests/test_scheduler.py", "tests/test_scheduler_base.py")
#: What they import or serve from Scrapy's ``tests`` package (MockServer:
#: its resources, sample pages and TLS keys).
SUPPORT = (
    "tests/__init__.py", "tests/utils/", "tests/mockserver/", "tests/keys/",
    "tests/sample_data/",
)
#: How many tests the two files hold in Scrapy 2.19.0.
SUITE_SIZE = 29
#: Seconds one of Scrapy's tests may take (each takes under 2 s here; a
#: scheduler that never says it is done makes them hang).
TEST_TIMEOUT = 15

PROJECT_DIR = Path(__file__).resolve().parent.parent
PLUGIN_DIR = PROJECT_DIR / "tests" / "scrapy_suite"
#: Signs in pip's output that the package index could not be reached.
UNREACHABLE = (
    "Failed to establish a new connection", "Network is unreachable",
    "Temporary failure in name resolution", "Name or service not known",
    "Connection refused", "Read timed out", "Could not fetch URL",
    "ProxyError", "SSLError",
)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "frontier-tests"


@pytest.fixture(scope="session")
def scrapy_sdist() -> Path:
    """Scrapy's sdist (``pip download --no-binary :all:``), cached."""
    target = _cache_dir() / f"scrapy-{SCRAPY_VERSION}.tar.gz"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"scrapy=={SCRAPY_VERSION}",
             "--no-binary", ":all:", "--no-deps",
             "--disable-pip-version-check", "--retries", "2", "--timeout", "20",
             "-d", tmp],
            capture_output=True, text=True, timeout=300, check=False,
        )
        out = done.stdout + done.stderr
        got = list(Path(tmp).glob("scrapy-*.tar.gz")) + list(Path(tmp).glob("Scrapy-*.tar.gz"))
        if done.returncode != 0 or not got:
            why = [line.strip() for line in out.splitlines()
                   if any(sign in line for sign in UNREACHABLE)]
            if why:
                pytest.skip(f"pip cannot reach the package index for scrapy=={SCRAPY_VERSION}'s "
                            f"sdist: {why[-1]}")
            pytest.fail(f"pip download scrapy=={SCRAPY_VERSION} failed:\n{out}")
        os.replace(got[0], target)  # atomic: another session may race
    return target


@pytest.fixture(scope="session")
def scrapy_suite_dir(scrapy_sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's files and their support from the sdist, with a pytest.ini
    of ours (Scrapy's own pytest configuration is not used)."""
    out = tmp_path_factory.mktemp("scrapy-tests")
    wanted = (*SUITE, *SUPPORT)
    with tarfile.open(scrapy_sdist) as archive:
        members = []
        for member in archive.getmembers():
            _, _, inner = member.name.partition("/")
            if inner.startswith(wanted):
                member.name = inner
                members.append(member)
        archive.extractall(out, members=members, filter="data")
    missing = [name for name in SUITE if not (out / name).is_file()]
    assert not missing, f"{scrapy_sdist.name} lacks {missing}"
    (out / "pytest.ini").write_text("[pytest]\nxfail_strict = true\n")
    return out


def _junit_id(nodeid: str) -> str:
    """A pytest node id as JUnit XML names the test: ``classname::name``
    (``tests/test_x.py::TestY::test_z`` -> ``tests.test_x.TestY::test_z``)."""
    path, *classes, name = nodeid.split("::")
    return "::".join([".".join([path.removesuffix(".py").replace("/", "."), *classes]), name])


def _outcomes(report: Path) -> dict[str, str]:
    """JUnit id -> passed, xfailed, skipped, failed or error."""
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        if "failure" in kinds:
            outcomes[test_id] = "failed"
        elif "error" in kinds:
            outcomes[test_id] = "error"
        elif "skipped" in kinds:
            skipped = kinds["skipped"].get("type", "")
            outcomes[test_id] = "xfailed" if skipped == "pytest.xfail" else "skipped"
        else:
            outcomes[test_id] = "passed"
    return outcomes


@pytest.mark.timeout(SUITE_SIZE * TEST_TIMEOUT + 420)  # and the download
def test_scrapy_scheduler_tests_pass_on_the_frontier_but_for_listed_differences(
    scrapy_suite_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    report = tmp_path / "report.xml"
    env = {
        **os.environ,
        REDIS_URL_ENV: redis_url,
        # Scrapy's tests package first: it is the ``tests`` they import.
        "PYTHONPATH": os.pathsep.join([str(scrapy_suite_dir), str(PLUGIN_DIR), str(PROJECT_DIR)]),
    }
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(scrapy_suite_dir / "pytest.ini"),
         "--rootdir", str(scrapy_suite_dir), "-p", "frontier_scrapy_suite",
         "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rfEX",
         "--timeout", str(TEST_TIMEOUT),
         f"--junitxml={report}", *SUITE],
        cwd=scrapy_suite_dir, env=env, capture_output=True, text=True,
        timeout=SUITE_SIZE * TEST_TIMEOUT + 60, check=False,
    )
    output = done.stdout[-20000:] + done.stderr[-5000:]
    assert report.exists(), output
    outcomes = _outcomes(report)
    not_passed = {t: o for t, o in outcomes.items() if o != "passed"}
    expected = {_junit_id(t): "xfailed" for t in EXPECTED_DIFFERENCES}
    assert not_passed == expected, f"not passed: {not_passed}\n{output}"
    assert len(outcomes) == SUITE_SIZE, output
    assert done.returncode == 0, output
