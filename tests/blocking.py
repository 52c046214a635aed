"""A callback that blocks the reactor, for tests: a response whose URL is
in the environment variable ``BLOCK_URLS`` (space-separated) blocks the
worker's reactor for ``BLOCK_SECONDS`` seconds (``time.sleep``: a long
synchronous parse), every time it is parsed.

:class:`BlockOnUrlMiddleware` is a spider middleware (it blocks before the
callback runs, on the reactor)."""

from __future__ import annotations

import os
import time
from typing import Any


class BlockOnUrlMiddleware:
    """Blocks the reactor on a listed response."""

    def process_spider_input(self, response: Any) -> None:
        if response.url in os.environ.get("BLOCK_URLS", "").split():
            time.sleep(float(os.environ.get("BLOCK_SECONDS", "0")))
