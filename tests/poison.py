"""A poison request for tests: a request or response whose URL is in the
environment variable ``POISON_URLS`` (space-separated) kills its worker
with SIGKILL, every time (a parser that segfaults, an out-of-memory kill).

:class:`KillOnPoisonMiddleware` is a spider middleware (it kills before the
callback runs) and a downloader middleware (it kills as the download starts,
while the requests leased with it are still held)."""

from __future__ import annotations

import os
import signal
from typing import Any


def _kill_if_poison(url: str) -> None:
    if url in os.environ.get("POISON_URLS", "").split():
        os.kill(os.getpid(), signal.SIGKILL)


class KillOnPoisonMiddleware:
    """Kills the process on a poison request or response."""

    def process_spider_input(self, response: Any) -> None:
        _kill_if_poison(response.url)

    def process_request(self, request: Any) -> None:
        _kill_if_poison(request.url)
