"""The frontier pip-installed into a fresh virtualenv and switched on in a
``scrapy startproject`` project by one ``ADDONS`` line.

The checkout is built into a wheel, installed with ``--no-deps`` into a new
virtualenv (no system site-packages) that holds the pins of
``requirements.txt``; the project is made by that environment's ``scrapy
startproject``, its template settings kept (``ROBOTSTXT_OBEY = True``,
``DOWNLOAD_DELAY = 1``, ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``). Workers get
``REDIS_URL`` from the environment only (the test's Redis), no MongoDB, and
write feeds (``-O``).

Four spiders, each against one stock Scrapy process running the same logic
on ``scrapy.Spider``/``CrawlSpider`` with ``start_urls``: scrapy/quotesbot's
(a ``FrontierSpider`` seeded with ``scrapy seed``), and three in the image of
scrapy-redis 0.9.1's example project (a plain ``CrawlSpider`` with
``start_urls``, a ``RedisSpider``, a ``RedisCrawlSpider``, seeded with
``LPUSH``). The two workers' feeds together hold the stock items, none
twice, and the replay server saw no path fetched twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from tests.workers import PROJECT_DIR, Worker, wait_workers

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

#: In the image of scrapy-redis 0.9.1's example ``dmoz.py``: a plain
#: CrawlSpider with ``start_urls`` and a rule that follows a listing's pages
#: and turns each into items; nothing of the frontier's. The same file runs
#: in both projects. ``START_URL`` is replaced with the replay server's root.
DIRECTORY_SPIDER = '''
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class QuotesDirectorySpider(CrawlSpider):
    """Follow the pages of the listing and extract its entries."""

    name = "quotes-directory"
    start_urls = ["START_URL"]

    rules = [
        Rule(LinkExtractor(restrict_css="li.next"), callback="parse_directory", follow=True),
    ]

    def parse_directory(self, response):
        for entry in response.css("div.quote"):
            yield {
                "text": entry.css("span.text::text").get(),
                "author": entry.css("small.author::text").get(),
                "page": response.url,
            }
'''

#: How the pages spider reads a page, on scrapy-redis's RedisSpider (seeds
#: from ``quotes-pages:start_urls``) and on scrapy.Spider (``-a start=``).
PAGES_PARSE = '''
    def parse(self, response):
        for quote in response.css("div.quote"):
            yield {
                "title": response.css("title::text").get(),
                "text": quote.css("span.text::text").get(),
                "url": response.url,
            }
'''

#: In the image of scrapy-redis's ``myspider_redis.py``: a RedisSpider whose
#: allowed domains come from ``-a domain=``, one item per entry of a page.
PAGES_REDIS_SPIDER = '''
from scrapy_redis.spiders import RedisSpider


class QuotesPagesSpider(RedisSpider):
    """Read URLs from the Redis list quotes-pages:start_urls."""

    name = "quotes-pages"

    def __init__(self, *args, **kwargs):
        domain = kwargs.pop("domain", "")
        self.allowed_domains = [d for d in domain.split(",") if d]
        super().__init__(*args, **kwargs)
''' + PAGES_PARSE

PAGES_STOCK_SPIDER = '''
import scrapy


class QuotesPagesSpider(scrapy.Spider):
    name = "quotes-pages"

    def __init__(self, *args, start="", **kwargs):
        domain = kwargs.pop("domain", "")
        self.allowed_domains = [d for d in domain.split(",") if d]
        super().__init__(*args, **kwargs)
        self.start_urls = start.split(",")
''' + PAGES_PARSE

#: How the authors spider follows and reads pages, on scrapy-redis's
#: RedisCrawlSpider and on Scrapy's CrawlSpider: the seed's author links
#: (each a 308 redirect to the author's page) become items.
AUTHORS_RULES = '''
    rules = (
        Rule(LinkExtractor(restrict_css="div.quote", allow=r"/author/"), callback="parse_page"),
    )

    def parse_page(self, response):
        return {
            "name": response.css("h3.author-title::text").get(default="").strip(),
            "born": response.css("span.author-born-date::text").get(),
            "url": response.url,
        }
'''

#: In the image of scrapy-redis's ``mycrawler_redis.py``: a RedisCrawlSpider
#: with rules, seeds from ``quotes-authors:start_urls``.
AUTHORS_REDIS_SPIDER = '''
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider


class QuotesAuthorsSpider(RedisCrawlSpider):
    """Read URLs from the Redis list quotes-authors:start_urls."""

    name = "quotes-authors"

    def __init__(self, *args, **kwargs):
        domain = kwargs.pop("domain", "")
        self.allowed_domains = [d for d in domain.split(",") if d]
        super().__init__(*args, **kwargs)
''' + AUTHORS_RULES

AUTHORS_STOCK_SPIDER = '''
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class QuotesAuthorsSpider(CrawlSpider):
    name = "quotes-authors"

    def __init__(self, *args, start="", **kwargs):
        domain = kwargs.pop("domain", "")
        self.allowed_domains = [d for d in domain.split(",") if d]
        super().__init__(*args, **kwargs)
        self.start_urls = start.split(",")
''' + AUTHORS_RULES

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


@pytest.fixture(scope="module")
def stock_project(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``scrapy startproject`` project as the template makes it: the tests
    add their spiders (one module each) and run them with stock Scrapy."""
    return _startproject(installed, tmp_path_factory.mktemp("stock"), "stockbot")


@pytest.fixture(scope="module")
def frontier_project(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``scrapy startproject`` project with the one ``ADDONS`` line added,
    every other template setting kept: the tests add their spiders."""
    project = _startproject(installed, tmp_path_factory.mktemp("frontier"), "qbot")
    settings = project / "qbot" / "settings.py"
    template = settings.read_text()
    assert "\nADDONS = {}\n" in template
    assert "\nROBOTSTXT_OBEY = True\n" in template
    assert "\nDOWNLOAD_DELAY = 1\n" in template
    settings.write_text(template.replace("\nADDONS = {}\n", f"\n{ADDONS_LINE}\n"))
    return project


def _add_spider(project: Path, module: str, source: str) -> None:
    (project / project.name / "spiders" / f"{module}.py").write_text(source)


def _frontier_env(redis_url: str) -> dict[str, str]:
    """The workers' environment: the test's Redis in ``REDIS_URL`` only."""
    return _clean_env(REDIS_URL=redis_url, MAX_IDLE_TIME_BEFORE_CLOSE="3")


def _stock_items(installed: Path, project: Path, spider: str, feed: Path, *args: str) -> list[str]:
    """Crawl ``spider`` with one stock Scrapy process: its feed's items."""
    _run([str(installed / "scrapy"), "crawl", spider, *args, "-O", str(feed),
          "-s", "TELNETCONSOLE_ENABLED=False"], cwd=project, env=_clean_env(), timeout=300)
    return _feed(feed)


def _two_workers(
    installed: Path, project: Path, spider: str, env: dict[str, str], feeds: list[Path],
    logs: list[Path], *args: str,
) -> list[Worker]:
    """Run two workers of ``spider`` at once, each with its own ``-O`` feed,
    to their end; both finished cleanly."""
    procs = [
        subprocess.Popen(
            [str(installed / "scrapy"), "crawl", spider, *args, "-O", str(feed),
             "-s", f"LOG_FILE={log}", "-s", "TELNETCONSOLE_ENABLED=False"],
            cwd=project, env=env,
        )
        for feed, log in zip(feeds, logs, strict=True)
    ]
    workers = wait_workers(procs, logs, timeout=300)
    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    assert all("'finish_reason': 'finished'" in w.log for w in workers), [
        w.log[-3000:] for w in workers]
    assert not any("Traceback" in w.log for w in workers), [w.log[-3000:] for w in workers]
    return workers


def _assert_stored_as_stock(feeds: list[Path], expected: list[str]) -> None:
    """The workers' feeds together hold the stock crawl's items, each once."""
    stored = [item for feed in feeds for item in _feed(feed)]
    assert len(stored) == len(set(stored)), "an item was stored twice"
    assert set(stored) == set(expected)


def _assert_fetched_once(site: ReplayServer) -> None:
    """No path of the site was fetched twice (robots.txt and seeds included)."""
    counts = Counter(h.path for h in site.hits())
    assert counts, "nothing was fetched"
    assert [p for p, n in counts.items() if n > 1] == [], counts


def test_two_installed_workers_with_one_addons_line_store_what_stock_scrapy_stores(
    installed: Path, stock_project: Path, frontier_project: Path, redis_url: str,
    rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path,
) -> None:
    scrapy = str(installed / "scrapy")
    start = replay_server.url_for("/")

    _add_spider(stock_project, "toscrape", STOCK_SPIDER)
    expected = _stock_items(installed, stock_project, "toscrape-css", tmp_path / "stock.jsonl",
                            "-a", f"start={start}")
    assert len(expected) == 100

    project = frontier_project
    _add_spider(project, "toscrape", FRONTIER_SPIDER)
    env = _frontier_env(redis_url)
    seeded = _run([scrapy, "seed", "toscrape-css", start], cwd=project, env=env)
    assert "queued 1 seeds" in seeded.stdout, seeded.stdout
    assert rds.llen("toscrape-css:start_urls") == 1  # the test's Redis, from the environment

    replay_server.clear_hits()
    feeds = [project / f"items-{i}.jsonl" for i in (1, 2)]
    logs = [tmp_path / f"worker-{i}.log" for i in (1, 2)]
    workers = _two_workers(installed, project, "toscrape-css", env, feeds, logs)
    _assert_stored_as_stock(feeds, expected)
    assert sum(w.stats.get("item_scraped_count", 0) for w in workers) == 100
    _assert_fetched_once(replay_server)

    # The status counts the feeds the workers wrote, dict items and all.
    shown = _run([scrapy, "frontier", "status", "toscrape-css", "--json"], cwd=project, env=env)
    status = json.loads(shown.stdout)
    feed_counts = status["spiders"]["toscrape-css"]["feeds"]
    assert sum(feed_counts.values()) == 100, feed_counts
    assert set(feed_counts) <= {str(feed) for feed in feeds}, feed_counts


def test_a_plain_crawl_spider_with_start_urls_on_two_workers_stores_what_stock_scrapy_stores(
    installed: Path, stock_project: Path, frontier_project: Path, redis_url: str,
    replay_server: ReplayServer, tmp_path: Path,
) -> None:
    """scrapy-redis's ``dmoz.py`` kind: ``start_urls`` and rules, no seeds
    in Redis. The frontier queues the start URLs once per crawl, not once
    per worker: the root is fetched once."""
    source = DIRECTORY_SPIDER.replace("START_URL", replay_server.url_for("/"))
    _add_spider(stock_project, "directory", source)
    expected = _stock_items(installed, stock_project, "quotes-directory",
                            tmp_path / "stock.jsonl")
    assert len(expected) == 90  # pages 2 to 10: the start page goes to parse_start_url

    _add_spider(frontier_project, "directory", source)
    replay_server.clear_hits()
    feeds = [tmp_path / f"items-{i}.jsonl" for i in (1, 2)]
    logs = [tmp_path / f"worker-{i}.log" for i in (1, 2)]
    _two_workers(installed, frontier_project, "quotes-directory", _frontier_env(redis_url),
                 feeds, logs)
    _assert_stored_as_stock(feeds, expected)
    _assert_fetched_once(replay_server)


def test_a_scrapy_redis_spider_on_two_installed_workers_stores_what_stock_scrapy_stores(
    installed: Path, stock_project: Path, frontier_project: Path, redis_url: str,
    rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path,
) -> None:
    """scrapy-redis's ``myspider_redis.py`` kind: a ``RedisSpider`` reading
    ``quotes-pages:start_urls``, seeded as with ``redis-cli lpush``."""
    pages = [replay_server.url_for(f"/page/{n}/") for n in range(1, 11)]
    domain = "-a", "domain=127.0.0.1"
    _add_spider(stock_project, "pages", PAGES_STOCK_SPIDER)
    expected = _stock_items(installed, stock_project, "quotes-pages", tmp_path / "stock.jsonl",
                            *domain, "-a", f"start={','.join(pages)}")
    assert len(expected) == 100

    _add_spider(frontier_project, "pages", PAGES_REDIS_SPIDER)
    rds.lpush("quotes-pages:start_urls", *pages)
    replay_server.clear_hits()
    feeds = [tmp_path / f"items-{i}.jsonl" for i in (1, 2)]
    logs = [tmp_path / f"worker-{i}.log" for i in (1, 2)]
    _two_workers(installed, frontier_project, "quotes-pages", _frontier_env(redis_url),
                 feeds, logs, *domain)
    _assert_stored_as_stock(feeds, expected)
    _assert_fetched_once(replay_server)
    assert rds.llen("quotes-pages:start_urls") == 0


def test_a_scrapy_redis_crawl_spider_on_two_installed_workers_stores_what_stock_scrapy_stores(
    installed: Path, stock_project: Path, frontier_project: Path, redis_url: str,
    rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path,
) -> None:
    """scrapy-redis's ``mycrawler_redis.py`` kind: a ``RedisCrawlSpider``
    with rules, seeded with the site's root; its author links redirect."""
    start = replay_server.url_for("/")
    domain = "-a", "domain=127.0.0.1"
    _add_spider(stock_project, "authors", AUTHORS_STOCK_SPIDER)
    expected = _stock_items(installed, stock_project, "quotes-authors",
                            tmp_path / "stock.jsonl", *domain, "-a", f"start={start}")
    assert len(expected) == 8  # the root's authors

    _add_spider(frontier_project, "authors", AUTHORS_REDIS_SPIDER)
    rds.lpush("quotes-authors:start_urls", start)
    replay_server.clear_hits()
    feeds = [tmp_path / f"items-{i}.jsonl" for i in (1, 2)]
    logs = [tmp_path / f"worker-{i}.log" for i in (1, 2)]
    _two_workers(installed, frontier_project, "quotes-authors", _frontier_env(redis_url),
                 feeds, logs, *domain)
    _assert_stored_as_stock(feeds, expected)
    _assert_fetched_once(replay_server)
