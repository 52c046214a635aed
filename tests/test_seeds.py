"""Parsing of seeds pushed with redis-cli (pure logic)."""

from __future__ import annotations

import pytest

from crawler.frontier.seeds import BadSeed, Seed, parse_seed


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"https://quotes.toscrape.com/", Seed(url="https://quotes.toscrape.com/")),
        ("  http://a.example/x?y=1 \n", Seed(url="http://a.example/x?y=1")),
        (
            b'{"url": "https://a.example/", "meta": {"k": [1]}, "priority": 9}',
            Seed(url="https://a.example/", meta={"k": [1]}, priority=9),
        ),
        (
            '{"url": "https://a.example/", "method": "post", "body": "x=1"}',
            Seed(url="https://a.example/", method="POST", body="x=1"),
        ),
        (  # scrapy-redis 0.9.1's form data: every other key
            '{"url": "https://a.example/", "method": "POST", "q": "x", "n": 1, "m": ["a", 2]}',
            Seed(url="https://a.example/", method="POST",
                 formdata={"q": "x", "n": "1", "m": ["a", "2"]}),
        ),
    ],
)
def test_good_seeds_parse(data: bytes | str, expected: Seed) -> None:
    assert parse_seed(data) == expected


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ("not a url", "not an http(s) URL: 'not a url'"),
        ("ftp://example.com/", "not an http(s) URL"),
        ("http:///path-only", "URL has no host"),
        ("http://a.example:99999/", "malformed URL"),
        ('{"url": 5}', "JSON seed has no string 'url' (got int)"),
        ('{"meta": {}}', "JSON seed has no string 'url'"),
        ('{"url": "http://', "not valid JSON"),
        ("[1, 2]", "JSON seed must be an object"),
        ('{"url": "https://a.example/", "priority": "high"}', "'priority' must be int"),
        ('{"url": "https://a.example/", "priority": true}', "'priority' must be int"),
        ('{"url": "https://a.example/", "priority": 1000001}', "'priority' 1000001 is out of"),
        ('{"url": "https://a.example/", "priority": -5000000}', "the frontier takes"),
        ('{"url": "https://a.example/", "meta": []}', "'meta' must be dict"),
        ('{"url": "https://a.example/", "headers": {"a": 1}}', "'headers' values"),
        ('{"url": "https://a.example/", "body": "x", "q": "y"}', "both a 'body' and form data"),
        ('{"url": "https://a.example/", "q": {"a": 1}}', "form field 'q' must be a string"),
        ("", "empty seed"),
        (b"   ", "empty seed"),
        (b"\xff\xfe", "not utf-8 text"),
    ],
)
def test_bad_seeds_raise_with_the_reason(data: bytes | str, reason: str) -> None:
    with pytest.raises(BadSeed, match=None) as info:
        parse_seed(data)
    assert reason in str(info.value)


def test_a_deeply_nested_json_seed_is_a_bad_seed() -> None:
    with pytest.raises(BadSeed, match="not valid JSON"):
        parse_seed("[" * 100_000)


@pytest.mark.parametrize("name", ["_return_pending", "__init__", "start", "close", "nope"])
def test_a_seed_cannot_name_a_private_or_machinery_method_as_callback(name: str) -> None:
    from crawler.spiders.quotes import QuotesSpider

    with pytest.raises(BadSeed):
        QuotesSpider()._seed_callback(name)


@pytest.mark.parametrize("name", ["parse", "parse_author"])
def test_a_seed_may_name_the_spiders_callbacks(name: str) -> None:
    from crawler.spiders.quotes import QuotesSpider

    spider = QuotesSpider()
    assert spider._seed_callback(name) == getattr(spider, name)
