"""A stock scrapy-redis spider that follows the links of its seed's host."""

from __future__ import annotations

from typing import Any

from scrapy_redis.spiders import RedisSpider


class StockPagesSpider(RedisSpider):  # type: ignore[misc]
    """Follows every same-host link; yields no items."""

    name = "stockpages"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        host = response.url.split("/")[2]
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            if url.split("/")[2] == host:
                yield response.follow(url)
