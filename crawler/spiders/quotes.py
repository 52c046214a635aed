"""The ``quotes`` spider, for quotes.toscrape.com (or a replay of it)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from crawler.frontier.spider import FrontierSpider
from crawler.items import AuthorItem, QuoteItem

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response, TextResponse

__all__ = ["QuotesSpider"]


def iso_date(text: str) -> str | None:
    """Turn the site's ``March 14, 1879`` into ISO 8601 ``1879-03-14``.

    :returns: None when ``text`` is not in that form.
    """
    try:
        return datetime.strptime(text.strip(), "%B %d, %Y").date().isoformat()
    except ValueError:
        return None


class QuotesSpider(FrontierSpider):
    """Quotes and authors of quotes.toscrape.com.

    Seed it with the site's root (``redis-cli lpush quotes:start_urls
    https://quotes.toscrape.com/``). It follows pagination, tag and author
    links, yields a :class:`~crawler.items.QuoteItem` per quote on list and
    tag pages and an :class:`~crawler.items.AuthorItem` per author page.
    Links off the seed's host (goodreads.com, zyte.com) are dropped by
    :class:`~crawler.middlewares.SeedHostsMiddleware`.
    """

    name = "quotes"

    def parse(self, response: TextResponse, **kwargs: Any) -> Iterator[Any]:
        """Parse a list or tag page: quotes, then the links to follow."""
        for quote in response.css("div.quote"):
            yield QuoteItem(
                text=quote.css("span.text::text").get(default="").strip(),
                author=quote.css("small.author::text").get(default="").strip(),
                tags=quote.css("a.tag::text").getall(),
                url=response.url,
            )
        yield from response.follow_all(
            css="div.quote span a[href*='/author/']", callback=self.parse_author
        )
        yield from response.follow_all(css="a.tag, div.tags-box a.tag")
        yield from response.follow_all(css="li.next a")

    def parse_author(self, response: Response) -> Iterator[Any]:
        """Parse an author page."""
        place = response.css("span.author-born-location::text").get(default="").strip()
        yield AuthorItem(
            name=response.css("h3.author-title::text").get(default="").strip(),
            birth_date=iso_date(response.css("span.author-born-date::text").get(default="")),
            birth_place=place.removeprefix("in ").strip(),
            description=response.css("div.author-description::text").get(default="").strip(),
            url=response.url,
        )
