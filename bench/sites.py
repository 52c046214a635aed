"""A fast asyncio HTTP/1.1 server for generated sites, in a background thread.

:class:`devtools.replay.SiteServer` runs one Python thread per connection and
parses each request with :mod:`http.server`; on this 2-core machine that costs
about as much CPU per page as the Scrapy worker it serves, so the benchmark
would partly measure the server. :class:`FastSite` keeps every response
pre-encoded (headers and body) and serves them from one asyncio event loop,
with an optional delay per response for the latency-bound figure.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType

    from devtools.replay import Page

__all__ = ["FastSite", "ServedHit", "flat_site"]

#: The response sent for a path not in the site when ``default_ok`` is set.
_DEFAULT_BODY = b"<!doctype html><html><head><title>ok</title></head><body>ok</body></html>"


@dataclass(frozen=True)
class ServedHit:
    """One request seen by :class:`FastSite`.

    :ivar path: the request target.
    :ivar started: :func:`time.monotonic` when the request line was read.
    :ivar finished: :func:`time.monotonic` when the response was written.
    """

    path: str
    started: float
    finished: float


def _encode(status: int, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} OK"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() != "content-length"]
    lines += [f"Content-Length: {len(body)}", "Connection: keep-alive", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def flat_site(n_pages: int, prefix: str = "/f/") -> dict[str, bytes]:
    """A hub page ``/`` linking to ``n_pages`` leaf pages with no links.

    Every page is known after one fetch, so the crawl runs at full width from
    its first second (the latency-bound figure needs that).

    :returns: ``{path: HTML body}``.
    """
    links = "".join(f'<a href="{prefix}{i}">{i}</a>\n' for i in range(n_pages))
    hub = f"<!doctype html><html><head><title>hub</title></head><body>{links}</body></html>"
    site = {"/": hub.encode()}
    for i in range(n_pages):
        site[f"{prefix}{i}"] = (
            f"<!doctype html><html><head><title>Leaf {i}</title></head>"
            f"<body><p>Leaf page {i} of a flat site.</p></body></html>"
        ).encode()
    return site


class FastSite:
    """Serve pages over HTTP/1.1 (keep-alive) from an asyncio loop in a thread.

    :param pages: ``{path: Page}`` (as :func:`devtools.replay.generated_site`
        builds) or ``{path: HTML bytes}``.
    :param host: address to listen on (``127.0.0.x``).
    :param delay: seconds each response is held before it is sent.
    :param default_ok: answer unknown paths with a small 200 page (else 404).
    """

    def __init__(
        self,
        pages: Mapping[str, Page | bytes],
        *,
        host: str = "127.0.0.1",
        delay: float = 0.0,
        default_ok: bool = False,
    ) -> None:
        html = [("Content-Type", "text/html; charset=utf-8")]
        self._responses: dict[str, bytes] = {}
        for path, page in pages.items():
            if isinstance(page, bytes):
                self._responses[path] = _encode(200, html, page)
            else:
                self._responses[path] = _encode(page.status, page.headers, page.body)
        self._default = _encode(200, html, _DEFAULT_BODY) if default_ok else None
        self._not_found = _encode(404, html, b"not found")
        self.host = host
        self.delay = delay
        self.port = 0
        self._hits: list[ServedHit] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._arrived = threading.Condition()

    # -- life cycle ------------------------------------------------------------

    def start(self) -> None:
        """Start serving; returns once the socket listens."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("FastSite did not start within 10 seconds")

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._server = loop.run_until_complete(
            asyncio.start_server(self._serve, self.host, 0, backlog=1024)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        """Stop serving and join the thread."""
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def shutdown() -> None:
            server.close()
            server.close_clients()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = self._server = None

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

    # -- addresses and hits ----------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8123``."""
        return f"http://{self.host}:{self.port}"

    def hits(self) -> list[ServedHit]:
        """A copy of the requests served so far, in completion order."""
        return list(self._hits)

    def clear_hits(self) -> None:
        """Forget the requests served so far."""
        self._hits = []

    def wait_for_hits(self, count: int, timeout: float) -> bool:
        """Block until ``count`` requests were served; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self._hits) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._arrived.wait(min(left, 0.5))
        return True

    # -- serving ----------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                started = time.monotonic()
                line_end = head.find(b"\r\n")
                parts = head[:line_end].split(b" ")
                path = parts[1].decode("latin-1") if len(parts) > 1 else "/"
                length = 0
                lower = head.lower()
                at = lower.find(b"\r\ncontent-length:")
                if at >= 0:
                    end = lower.find(b"\r\n", at + 2)
                    length = int(lower[at + 17 : end])
                if length:
                    await reader.readexactly(length)
                if self.delay:
                    await asyncio.sleep(self.delay)
                response = self._responses.get(path) or self._default or self._not_found
                writer.write(response)
                self._hits.append(ServedHit(path, started, time.monotonic()))
                if self._hits_waited():
                    with self._arrived:
                        self._arrived.notify_all()
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def _hits_waited(self) -> bool:
        # Notify waiters at most every 64 hits, and on every hit while few
        # arrive (the seed-pickup figure waits for single hits).
        n = len(self._hits)
        return n < 64 or n % 64 == 0
