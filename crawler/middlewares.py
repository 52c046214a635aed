"""Spider middlewares of the crawler."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

__all__ = ["SeedHostsMiddleware"]

#: Request meta key holding the hosts a request's crawl may visit.
META_KEY = "seed_hosts"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def site_of(target: Request | Response) -> str:
    """The host of a request or response, with its port when not the default.

    ``http://Example.com:80/a`` gives ``example.com``; ``http://127.0.0.1:8080/``
    gives ``127.0.0.1:8080``.
    """
    parts = urlparse_cached(target)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:
        return host
    if port is None or port == _DEFAULT_PORTS.get(parts.scheme):
        return host
    return f"{host}:{port}"


def on_sites(target: Request | Response, sites: list[str]) -> bool:
    """Whether ``target`` is on one of ``sites`` or a subdomain of one."""
    site = site_of(target)
    return bool(site) and any(site == s or site.endswith(f".{s}") for s in sites)


class SeedHostsMiddleware:
    """Keep every crawl on the hosts of the seed it started from.

    Each request from ``Spider.start()`` (a seed) gets ``meta["seed_hosts"]``
    = ``[its host]`` (with the port when not the default one); when a seed's
    response comes from another host after redirects, that host is added.
    Requests a callback yields inherit the list and are dropped when their
    host is neither one of those hosts nor a subdomain of one (the rule of
    Scrapy's ``allowed_domains``). Requests with
    no ``seed_hosts`` (and whose response has none) are left alone.

    Works across workers with no shared state: the list travels in meta.
    Enable it as a spider middleware and, to also stop redirects that leave
    the hosts, as a downloader middleware.

    Setting: ``FRONTIER_STAY_ON_SEED_HOSTS`` (default True).
    Stats: ``offsite/filtered``, ``offsite/domains`` (as Scrapy's
    OffsiteMiddleware counts them).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._logged: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build from ``crawler``; raise NotConfigured when switched off."""
        if not crawler.settings.getbool("FRONTIER_STAY_ON_SEED_HOSTS", True):
            raise NotConfigured("FRONTIER_STAY_ON_SEED_HOSTS is off")
        return cls(crawler)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Tag each seed request with its own host."""
        async for item_or_request in start:
            if isinstance(item_or_request, Request):
                host = site_of(item_or_request)
                if host and META_KEY not in item_or_request.meta:
                    item_or_request.meta[META_KEY] = [host]
            yield item_or_request

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """Pass items on; drop requests that leave the seed's hosts."""
        hosts = self._hosts_for(response)
        async for item_or_request in result:
            if hosts is None or not isinstance(item_or_request, Request):
                yield item_or_request
                continue
            if self._allow(item_or_request, hosts):
                yield item_or_request

    def process_spider_output_sync(
        self, response: Response, result: Iterable[Any]
    ) -> Iterable[Any]:
        """Synchronous twin of :meth:`process_spider_output`."""
        hosts = self._hosts_for(response)
        for item_or_request in result:
            if (
                hosts is None
                or not isinstance(item_or_request, Request)
                or self._allow(item_or_request, hosts)
            ):
                yield item_or_request

    def process_request(self, request: Request) -> None:
        """As a downloader middleware: drop redirects that leave the hosts.

        A seed (depth 0) may redirect anywhere; the host it lands on joins
        its hosts. A deeper request redirected off the seed's hosts is
        ignored, as Scrapy's OffsiteMiddleware ignores it.

        :raises scrapy.exceptions.IgnoreRequest: for such a redirect.
        """
        hosts = request.meta.get(META_KEY)
        if (
            hosts is not None
            and request.meta.get("redirect_times")
            and request.meta.get("depth", 0) > 0
            and not on_sites(request, hosts)
        ):
            self._filtered(request)
            raise IgnoreRequest(f"redirected off the seed's hosts: {request.url}")

    def _allow(self, request: Request, hosts: list[str]) -> bool:
        """Whether ``request`` stays on ``hosts``; tag it with them if so."""
        if on_sites(request, hosts):
            request.meta[META_KEY] = hosts
            return True
        self._filtered(request)
        return False

    def _hosts_for(self, response: Response) -> list[str] | None:
        hosts: list[str] | None = response.meta.get(META_KEY)
        if hosts is None:
            return None
        host = site_of(response)
        if host and not on_sites(response, hosts):
            # Only a seed (depth 0) may move the crawl to a new host, by
            # redirecting there; deeper redirects off-site were filtered.
            if response.meta.get("depth", 0) == 0:
                hosts = [*hosts, host]
        return hosts

    def _filtered(self, request: Request) -> None:
        stats = self.crawler.stats
        assert stats is not None
        stats.inc_value("offsite/filtered")
        host = site_of(request)
        if host not in self._logged:
            self._logged.add(host)
            stats.inc_value("offsite/domains")
            logger.debug(
                "Filtered offsite request to %r: %s", host, request,
                extra={"spider": self.crawler.spider},
            )
