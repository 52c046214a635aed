"""Scrapy's download slots, kept by the frontier for the whole cluster.

Scrapy paces each download slot of one process (``scrapy.core.downloader``:
a ``Slot`` with a concurrency and a delay; ``DOWNLOAD_SLOTS`` sets them per
slot). The frontier paces the same slots across all workers: a request's
site is its slot (:func:`~crawler.frontier.sites.slot_of`), and
:class:`SitePolicy` reads the settings that shape a slot into the frontier's
defaults and per-site overrides:

===================================  =========================================
Scrapy                               frontier, for all workers together
===================================  =========================================
``DOWNLOAD_DELAY`` (and a spider's   default delay (unless ``FRONTIER_DELAY``)
``download_delay``)
``CONCURRENT_REQUESTS_PER_DOMAIN``   default concurrency (unless
(and ``max_concurrent_requests``)    ``FRONTIER_CONCURRENCY``)
``DOWNLOAD_SLOTS[slot]["delay"]``    the slot's ``{s}:delay`` (unless
                                     ``FRONTIER_SITE_DELAYS`` names it)
``DOWNLOAD_SLOTS[slot]               the slot's ``{s}:conc`` (unless
["concurrency"]``                    ``FRONTIER_SITE_CONCURRENCY`` names it)
``DOWNLOAD_DELAY_JITTER`` j (and     each gap between two leases of a site
``DOWNLOAD_SLOTS[slot]["jitter"]``;  drawn in [1, 1 + j) x its delay (Scrapy:
the deprecated                       [1 - j, 1 + j)): the delay is the floor
``RANDOMIZE_DOWNLOAD_DELAY`` and
``randomize_delay``: j = 0.5 or 0)
``meta["download_slot"]``            the request's site
===================================  =========================================

Each worker's own downloader (:class:`FrontierDownloader`) then waits no
delay of its own: the frontier hands a request out when its slot is due.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from scrapy.core.downloader import Downloader
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from crawler.config import setting_value
from crawler.frontier.sites import check_slot, slot_of
from crawler.overrides import parse_download_slots

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

__all__ = ["FrontierDownloader", "RobotsGate", "SitePolicy", "shared_robots_enabled"]

#: The class path of the project's robots.txt middleware, a
#: :class:`RobotsGate` (it stores each site's robots.txt in Redis).
SHARED_ROBOTS = "crawler.politeness.SharedRobotsTxtMiddleware"


class RobotsGate:
    """What a downloader middleware is when it tells the frontier each
    site's robots.txt state (fetched, pending, unreachable): the frontier
    then serves a site one request at a time until its robots.txt is known
    (:attr:`SitePolicy.robots_gate`).

    The frontier defines it and a middleware above it subclasses it
    (:data:`SHARED_ROBOTS`), so the frontier imports no middleware. It adds
    no behaviour.
    """


@dataclass(frozen=True)
class SitePolicy:
    """The politeness the frontier keeps per site, from the final settings.

    Built once the spider's attributes are merged into the settings
    (Scrapy copies a spider's ``download_delay`` into ``DOWNLOAD_DELAY`` and
    ``max_concurrent_requests`` into ``CONCURRENT_REQUESTS_PER_DOMAIN``),
    i.e. from a component's ``from_crawler``.

    :ivar delay: seconds between two requests to a site, >= 0:
        ``FRONTIER_DELAY``, else ``DOWNLOAD_DELAY``.
    :ivar concurrency: requests to a site at once, >= 1:
        ``FRONTIER_CONCURRENCY``, else ``CONCURRENT_REQUESTS_PER_DOMAIN``.
    :ivar slot_delays: slot -> delay, ms, from ``DOWNLOAD_SLOTS``.
    :ivar slot_concurrency: slot -> concurrency, from ``DOWNLOAD_SLOTS``.
    :ivar jitter: the random variation j of each site's delay
        (``DOWNLOAD_DELAY_JITTER``, or the deprecated
        ``RANDOMIZE_DOWNLOAD_DELAY`` as Scrapy reads it: 0.5 or 0); the gap
        is drawn in [1, 1 + j) times the delay, for the whole cluster.
    :ivar slot_jitter: slot -> its own jitter, from ``DOWNLOAD_SLOTS``
        (``jitter``, or the deprecated ``randomize_delay``: 0.5 or 0).
    :ivar robots_gate: the frontier serves a site one request at a time
        until its robots.txt is known: ``ROBOTSTXT_OBEY`` with
        a :class:`RobotsGate` enabled (:data:`SHARED_ROBOTS`).
    """

    delay: float
    concurrency: int
    slot_delays: dict[str, int] = field(default_factory=dict)
    slot_concurrency: dict[str, int] = field(default_factory=dict)
    jitter: float = 0.0
    slot_jitter: dict[str, float] = field(default_factory=dict)
    robots_gate: bool = False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> SitePolicy:
        """Read the policy.

        :raises ValueError: a ``DOWNLOAD_SLOTS`` entry is not a dict, names
            a slot the frontier cannot keep, or has a delay or concurrency
            out of range (the message names the slot and what is allowed).
        """
        own_delay: float | None = setting_value(settings, "FRONTIER_DELAY")
        own_concurrency: int | None = setting_value(settings, "FRONTIER_CONCURRENCY")
        delay = settings.getfloat("DOWNLOAD_DELAY") if own_delay is None else own_delay
        concurrency = (
            settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
            if own_concurrency is None else own_concurrency
        )
        slots = settings.getdict("DOWNLOAD_SLOTS")
        delays, caps = parse_download_slots(slots)
        jitters = {
            check_slot(name): slot_jitter(entry) for name, entry in slots.items()
            if isinstance(entry, dict) and slot_jitter(entry) is not None
        }
        return cls(
            delay=max(0.0, delay),
            concurrency=max(1, concurrency),
            slot_delays=delays,
            slot_concurrency=caps,
            jitter=default_jitter(settings),
            slot_jitter=cast("dict[str, float]", jitters),
            robots_gate=settings.getbool("ROBOTSTXT_OBEY") and shared_robots_enabled(settings),
        )

    @property
    def named_slots(self) -> frozenset[str]:
        """The slots ``DOWNLOAD_SLOTS`` names."""
        return frozenset(self.slot_delays) | frozenset(self.slot_concurrency)

    def slot_of(self, request: Request) -> str:
        """The site of ``request`` in the frontier
        (:func:`~crawler.frontier.sites.slot_of` with :attr:`named_slots`).

        :raises ValueError: its ``meta["download_slot"]`` cannot be kept
            (:func:`~crawler.frontier.sites.check_slot`).
        """
        slot = request.meta.get("download_slot")
        if slot is not None:
            return check_slot(slot)
        return slot_of(request, self.named_slots)


def default_jitter(settings: BaseSettings) -> float:
    """The jitter of a site's delay as Scrapy's downloader reads it
    (``scrapy.core.downloader._default_jitter``, whose deprecation warning
    the worker's downloader gives): ``DOWNLOAD_DELAY_JITTER``, or
    ``RANDOMIZE_DOWNLOAD_DELAY`` (0.5 or 0) when set at a higher priority."""
    randomize = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    if randomize > SETTINGS_PRIORITIES["default"] and randomize > (
        settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0
    ):
        return 0.5 if settings.getbool("RANDOMIZE_DOWNLOAD_DELAY") else 0.0
    return max(0.0, settings.getfloat("DOWNLOAD_DELAY_JITTER"))


def slot_jitter(entry: dict[str, Any]) -> float | None:
    """A ``DOWNLOAD_SLOTS`` entry's own jitter (``jitter``, else the
    deprecated ``randomize_delay``: 0.5 or 0), or None."""
    if entry.get("jitter") is not None:
        return max(0.0, float(entry["jitter"]))
    if entry.get("randomize_delay") is not None:
        return 0.5 if entry["randomize_delay"] else 0.0
    return None


def shared_robots_enabled(settings: BaseSettings) -> bool:
    """Whether an enabled (not ``None``) downloader middleware of
    ``settings`` is a :class:`RobotsGate` (:data:`SHARED_ROBOTS` or a
    subclass of it)."""
    for path in build_component_list(settings.getwithbase("DOWNLOADER_MIDDLEWARES")):
        try:
            component = load_object(path) if isinstance(path, str) else path
        except (ImportError, ValueError, NameError, AttributeError):
            continue
        if isinstance(component, type) and issubclass(component, RobotsGate):
            return True
    return False


class FrontierDownloader(Downloader):
    """Scrapy's downloader with no delay of its own.

    The frontier hands a worker a request when the request's slot is due
    for the whole cluster (``DOWNLOAD_DELAY``, ``DOWNLOAD_SLOTS``' delays,
    a spider's ``download_delay``: :class:`SitePolicy`); a second delay in
    each worker would only hold requests already timed and let them reach
    the site closer together. Slots keep Scrapy's keys and concurrency.
    Set as ``DOWNLOADER`` by :class:`crawler.addon.FrontierAddon`.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._delay = 0.0
        self._jitter = 0.0
        self.per_slot_settings = {
            key: {**(value if isinstance(value, dict) else {}), "delay": 0.0, "jitter": 0.0}
            for key, value in self.per_slot_settings.items()
        }
