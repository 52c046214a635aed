"""Sites: the unit of politeness and of seed scoping.

A request's site in the frontier is its download slot, as Scrapy's
downloader would give it (:func:`slot_of`): ``meta["download_slot"]`` when
set, else its host. The frontier keeps each site's delay and concurrency
for all workers together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.utils.httpobj import urlparse_cached

# SLOT_META and check_slot are the configuration's (DOWNLOAD_SLOTS' keys are
# checked with them), re-exported here beside slot_of.
from crawler.overrides import SLOT_MAX_CHARS, SLOT_META, check_slot

if TYPE_CHECKING:
    from collections.abc import Collection
    from urllib.parse import ParseResult

    from scrapy import Request
    from scrapy.http import Response

__all__ = [
    "SEED_HOSTS_META",
    "SLOT_MAX_CHARS",
    "SLOT_META",
    "check_slot",
    "on_sites",
    "site_of",
    "slot_of",
    "tag_seed",
]

#: Request meta key: the hosts (sites) a request's crawl stays on, those of
#: the seed it descends from (:func:`tag_seed`;
#: ``crawler.middlewares.SeedHostsMiddleware`` keeps it).
SEED_HOSTS_META = "seed_hosts"

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


def slot_of(request: Request, named: Collection[str] = ()) -> str:
    """The download slot of ``request``: its site in the frontier.

    As Scrapy's downloader chooses it (``Downloader.get_slot_key``):
    ``meta["download_slot"]`` when set; else the host, which is
    :func:`site_of` (with the port when it is not the scheme's default:
    two servers of one host are two sites) unless the bare host name is
    one of ``named`` (the keys of ``DOWNLOAD_SLOTS``), which Scrapy's
    downloader would then use.

    :param named: slot names given settings of their own (``DOWNLOAD_SLOTS``).
    :returns: the slot; never raises (:func:`check_slot` checks a meta one).
    """
    slot = request.meta.get(SLOT_META)
    if slot is not None:
        return str(slot)
    if named:
        host = urlparse_cached(request).hostname or ""
        if host in named:
            return host
    return site_of(request)


def tag_seed(request: Request) -> Request:
    """Mark ``request`` as a seed: its crawl stays on its own host.

    Sets ``meta["seed_hosts"]`` (:data:`SEED_HOSTS_META`) to
    ``[site_of(request)]`` unless set; returns ``request``.
    """
    if SEED_HOSTS_META not in request.meta:
        request.meta[SEED_HOSTS_META] = [site_of(request)]
    return request
