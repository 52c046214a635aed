"""A forced stop (a second SIGTERM/SIGINT) finishes the local feed exports.

Without an item pipeline that stores items durably, a page's lease is
acknowledged once its items were scraped, that is handed to Scrapy's
``FeedExporter`` (``scrapy crawl ... -O out.jsonl``), which writes them into a
buffered file and closes it in ``close_spider``. A forced stop stops the
reactor at once: ``close_spider`` never runs and the buffer, with items of
acknowledged pages, would be lost. :func:`finish_local_feeds` runs in the
scheduler's ``before shutdown`` trigger (:mod:`crawler.frontier.forcedstop`),
before the last acknowledgements are sent, and finishes every feed on a local
file or standard output synchronously, as ``FeedExporter._close_slot``
(Scrapy 2.19, ``scrapy/extensions/feedexport.py``) would.

Feeds whose storage uploads a temporary file at close (S3, GCS, FTP, or any
other storage class) cannot be finished synchronously: a forced stop loses
their items of acknowledged pages, which :func:`warn_remote_feeds` says in
one line at start.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from scrapy.extensions.feedexport import FeedExporter, FileFeedStorage, StdoutFeedStorage

from crawler.config import masked_url

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: Storages :func:`finish_local_feeds` finishes; ``store`` of each is synchronous.
LOCAL_STORAGES = (FileFeedStorage, StdoutFeedStorage)


def feed_exporter(crawler: Crawler) -> FeedExporter | None:
    """The crawler's enabled ``FeedExporter`` (or a subclass), or None
    (also before the crawl starts: Scrapy's ``Crawler.extensions`` raises
    RuntimeError until then)."""
    try:
        manager = crawler.extensions
    except (AttributeError, RuntimeError):
        return None
    for extension in getattr(manager, "middlewares", ()):
        if isinstance(extension, FeedExporter):
            return extension
    return None


def warn_remote_feeds(crawler: Crawler) -> list[str]:
    """Log one warning naming the feeds (URI templates, password masked)
    whose storage is not a local file or standard output: a forced stop
    loses their items. The storage class is chosen by URI scheme as
    ``FeedExporter._get_storage`` does.

    :returns: those URIs, masked.
    """
    exporter = feed_exporter(crawler)
    if exporter is None:
        return []
    remote = []
    for uri in exporter.feeds:
        storage = exporter.storages.get(urlparse(uri).scheme, exporter.storages.get("file"))
        if not (isinstance(storage, type) and issubclass(storage, LOCAL_STORAGES)):
            remote.append(masked_url(uri))
    if remote:
        logger.warning(
            "Feeds %s are uploaded only when the spider closes: a forced stop "
            "(a second SIGTERM/SIGINT) loses their items of pages already "
            "acknowledged (unlike local files and stdout, finished at a forced "
            "stop; docs/stopping.md)", ", ".join(remote),
        )
    return remote


def finish_local_feeds(crawler: Crawler) -> int:
    """Finish every open feed slot on a local file or standard output: the
    exporter's closing bytes written, the file flushed, ``fsync`` ed and
    closed (standard output: flushed only). A finished slot is taken out of
    the exporter, so an item scraped after it is not written to a closed
    file. Errors are logged, never raised (this runs while the reactor
    stops).

    :returns: the number of items in the feeds finished.
    """
    exporter = feed_exporter(crawler)
    if exporter is None:
        return 0
    items = 0
    kept = []
    for slot in exporter.slots:
        if not isinstance(slot.storage, LOCAL_STORAGES) or slot.file is None:
            kept.append(slot)
            continue
        try:
            slot.finish_exporting()
            # (closes a post-processing wrapper, e.g. gzip, onto the file)
            file: Any = FeedExporter._get_file(slot)
            file.flush()
            if isinstance(slot.storage, FileFeedStorage):
                os.fsync(file.fileno())
            slot.storage.store(file)
        except Exception:
            logger.exception("Forced stop: could not finish the feed %s", masked_url(slot.uri))
            kept.append(slot)
            continue
        items += slot.itemcount
        logger.info("Forced stop: finished the %s feed (%d items) in %s",
                    slot.format, slot.itemcount, masked_url(slot.uri))
    exporter.slots = kept
    return items
