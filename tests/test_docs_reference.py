"""The reference pages generated from the code (devtools/docs_reference.py):
every marker names a generator, and the generated tables hold every
setting, metric and key the code has."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from crawler.config import SETTINGS
from crawler.frontier import protocol
from devtools import docs_reference
from devtools.docs_reference import GENERATORS, MARKER, expand

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").rglob("*.md"))


def test_every_marker_names_a_generator_and_every_generator_has_a_page() -> None:
    used = {name for page in PAGES for name in MARKER.findall(page.read_text())}
    assert used == set(GENERATORS)


def test_an_unknown_marker_fails_the_build() -> None:
    try:
        expand("<!-- generated: nothing -->\n")
    except KeyError as error:
        assert "nothing" in str(error)
    else:
        raise AssertionError("an unknown marker was accepted")


def test_the_settings_table_has_a_row_per_setting_with_its_default() -> None:
    table = docs_reference.settings_table()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \|", table, re.M)}
    assert set(rows) == set(SETTINGS)
    assert rows["FRONTIER_LEASE_TIMEOUT"] == "`60.0`"
    assert rows["DOWNLOAD_DELAY"] == "Scrapy's: `0`"


def test_the_metrics_table_names_every_metric_of_the_exporter_s_own_table() -> None:
    """What the collector yields and the table in crawler/metrics.py's
    docstring name the same metrics."""
    generated = set(re.findall(r"^\| `(\w+)` \|", docs_reference.metrics_table(), re.M))
    documented = set(re.findall(r"^``(crawler_\w+)", (ROOT / "crawler" / "metrics.py")
                                .read_text(), re.M))
    assert generated == documented


def test_the_frontier_s_key_table_names_every_key_the_scripts_are_given() -> None:
    """crawler/frontier/store.py's table (on the Redis keys page) has a row
    for each key of :data:`crawler.frontier.protocol.SHARD_KEYS`."""
    page = docs_reference.redis_keys_page()
    assert "| `<spider>:start_urls` | list |" in page
    store = page[page.index("The frontier's keys"):page.index("The keys of a shard script")]
    missing = [s for _, s in protocol.SHARD_KEYS if f"`{{s}}:{s}`" not in store]
    assert missing == []


@pytest.mark.workers
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """``mkdocs build --strict`` (``make docs``): no broken link, no page
    left out of the navigation, every marker filled."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    commands = (tmp_path / "reference" / "commands.html").read_text()
    assert "scrapy frontier audit --help" in commands
    assert "generated:" not in commands
