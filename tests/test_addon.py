"""One ``ADDONS`` entry switches the frontier on in any Scrapy project, and
reads the connection settings the project leaves unset from the environment."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Spider, signals
from scrapy.crawler import AsyncCrawlerRunner
from scrapy.exceptions import UsageError
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler, get_reactor_settings

from crawler.addon import FrontierAddon, MongoAddon, with_project_addons
from crawler.commands.crawl import frontier_enabled
from crawler.commands.frontier import check_spider
from crawler.commands.seed import Command as SeedCommand
from crawler.frontier.compat import refusals
from crawler.frontier.spider import FrontierSpider

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

FRONTIER = {"crawler.addon.FrontierAddon": 0}


class PlainSpider(Spider):
    name = "plain"


class SeededSpider(FrontierSpider):
    name = "seeded"


def _components(crawler: Crawler, setting: str) -> dict[type, Any]:
    """The effective component dict (base and project merged), by class."""
    merged = crawler.settings.getwithbase(setting)
    return {load_object(k): v for k, v in merged.items()}


@pytest.fixture
def no_crawl_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("REDIS_URL", "MONGO_URI", "MONGO_DATABASE", "MAX_IDLE_TIME_BEFORE_CLOSE",
                 "FRONTIER_WORKER_ID", "FRONTIER_REDIS_CLUSTER", "LOG_LEVEL",
                 "LOG_JSON_ENABLED", "METRICS_HOST", "METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_one_addons_entry_switches_on_everything_the_frontier_needs(
    no_crawl_env: pytest.MonkeyPatch,
) -> None:
    crawler = get_crawler(PlainSpider, {"ADDONS": FRONTIER, "ROBOTSTXT_OBEY": True})
    settings = crawler.settings
    assert settings["SCHEDULER"] == "crawler.frontier.scheduler.FrontierScheduler"
    assert settings["DUPEFILTER_CLASS"] == "crawler.frontier.dupefilter.FrontierDupeFilter"
    assert settings["SCHEDULER_QUEUE_CLASS"] == "crawler.frontier.queue.LeasedPriorityQueue"
    assert settings.getbool("SCHEDULER_PERSIST")
    assert settings["SCHEDULER_QUEUE_KEY"] == "{%(spider)s}"
    downloader = _components(crawler, "DOWNLOADER_MIDDLEWARES")
    robots = load_object("scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware")
    retry = load_object("scrapy.downloadermiddlewares.retry.RetryMiddleware")
    assert downloader[robots] is None and downloader[retry] is None
    for path in ("crawler.politeness.SharedRobotsTxtMiddleware",
                 "crawler.middlewares.BackoffRetryMiddleware",
                 "crawler.politeness.AdaptiveSlowdownMiddleware"):
        assert downloader[load_object(path)] is not None, path
    extensions = _components(crawler, "EXTENSIONS")
    for path in ("crawler.extensions.ClusterStats", "crawler.control.CrawlControl",
                 "crawler.frontier.housekeeping.FrontierHousekeeping"):
        assert extensions[load_object(path)] is not None, path
    # No MongoDB unless asked for: items go wherever the project sends them.
    pipelines = _components(crawler, "ITEM_PIPELINES")
    assert load_object("crawler.pipelines.MongoPipeline") not in pipelines


def test_the_projects_own_settings_win_over_the_addon(no_crawl_env: pytest.MonkeyPatch) -> None:
    mine = "scrapy.downloadermiddlewares.retry.RetryMiddleware"
    crawler = get_crawler(PlainSpider, {
        "ADDONS": FRONTIER,
        "SCHEDULER_PERSIST": False,
        "EXTENSIONS": {"crawler.control.CrawlControl": None},
        "DOWNLOADER_MIDDLEWARES": {mine: 551},
    })
    assert not crawler.settings.getbool("SCHEDULER_PERSIST")
    assert _components(crawler, "EXTENSIONS")[load_object("crawler.control.CrawlControl")] is None
    assert _components(crawler, "DOWNLOADER_MIDDLEWARES")[load_object(mine)] == 551


def test_the_addon_reads_redis_url_from_the_environment_when_the_project_leaves_it_unset(
    no_crawl_env: pytest.MonkeyPatch,
) -> None:
    no_crawl_env.setenv("REDIS_URL", "redis://redis.example:6390/2")
    no_crawl_env.setenv("MAX_IDLE_TIME_BEFORE_CLOSE", "7")
    no_crawl_env.setenv("FRONTIER_WORKER_ID", "node-3")
    crawler = get_crawler(PlainSpider, {"ADDONS": FRONTIER})
    assert crawler.settings["REDIS_URL"] == "redis://redis.example:6390/2"
    assert crawler.settings.getint("MAX_IDLE_TIME_BEFORE_CLOSE") == 7
    assert crawler.settings["FRONTIER_WORKER_ID"] == "node-3"


def test_a_redis_url_the_project_sets_wins_over_the_environment(
    no_crawl_env: pytest.MonkeyPatch,
) -> None:
    no_crawl_env.setenv("REDIS_URL", "redis://redis.example:6390/2")
    crawler = get_crawler(PlainSpider, {"ADDONS": FRONTIER, "REDIS_URL": "redis://mine:7000/0"})
    assert crawler.settings["REDIS_URL"] == "redis://mine:7000/0"


def test_a_bad_value_in_the_environment_is_refused_as_a_bad_setting(
    no_crawl_env: pytest.MonkeyPatch,
) -> None:
    no_crawl_env.setenv("MAX_IDLE_TIME_BEFORE_CLOSE", "soon")
    settings = Settings({"ADDONS": FRONTIER})
    with pytest.raises(ValueError, match="MAX_IDLE_TIME_BEFORE_CLOSE=soon: must be"):
        FrontierAddon().update_settings(settings)


def test_mongodb_storage_is_its_own_addon_reading_mongo_uri_from_the_environment(
    no_crawl_env: pytest.MonkeyPatch,
) -> None:
    no_crawl_env.setenv("MONGO_URI", "mongodb://mongo.example:27018")
    no_crawl_env.setenv("MONGO_DATABASE", "quotes")
    crawler = get_crawler(PlainSpider, {"ADDONS": {**FRONTIER, MongoAddon: 0}})
    assert crawler.settings["MONGO_URI"] == "mongodb://mongo.example:27018"
    assert crawler.settings["MONGO_DATABASE"] == "quotes"
    pipelines = _components(crawler, "ITEM_PIPELINES")
    assert pipelines[load_object("crawler.pipelines.MongoPipeline")] == 300
    middlewares = _components(crawler, "SPIDER_MIDDLEWARES")
    assert middlewares[load_object("crawler.middlewares.ItemIdMiddleware")] == 40


def test_a_frontier_spider_reads_the_settings_the_addon_set_from_the_environment(
    no_crawl_env: pytest.MonkeyPatch,
) -> None:
    no_crawl_env.setenv("MAX_IDLE_TIME_BEFORE_CLOSE", "4")
    no_crawl_env.setenv("FRONTIER_WORKER_ID", "node-9")
    # The frontier's extensions off: their spider_opened handlers are
    # coroutines, and only the spider's is looked at.
    extensions = dict.fromkeys(("crawler.extensions.ClusterStats", "crawler.control.CrawlControl",
                                "crawler.frontier.housekeeping.FrontierHousekeeping"))
    runner = AsyncCrawlerRunner({**get_reactor_settings(), "ADDONS": FRONTIER,
                                 "TELNETCONSOLE_ENABLED": False, "LOGSTATS_INTERVAL": 0,
                                 "EXTENSIONS": extensions})
    crawler = runner.create_crawler(SeededSpider)
    # Scrapy builds the spider first, then runs the add-ons.
    spider = crawler._create_spider()
    crawler.spider = spider
    crawler._apply_settings()
    crawler.signals.send_catch_log(signals.spider_opened, spider=spider)
    assert spider.max_idle_time == 4
    assert spider.holder.startswith("node-9#")


def test_scrapy_commands_read_redis_url_from_the_environment_when_the_project_leaves_it_unset(
    no_crawl_env: pytest.MonkeyPatch,
) -> None:
    no_crawl_env.setenv("REDIS_URL", "redis://redis.example:6390/2")
    command = SeedCommand()
    command.settings = Settings()
    parser = argparse.ArgumentParser()
    command.add_options(parser)
    opts = parser.parse_args([])
    command.process_options([], opts)
    assert command.settings["REDIS_URL"] == "redis://redis.example:6390/2"


@pytest.mark.parametrize(("settings", "enabled"), [
    ({}, False),
    ({"ADDONS": {"crawler.addon.FrontierAddon": 0}}, True),
    ({"ADDONS": {"crawler.addon.MongoAddon": 0}}, False),
    ({"SCHEDULER": "crawler.frontier.scheduler.FrontierScheduler"}, True),
    ({"SCHEDULER": "scrapy_redis.scheduler.Scheduler"}, False),
])
def test_the_installed_crawl_command_checks_only_projects_that_switch_the_frontier_on(
    settings: dict[str, Any], enabled: bool
) -> None:
    """The package gives every project of its environment its ``scrapy
    crawl``; a project without the frontier is not held to its settings."""
    assert frontier_enabled(Settings(settings)) is enabled


def test_scrapy_commands_check_an_addon_projects_settings_as_its_crawl_sees_them(
    no_crawl_env: pytest.MonkeyPatch,
) -> None:
    """A ``scrapy startproject`` project with the one ``ADDONS`` line leaves
    ``DUPEFILTER_CLASS`` at Scrapy's default, which the add-on replaces: the
    commands (``scrapy seed``, ``frontier``, ``deadletters``) accept it, and
    still refuse what the crawl would refuse."""
    modules = {"SPIDER_MODULES": ["crawler.spiders"]}
    settings = Settings({"ADDONS": FRONTIER, **modules})
    assert check_spider(settings, "quotes") == "quotes"
    assert settings["DUPEFILTER_CLASS"] == "scrapy.dupefilters.RFPDupeFilter"  # not changed
    seen = with_project_addons(settings)
    assert seen["SCHEDULER"] == "crawler.frontier.scheduler.FrontierScheduler"
    bad = Settings({"ADDONS": FRONTIER, "SCHEDULER_QUEUE_KEY": "mine", **modules})
    with pytest.raises(UsageError, match=r"^Bad setting: SCHEDULER_QUEUE_KEY=mine: not supp"):
        check_spider(bad, "quotes")
    # Without the frontier's scheduler, the scrapy-redis settings are not its.
    assert refusals(Settings({"SCHEDULER_QUEUE_KEY": "mine"})) == []
