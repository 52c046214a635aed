"""Seed-host scoping (pure logic on requests and responses)."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse

from crawler.middlewares import on_sites, site_of


@pytest.mark.parametrize(
    ("url", "site"),
    [
        ("http://Example.com:80/a", "example.com"),
        ("https://example.com:443/", "example.com"),
        ("http://127.0.0.1:8080/x", "127.0.0.1:8080"),
        ("https://sub.example.com/", "sub.example.com"),
        ("http://[::1]:8099/x", "[::1]:8099"),
    ],
)
def test_site_of(url: str, site: str) -> None:
    assert site_of(Request(url)) == site
    assert site_of(HtmlResponse(url)) == site


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://example.com/x", True),
        ("http://www.example.com/x", True),
        ("http://badexample.com/x", False),
        ("http://example.com:8080/x", False),
        ("https://www.goodreads.com/quotes", False),
    ],
)
def test_on_sites_follows_allowed_domains_rules(url: str, allowed: bool) -> None:
    assert on_sites(Request(url), ["example.com"]) is allowed


def test_revisits_off_by_default_are_disabled_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Revisits are off unless configured: Scrapy's middleware manager then
    skips the middleware without its "Disabled ..." warning (NotConfigured
    without a message), so a default crawl's log has none for it."""
    import logging

    from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
    from scrapy.settings import Settings
    from scrapy.utils.test import get_crawler

    from crawler import settings as project_settings
    from tests import scheduler_harness  # noqa: F401 - installs the reactor Scrapy expects

    settings = Settings()
    settings.setmodule(project_settings)
    crawler = get_crawler(settings_dict=dict(settings))
    with caplog.at_level(logging.DEBUG):
        manager = DownloaderMiddlewareManager.from_crawler(crawler)
    assert "RevisitMiddleware" not in {type(mw).__name__ for mw in manager.middlewares}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "Revisit" in w], warnings
    assert "FRONTIER_REVISIT_AFTER is 0" in caplog.text
