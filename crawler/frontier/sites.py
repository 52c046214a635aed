"""Sites: the unit of politeness and of seed scoping."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from urllib.parse import ParseResult

    from scrapy import Request
    from scrapy.http import Response

__all__ = ["on_sites", "site_of"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
#: Network locations whose site is remembered; the memo is emptied when full.
_CACHE_SIZE = 10_000
_cache: dict[tuple[str, str], str] = {}


def site_of(target: Request | Response) -> str:
    """The host of a request or response, with its port when not the default.

    ``http://Example.com:80/a`` gives ``example.com``; ``http://127.0.0.1:8080/``
    gives ``127.0.0.1:8080``. Every request is asked for its site several
    times on its way through a worker, so the answer is remembered per
    scheme and network location (at most :data:`_CACHE_SIZE` of them).
    """
    parts = urlparse_cached(target)
    key = (parts.scheme, parts.netloc)
    site = _cache.get(key)
    if site is None:
        site = _site(parts)
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[key] = site
    return site


def _site(parts: ParseResult) -> str:
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 literal keeps its brackets, as in URLs
        host = f"[{host}]"
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
