"""The frontier's Scrapy add-on (``ADDONS``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.utils.misc import load_object

from crawler.config import SettingsError, validate_settings
from crawler.frontier.slots import FrontierDownloader

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["FrontierAddon"]

#: Scrapy's own downloader, which the add-on replaces.
_SCRAPY_DOWNLOADER = "scrapy.core.downloader.Downloader"
#: Each worker's downloader under the frontier: no delay of its own.
_DOWNLOADER = "crawler.frontier.slots.FrontierDownloader"


class FrontierAddon:
    """Make Scrapy's per-process politeness settings hold for the cluster.

    ``DOWNLOAD_DELAY``, ``CONCURRENT_REQUESTS_PER_DOMAIN``, ``DOWNLOAD_SLOTS``,
    a spider's ``download_delay`` and ``max_concurrent_requests`` and
    ``meta["download_slot"]`` keep their Scrapy meaning, per download slot,
    but for all workers together: the frontier enforces them
    (:class:`crawler.frontier.slots.SitePolicy`). Each worker's own
    downloader then waits no delay (``DOWNLOADER`` is set to
    :class:`crawler.frontier.slots.FrontierDownloader`): a second, local
    delay would only hold requests that the frontier already timed, and
    bunch them up. Enabled in ``crawler/settings.py``.

    It first checks every setting of the project (:func:`crawler.config.
    validate_settings`), before any component is built: ``scrapy crawl``
    checks them before that already, this covers the other ways to run a
    crawl, and settings that other add-ons changed.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        """Check the settings and put the frontier's downloader in place.

        :raises crawler.config.SettingsError: a setting has a value that is
            not allowed (the message names each one and what is allowed),
            or ``DOWNLOADER`` is another downloader than Scrapy's or
            :class:`~crawler.frontier.slots.FrontierDownloader` (or a
            subclass): its delays would add to the cluster's.
        """
        validate_settings(settings)
        downloader = settings.get("DOWNLOADER")
        if downloader is None or load_object(downloader) is load_object(_SCRAPY_DOWNLOADER):
            settings.set(
                "DOWNLOADER", _DOWNLOADER, max(15, settings.getpriority("DOWNLOADER") or 0)
            )
            return
        cls = load_object(downloader) if isinstance(downloader, str) else downloader
        if not (isinstance(cls, type) and issubclass(cls, FrontierDownloader)):
            raise SettingsError([
                f"DOWNLOADER={downloader}: must be {_DOWNLOADER} or a subclass of it "
                "(the frontier paces each download slot for the whole cluster; a "
                "worker's own delays would add to it)"
            ])
