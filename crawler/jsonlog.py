"""JSON-lines logging for log shippers (``LOG_JSON_ENABLED``).

Each record becomes one line of JSON::

    {"time": "2025-01-31T12:00:00.123456+00:00", "level": "INFO",
     "logger": "scrapy.core.engine", "message": "Spider opened",
     "worker": "node1:4242", "spider": "quotes", "job": "6487ec5a..."}

``exception`` (the formatted traceback) is added when the record has one;
``job`` is the scrapyd job id, or null outside scrapyd.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.log import get_scrapy_root_handler

from crawler.config import FrontierConfig, worker_id
from crawler.extensions import job_id
from crawler.keys import spider_name_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["JsonLogFormatter", "JsonLogging", "install", "install_from_environment"]


class JsonLogFormatter(logging.Formatter):
    """Format a record as one JSON object on one line.

    :param fields: constant fields added to every record, e.g.
        ``{"worker": "node1:4242", "spider": "quotes", "job": None}``; a
        record's own ``spider`` (``extra={"spider": spider}``) wins over the
        constant one.
    """

    def __init__(self, fields: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self.fields,
        }
        spider = getattr(record, "spider", None)
        name = getattr(spider, "name", None)
        if isinstance(name, str):
            data["spider"] = name
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        return json.dumps(data, ensure_ascii=False, default=str)


_formatter: JsonLogFormatter | None = None


def install(fields: dict[str, Any] | None = None) -> JsonLogFormatter:
    """Make Scrapy's root log handler write JSON lines, now and when rebuilt.

    Scrapy replaces its handler when a crawler starts, so a log record
    factory checks the handler's formatter before each record: every line
    is JSON from the first record after this call. Calling it again only
    updates the constant fields.

    :param fields: constant fields to add (``worker``, ``spider``, ``job``).
    :returns: the formatter in use.
    """
    global _formatter  # noqa: PLW0603 - one formatter per process
    if _formatter is None:
        _formatter = formatter = JsonLogFormatter(fields)
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            handler = get_scrapy_root_handler()
            if handler is not None and handler.formatter is not formatter:
                handler.setFormatter(formatter)
            return previous(*args, **kwargs)

        logging.setLogRecordFactory(factory)
    elif fields:
        _formatter.fields.update(fields)
    handler = get_scrapy_root_handler()
    if handler is not None:
        handler.setFormatter(_formatter)
    return _formatter


def install_from_environment() -> None:
    """Call :func:`install` if ``$LOG_JSON_ENABLED`` is ``1`` or ``true``.

    ``crawler/settings.py`` calls it so that, when the switch comes from the
    environment (scrapyd, systemd, compose), even Scrapy's start-up lines,
    logged before any crawler exists, are JSON.
    """
    if os.environ.get("LOG_JSON_ENABLED", "").lower() in ("1", "true"):
        install({"worker": os.environ.get("FRONTIER_WORKER_ID") or _default_worker()})


def _default_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class JsonLogging:
    """Switch Scrapy's log handler to :class:`JsonLogFormatter` for a crawl.

    Adds the crawl's ``worker``, ``spider`` and ``job`` to every line. With
    ``-s LOG_JSON_ENABLED=True`` the few lines Scrapy logs before the
    crawler exists stay text; with ``LOG_JSON_ENABLED=1`` in the
    environment every line is JSON (see :func:`install_from_environment`).

    Settings: ``LOG_JSON_ENABLED`` (default False; NotConfigured when off),
    ``FRONTIER_WORKER_ID`` (see :func:`crawler.config.worker_id`).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Install the formatter; raise NotConfigured when switched off."""
        if not FrontierConfig.of(crawler).log_json_enabled:
            raise NotConfigured  # off by default: nothing to warn about
        ext = cls(crawler)
        install(ext.fields())
        crawler.signals.connect(ext.engine_started, signal=signals.engine_started)
        return ext

    def fields(self) -> dict[str, Any]:
        """The crawl's constant fields: worker, spider, job."""
        return {
            "worker": worker_id(self.crawler.settings),
            "spider": spider_name_of(self.crawler),
            "job": job_id(self.crawler),
        }

    def engine_started(self) -> None:
        """Refresh the fields (the job id is known once the spider exists)."""
        install(self.fields())
