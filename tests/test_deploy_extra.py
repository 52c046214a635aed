"""The operations tools install on their own: the package's ``deploy`` extra
names them, ``requirements-deploy.txt`` pins them within its ranges, and
``deploy/cluster.py`` without them says in one line how to install them."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def _extra() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        (r := Requirement(line)).name.lower(): r
        for line in project["optional-dependencies"]["deploy"]
    }


def test_the_deploy_extra_names_scrapyd_and_scrapyd_client() -> None:
    assert set(_extra()) == {"scrapyd", "scrapyd-client"}


def test_requirements_deploy_pins_versions_within_the_extra() -> None:
    extra = _extra()
    pins = dict(
        re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$",
                   (ROOT / "requirements-deploy.txt").read_text(), re.M)
    )
    assert {name.lower() for name in pins} == set(extra)
    for name, version in pins.items():
        assert extra[name.lower()].specifier.contains(version), (name, version)
    assert "-r requirements-deploy.txt" in (ROOT / "requirements-dev.txt").read_text()


@pytest.mark.workers
def test_the_deploy_script_without_scrapyd_client_says_how_to_install_it(
    tmp_path: Path,
) -> None:
    """A ``scrapyd_client`` that cannot be imported (a package shadowing the
    installed one raises ModuleNotFoundError, as a missing one does): one
    line on stderr naming ``pip install '.[deploy]'``, exit 1, no traceback."""
    shadow = tmp_path / "scrapyd_client"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'scrapyd_client'\", name='scrapyd_client')\n"
    )
    result = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "cluster.py"), "jobs"],
        cwd=ROOT, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "pip install '.[deploy]'" in lines[0]
    assert "No module named 'scrapyd_client'" in lines[0]
