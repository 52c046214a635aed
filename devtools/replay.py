"""Serve a WARC capture, or a generated site, over real HTTP on 127.0.0.x.

A :class:`SiteServer` is a small threaded HTTP/1.1 server (keep-alive
supported) running in a background thread.  It answers from a mapping of
request path to :class:`Page` and/or from a callback, and records every
request as a :class:`Hit` so tests can check what a crawler fetched, when,
and how many requests it had in flight at once.

:class:`ReplayServer` fills the mapping from a WARC file: each ``response``
record is served, with its captured status, headers and (decoded) body, at
its URL's path and query.  Paths that were not captured answer 404, as the
live site would.

Run ``python -m devtools.replay`` to serve the default capture by hand.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import html
import logging
import os
import signal
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Self

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed

if TYPE_CHECKING:
    from warcio.recordloader import ArcWarcRecord

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_WARC",
    "Hit",
    "Page",
    "ReplayServer",
    "SiteServer",
    "default_warc_path",
    "generated_site",
    "load_warc",
    "load_warcs",
    "main",
    "warc_files",
]

#: The quotes.toscrape.com capture in ``shared/sites`` beside the project checkout.
DEFAULT_WARC = (
    Path(__file__).resolve().parent.parent.parent
    / "shared"
    / "sites"
    / "quotes.toscrape.com.warc.gz"
)

#: Environment variable that overrides :data:`DEFAULT_WARC`.
WARC_ENV = "CRAWLER_SITES_WARC"

#: Captured headers that describe the original transfer, not the content;
#: they are dropped and ``Content-Length`` is recomputed.
_DROPPED_HEADERS = frozenset(
    {
        "transfer-encoding",
        "content-encoding",
        "content-length",
        "connection",
        "keep-alive",
    }
)

#: A handler callback: ``handler(path, nth)`` where ``path`` is the request
#: target (path and query) and ``nth`` is 1 for the first request of that path,
#: 2 for the second, ...; returns the page to send, or None to fall back to
#: the static pages (then 404).
PageHandler = Callable[[str, int], "Page | None"]


def default_warc_path() -> Path:
    """Return the WARC file to replay by default.

    :returns: ``$CRAWLER_SITES_WARC`` when set and non-empty, else
        :data:`DEFAULT_WARC`.  The file is not checked for existence.
    """
    env = os.environ.get(WARC_ENV)
    return Path(env) if env else DEFAULT_WARC


@dataclass(frozen=True)
class Page:
    """One HTTP response to serve.

    :ivar status: HTTP status code, e.g. 200, 308, 404.
    :ivar headers: ``(name, value)`` pairs, in order; must not contain
        ``Content-Length`` (the server computes it from ``body``).
    :ivar body: the entity body, bytes (already decoded: no transfer or
        content encoding).
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """Return the first value of header ``name`` (case-insensitive), or None."""
        lname = name.lower()
        for key, value in self.headers:
            if key.lower() == lname:
                return value
        return None


@dataclass(frozen=True)
class Hit:
    """One request received by a :class:`SiteServer`.

    :ivar path: the request target as sent, path and query (``/page/2/``).
    :ivar method: ``"GET"`` or ``"HEAD"``.
    :ivar host: the ``Host`` header ("" when absent).
    :ivar client: the client address, ``"ip:port"``.
    :ivar started: :func:`time.monotonic` seconds when the request was read.
    :ivar finished: :func:`time.monotonic` seconds when the response was
        ready to send (just before its bytes are written).
    :ivar status: the status code sent (0 if the request failed before a
        response was ready).
    :ivar conditional: the request carried ``If-None-Match`` or
        ``If-Modified-Since``.
    """

    path: str
    method: str
    host: str
    client: str
    started: float
    finished: float
    status: int
    conditional: bool = False

    @property
    def duration(self) -> float:
        """Seconds between reading the request and sending the response."""
        return self.finished - self.started


def _target_of(uri: str) -> str:
    """Return the request target (path and query, no fragment) of an absolute URI.

    A bare ``?`` is kept, as a client sends it: ``http://h/x.eot?#iefix``
    gives ``/x.eot?``.
    """
    uri = uri.split("#", 1)[0]
    scheme_sep = uri.find("://")
    if scheme_sep >= 0:
        rest = uri[scheme_sep + 3 :]
        slash = rest.find("/")
        query = rest.find("?")
        if slash < 0 or (0 <= query < slash):
            # No path ("http://h" or "http://h?q"): the path is "/".
            return "/" + rest[query:] if query >= 0 else "/"
        return rest[slash:]
    return uri or "/"


#: File names :func:`warc_files` takes from a directory: WARC files, gzipped
#: or not, and those a crawl is still writing (or a killed worker left).
WARC_SUFFIXES = (".warc", ".warc.gz", ".warc.open", ".warc.gz.open")

#: Errors warcio raises on a record cut short (a ``.open`` file's last one).
_TORN_RECORD_ERRORS = (ArchiveLoadFailed, zlib.error, EOFError, ValueError, TypeError,
                       AttributeError)


def warc_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Expand WARC paths: files as given, directories to their WARC files.

    :param paths: one path or several; a directory stands for the files in
        it (not below it) whose names end in one of :data:`WARC_SUFFIXES`,
        sorted by name (a crawl's files, ``<spider>-<worker>-<start>-<serial>``,
        then come in the order each worker wrote them).
    :returns: the files, in order, each once.
    :raises FileNotFoundError: if a path does not exist, or a directory
        holds no WARC file.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            found = sorted(p for p in entry.iterdir() if p.name.endswith(WARC_SUFFIXES))
            if not found:
                raise FileNotFoundError(f"no WARC file ({', '.join(WARC_SUFFIXES)}) in {entry}")
            files.extend(found)
        elif entry.exists():
            files.append(entry)
        else:
            raise FileNotFoundError(f"WARC file not found: {entry}")
    return list(dict.fromkeys(files))


def load_warc(path: str | Path) -> dict[str, Page]:
    """Parse the ``response`` records of a WARC file.

    :param path: a ``.warc`` or ``.warc.gz`` file, or one still being
        written (``.open``, see :mod:`crawler.warc`): such a file is read up
        to its last complete record, digests checked, and a torn record
        after it is skipped with a warning.
    :returns: ``{request target: Page}``, the target being the URL's path and
        query (``/``, ``/page/2/``, ``/author/Albert-Einstein``).  Bodies are
        decoded (chunked transfer and content encodings undone); hop-by-hop
        and encoding headers are dropped.  When a target was captured twice
        the first record of the best kind wins (see :func:`load_warcs`).
    :raises OSError: if the file cannot be read.
    :raises warcio.exceptions.ArchiveLoadFailed: if it is not a WARC file.
    """
    pages: dict[str, Page] = {}
    torn_ok = str(path).endswith(".open")
    with open(path, "rb") as fh:
        try:
            for record in ArchiveIterator(fh, check_digests="raise" if torn_ok else False):
                _add_page(pages, record)
        except _TORN_RECORD_ERRORS as exc:
            if not torn_ok:
                raise
            logger.warning("%s ends with a torn record (%s): read up to the one before",
                           path, exc)
    logger.debug("loaded %d pages from %s", len(pages), path)
    return pages


def _add_page(pages: dict[str, Page], record: ArcWarcRecord) -> None:
    """Add a ``response`` record to ``pages`` (other records are skipped)."""
    if record.rec_type != "response" or record.http_headers is None:
        return
    uri = record.rec_headers.get_header("WARC-Target-URI")
    if not uri:
        return
    target = _target_of(uri)
    body = record.content_stream().read()  # read first: a torn record raises here
    status = int(record.http_headers.get_statuscode())
    if target in pages and _rank(status) >= _rank(pages[target].status):
        logger.debug("duplicate WARC record for %s ignored", target)
        return
    headers = [
        (name, value)
        for name, value in record.http_headers.headers
        if name.lower() not in _DROPPED_HEADERS
    ]
    pages[target] = Page(status=status, headers=headers, body=body)


def _rank(status: int) -> int:
    """Which record of a URL replays it (lowest wins): a page (2xx, 3xx but
    304), then a 4xx, then what a crawl meets on its way (5xx before a
    retry, 304 to a revisit)."""
    if 200 <= status < 400 and status != 304:
        return 0
    return 1 if 400 <= status < 500 else 2


def load_warcs(paths: str | Path | Iterable[str | Path]) -> dict[str, Page]:
    """Parse the ``response`` records of several WARC files (:func:`warc_files`).

    :param paths: files and/or directories of them, e.g. the ``WARC_DIR``
        of a crawl.
    :returns: ``{request target: Page}`` as :func:`load_warc`; of the
        records of a target, the first in file order of the best kind wins
        (a page, then a 4xx, then a 5xx or a 304: a crawl's retries and
        revisits do not hide the page).
    :raises FileNotFoundError: as :func:`warc_files`.
    :raises OSError, warcio.exceptions.ArchiveLoadFailed: as :func:`load_warc`.
    """
    pages: dict[str, Page] = {}
    for file in warc_files(paths):
        for target, page in _load_warc_cached(file).items():
            if target not in pages or _rank(page.status) < _rank(pages[target].status):
                pages[target] = page
    return pages


@functools.lru_cache(maxsize=8)
def _cached_warc(path: str, mtime_ns: int, size: int) -> Mapping[str, Page]:
    """Parse ``path`` once per (path, mtime, size); returns a read-only view."""
    return MappingProxyType(load_warc(path))


def _load_warc_cached(path: str | Path) -> Mapping[str, Page]:
    resolved = Path(path).resolve()
    st = resolved.stat()
    return _cached_warc(str(resolved), st.st_mtime_ns, st.st_size)


def _not_found(path: str) -> Page:
    body = (
        "<!doctype html>\n<html><head><title>404 Not Found</title></head>"
        f"<body><h1>Not Found</h1><p>{html.escape(path)} is not on this site.</p></body></html>\n"
    ).encode()
    return Page(404, [("Content-Type", "text/html; charset=utf-8")], body)


def _server_error() -> Page:
    return Page(500, [("Content-Type", "text/plain; charset=utf-8")], b"handler failed\n")


def _validated(page: Page, request_headers: Any) -> Page:
    """``page`` (a 200) with an ``ETag`` (its own, else a hash of its body),
    or 304 Not Modified when the request's ``If-None-Match`` matches it, or,
    without ``If-None-Match``, when ``If-Modified-Since`` is not before the
    page's ``Last-Modified`` (RFC 9110, sections 13.1.2, 13.1.3, 13.2.2)."""
    if page.status != 200:
        return page
    etag = page.header("ETag")
    headers = list(page.headers)
    if etag is None:
        etag = '"' + hashlib.sha1(page.body).hexdigest()[:20] + '"'  # noqa: S324 - no crypto
        headers.append(("ETag", etag))
    validators = [(n, v) for n, v in headers if n.lower() in ("etag", "last-modified")]
    match = request_headers.get("If-None-Match")
    if match is not None:
        tags = [t.strip().removeprefix("W/") for t in match.split(",")]
        if "*" in tags or etag.removeprefix("W/") in tags:
            return Page(304, validators, b"")
        return Page(page.status, headers, page.body)
    since, modified = request_headers.get("If-Modified-Since"), page.header("Last-Modified")
    if since and modified:
        try:
            if parsedate_to_datetime(modified) <= parsedate_to_datetime(since):
                return Page(304, validators, b"")
        except (TypeError, ValueError):
            pass  # an invalid date: the condition is ignored
    return Page(page.status, headers, page.body)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    site: SiteServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "crawler-replay/1.0"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.site._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.site._track(self.connection, add=False)

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, *, send_body: bool) -> None:
        site = self.server.site
        started = time.monotonic()
        site._enter()
        recorded = False

        def record(status: int) -> None:
            nonlocal recorded
            if not recorded:
                recorded = True
                site._leave(
                    Hit(
                        path=self.path,
                        method=self.command,
                        host=self.headers.get("Host", ""),
                        client=f"{self.client_address[0]}:{self.client_address[1]}",
                        started=started,
                        finished=time.monotonic(),
                        status=status,
                        conditional=any(
                            h in self.headers for h in ("If-None-Match", "If-Modified-Since")
                        ),
                    )
                )

        try:
            page = site._respond(self.path)
            if site.conditional_get:
                page = _validated(page, self.headers)
            # Headers are buffered until end_headers(): nothing reaches the
            # client before the hit is recorded, so a client that has its
            # response always finds the hit in hits().
            self.send_response_only(page.status)
            names = set()
            for name, value in page.headers:
                names.add(name.lower())
                self.send_header(name, value)
            if "date" not in names:
                self.send_header("Date", self.date_time_string())
            if "server" not in names:
                self.send_header("Server", self.version_string())
            self.send_header("Content-Length", str(len(page.body)))
            record(page.status)
            self.end_headers()
            if send_body:
                self.wfile.write(page.body)
            self.wfile.flush()
            self.log_request(page.status, len(page.body))
        finally:
            record(0)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("%s - %s", self.address_string(), format % args)


class SiteServer:
    """A threaded HTTP/1.1 server for tests, running in a background thread.

    Every 200 carries an ``ETag`` (the page's own, else a hash of its body)
    and a conditional GET that matches it (``If-None-Match``, or
    ``If-Modified-Since`` against the page's ``Last-Modified``) gets
    ``304 Not Modified``; set ``conditional_get = False`` on the server (or
    its class) to serve pages as they are.

    :param pages: ``{request target: Page}`` served as is (targets are path
        plus query, e.g. ``/page/2/``); unknown targets answer 404.
    :param handler: ``handler(path, nth)`` called for every request before
        ``pages`` is consulted; ``nth`` counts the requests of that exact
        target, from 1.  A non-None result is sent; None falls through to
        ``pages``.  If it raises, 500 is sent and the error logged.
    :param host: address to listen on; any ``127.0.0.x`` works on Linux.
    :param port: TCP port; a free one is chosen when None (or 0).
    :param latency: seconds slept before answering each request, in the
        request's own thread (simulates a slow site; requests overlap).
    """

    #: Send ETags and answer conditional GETs with 304 (see the class doc).
    conditional_get: bool = True

    def __init__(
        self,
        pages: Mapping[str, Page] | None = None,
        *,
        handler: PageHandler | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        latency: float = 0.0,
    ) -> None:
        if latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, not {latency!r}")
        self._pages: Mapping[str, Page] = pages if pages is not None else {}
        self._handler = handler
        self._host = host
        self._requested_port = port or 0
        self.latency = latency
        self._lock = threading.Lock()
        self._hits: list[Hit] = []
        self._counts: dict[str, int] = {}
        self._active = 0
        self._max_active = 0
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle -----------------------------------------------------------

    def start(self) -> None:
        """Bind the socket and start serving in a daemon thread.

        Returns once the socket listens, so requests made afterwards succeed.
        Does nothing if already started.

        :raises OSError: if the address cannot be bound.
        """
        if self._httpd is not None:
            return
        httpd = _HTTPServer((self._host, self._requested_port), _Handler)
        httpd.site = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"SiteServer-{self._host}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.debug("%s serving on %s", type(self).__name__, self.url)

    def stop(self) -> None:
        """Stop serving, close the listening socket and open connections.

        Blocks until the serving thread has exited.  Does nothing if not
        started.  A stopped server can be started again (on a new free port
        unless a port was given).
        """
        httpd = self._httpd
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:  # wake keep-alive handler threads blocked on read
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join()
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses ------------------------------------------------------------

    @property
    def host(self) -> str:
        """The address the server listens on."""
        return self._host

    @property
    def port(self) -> int:
        """The TCP port; only known after :meth:`start` when chosen automatically.

        :raises RuntimeError: if the port is automatic and not yet bound.
        """
        if self._httpd is not None:
            port: int = self._httpd.server_address[1]
            return port
        if self._requested_port:
            return self._requested_port
        raise RuntimeError("SiteServer not started: its port is not chosen yet")

    @property
    def url(self) -> str:
        """Base URL without trailing slash, e.g. ``http://127.0.0.1:8123``."""
        return f"http://{self._host}:{self.port}"

    def url_for(self, path: str) -> str:
        """Return the absolute URL of ``path`` (``"/page/2/"`` or ``"page/2/"``)."""
        return self.url + (path if path.startswith("/") else "/" + path)

    @property
    def pages(self) -> Mapping[str, Page]:
        """The static pages served (read-only use)."""
        return self._pages

    # -- request log ----------------------------------------------------------

    def hits(self) -> list[Hit]:
        """Return a copy of the requests served so far, in completion order."""
        with self._lock:
            return list(self._hits)

    def clear_hits(self) -> None:
        """Forget recorded hits, per-path counters and the concurrency peak."""
        with self._lock:
            self._hits.clear()
            self._counts.clear()
            self._max_active = self._active

    def max_concurrency(self) -> int:
        """Return the largest number of requests that were being served at once."""
        with self._lock:
            return self._max_active

    # -- internals used by the handler ---------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _enter(self) -> None:
        with self._lock:
            self._active += 1
            self._max_active = max(self._max_active, self._active)

    def _leave(self, hit: Hit) -> None:
        with self._lock:
            self._active -= 1
            self._hits.append(hit)

    def _respond(self, target: str) -> Page:
        """Build the page for ``target`` (path and query as requested)."""
        if target.startswith(("http://", "https://")):  # absolute-form request target
            target = _target_of(target)
        with self._lock:
            nth = self._counts.get(target, 0) + 1
            self._counts[target] = nth
        if self.latency > 0:
            time.sleep(self.latency)
        if self._handler is not None:
            try:
                page = self._handler(target, nth)
            except Exception:
                logger.exception("SiteServer handler failed for %s", target)
                return _server_error()
            if page is not None:
                return page
        page = self._pages.get(target)
        if page is None and target.endswith("?"):  # "/x?" and "/x" are the same resource
            page = self._pages.get(target[:-1])
        return page if page is not None else _not_found(target)


class ReplayServer(SiteServer):
    """A :class:`SiteServer` answering from a WARC capture.

    The WARC is parsed once per file (and modification time) per process;
    later servers of the same file share the parsed pages.

    :param warc: the WARC file, several files, or directories of them (the
        ``WARC_DIR`` a crawl wrote, ``.open`` files included; see
        :func:`load_warcs`); :func:`default_warc_path` when None.
    :param kwargs: passed to :class:`SiteServer` (``handler``, ``host``,
        ``port``, ``latency``).
    :raises FileNotFoundError: if a WARC file does not exist, or a
        directory holds none.
    """

    def __init__(
        self,
        warc: str | Path | Sequence[str | Path] | None = None,
        *,
        handler: PageHandler | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        latency: float = 0.0,
    ) -> None:
        if warc is None:
            warc = default_warc_path()
        #: The files served, in the order their records count.
        self.warcs = warc_files(warc)
        #: The WARC path given (the first one when several).
        self.warc = Path(warc) if isinstance(warc, (str, Path)) else Path(warc[0])
        pages = (
            _load_warc_cached(self.warcs[0])
            if len(self.warcs) == 1
            else MappingProxyType(load_warcs(self.warcs))
        )
        super().__init__(pages, handler=handler, host=host, port=port, latency=latency)


def _page_html(title: str, description: str, text: str, links: list[str]) -> bytes:
    items = "\n".join(
        f'    <li><a href="{html.escape(href)}">{html.escape(href)}</a></li>' for href in links
    )
    return (
        "<!doctype html>\n<html>\n<head>\n"
        '  <meta charset="utf-8">\n'
        f"  <title>{html.escape(title)}</title>\n"
        f'  <meta name="description" content="{html.escape(description)}">\n'
        "</head>\n<body>\n"
        f"  <h1>{html.escape(title)}</h1>\n"
        f"  <p>{html.escape(text)}</p>\n"
        f"  <ul>\n{items}\n  </ul>\n"
        "</body>\n</html>\n"
    ).encode()


#: The one external link of every generated page; a correct crawl never fetches it.
EXTERNAL_LINK = "http://example.invalid/x"


def generated_site(
    n_pages: int, *, links_per_page: int = 5, prefix: str = "/p/"
) -> dict[str, Page]:
    """Build a deterministic synthetic HTML site shaped as a tree.

    ``/`` links to ``{prefix}0``; page ``i`` links to its children
    ``i*links_per_page + 1`` … ``i*links_per_page + links_per_page`` (those
    below ``n_pages``), so every page is reachable from ``/``.  Each page has
    ``<title>Page i</title>``, a meta description, a paragraph of text, a link
    back to ``/`` and the external link :data:`EXTERNAL_LINK`.

    :param n_pages: number of ``{prefix}i`` pages (``/`` comes in addition).
    :param links_per_page: children per page, >= 1.
    :param prefix: path prefix of the pages.
    :returns: ``{path: Page}`` with ``n_pages + 1`` entries, all status 200
        ``text/html; charset=utf-8``.
    :raises ValueError: if ``n_pages < 0`` or ``links_per_page < 1``.
    """
    if n_pages < 0:
        raise ValueError(f"n_pages must be >= 0, not {n_pages}")
    if links_per_page < 1:
        raise ValueError(f"links_per_page must be >= 1, not {links_per_page}")
    headers = [("Content-Type", "text/html; charset=utf-8")]
    site: dict[str, Page] = {}
    root_links = [f"{prefix}0"] if n_pages > 0 else []
    site["/"] = Page(
        200,
        list(headers),
        _page_html(
            "Home",
            "Generated test site home page",
            f"A site of {n_pages} pages.",
            root_links,
        ),
    )
    for i in range(n_pages):
        first = i * links_per_page + 1
        children = [f"{prefix}{j}" for j in range(first, min(first + links_per_page, n_pages))]
        body = _page_html(
            f"Page {i}",
            f"Description of generated page {i}",
            f"This is page number {i} of {n_pages}. It has {len(children)} child pages.",
            [*children, "/", EXTERNAL_LINK],
        )
        site[f"{prefix}{i}"] = Page(200, list(headers), body)
    return site


def main(argv: list[str] | None = None) -> int:
    """Serve a WARC capture until SIGINT/SIGTERM (``python -m devtools.replay``).

    :param argv: command-line arguments (default ``sys.argv[1:]``).
    :returns: the process exit status, 0.
    """
    parser = argparse.ArgumentParser(description="Replay a WARC capture over HTTP.")
    parser.add_argument(
        "--warc",
        type=Path,
        action="append",
        default=None,
        metavar="PATH",
        help="a WARC file, or a directory of them (a crawl's WARC_DIR); repeat for "
        "several; a URL replays its page rather than a 5xx or 304 met on the way "
        f"(default: {default_warc_path()})",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=None, help="TCP port (default: a free one)")
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds to wait before each answer"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        server = ReplayServer(args.warc, host=args.host, port=args.port, latency=args.latency)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Explicit handlers: a background job inherits SIGINT as ignored.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    server.start()
    shown = str(server.warc) if len(server.warcs) == 1 else f"{len(server.warcs)} WARC files"
    print(f"Serving {shown} ({len(server.pages)} pages) at {server.url}/", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
