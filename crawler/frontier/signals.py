"""Signals of the frontier, sent through ``crawler.signals``."""

from __future__ import annotations

__all__ = ["request_dead"]

#: A request has failed for good and belongs in the dead-letter queue.
#: Arguments: ``request`` (scrapy.Request), ``reason`` (str, e.g. "gave up
#: after 3 attempts: 500 Internal Server Error"), ``error`` (str or None, the
#: last error). The scheduler records it in ``{<spider>}:dead``.
request_dead = object()
