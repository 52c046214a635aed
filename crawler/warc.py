"""WARC archive of every exchange a worker has with the sites (WARC 1.1).

With ``WARC_DIR`` set, :class:`WarcWriterMiddleware` writes each response a
worker downloads, robots.txt and redirects included, as a ``response``
record and its request as a ``request`` record (``WARC-Concurrent-To`` the
response), with warcio, in the format of the WARC 1.1 standard (ISO
28500:2017, https://iipc.github.io/warc-specifications/). Each record is its
own gzip member, flushed to the file as soon as it is written, so a killed
worker leaves a file readable up to its last complete record.

Files, one series per worker, in ``WARC_DIR``::

    <spider>-<worker id>-<start, UTC yyyymmddHHMMSS>-<serial, 00000>.warc.gz

(the worker id of :func:`crawler.config.worker_id`, ``host:pid`` by
default, with characters other than letters, digits, ``.``, ``_`` and
``-`` replaced by ``_``). A file is written as ``NAME.warc.gz.open`` and
renamed to ``NAME.warc.gz`` when it is closed, as Heritrix does: a file
still ending in ``.open`` belonged to a worker that was killed (it is
readable, up to its last complete record). Each file starts with a
``warcinfo`` record naming the crawl (spider, worker, job, software
versions, the settings that shape what was fetched). Once a file holds
``WARC_MAX_SIZE`` bytes or more it is closed, and the next record opens the
next serial, so a file exceeds the limit by at most one record.

What is recorded is what Scrapy keeps of the wire: the status line (the
protocol Scrapy saw, the code and its standard reason phrase; Scrapy keeps
no reason phrase), the headers (names in Scrapy's capitalisation), and the
body as it came from the download handler: the middleware sits right after
the download handler (priority 950, past HttpCacheMiddleware's 900), so the
body is still content-encoded (gzip, br, ...) when its ``Content-Encoding``
header says so; HttpCompressionMiddleware (590) decodes it later. The
download handler does undo chunked transfer coding, so a
``Transfer-Encoding`` header is left out of the record (its payload is the
de-chunked body, whose length the record states). The request record holds
the request line, the headers Scrapy sent (``Host`` added when Scrapy left
it to the handler) and the body. ``WARC-IP-Address`` is the server's
address when the handler reports it.

Writing happens in one thread of the worker's own (records in the order
the responses arrived), off the reactor: compressing and digesting a large
body takes milliseconds that the crawl should not wait for. The files are
closed when the spider closes: at the end of the crawl and on the first
SIGTERM or SIGINT (Scrapy's graceful shutdown).

Settings: ``WARC_DIR`` (default "": off, NotConfigured), ``WARC_MAX_SIZE``
(bytes, default 1,000,000,000: 1 GB, Heritrix's default).
Stats: ``warc/records``, ``warc/bytes`` (compressed bytes written),
``warc/files`` (files opened).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import socket
import tempfile
import time
from dataclasses import dataclass
from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version
from io import BytesIO, FileIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawler.config import FrontierConfig, SettingsError
from crawler.extensions import job_id
from crawler.keys import spider_name_of

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_SIZE",
    "OPEN_SUFFIX",
    "Exchange",
    "WarcFileSeries",
    "WarcWriterMiddleware",
]

#: Default of ``WARC_MAX_SIZE``: 1 GB (10**9 bytes), as Heritrix.
DEFAULT_MAX_SIZE = FrontierConfig().warc_max_size
#: Suffix of a file still being written (or left by a killed worker).
OPEN_SUFFIX = ".open"
#: Response headers that describe the transfer the download handler undid.
_TRANSFER_HEADERS = frozenset({b"transfer-encoding"})
#: Settings named in the warcinfo record (they shape what was fetched).
_INFO_SETTINGS = (
    "ROBOTSTXT_OBEY",
    "DOWNLOAD_DELAY",
    "FRONTIER_DELAY",
    "CONCURRENT_REQUESTS",
    "CONCURRENT_REQUESTS_PER_DOMAIN",
    "FRONTIER_CONCURRENCY",
    "DEPTH_LIMIT",
    "FRONTIER_STAY_ON_SEED_HOSTS",
    "WARC_MAX_SIZE",
)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _check_writable(directory: Path) -> None:
    """Create ``directory`` (with its parents) and create and delete a file
    in it, as the writer will.

    :raises crawler.config.SettingsError: naming ``WARC_DIR``, its value and
        the system's error.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".warc-check-"):
            pass
    except OSError as exc:
        raise SettingsError([
            f"WARC_DIR={str(directory)!r}: must be a directory the worker can create "
            f"and write WARC files in ({exc.strerror or exc})"
        ]) from None


def _versions() -> str:
    """``crawler`` software versions, as the warcinfo ``software`` field."""
    parts = []
    for dist in ("Scrapy", "scrapy-redis", "Twisted", "warcio"):
        try:
            parts.append(f"{dist}/{version(dist)}")
        except PackageNotFoundError:  # pragma: no cover - all are requirements
            continue
    parts.append(f"Python/{platform.python_version()}")
    return "crawler (" + " ".join(parts) + ")"


@dataclass(frozen=True)
class Exchange:
    """One request and its response, as plain data for the writer thread.

    :ivar url: the URL requested (the response's ``WARC-Target-URI``).
    :ivar method: ``GET``, ``HEAD``, ...
    :ivar request_headers: ``(name, value)`` pairs sent, in order.
    :ivar request_body: the request body, bytes.
    :ivar protocol: ``HTTP/1.1`` (what the download handler reported).
    :ivar status: the status code.
    :ivar response_headers: ``(name, value)`` pairs received (less
        ``Transfer-Encoding``).
    :ivar body: the response body as the handler gave it (still
        content-encoded), bytes.
    :ivar ip: the server's IP address, or None when unknown.
    :ivar date: WARC-Date of both records, ISO 8601 UTC with microseconds.
    """

    url: str
    method: str
    request_headers: list[tuple[str, str]]
    request_body: bytes
    protocol: str
    status: int
    response_headers: list[tuple[str, str]]
    body: bytes
    ip: str | None
    date: str

    @classmethod
    def of(cls, request: Request, response: Response) -> Self:
        """Capture ``request`` and ``response`` (no copy of the body).

        :param request: the request as the download handler sent it.
        :param response: its response, before any middleware changed it.
        """
        request_headers = _header_pairs(request.headers.items())
        if not any(name.lower() == "host" for name, _ in request_headers):
            request_headers.insert(0, ("Host", urlsplit(request.url).netloc))
        response_headers = _header_pairs(
            (name, values)
            for name, values in response.headers.items()
            if name.lower() not in _TRANSFER_HEADERS
        )
        ip = getattr(response, "ip_address", None)
        now = time.time()
        date = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + (
            f".{int(now % 1 * 1_000_000):06d}Z"
        )
        return cls(
            url=response.url,
            method=request.method,
            request_headers=request_headers,
            request_body=request.body,
            protocol=getattr(response, "protocol", None) or "HTTP/1.1",
            status=response.status,
            response_headers=response_headers,
            body=response.body,
            ip=str(ip) if ip is not None else None,
            date=date,
        )


def _header_pairs(items: Any) -> list[tuple[str, str]]:
    """Scrapy's ``(bytes name, [bytes value, ...])`` as ``(str, str)`` pairs."""
    pairs = []
    for name, values in items:
        key = name.decode("latin-1")
        for value in values:
            pairs.append((key, value.decode("latin-1")))
    return pairs


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class WarcFileSeries:
    """The gzip WARC files of one worker, rotated by size.

    Not thread-safe: use it from one thread (the middleware's writer).

    :param directory: where the files go (created when missing).
    :param prefix: file names start with it (``<spider>-<worker>``).
    :param max_size: bytes after which a file is closed; >= 1.
    :param info: fields of the ``warcinfo`` record at the start of each file.
    :raises ValueError: if ``max_size`` < 1.
    """

    def __init__(
        self, directory: str | Path, prefix: str, max_size: int, info: dict[str, str]
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1 byte, not {max_size!r}")
        self.directory = Path(directory)
        self.prefix = prefix
        self.max_size = max_size
        self.info = info
        self.started = time.strftime("%Y%m%d%H%M%S", time.gmtime())
        self.serial = -1
        self.closed_files: list[Path] = []
        self._fh: FileIO | None = None
        self._path: Path | None = None
        self._writer: WARCWriter | None = None
        self._size = 0  # bytes in the current file
        # Records are built here, each its own gzip member, then written to
        # the file at once: a killed worker leaves whole records (or, at
        # worst, a torn last one that readers skip).
        self._buffer = BytesIO()

    @property
    def current(self) -> Path | None:
        """The ``.open`` file being written, or None."""
        return self._path

    def _open(self) -> int:
        """Open the next file and write its warcinfo; returns its bytes."""
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            self.serial += 1
            name = f"{self.prefix}-{self.started}-{self.serial:05d}.warc.gz"
            path = self.directory / (name + OPEN_SUFFIX)
            if (self.directory / name).exists():
                continue
            try:
                # Unbuffered: each record goes to the file in one write().
                fh = open(path, "xb", buffering=0)
            except FileExistsError:
                continue
            break
        self._fh, self._path, self._size = fh, path, 0
        self._writer = WARCWriter(self._buffer, gzip=True, warc_version="1.1")
        self._writer.write_record(self._writer.create_warcinfo_record(name, self.info))
        written = self._flush()
        logger.info("WARC file %s opened", path)
        return written

    def _flush(self) -> int:
        """Move the records built in the buffer to the file, in one
        ``write()`` when the system allows; returns the bytes written."""
        assert self._fh is not None
        data = memoryview(self._buffer.getbuffer())
        try:
            done = 0
            while done < len(data):
                done += self._fh.write(data[done:]) or 0
        finally:
            data.release()
            self._buffer.seek(0)
            self._buffer.truncate()
        self._size += done
        return done

    def write(self, exchange: Exchange) -> tuple[int, int, int]:
        """Write the response and request records of ``exchange``.

        :returns: ``(records, bytes, files opened)`` written by this call
            (the warcinfo record of a new file counts).
        :raises OSError: if the file cannot be opened or written.
        """
        opened = records = 0
        written = 0
        if self._fh is None:
            written += self._open()
            opened += 1
            records += 1
        assert self._fh is not None and self._writer is not None
        writer = self._writer
        response_headers = {"WARC-Date": exchange.date}
        if exchange.ip:
            response_headers["WARC-IP-Address"] = exchange.ip
        status_line = f"{exchange.status} {_reason(exchange.status)}".rstrip()
        response = writer.create_warc_record(
            exchange.url,
            "response",
            payload=BytesIO(exchange.body),
            length=len(exchange.body),
            warc_headers_dict=response_headers,
            http_headers=StatusAndHeaders(
                status_line, exchange.response_headers, protocol=exchange.protocol
            ),
        )
        target = urlsplit(exchange.url)
        path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        request = writer.create_warc_record(
            exchange.url,
            "request",
            payload=BytesIO(exchange.request_body),
            length=len(exchange.request_body),
            warc_headers_dict={"WARC-Date": exchange.date},
            http_headers=StatusAndHeaders(
                f"{exchange.method} {path} {exchange.protocol}",
                exchange.request_headers,
                is_http_request=True,
            ),
        )
        # The response first, then the request WARC-Concurrent-To it.
        writer.write_request_response_pair(request, response)
        written += self._flush()
        records += 2
        if self._size >= self.max_size:
            self.close()
        return records, written, opened

    def close(self) -> Path | None:
        """Close the current file and drop its ``.open`` suffix.

        :returns: the closed file's final path, or None if none was open.
        :raises OSError: if closing or renaming fails.
        """
        fh, path = self._fh, self._path
        if fh is None or path is None:
            return None
        self._fh = self._path = None
        self._writer = None
        fh.close()
        final = path.with_name(path.name.removesuffix(OPEN_SUFFIX))
        os.replace(path, final)
        self.closed_files.append(final)
        logger.info("WARC file %s closed", final)
        return final


class WarcWriterMiddleware:
    """Downloader middleware writing every downloaded response (and its
    request) to WARC files; see the module's documentation.

    Enable it near the download handler (``DOWNLOADER_MIDDLEWARES``, 950)
    so it sees responses before any other middleware changes them.

    :raises NotConfigured: (from :meth:`from_crawler`) ``WARC_DIR`` unset or
        empty.
    """

    def __init__(self, crawler: Crawler, series: WarcFileSeries) -> None:
        self.crawler = crawler
        self.series = series
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="warc-writer")
        self._last: Deferred[None] | None = None
        self._failed = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the middleware; opens no file yet (the first response does).

        :raises NotConfigured: ``WARC_DIR`` is unset or empty.
        :raises crawler.config.SettingsError: ``WARC_DIR`` cannot be created
            or written in (``scrapy crawl`` logs it as a bad setting and
            exits 2 before the crawl starts: an archive asked for and not
            written is no crawl to run).
        """
        settings = crawler.settings
        config = FrontierConfig.of(crawler)
        directory = config.warc_dir
        if not str(directory).strip():
            # (off by default: no WARNING, which Scrapy logs for a reason given)
            logger.debug("WARC archive off: WARC_DIR is not set")
            raise NotConfigured
        max_size = config.warc_max_size
        spider = spider_name_of(crawler)  # the instance's, at open (spider_opened)
        worker = config.worker
        info = {
            "software": _versions(),
            "format": "WARC File Format 1.1",
            "conformsTo": "https://iipc.github.io/warc-specifications/specifications/"
            "warc-format/warc-1.1/",
            "hostname": socket.gethostname(),
            "isPartOf": str(spider),
            "spider": str(spider),
            "worker": worker,
            "robots": "obey" if settings.getbool("ROBOTSTXT_OBEY") else "ignore",
            "http-header-user-agent": str(settings.get("USER_AGENT") or ""),
        }
        for name in _INFO_SETTINGS:
            value = settings.get(name)
            if value is not None:
                info[f"setting-{name}"] = str(value)
        prefix = _UNSAFE.sub("_", f"{spider}-{worker}")
        _check_writable(Path(directory))
        series = WarcFileSeries(directory, prefix, max_size, info)
        mw = cls(crawler, series)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(mw.engine_stopped, signal=signals.engine_stopped)
        return mw

    def spider_opened(self) -> None:
        """Start the writer thread; name the scrapyd job in the warcinfo."""
        name = spider_name_of(self.crawler)
        if name != self.series.info["spider"]:
            worker = self.series.info["worker"]
            self.series.prefix = _UNSAFE.sub("_", f"{name}-{worker}")
            self.series.info["spider"] = self.series.info["isPartOf"] = name
        job = job_id(self.crawler)
        if job:
            self.series.info["job"] = job
        self._pool.start()

    def engine_stopped(self) -> None:
        """Stop the writer thread if the spider never closed (it must not
        keep the process alive)."""
        if self._pool.started:
            self._pool.stop()

    def process_response(self, request: Request, response: Response) -> Response:
        """Queue ``response`` and ``request`` for writing; return ``response``."""
        if not self._pool.started:  # a response after the close: too late
            return response
        exchange = Exchange.of(request, response)
        from twisted.internet import reactor  # noqa: PLC0415 - the installed one

        d: Deferred[tuple[int, int, int]] = deferToThreadPool(
            reactor,
            self._pool,
            self.series.write,
            exchange,
        )
        self._last = d.addCallbacks(self._count, self._write_failed, errbackArgs=(exchange.url,))
        return response

    def _count(self, result: tuple[int, int, int]) -> None:
        records, written, opened = result
        stats = self.crawler.stats
        assert stats is not None
        stats.inc_value("warc/records", records)
        stats.inc_value("warc/bytes", written)
        if opened:
            stats.inc_value("warc/files", opened)

    def _write_failed(self, failure: Any, url: str) -> None:
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("warc/errors")
        if not self._failed:  # the first one in full; the others are counted
            self._failed = True
            logger.error(
                "WARC records of %s not written: %s", url, failure.getErrorMessage()
            )

    async def spider_closed(self) -> None:
        """Write what is queued, close the current file (renamed without
        ``.open``) and stop the writer thread."""
        if not self._pool.started:
            return
        from twisted.internet import reactor  # noqa: PLC0415 - the installed one

        if self._last is not None:
            await maybe_deferred_to_future(self._last)
        try:
            await maybe_deferred_to_future(
                deferToThreadPool(reactor, self._pool, self.series.close)
            )
        except OSError as exc:
            logger.error("WARC file %s not closed cleanly: %s", self.series.current, exc)
        finally:
            self._pool.stop()
