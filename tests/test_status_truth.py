"""``scrapy frontier status`` tells the truth about a crawl: per-worker pages
and items that add up to what was stored, the crawl's state from the facts,
items per spider only for that spider; ``--json`` is valid JSON in every
state and on every failure; each subcommand has its own ``--help``.

Real servers and real worker processes (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from crawler.commands.deadletters import DEADLETTER_SUBCOMMANDS
from crawler.commands.frontier import FRONTIER_SUBCOMMANDS
from devtools.embedded import free_port
from tests.workers import crawl

if TYPE_CHECKING:
    import redis

    from devtools.replay import ReplayServer

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable


def scrapy(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``scrapy ARGS`` in the project, as an operator would."""
    return subprocess.run(
        [PYTHON, "-m", "scrapy", *args], cwd=ROOT, env={**env, "COLUMNS": "160"},
        capture_output=True, text=True, timeout=60, check=False,
    )


def status_json(env: dict[str, str], *spiders: str) -> dict[str, Any]:
    result = scrapy(env, "frontier", "status", *spiders, "--json")
    assert result.returncode == 0, (result.stdout, result.stderr)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.mark.workers
def test_per_worker_pages_and_items_add_up_to_what_two_workers_stored(
    env: dict[str, str], db: Any, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    """After a two-worker crawl: each worker's record stays with its final
    figures; the items summed over the workers are the documents in MongoDB,
    the pages the responses received; the crawl is finished; the items of
    quotes are the documents it added, and pages (which stored nothing) has
    none."""
    rds.lpush("quotes:start_urls", replay_server.url_for("/"))
    workers = crawl("quotes", env, tmp_path, workers=2)
    assert [w.returncode for w in workers] == [0, 0], [w.log[-2000:] for w in workers]

    status = status_json(env)
    quotes = status["spiders"]["quotes"]
    records = quotes["workers"]
    assert len(records) == 2
    assert all(not w["live"] and w["closed"] and w["finish_reason"] == "finished"
               for w in records), records
    stored = {name: db[name].count_documents({}) for name in ("quotes", "authors")}
    assert stored == {"quotes": 100, "authors": 50}
    assert sum(w["items"] for w in records) == sum(stored.values())
    responses = sum(w.stats["response_received_count"] for w in workers)
    assert sum(w["pages"] for w in records) == responses
    assert quotes["stats"]["response_received_count"] == responses
    assert sum(w["scraped"] for w in records) == quotes["stats"]["item_scraped_count"]
    assert [w["pages"] > 0 for w in records] == [True, True]
    assert quotes["state"] == "finished" and quotes["workers_live"] == 0
    assert quotes["items"] == stored
    assert status["spiders"]["pages"]["items"] == {}
    assert status["spiders"]["pages"]["state"] == "idle"  # never started
    assert status["items"] == stored

    table = scrapy(env, "frontier", "status", "quotes")
    assert "finished" in table.stdout and "no: closed (finished)" in table.stdout
    assert "documents in MongoDB, in these spiders' collections" in table.stdout


def _json_commands() -> list[list[str]]:
    return [
        ["frontier", "status", "--json"],
        ["frontier", "status", "quotes", "--json"],
        ["frontier", "overrides", "--json"],
        ["frontier", "overrides", "quotes", "--json"],
        ["frontier", "audit", "quotes", "--json"],
        ["deadletters", "list", "quotes", "--json"],
    ]


@pytest.mark.parametrize("args", _json_commands(), ids=lambda a: "-".join(a[:2]))
@pytest.mark.workers
def test_json_output_is_valid_json_on_an_empty_crawl_and_when_redis_is_down(
    env: dict[str, str], args: list[str]
) -> None:
    """With nothing in Redis: valid JSON (an empty array for the lists);
    with Redis down: a JSON object with an "error" field, exit non-zero."""
    empty = scrapy(env, *args)
    assert "Traceback" not in empty.stderr
    data = json.loads(empty.stdout)
    if args[1] in ("overrides", "list"):
        assert (empty.returncode, data) == (0, [])
    if args[1] == "audit":  # a crawl with nothing in Redis is not clean
        assert empty.returncode == 1 and data and data[0]["kind"] == "absent"
    down = scrapy({**env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, *args)
    assert down.returncode != 0
    assert "Traceback" not in down.stderr
    error = json.loads(down.stdout)
    assert isinstance(error, dict) and "ConnectionError" in error["error"]


@pytest.mark.parametrize(
    "args",
    [
        ["frontier", "status", "nosuch", "--json"],
        ["frontier", "status", "--json", "--interval", "0"],
        ["frontier", "audit", "--json"],
        ["frontier", "overrides", "nosuch", "--json"],
        ["deadletters", "list", "nosuch", "--json"],
        ["deadletters", "list", "--json"],
    ],
    ids="-".join,
)
@pytest.mark.workers
def test_a_usage_error_with_json_prints_a_json_error_and_exits_2(
    env: dict[str, str], args: list[str]
) -> None:
    result = scrapy(env, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert json.loads(result.stdout)["error"]
    assert "Traceback" not in result.stderr


@pytest.mark.workers
def test_each_subcommand_has_its_own_help_and_the_group_lists_them(
    env: dict[str, str],
) -> None:
    """``scrapy frontier SUB --help`` and ``scrapy deadletters SUB --help``:
    that subcommand's usage, one-line description and options, not the
    others'; ``scrapy frontier --help`` lists every subcommand."""
    groups = {"frontier": FRONTIER_SUBCOMMANDS, "deadletters": DEADLETTER_SUBCOMMANDS}
    for command, subs in groups.items():
        whole = scrapy(env, command, "--help")
        assert whole.returncode == 0, whole.stderr
        for sub in subs:
            assert f"    {sub.name} " in whole.stdout, (sub.name, whole.stdout)
        for sub in subs:
            shown = scrapy(env, command, sub.name, "--help")
            assert shown.returncode == 0, shown.stderr
            assert f"scrapy {command} {sub.usage}" in shown.stdout
            assert sub.summary.split()[0] in shown.stdout
            others = [o for o in subs if o.name != sub.name]
            assert not [o.usage for o in others if f"scrapy {command} {o.usage}" in shown.stdout]
            assert len(shown.stdout.splitlines()) < 45, shown.stdout
    status = scrapy(env, "frontier", "status", "-h").stdout
    assert "--watch" in status and "--interval" in status and "--unset" not in status
    pause = scrapy(env, "frontier", "pause", "--help").stdout
    assert "--json" not in pause and "--yes" not in pause
