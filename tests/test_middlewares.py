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
