"""The suite's tiers: what a test needs, as a pytest mark, checked when it runs.

=========  ==============================================================
mark       the test ...
=========  ==============================================================
workers    starts ``scrapy`` worker or command processes (``scrapy crawl``,
           ``scrapy frontier``, ``scrapy seed``, scrapyd, ``python -m
           bench``, the deploy scripts: any Python process of the project)
faults     injects faults: kills, outages (servers stopped or restarted),
           the fault proxy (:mod:`tests.faultproxy`)
cluster    starts or uses the three-master Redis Cluster
slow       a whole-system run: the soak, ``bench --quick``, scrapyd
=========  ==============================================================

The fast tier (``make check``) is the tests with none of ``workers``,
``cluster`` and ``slow``; ``make test`` runs every test.

A mark is given three ways: by the test (or its module's ``pytestmark``);
by a fixture the test uses, decorated with :func:`gives` (a fixture that
starts workers or a cluster marks every test that uses it); and never by
chance: :func:`install` adds an audit hook (:pep:`578`) that refuses a
worker process or a cluster node started by a test that lacks the mark,
with an error naming the mark it needs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import pytest

#: Each tier's mark and what it says of a test (registered in pyproject.toml).
MARKS = {
    "workers": "starts scrapy worker or command processes",
    "faults": "injects faults: kills, outages, the fault proxy",
    "cluster": "starts or uses the three-master Redis Cluster",
    "slow": "a whole-system run: soak, bench --quick, scrapyd",
}

#: The marks that keep a test out of the fast tier (``make check``).
NOT_FAST = ("workers", "cluster", "slow")

#: Modules whose ``python -m`` process is a worker or a command of the project.
_PROJECT_MODULES = {"scrapy", "scrapyd", "scrapyd_client", "bench", "crawler", "devtools"}
#: Executables that are workers or commands whatever their path.
_PROJECT_EXECUTABLES = {"scrapy", "scrapyd", "scrapyd-deploy"}
_PROJECT_DIR = Path(__file__).resolve().parent.parent

F = TypeVar("F", bound=Callable[..., Any])

#: The test being set up, run or torn down in this process (None between).
_current: pytest.Item | None = None


def gives(*marks: str) -> Callable[[F], F]:
    """Decorate a fixture's function (under ``@pytest.fixture``): every test
    that uses the fixture, directly or through another, gets ``marks``.

    :raises ValueError: a mark not in :data:`MARKS`.
    """
    unknown = set(marks) - set(MARKS)
    if unknown:
        raise ValueError(f"unknown tier marks {sorted(unknown)}; known: {sorted(MARKS)}")

    def decorate(func: F) -> F:
        func.__dict__["_tier_marks"] = marks
        return func

    return decorate


def mark_by_fixtures(items: Sequence[pytest.Item]) -> None:
    """Add to each item the marks of the :func:`gives` fixtures it uses."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        for name in info.names_closure:
            for fixturedef in info.name2fixturedefs.get(name, ()):
                for mark in getattr(fixturedef.func, "_tier_marks", ()):
                    if item.get_closest_marker(mark) is None:
                        item.add_marker(mark)


def set_current(item: pytest.Item | None) -> None:
    """Record the test that runs now (``None`` when none does)."""
    global _current  # noqa: PLW0603 - one test runs at a time in a process
    _current = item


def _needs(argv: Sequence[str]) -> tuple[str, str] | None:
    """The mark a process with ``argv`` needs and what it is, or None."""
    args = [os.fspath(a) for a in argv]
    name = os.path.basename(args[0]) if args else ""
    modules = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "-m"]
    scripts = [Path(a) for a in args[1:] if Path(a).suffix == ".py" or "deploy" in Path(a).parts]
    found: tuple[str, str] | None = None
    if "--cluster-enabled" in args:
        found = "cluster", "a Redis Cluster node"
    elif name in _PROJECT_EXECUTABLES:
        found = "workers", f"a `{name}` process"
    elif any(m.split(".")[0] in _PROJECT_MODULES for m in modules):
        found = "workers", f"a `python -m {modules[0]}` process"
    elif any(not p.is_absolute() or p.is_relative_to(_PROJECT_DIR) or "deploy" in p.parts
             for p in scripts):
        found = "workers", f"the project's script {scripts[0]}"
    return found


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or _current is None:
        return
    argv = args[1]
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    needed = _needs([a.decode() if isinstance(a, bytes) else a for a in argv])
    if needed is None:
        return
    mark, what = needed
    if _current.get_closest_marker(mark) is None:
        raise RuntimeError(
            f"{_current.nodeid} starts {what}: mark it @pytest.mark.{mark} "
            f"({MARKS[mark]}); such tests stay out of the fast tier (make check)"
        )


_installed = False


def install() -> None:
    """Add the audit hook that checks each process a test starts (once)."""
    global _installed  # noqa: PLW0603 - an audit hook cannot be removed
    if not _installed:
        sys.addaudithook(_audit)
        _installed = True
