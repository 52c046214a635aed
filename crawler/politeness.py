"""Politeness shared by all workers: robots.txt once per cluster, adaptive slowing.

Both downloader middlewares write per-site figures into the frontier's Redis
hashes, which ``lua/lease.lua`` reads when it paces a site:

* ``{<spider>}:rdelay``: site -> ``Crawl-delay`` of its robots.txt, ms;
* ``{<spider>}:slow``: site -> extra delay after 429/503 or slow responses, ms.

A site's delay between two requests, across all workers, is then
``max(FRONTIER_DELAY or its {s}:delay override, its Crawl-delay) + its slow
delay``, times ``1 + FRONTIER_DELAY_MARGIN``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler

from crawler.frontier.connection import get_redis
from crawler.frontier.sites import site_of
from crawler.frontier.store import frontier_prefix

#: Longest pause, in seconds, between attempts to read robots.txt from Redis.
REDIS_BACKOFF_CAP = 30.0

if TYPE_CHECKING:
    from typing import Self

    from redis import Redis
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.robotstxt import RobotParser

logger = logging.getLogger(__name__)

__all__ = ["AdaptiveSlowdownMiddleware", "SharedRobotsTxtMiddleware"]


class SharedRobotsTxtMiddleware(RobotsTxtMiddleware):
    """Scrapy's RobotsTxtMiddleware with robots.txt fetched once per cluster.

    Scrapy fetches robots.txt once per site in every worker process. Here the
    first worker to need a site's robots.txt takes a lock in Redis
    (``{s}:robots:lock:<site>``, 60 s), fetches it as Scrapy would and stores
    the body in ``{s}:robots`` (site -> body), with its ``Crawl-delay`` for our
    user agent in ``{s}:rdelay`` (ms), which the frontier then holds every
    worker to. Other workers wait for the body and parse it themselves (with
    ``ROBOTSTXT_PARSER``, protego by default). A stored robots.txt is fetched
    again after ``FRONTIER_ROBOTS_TTL`` seconds (default 86400).

    Enabled by ``ROBOTSTXT_OBEY``, as Scrapy's is.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._redis: Redis | None = None
        self.ttl = crawler.settings.getfloat("FRONTIER_ROBOTS_TTL", 86400.0)
        self.margin = crawler.settings.getfloat("FRONTIER_DELAY_MARGIN", 0.1)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the middleware; NotConfigured unless ``ROBOTSTXT_OBEY``."""
        return cls(crawler)

    @property
    def redis(self) -> Redis:
        """The Redis client, built on first use (a cluster client connects)."""
        if self._redis is None:
            self._redis = get_redis(self.crawler.settings)
        return self._redis

    def _prefix(self) -> str:
        assert self.crawler.spider is not None
        return frontier_prefix(self.crawler.spider.name)

    async def robot_parser(self, request: Request) -> RobotParser | None:
        """The site's parser: local cache, then Redis, then one fetch for all."""
        site = site_of(request)
        netloc = urlparse_cached(request).netloc
        cached = self._parsers.get(netloc)
        if cached is not None and not hasattr(cached, "addCallback"):
            return cached
        prefix = self._prefix()
        deadline = time.monotonic() + 60
        backoff = 0.0
        while True:
            try:
                parser, locked = self._from_redis(prefix, site, netloc)
            except RedisError as exc:
                # An outage, or a lost reply (a lock taken with it expires in
                # 60 s): the request waits; it is no download failure.
                backoff = min(REDIS_BACKOFF_CAP, max(0.5, backoff * 2))
                logger.warning(
                    "Redis unreachable reading robots.txt of %s (%s); trying again in %.1fs",
                    site, exc, backoff,
                )
                await asyncio.sleep(backoff)
                deadline = time.monotonic() + 60
                continue
            if parser is not None:
                return parser
            if locked:
                break
            if time.monotonic() > deadline:
                return None  # the fetching worker died: crawl as Scrapy does without
            await asyncio.sleep(0.1)
        self._parsers.pop(netloc, None)
        # Scrapy's own fetch, keyed by netloc; _parse_robots stores the body.
        return await super().robot_parser(request)

    def _from_redis(
        self, prefix: str, site: str, netloc: str
    ) -> tuple[RobotParser | None, bool]:
        """The parser of ``site``'s robots.txt as stored in Redis (None when
        missing, stale or unreadable), or else whether this worker took the
        lock to fetch it.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        body: bytes | None = self.redis.hget(prefix + "robots", site)  # type: ignore[assignment]
        if body is not None:
            fetched, _, text = body.partition(b"\n")
            try:
                fresh = time.time() - float(fetched or 0) < self.ttl
            except ValueError:
                fresh = False
            if fresh:
                # _parserimpl is the ROBOTSTXT_PARSER class (typed as an instance).
                parserimpl: Any = self._parserimpl
                parser: RobotParser = build_from_crawler(parserimpl, self.crawler, text)
                self._parsers[netloc] = parser
                return parser, False
        return None, bool(self.redis.set(prefix + "robots:lock:" + site, "1", nx=True, ex=60))

    async def _parse_robots(self, response: Response, netloc: str, request: Request) -> None:
        await super()._parse_robots(response, netloc, request)
        site = site_of(request)
        body = response.body if response.status == 200 else b""
        parser = self._parsers.get(netloc)
        delay = None
        if parser is not None and not hasattr(parser, "addCallback"):
            agent = self._robotstxt_useragent or request.headers.get(
                b"User-Agent", self._default_useragent
            )
            delay = parser.crawl_delay(agent or "")
        self._store(site, body, delay)

    def _robots_error(self, exc: Exception, netloc: str) -> None:
        super()._robots_error(exc, netloc)
        # No robots.txt: allowed everywhere, no Crawl-delay; other workers
        # need not try again.
        self._store(netloc.rsplit("@", 1)[-1].lower(), b"", None)

    def _store(self, site: str, body: bytes, delay: float | None) -> None:
        """Share the robots.txt and Crawl-delay of ``site`` with every worker.

        A Crawl-delay also pushes the site's next due time that far from now,
        stretched by ``FRONTIER_DELAY_MARGIN`` as the frontier stretches
        every delay: the request that waited for robots.txt reaches the site
        a moment after this, and is the last one before that time.
        """
        try:
            self._share(site, body, delay)
        except RedisError as exc:
            # This worker obeys it already; the others fetch it themselves
            # once the lock expires (60 s).
            logger.warning("Could not share robots.txt of %s in Redis: %s", site, exc)

    def _share(self, site: str, body: bytes, delay: float | None) -> None:
        prefix = self._prefix()
        seconds, micros = self.redis.time()
        now_ms = seconds * 1000 + micros // 1000
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(prefix + "robots", site, f"{time.time()}\n".encode() + body)
            if delay:
                pipe.hset(prefix + "rdelay", site, round(delay * 1000))
                due = now_ms + round(delay * 1000 * (1 + self.margin))
                pipe.hset(prefix + "due", site, due)
                pipe.zadd(prefix + "wait", {site: due}, xx=True)
                logger.info("%s asks for Crawl-delay: %ss; all workers keep to it", site, delay)
            else:
                pipe.hdel(prefix + "rdelay", site)
            pipe.delete(prefix + "robots:lock:" + site)
            pipe.execute()


class AdaptiveSlowdownMiddleware:
    """Slow a site down for every worker when it pushes back.

    The idea of Scrapy's AutoThrottle, held in Redis so that all workers
    slow down together (AutoThrottle acts inside one process):

    * a 429 or 503 response doubles the site's extra delay in ``{s}:slow``
      (starting at ``FRONTIER_ADAPTIVE_START``, seconds, default 1.0; at most
      ``FRONTIER_ADAPTIVE_MAX``, default 60.0);
    * a response slower than ``FRONTIER_ADAPTIVE_LATENCY`` seconds (default
      5.0) raises the extra delay to at least its download latency;
    * any other response shrinks it by a quarter, and clears it below 50 ms.

    One Redis write per response only while a site is slowed.
    Switched off by ``FRONTIER_ADAPTIVE_ENABLED = False``.
    """

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self.crawler = crawler
        self._redis: Redis | None = None
        self.start = settings.getfloat("FRONTIER_ADAPTIVE_START", 1.0) * 1000
        self.max = settings.getfloat("FRONTIER_ADAPTIVE_MAX", 60.0) * 1000
        self.latency = settings.getfloat("FRONTIER_ADAPTIVE_LATENCY", 5.0)
        self._slow: dict[str, float] = {}

    @property
    def redis(self) -> Redis:
        """The Redis client, built on first use (a cluster client connects)."""
        if self._redis is None:
            self._redis = get_redis(self.crawler.settings)
        return self._redis

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the middleware; NotConfigured when switched off."""
        if not crawler.settings.getbool("FRONTIER_ADAPTIVE_ENABLED", True):
            raise NotConfigured("FRONTIER_ADAPTIVE_ENABLED is off")
        return cls(crawler)

    def process_response(self, request: Request, response: Response) -> Any:
        """Adjust the site's extra delay from this response."""
        site = site_of(request)
        assert self.crawler.spider is not None
        key = frontier_prefix(self.crawler.spider.name) + "slow"
        slow = self._slow.get(site, 0.0)
        latency = float(request.meta.get("download_latency") or 0.0)
        try:
            if response.status in (429, 503):
                current = _number(self.redis.hget(key, site))
                new = min(self.max, max(self.start, 2 * max(current, slow)))
                assert self.crawler.stats is not None
                self.crawler.stats.inc_value("frontier/adaptive/slowed")
            elif latency > self.latency:
                new = min(self.max, max(slow, latency * 1000))
            elif slow:
                new = slow * 0.75 if slow * 0.75 >= 50 else 0.0
            else:
                return response
            self._slow[site] = new
            if new:
                self.redis.hset(key, site, round(new))
            else:
                self.redis.hdel(key, site)
        except RedisError as exc:
            # Slowing down is best effort: the response goes on either way.
            logger.warning("Could not adjust the delay of %s in Redis: %s", site, exc)
        return response


def _number(raw: Any) -> float:
    """A stored delay (ms); a value that is not a number counts as 0."""
    try:
        value = float(raw or 0)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) and value >= 0 else 0.0
