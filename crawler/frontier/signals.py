"""What middlewares tell the frontier: its signals, sent through
``crawler.signals``, and the request meta key of a retry's delay."""

from __future__ import annotations

__all__ = ["RETRY_DELAY_META", "request_dead", "request_fetched"]

#: A request has failed for good and belongs in the dead-letter queue.
#: Arguments: ``request`` (scrapy.Request), ``reason`` (str, e.g. "gave up
#: after 3 attempts: 500 Internal Server Error"), ``error`` (str or None, the
#: last error). The scheduler records it in ``{<spider>}:dead``.
request_dead = object()

#: A request the frontier leased was fetched (a 2xx response, or a 304 to a
#: conditional revisit) and is due again ``FRONTIER_REVISIT_AFTER`` seconds
#: later. Arguments: ``request`` (scrapy.Request, as leased), ``validators``
#: (dict: ``etag`` and/or ``modified``, the ``ETag`` and ``Last-Modified``
#: values, str, to send as ``If-None-Match`` / ``If-Modified-Since``; may be
#: empty). The scheduler commits the revisit with the request's ack.
request_fetched = object()

#: Request meta key: seconds to hold the request in the retry set before it
#: is queued again (set by :class:`crawler.middlewares.BackoffRetryMiddleware`).
RETRY_DELAY_META = "frontier_retry_delay"
