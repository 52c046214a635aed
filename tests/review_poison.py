"""A spider middleware for tests: a response whose URL is in the
environment variable ``REVIEW_POISON`` (space-separated) kills its worker
with SIGKILL before the callback runs, every time (a parser that
segfaults, an out-of-memory kill)."""

from __future__ import annotations

import os
import signal
from typing import Any


class KillOnPoisonMiddleware:
    """Kills the process on a poison response (a spider middleware)."""

    def process_spider_input(self, response: Any) -> None:
        if response.url in os.environ.get("REVIEW_POISON", "").split():
            os.kill(os.getpid(), signal.SIGKILL)
