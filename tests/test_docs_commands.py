"""Every shell block of the README and of ``docs/`` is run or checked.

A shell block (a fence of ``sh``, ``bash``, ``console`` or ``shell``) has a
comment on the line before it that says how (docs/development.md):

- ``<!-- test: run -->``: run here. A page's run blocks run in order, in
  one ``bash`` (``set -euo pipefail``), in a temporary directory that links
  the checkout's files and ``.venv``. ``REDIS_PORT``, ``MONGO_PORT``,
  ``SITE_PORT``, ``REDIS_URL`` and ``MONGO_URI`` point at servers the test
  starts on free ports, or, on a page whose blocks start their own
  ``redis-server``, at free ports for them: never at port 6379;
- ``<!-- test: env -->``: the block only exports those variables (set here);
- ``<!-- test: serve -->``: each line starts a server that prints
  ``Serving``; it is started, must say so, and is stopped;
- ``<!-- test: install -->``: each line is a ``pip install`` of files the
  checkout has (``-r FILE``; ``'.[EXTRA]'`` of an extra ``pyproject.toml``
  defines) or an ``apt-get install`` of packages the Makefile installs;
- ``<!-- test: tests/test_x.py::test_name -->`` (or a whole file): that test
  runs what the block does; it must exist.

A block without such a comment fails here, so a command added to the
documentation needs a test; a command that drifts from the code fails the
run that runs it.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devtools.embedded import free_port
from devtools.replay import default_warc_path

if TYPE_CHECKING:
    from collections.abc import Iterator

    from devtools.replay import ReplayServer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELLS = {"sh", "bash", "console", "shell"}
MARK = re.compile(r"^\s*<!-- test: (.+?) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
#: The variables an ``env`` block may export, and the test sets.
VARIABLES = {"REDIS_PORT", "MONGO_PORT", "SITE_PORT", "REDIS_URL", "MONGO_URI",
             "SCRAPYD_HTTP_PORT"}
#: The kinds of ``test:`` comment that name no test.
KINDS = ("run", "env", "serve", "install")
#: The top-level entries of the checkout a run's directory links to.
LINKED = ("scrapy.cfg", "crawler", "devtools", "bench", "deploy", "requirements.txt")
#: Seconds one page's run blocks may take together.
RUN_TIMEOUT = 240


@dataclass(frozen=True)
class Block:
    """One fenced shell block of a page."""

    page: Path
    line: int
    how: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def shell_blocks(page: Path) -> list[Block]:
    """The shell blocks of ``page``, each with its ``test:`` comment (the
    last non-blank line before the fence), dedented."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        lang = opened.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if lang in SHELLS:
            before = [x for x in lines[:i] if x.strip()]
            mark = MARK.match(before[-1]) if before else None
            text = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
            blocks.append(Block(page, i + 1, mark.group(1) if mark else None, text))
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in shell_blocks(page)]
RUN_PAGES = sorted({b.page for b in BLOCKS if b.how == "run"})


def test_the_pages_have_shell_blocks_of_each_kind() -> None:
    hows = {b.how if b.how in KINDS else "test" for b in BLOCKS}
    assert hows >= {"run", "env", "serve", "test"}
    assert len(BLOCKS) >= 30


def test_every_shell_block_is_run_or_names_the_test_that_runs_it() -> None:
    unchecked = [f"{b.where}: {b.text.splitlines()[0]}" for b in BLOCKS if b.how is None]
    assert unchecked == [], (
        "add <!-- test: run --> (or env, serve, or tests/test_x.py::test_name) before "
        f"each of these blocks: {unchecked}"
    )


def test_each_named_test_exists() -> None:
    missing = []
    for block in BLOCKS:
        if block.how is None or block.how in KINDS:
            continue
        path, _, name = block.how.partition("::")
        source = ROOT / path
        if not source.is_file() or (
            name and not re.search(rf"^def {re.escape(name)}\(", source.read_text(), re.M)
        ):
            missing.append(f"{block.where}: {block.how}")
    assert missing == []


def test_env_blocks_only_export_the_variables_the_test_sets() -> None:
    for block in (b for b in BLOCKS if b.how == "env"):
        for line in block.text.splitlines():
            words = shlex.split(line)
            assert words[0] == "export", f"{block.where}: {line}"
            names = {word.partition("=")[0] for word in words[1:]}
            assert names <= VARIABLES, f"{block.where}: {sorted(names - VARIABLES)}"


def test_install_blocks_install_what_the_checkout_and_the_makefile_have() -> None:
    makefile = (ROOT / "Makefile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("project", {}).get(
        "optional-dependencies", {})
    for block in (b for b in BLOCKS if b.how == "install"):
        for line in block.text.splitlines():
            words = shlex.split(line.partition(" #")[0])
            if not words:
                continue
            where = f"{block.where}: {line}"
            if "apt-get" in words[0] or words[:2] == ["sudo", "apt-get"]:
                packages = [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
                assert all(f"install -y -q {p}" in makefile for p in packages), where
                continue
            assert words[0].endswith("pip") and words[1] == "install", where
            for n, word in enumerate(words[2:], 2):
                if words[n - 1] == "-r":
                    assert (ROOT / Path(word).name).is_file(), where
                elif m := re.fullmatch(r"\.\[([\w,-]+)\]", word):
                    assert set(m.group(1).split(",")) <= set(extras), where


def test_no_run_block_names_port_6379() -> None:
    for block in (b for b in BLOCKS if b.how in ("run", "serve")):
        assert "6379" not in block.text, block.where


def _make_rule(target: str) -> tuple[list[str], list[str]]:
    """The prerequisites and recipe lines of a Makefile target."""
    text = (ROOT / "Makefile").read_text()
    found = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n)*)", text, re.M)
    assert found, f"no {target} target in the Makefile"
    return found.group(1).split(), [x.strip() for x in found.group(2).splitlines()]


def test_make_check_and_make_test_are_what_ci_runs() -> None:
    """``make check``/``make test``/``make docs`` as the pages describe them:
    CI runs ``make test``; both run ``lint``, which builds the docs strictly."""
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    check, check_recipe = _make_rule("check")
    test, test_recipe = _make_rule("test")
    lint, _ = _make_rule("lint")
    _, docs_recipe = _make_rule("docs")
    assert "lint" in check and "lint" in test and "docs" in lint
    assert any("-m \"$(FAST)\"" in x for x in check_recipe)
    assert any("pytest" in x and "-m \"" not in x for x in test_recipe)
    assert any("mkdocs build --strict" in x for x in docs_recipe)
    requirements = (ROOT / "requirements-dev.txt").read_text()
    assert re.search(r"^mkdocs==", requirements, re.M)


def _linked_dir(tmp_path: Path) -> Path:
    """A directory holding links to the checkout's files and the venv, as
    a checkout would, where the blocks may write what they like."""
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    venv = ROOT / ".venv" if (ROOT / ".venv").is_dir() else Path(sys.prefix)
    (tmp_path / ".venv").symlink_to(venv)
    return tmp_path


def _run_env(variables: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REDIS_", "MONGO_", "FRONTIER_"))}
    env.update(variables, CRAWLER_SITES_WARC=str(default_warc_path()), LOG_LEVEL="INFO")
    return env


def _run_script(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in one bash, then stop what it left running."""
    process = subprocess.Popen(
        ["bash", "-c", "set -euo pipefail\n" + script], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        try:
            out, _ = process.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            out += f"\n(stopped after {RUN_TIMEOUT} s)"
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        pidfile = cwd / "data" / "redis.pid"  # a daemonized redis-server leaves its group
        if pidfile.is_file():
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
    return subprocess.CompletedProcess(process.args, process.returncode, out)


@pytest.fixture
def page_servers(redis_url: str, mongo_uri: str, mongo_db: str,
                 replay_server: ReplayServer) -> Iterator[dict[str, str]]:
    """The variables of a page whose blocks use servers they do not start."""
    yield {
        "REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db,
        "REDIS_PORT": redis_url.rsplit(":", 1)[1].split("/", 1)[0],
        "MONGO_PORT": str(free_port()), "SITE_PORT": str(replay_server.port),
        "SCRAPYD_HTTP_PORT": str(free_port()),
    }


def _page_param(page: Path) -> object:
    """A page to run; one that starts scrapyd is a whole-system run (slow)."""
    slow = any("scrapyd" in b.text for b in shell_blocks(page) if b.how == "run")
    return pytest.param(page, marks=[pytest.mark.slow] if slow else [],
                        id=str(page.relative_to(ROOT)))


@pytest.mark.workers
@pytest.mark.parametrize("page", [_page_param(page) for page in RUN_PAGES])
def test_the_run_blocks_of_each_page_run_in_order(
    page: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    blocks = [b for b in shell_blocks(page) if b.how == "run"]
    own_servers = any("redis-server" in b.text for b in blocks)
    if own_servers:
        redis_port, mongo_port, site_port = (str(free_port()) for _ in range(3))
        variables = {
            "REDIS_PORT": redis_port, "MONGO_PORT": mongo_port, "SITE_PORT": site_port,
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "MONGO_URI": f"mongodb://127.0.0.1:{mongo_port}",
            "SCRAPYD_HTTP_PORT": str(free_port()),
        }
    else:
        variables = request.getfixturevalue("page_servers")
    assert "6379" not in variables["REDIS_URL"]
    script = "".join(f"# {b.where}\n{b.text}" for b in blocks)
    done = _run_script(script, _linked_dir(tmp_path), _run_env(variables))
    assert done.returncode == 0, f"{page.relative_to(ROOT)}:\n{done.stdout[-6000:]}"
    if page.name == "getting-started.md":
        # The figures the page quotes, as its commands print them.
        assert "100 50\n" in done.stdout
        logs = "".join(p.read_text() for p in sorted(tmp_path.glob("data/worker-*.log"))
                       if p.is_file())
        assert logs == "" or "'finish_reason': 'finished'" in logs


@pytest.mark.workers
def test_each_serve_block_starts_a_server_that_says_where_it_serves(tmp_path: Path) -> None:
    cwd = _linked_dir(tmp_path)
    (cwd / "warc").mkdir()
    (cwd / "warc" / "capture.warc.gz").symlink_to(default_warc_path())
    for block in (b for b in BLOCKS if b.how == "serve"):
        for line in block.text.splitlines():
            env = _run_env({"SITE_PORT": str(free_port())})
            process = subprocess.Popen(
                ["bash", "-c", f"exec {line}"], cwd=cwd, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                assert process.stdout is not None
                first = process.stdout.readline()
                assert first.startswith("Serving"), f"{block.where}: {first}"
            finally:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=10)


@pytest.mark.workers
def test_make_demo_runs_the_demo_crawl(tmp_path: Path) -> None:
    """``make demo`` runs ``python -m devtools.demo`` (here with ``--replay``,
    so that no test needs the internet): it stores 100 quotes and 50
    authors, and the workers' stats add up to the figures the docs quote
    (``mongo/upserted`` 150, ``mongo/inserted`` 0, ``item_scraped_count``
    455)."""
    _, recipe = _make_rule("demo")
    assert recipe == ["$(PY) -m devtools.demo"]
    env = _run_env({})
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "devtools.demo", "--replay"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Stored 100 quotes and 50 authors in MongoDB database 'crawler'" in done.stdout
    logs = [p.read_text() for p in tmp_path.glob("crawler-demo-*/worker-*.log")]
    assert len(logs) == 2

    def total(stat: str) -> int:
        return sum(int(m) for log in logs for m in re.findall(rf"'{stat}': (\d+)", log))

    assert total("mongo/upserted") == 150
    assert total("mongo/inserted") == 0
    assert total("item_scraped_count") == 455
