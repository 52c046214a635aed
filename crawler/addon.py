"""The frontier's Scrapy add-on (``ADDONS``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from crawler.config import is_unset, validate_settings

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["FrontierAddon"]

#: Above every named priority (cmdline is 40): the per-worker download delay
#: must stay 0 whatever sets DOWNLOAD_DELAY, or it would add to the cluster's.
_OVER_CMDLINE = 50


class FrontierAddon:
    """Make Scrapy's per-process politeness settings hold for the cluster.

    ``DOWNLOAD_DELAY`` and ``CONCURRENT_REQUESTS_PER_DOMAIN`` are the
    defaults of ``FRONTIER_DELAY`` and ``FRONTIER_CONCURRENCY``, which the
    frontier enforces per site across all workers together. Each worker's
    own downloader then runs with ``DOWNLOAD_DELAY = 0``: a second, local
    delay would only hold requests that the frontier already timed, and bunch
    them up. Enabled in ``crawler/settings.py``.

    It first checks every setting of the project (:func:`crawler.config.
    validate_settings`), before any component is built: ``scrapy crawl``
    checks them before that already, this covers the other ways to run a
    crawl, and settings that other add-ons changed.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        """Check the settings, copy the politeness settings into
        ``FRONTIER_*`` and zero the local delay.

        :raises crawler.config.SettingsError: a setting has a value that is
            not allowed (the message names each one and what is allowed).
        """
        validate_settings(settings)
        if is_unset(settings, "FRONTIER_DELAY"):
            settings.set(
                "FRONTIER_DELAY",
                settings.getfloat("DOWNLOAD_DELAY"),
                settings.getpriority("DOWNLOAD_DELAY") or 0,
            )
        if is_unset(settings, "FRONTIER_CONCURRENCY"):
            settings.set(
                "FRONTIER_CONCURRENCY",
                settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
                settings.getpriority("CONCURRENT_REQUESTS_PER_DOMAIN") or 0,
            )
        settings.set("DOWNLOAD_DELAY", 0, _OVER_CMDLINE)
