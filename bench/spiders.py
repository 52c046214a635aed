"""The spiders the benchmark runs as real ``scrapy crawl`` workers.

``bench_links`` follows links and yields nothing, so the crawl figures
measure the scheduler and the downloader, not item handling; it is a
:class:`~crawler.frontier.spider.FrontierSpider`, so our seed reading is the
same whichever scheduler the run uses. ``bench_stock`` is a plain
scrapy-redis :class:`~scrapy_redis.spiders.RedisSpider`, for the stock
seed-pickup baseline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.linkextractors import LinkExtractor
from scrapy_redis.spiders import RedisSpider

from crawler.frontier.spider import FrontierSpider

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response

__all__ = ["LinksSpider", "StockSpider"]


class LinksSpider(FrontierSpider):
    """Follow every link of every page; yield no items."""

    name = "bench_links"
    link_extractor = LinkExtractor()

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """Follow the page's links."""
        yield from response.follow_all(self.link_extractor.extract_links(response))


class StockSpider(RedisSpider):  # type: ignore[misc]
    """A stock scrapy-redis spider: seeds from ``bench_stock:start_urls``."""

    name = "bench_stock"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """Yield nothing (the figure times the request, not the parse)."""
        return iter(())
