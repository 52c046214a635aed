"""scrapy-redis's own spider classes, unchanged, as its example project has them."""

from __future__ import annotations

import time
from typing import Any

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider, RedisSpider


class SwitchedSpider(RedisSpider):  # type: ignore[misc]
    """Follows every same-host link and yields one item per page."""

    name = "switched"
    redis_key = "switched:seeds"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        yield {"url": response.url}
        host = response.url.split("/")[2]
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            if url.split("/")[2] == host:
                yield response.follow(url)


class SwitchedCrawlSpider(RedisCrawlSpider):  # type: ignore[misc]
    """scrapy-redis's RedisCrawlSpider with one rule."""

    name = "switchedcrawl"
    rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)

    def parse_page(self, response: Any) -> Any:
        yield {"url": response.url}


class StallingSeedSpider(RedisSpider):  # type: ignore[misc]
    """scrapy-redis's RedisSpider whose ``make_request_from_data`` blocks
    for ``SEED_STALL_SECONDS`` (a test setting, 0 by default) before it
    makes its request: a worker to kill after it took seeds and before they
    are in the frontier."""

    name = "stalling"

    def make_request_from_data(self, data: bytes) -> Any:
        time.sleep(self.settings.getfloat("SEED_STALL_SECONDS", 0))
        return super().make_request_from_data(data)

    def parse(self, response: Any, **kwargs: Any) -> Any:
        yield {"url": response.url}


class SeedKeySpider(RedisSpider):  # type: ignore[misc]
    """scrapy-redis's RedisSpider as a tester's project had it: its own
    ``redis_key``, nothing overridden but ``parse``."""

    name = "rqseeds"
    redis_key = "rq:seeds"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        yield {"url": response.url}
