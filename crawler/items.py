"""Items the spiders yield, one class per MongoDB collection.

Each item class names its collection (``collection``) and the fields that
identify one real-world thing (``key``): the pipeline stores by those
fields, under a unique index (a new key is inserted, a key stored already is
updated), so a thing is stored once however many pages show it and however
often the site is crawled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from datetime import datetime

__all__ = ["AuthorItem", "PageItem", "QuoteItem"]


@dataclass
class QuoteItem:
    """A quote, as quotes.toscrape.com lists it.

    :ivar text: the quote as shown, curly quotes included.
    :ivar author: the author's name as shown.
    :ivar tags: tag names, in page order.
    :ivar url: URL of the page it was found on.
    """

    collection: ClassVar[str] = "quotes"
    key: ClassVar[tuple[str, ...]] = ("text", "author")

    text: str
    author: str
    tags: list[str] = field(default_factory=list)
    url: str = ""


@dataclass
class AuthorItem:
    """An author's page on quotes.toscrape.com.

    :ivar birth_date: ISO 8601 date (``YYYY-MM-DD``), or None if unparsable.
    :ivar birth_place: e.g. ``Ulm, Germany`` (the page's leading "in " removed).
    """

    collection: ClassVar[str] = "authors"
    key: ClassVar[tuple[str, ...]] = ("name",)

    name: str
    birth_date: str | None
    birth_place: str
    description: str
    url: str


@dataclass
class PageItem:
    """One HTML page of a generic crawl.

    :ivar url: canonical form of ``final_url`` (w3lib's canonicalize_url);
        the natural key.
    :ivar requested_url: the URL first requested, before redirects.
    :ivar final_url: the URL the page was finally served from.
    :ivar status: HTTP status code.
    :ivar fetched_at: when the response arrived, UTC.
    :ivar links: absolute URLs of the page's outgoing links, in page order,
        without repeats.
    """

    collection: ClassVar[str] = "pages"
    key: ClassVar[tuple[str, ...]] = ("url",)

    url: str
    requested_url: str
    final_url: str
    status: int
    title: str
    description: str
    text: str
    links: list[str]
    fetched_at: datetime
