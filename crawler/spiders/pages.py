"""The ``pages`` spider: a generic crawl of any site."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.http import Response, TextResponse
from scrapy.linkextractors import LinkExtractor
from w3lib.url import canonicalize_url

from crawler.frontier.clock import CLOCK
from crawler.frontier.spider import FrontierSpider
from crawler.items import PageItem

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["PagesSpider"]

_TEXT_XPATH = (
    "//body//text()[not(ancestor::script or ancestor::style "
    "or ancestor::noscript or ancestor::template)]"
)


class PagesSpider(FrontierSpider):
    """One :class:`~crawler.items.PageItem` per HTML page reachable from the seeds.

    Follows every link on the seeds' hosts (see
    :class:`~crawler.middlewares.SeedHostsMiddleware`), down to Scrapy's
    ``DEPTH_LIMIT`` (0, the default, means no limit; a seed is depth 0), e.g.
    ``scrapy crawl pages -s DEPTH_LIMIT=2``. Responses that are not HTML
    (stylesheets, images) yield nothing and are not followed; non-2xx
    responses are dropped by Scrapy's HttpErrorMiddleware, and redirects are
    followed, so a page is stored under the URL it was finally served from.
    """

    name = "pages"
    link_extractor = LinkExtractor()

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """Store the page, then follow its links."""
        if not isinstance(response, TextResponse) or b"html" not in (
            response.headers.get("Content-Type") or b"html"
        ):
            return
        links = list(
            dict.fromkeys(link.url for link in self.link_extractor.extract_links(response))
        )
        text = " ".join(t.strip() for t in response.xpath(_TEXT_XPATH).getall() if t.strip())
        redirects = response.request.meta.get("redirect_urls") if response.request else None
        yield PageItem(
            url=canonicalize_url(response.url),
            requested_url=redirects[0] if redirects else response.url,
            final_url=response.url,
            status=response.status,
            title=(response.css("title::text").get() or "").strip(),
            description=(
                response.xpath("//meta[@name='description']/@content").get() or ""
            ).strip(),
            text=text,
            links=links,
            fetched_at=CLOCK.utcnow(),
        )
        yield from response.follow_all(links)
