"""The frontier pip-installed into a fresh virtualenv and switched on in a
``scrapy startproject`` project by one ``ADDONS`` line.

The checkout is built into a wheel, installed with ``--no-deps`` into a new
virtualenv (no system site-packages) that holds the pins of
``requirements.txt``; the project is made by that environment's ``scrapy
startproject``, its template settings kept (``ROBOTSTXT_OBEY = True``,
``DOWNLOAD_DELAY = 1``, ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``). Workers get
``REDIS_URL`` from the environment only (the test's Redis), no MongoDB, and
write feeds (``-O``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from typing import TYPE_CHECKING

import pytest

from tests.workers import PROJECT_DIR, wait_workers

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import redis

    from devtools.replay import ReplayServer

pytestmark = [pytest.mark.workers, pytest.mark.slow]

#: The one line added to the template's settings.py (it has ``ADDONS = {}``).
ADDONS_LINE = 'ADDONS = {"crawler.addon.FrontierAddon": 0}'

#: scrapy/quotesbot's CSS spider, on the frontier: seeds come from Redis.
FRONTIER_SPIDER = '''
from crawler.frontier.spider import FrontierSpider


class ToScrapeCSSSpider(FrontierSpider):
    name = "toscrape-css"

    def parse(self, response):
        for quote in response.css("div.quote"):
            yield {
                "text": quote.css("span.text::text").get(),
                "author": quote.css("small.author::text").get(),
                "tags": quote.css("div.tags > a.tag::text").getall(),
            }
        next_page_url = response.css("li.next > a::attr(href)").get()
        if next_page_url is not None:
            yield response.follow(next_page_url)
'''

#: The same spider as stock Scrapy runs it: ``start_urls`` from ``-a start=``.
STOCK_SPIDER = '''
import scrapy


class ToScrapeCSSSpider(scrapy.Spider):
    name = "toscrape-css"

    def __init__(self, start, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [start]

    def parse(self, response):
        for quote in response.css("div.quote"):
            yield {
                "text": quote.css("span.text::text").get(),
                "author": quote.css("small.author::text").get(),
                "tags": quote.css("div.tags > a.tag::text").getall(),
            }
        next_page_url = response.css("li.next > a::attr(href)").get()
        if next_page_url is not None:
            yield response.follow(next_page_url)
'''

#: Seconds the venv may take to build and fill (pip downloads from PyPI).
INSTALL_TIMEOUT = 900


def _run(
    args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; fail the test with its output if it fails."""
    done = subprocess.run(args, capture_output=True, text=True, check=False, cwd=cwd, env=env,
                          timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with requirements.txt's pins and a wheel of this
    checkout (``--no-deps``): its ``bin`` directory."""
    root = tmp_path_factory.mktemp("installed")
    wheels = root / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
          "-q", "-w", str(wheels), str(PROJECT_DIR)], timeout=INSTALL_TIMEOUT)
    [wheel] = wheels.glob("*.whl")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, "-r", str(PROJECT_DIR / "requirements.txt")], timeout=INSTALL_TIMEOUT)
    _run([*pip, "--no-deps", str(wheel)], timeout=INSTALL_TIMEOUT)
    yield env_dir / "bin"


def _clean_env(**extra: str) -> dict[str, str]:
    """An environment that knows nothing of the checkout: no PYTHONPATH, no
    project settings module, no MongoDB, none of the crawl's variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "SCRAPY_SETTINGS_MODULE", "MONGO_URI", "MONGO_DATABASE",
                        "REDIS_URL", "MAX_IDLE_TIME_BEFORE_CLOSE", "FRONTIER_WORKER_ID"}}
    return {**env, **extra}


def _startproject(bin_dir: Path, where: Path, name: str) -> Path:
    _run([str(bin_dir / "scrapy"), "startproject", name], cwd=where, env=_clean_env())
    return where / name


def _feed(path: Path) -> list[str]:
    """The items of a JSON-lines feed, each as canonical JSON."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.dumps(json.loads(line), sort_keys=True) for line in lines if line.strip()]


def test_the_wheel_carries_the_package_its_lua_scripts_and_the_scrapy_commands(
    installed: Path, tmp_path: Path
) -> None:
    python = str(installed / "python")
    where = _run([python, "-c", "import crawler.frontier, importlib.resources as r; "
                  "print(crawler.frontier.__file__); "
                  "print(r.files('crawler.frontier').joinpath('lua', 'lease.lua').is_file())"],
                 cwd=tmp_path, env=_clean_env()).stdout.split()
    assert where[0].startswith(str(installed.parent)), where
    assert where[1] == "True"
    tops = _run([python, "-c", "import importlib.util as u; "
                 "print([m for m in ('devtools', 'tests', 'bench') if u.find_spec(m)])"],
                cwd=tmp_path, env=_clean_env()).stdout.strip()
    assert tops == "[]"
    project = _startproject(installed, tmp_path, "plain")
    listing = _run([str(installed / "scrapy")], cwd=project, env=_clean_env()).stdout
    for command in ("seed", "frontier", "deadletters", "loadspill"):
        assert f"\n  {command} " in listing, listing


def test_two_installed_workers_with_one_addons_line_store_what_stock_scrapy_stores(
    installed: Path, redis_url: str, rds: redis.Redis, replay_server: ReplayServer,
    tmp_path: Path,
) -> None:
    scrapy = str(installed / "scrapy")
    start = replay_server.url_for("/")

    stock = _startproject(installed, tmp_path, "stockbot")
    (stock / "stockbot" / "spiders" / "toscrape.py").write_text(STOCK_SPIDER)
    _run([scrapy, "crawl", "toscrape-css", "-a", f"start={start}", "-O", "items.jsonl",
          "-s", "TELNETCONSOLE_ENABLED=False"], cwd=stock, env=_clean_env(), timeout=300)
    expected = _feed(stock / "items.jsonl")
    assert len(expected) == 100

    project = _startproject(installed, tmp_path, "qbot")
    settings = project / "qbot" / "settings.py"
    template = settings.read_text()
    assert "\nADDONS = {}\n" in template
    assert "\nROBOTSTXT_OBEY = True\n" in template
    settings.write_text(template.replace("\nADDONS = {}\n", f"\n{ADDONS_LINE}\n"))
    (project / "qbot" / "spiders" / "toscrape.py").write_text(FRONTIER_SPIDER)
    env = _clean_env(REDIS_URL=redis_url, MAX_IDLE_TIME_BEFORE_CLOSE="3")

    seeded = _run([scrapy, "seed", "toscrape-css", start], cwd=project, env=env)
    assert "queued 1 seeds" in seeded.stdout, seeded.stdout
    assert rds.llen("toscrape-css:start_urls") == 1  # the test's Redis, from the environment

    logs = [tmp_path / f"worker-{i}.log" for i in (1, 2)]
    procs = [
        subprocess.Popen(
            [scrapy, "crawl", "toscrape-css", "-O", f"items-{i}.jsonl",
             "-s", f"LOG_FILE={log}", "-s", "TELNETCONSOLE_ENABLED=False"],
            cwd=project, env=env,
        )
        for i, log in zip((1, 2), logs, strict=True)
    ]
    workers = wait_workers(procs, logs, timeout=300)

    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    assert all("'finish_reason': 'finished'" in w.log for w in workers)
    assert not any("Traceback" in w.log for w in workers)
    stored = _feed(project / "items-1.jsonl") + _feed(project / "items-2.jsonl")
    assert len(stored) == len(set(stored)), "an item was stored twice"
    assert set(stored) == set(expected)
    assert sum(w.stats.get("item_scraped_count", 0) for w in workers) == 100

    # The status counts the feeds the workers wrote, dict items and all.
    shown = _run([scrapy, "frontier", "status", "toscrape-css", "--json"], cwd=project, env=env)
    status = json.loads(shown.stdout)
    feeds = status["spiders"]["toscrape-css"]["feeds"]
    assert sum(feeds.values()) == 100, feeds
    assert set(feeds) <= {"items-1.jsonl", "items-2.jsonl"}, feeds
