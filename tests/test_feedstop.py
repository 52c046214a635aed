"""Feed exports at a forced stop (crawler/frontier/feedstop.py), in process:
local feeds are finished at once, feeds uploaded at close are named in a
warning with their password masked."""

from __future__ import annotations

import gzip
import json
import logging
from typing import TYPE_CHECKING, Any

from scrapy import Spider
from scrapy.utils.test import get_crawler

from crawler.frontier.feedstop import feed_exporter, finish_local_feeds, warn_remote_feeds

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

GZIP = "scrapy.extensions.postprocessing.GzipPlugin"


def crawler_with_feeds(feeds: dict[str, dict[str, Any]]) -> Any:
    crawler = get_crawler(Spider, {"FEEDS": feeds})
    crawler._apply_settings()
    return crawler


def test_local_feeds_are_finished_valid_and_complete_and_remote_ones_left_open(
    tmp_path: Path,
) -> None:
    remote = "ftp://user:secret@127.0.0.1/items.jsonl"
    crawler = crawler_with_feeds({
        str(tmp_path / "items.json"): {"format": "json"},
        str(tmp_path / "items.jl.gz"): {"format": "jsonlines", "postprocessing": [GZIP]},
        remote: {"format": "jsonlines"},
    })
    spider = Spider("feeds")
    spider.crawler = crawler
    exporter = feed_exporter(crawler)
    assert exporter is not None
    exporter.open_spider(spider)
    for i in range(3):
        exporter.item_scraped({"i": i}, spider)

    assert finish_local_feeds(crawler) == 6

    assert json.loads((tmp_path / "items.json").read_text()) == [{"i": 0}, {"i": 1}, {"i": 2}]
    lines = gzip.decompress((tmp_path / "items.jl.gz").read_bytes()).decode().splitlines()
    assert [json.loads(line) for line in lines] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [slot.uri for slot in exporter.slots] == [remote]
    exporter.item_scraped({"i": 3}, spider)  # (not written to a closed file)
    assert finish_local_feeds(crawler) == 0


def test_feeds_uploaded_at_close_are_named_once_at_start_password_masked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    crawler = crawler_with_feeds({
        str(tmp_path / "items.jsonl"): {"format": "jsonlines"},
        "stdout:": {"format": "jsonlines"},
        "ftp://user:secret@127.0.0.1/items.jsonl": {"format": "jsonlines"},
    })
    with caplog.at_level(logging.WARNING, logger="crawler.frontier.feedstop"):
        assert warn_remote_feeds(crawler) == ["ftp://user:****@127.0.0.1/items.jsonl"]
    [record] = caplog.records
    assert "a forced stop" in record.getMessage()
    assert "secret" not in caplog.text
    assert warn_remote_feeds(crawler_with_feeds({str(tmp_path / "x.jsonl"): {}})) == []
