"""Spider and downloader middlewares of the crawler."""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from scrapy import Request
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.response import response_status_message

from crawler.config import FrontierConfig
from crawler.frontier.clock import CLOCK
from crawler.frontier.scheduler import RETRY_DELAY_META, REVISIT_META
from crawler.frontier.signals import request_dead, request_fetched
from crawler.frontier.sites import SEED_HOSTS_META as META_KEY
from crawler.frontier.sites import on_sites, site_of, tag_seed
from crawler.storage import (
    ItemIds,
    ItemSources,
    collection_of,
    derive_item_id,
    store_of,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

__all__ = [
    "DONT_DEAD_LETTER_META",
    "BackoffRetryMiddleware",
    "DeadLettered",
    "ItemIdMiddleware",
    "RevisitMiddleware",
    "SeedHostsMiddleware",
    "backoff_delay",
    "tag_seed",
]

#: Request meta key: the component that sent this request handles its
#: failure itself (the robots.txt fetch), so no dead letter is made of it.
DONT_DEAD_LETTER_META = "dont_dead_letter"


class SeedHostsMiddleware:
    """Keep every crawl on the hosts of the seed it started from.

    Each request from ``Spider.start()`` (a seed) gets ``meta["seed_hosts"]``
    = ``[its host]`` (with the port when not the default one); when a seed's
    response comes from another host after redirects, that host is added.
    Requests a callback yields inherit the list and are dropped when their
    host is neither one of those hosts nor a subdomain of one (the rule of
    Scrapy's ``allowed_domains``). Requests with
    no ``seed_hosts`` (and whose response has none) are left alone.

    Works across workers with no shared state: the list travels in meta.
    Enable it as a spider middleware and, to also stop redirects that leave
    the hosts, as a downloader middleware.

    Setting: ``FRONTIER_STAY_ON_SEED_HOSTS`` (default True).
    Stats: ``offsite/filtered``, ``offsite/domains`` (as Scrapy's
    OffsiteMiddleware counts them).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._logged: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build from ``crawler``; raise NotConfigured when switched off."""
        if not FrontierConfig.of(crawler).stay_on_seed_hosts:
            logger.info("SeedHostsMiddleware off: FRONTIER_STAY_ON_SEED_HOSTS is False")
            raise NotConfigured  # (switched off on purpose: no WARNING)
        return cls(crawler)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Tag each request from ``Spider.start()`` as a seed."""
        async for item_or_request in start:
            if isinstance(item_or_request, Request):
                tag_seed(item_or_request)
            yield item_or_request

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """Pass items on; drop requests that leave the seed's hosts."""
        hosts = self._hosts_for(response)
        async for item_or_request in result:
            if hosts is None or not isinstance(item_or_request, Request):
                yield item_or_request
                continue
            if self._allow(item_or_request, hosts):
                yield item_or_request

    def process_spider_output_sync(
        self, response: Response, result: Iterable[Any]
    ) -> Iterable[Any]:
        """Synchronous twin of :meth:`process_spider_output`."""
        hosts = self._hosts_for(response)
        for item_or_request in result:
            if (
                hosts is None
                or not isinstance(item_or_request, Request)
                or self._allow(item_or_request, hosts)
            ):
                yield item_or_request

    def process_request(self, request: Request) -> None:
        """As a downloader middleware: drop redirects that leave the hosts.

        A seed (depth 0) may redirect anywhere; the host it lands on joins
        its hosts. A deeper request redirected off the seed's hosts is
        ignored, as Scrapy's OffsiteMiddleware ignores it.

        :raises scrapy.exceptions.IgnoreRequest: for such a redirect.
        """
        hosts = request.meta.get(META_KEY)
        if (
            hosts is not None
            and request.meta.get("redirect_times")
            and request.meta.get("depth", 0) > 0
            and not on_sites(request, hosts)
        ):
            self._filtered(request)
            raise IgnoreRequest(f"redirected off the seed's hosts: {request.url}")

    def _allow(self, request: Request, hosts: list[str]) -> bool:
        """Whether ``request`` stays on ``hosts``; tag it with them if so."""
        if on_sites(request, hosts):
            request.meta[META_KEY] = hosts
            return True
        self._filtered(request)
        return False

    def _hosts_for(self, response: Response) -> list[str] | None:
        hosts: list[str] | None = response.meta.get(META_KEY)
        if hosts is None:
            return None
        host = site_of(response)
        if host and not on_sites(response, hosts):
            # Only a seed (depth 0) may move the crawl to a new host, by
            # redirecting there; deeper redirects off-site were filtered.
            if response.meta.get("depth", 0) == 0:
                hosts = [*hosts, host]
        return hosts

    def _filtered(self, request: Request) -> None:
        stats = self.crawler.stats
        assert stats is not None
        stats.inc_value("offsite/filtered")
        host = site_of(request)
        if host not in self._logged:
            self._logged.add(host)
            stats.inc_value("offsite/domains")
            logger.debug(
                "Filtered offsite request to %r: %s", host, request,
                extra={"spider": self.crawler.spider},
            )


def backoff_delay(attempt: int, base: float, cap: float, jitter: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first).

    Exponential backoff with jitter: ``min(cap, base * 2 ** (attempt - 1))``
    stretched by a random factor in ``[1, 1 + jitter]``, so a retry never comes
    earlier than the configured backoff and retries of many requests spread out
    (the "exponential backoff and jitter" scheme of AWS's architecture blog).
    """
    delay: float = min(cap, base * 2 ** max(0, attempt - 1))
    return delay * (1 + random.uniform(0, jitter))  # noqa: S311 - not crypto


def retry_after(value: bytes | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (RFC 9110, section 10.2.3).

    Accepts delay-seconds or an HTTP-date; returns None when absent or bad.
    """
    if not value:
        return None
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


#: Meta key: the reason a request was dead-lettered with (set at give-up).
_DEAD_REASON_META = "frontier_dead_reason"


class DeadLettered(IgnoreRequest):
    """A request's download failed for good and it is in the dead letters:
    Scrapy logs an ``IgnoreRequest`` without a traceback (the scheduler
    logged the dead letter's one line)."""


class BackoffRetryMiddleware(RetryMiddleware):
    """Scrapy's RetryMiddleware, with retries that wait in Redis.

    What is retried is Scrapy's choice (``RETRY_HTTP_CODES``, 500, 502, 503,
    504, 522, 524, 408 and 429 by default; ``RETRY_EXCEPTIONS``, network errors
    and timeouts), up to ``RETRY_TIMES`` (meta ``max_retry_times``). The
    retry, instead of going back to the queue at once, carries
    ``meta["frontier_retry_delay"]``: the scheduler holds it in the frontier's
    retry set that long, so any worker takes it when it is due and it
    survives the worker that failed it. The delay is :func:`backoff_delay`
    with ``FRONTIER_RETRY_BACKOFF_BASE`` (seconds, 1.0),
    ``FRONTIER_RETRY_BACKOFF_MAX`` (seconds, 60.0) and
    ``FRONTIER_RETRY_JITTER`` (fraction, 0.1), or what the response's
    ``Retry-After`` header asks, up to ``FRONTIER_RETRY_AFTER_MAX`` (seconds,
    600.0), when that is longer.

    A request that exhausts its retries is sent with the
    :data:`~crawler.frontier.signals.request_dead` signal, and the scheduler
    writes it to the dead-letter queue with the reason and attempt count;
    unless its meta has ``dont_dead_letter`` (:data:`DONT_DEAD_LETTER_META`):
    its failure is then left to the component that sent it.

    A dead letter is logged in one line, by the scheduler (``Dead letter
    for <url>: <reason>``): Scrapy's own give-up line is logged at DEBUG
    unless the project sets ``RETRY_GIVE_UP_LOG_LEVEL``, and a download
    error of a request without an errback ends as :class:`DeadLettered` (an
    ``IgnoreRequest``, which Scrapy logs without a traceback); a request
    with an errback gets the download error itself, as with Scrapy.
    """

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        if (settings.getpriority("RETRY_GIVE_UP_LOG_LEVEL") or 0) <= 0:
            # The dead letter's own line says it (and what to do).
            self.give_up_log_level = logging.DEBUG
        config = FrontierConfig.from_settings(settings)
        self.base = config.retry_backoff_base
        self.cap = config.retry_backoff_max
        self.jitter = config.retry_jitter
        self.after_max = config.retry_after_max

    def process_response(self, request: Request, response: Response) -> Any:  # type: ignore[override]
        """Retry a response whose status is in ``RETRY_HTTP_CODES``, later."""
        if request.meta.get("dont_retry", False) or response.status not in self.retry_http_codes:
            return response
        reason = response_status_message(response.status)
        wait = retry_after(response.headers.get(b"Retry-After"))
        retry = self._retry_later(request, reason, wait)
        request.meta.pop(_DEAD_REASON_META, None)
        return retry or response

    def process_exception(self, request: Request, exception: Exception) -> Any:  # type: ignore[override]
        """Retry a download error in ``RETRY_EXCEPTIONS``, later.

        Any other download error (an invalid request, say) is final: the
        request becomes a dead letter, so it is not lost silently.
        ``IgnoreRequest`` (robots.txt, offsite) is a decision, not an error.
        """
        if isinstance(exception, IgnoreRequest):
            return None
        if isinstance(exception, self.exceptions_to_retry) and not request.meta.get(
            "dont_retry", False
        ):
            retry = self._retry_later(request, exception, None)
            dead = request.meta.pop(_DEAD_REASON_META, None)
            if retry is None and dead is not None and request.errback is None:
                raise DeadLettered(dead)
            return retry
        if request.meta.get(DONT_DEAD_LETTER_META, False):
            return None
        reason = f"download failed: {type(exception).__name__}: {exception}"
        self.crawler.signals.send_catch_log(
            request_dead, request=request, reason=reason, error=repr(exception),
        )
        if request.errback is None:
            raise DeadLettered(reason)
        return None

    def _retry_later(
        self, request: Request, reason: str | Exception, wait: float | None
    ) -> Request | None:
        retry = self._retry(request, reason)
        if retry is None:
            if request.meta.get(DONT_DEAD_LETTER_META, False):
                return None
            attempts = request.meta.get("retry_times", 0) + 1
            text = f"gave up after {attempts} attempts: {reason}"
            self.crawler.signals.send_catch_log(
                request_dead, request=request, reason=text, error=str(reason),
            )
            request.meta[_DEAD_REASON_META] = text  # (after: not in the dead letter)
            return None
        delay = backoff_delay(retry.meta["retry_times"], self.base, self.cap, self.jitter)
        if wait is not None:
            delay = max(delay, min(wait, self.after_max))
        retry.meta[RETRY_DELAY_META] = delay
        return retry


class ItemIdMiddleware:
    """Give each item without a natural key an ``_id`` its redelivery repeats.

    Delivery is at least once: a worker killed after storing a response's
    items, before acknowledging its lease, leaves the response to be
    processed again. Items with a natural key (``key`` class attribute,
    :mod:`crawler.items`) are then updated by that key; this middleware
    gives the others the same stability. For each item of a callback's
    output that has no ``key`` and no ``_id`` of its own, in the order the
    callback yields them, it derives
    :func:`~crawler.storage.derive_item_id` from the spider's name,
    Scrapy's fingerprint of ``response.request``
    (``crawler.request_fingerprinter``), the item's collection and class,
    and its rank among that output's items of the same collection and class.
    :class:`~crawler.pipelines.MongoPipeline` stores the item under that
    ``_id`` (through :class:`~crawler.storage.ItemIds`; the item itself is
    not changed), so the second delivery updates the document the first one
    stored: ``first_seen`` kept, ``last_seen`` advanced.

    The id is as stable as the callback: the same response yielding the same
    items in the same order gives the same ids. Recrawling the same URL later
    therefore updates those documents too, as it updates keyed ones. Items
    from ``start()`` (no response) get none, and the pipeline mints an
    ObjectId for them.

    Sits near the engine (``SPIDER_MIDDLEWARES``, 40), so that it sees the
    items that spider middlewares closer to the spider let through.

    Setting: ``MONGO_ITEM_IDS_ENABLED`` (default True; NotConfigured when
    off). Stats: ``mongo/ids/forgotten`` (ids dropped because more than
    ``ItemIds.CAPACITY`` items were between this middleware and the
    pipeline; those items get a minted ObjectId).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.ids = ItemIds.of(crawler)
        #: With revisits on, every item's source too (see ItemSources).
        self.sources = (
            ItemSources.of(crawler)
            if FrontierConfig.of(crawler).revisit_after > 0 else None
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build from ``crawler``; raise NotConfigured when switched off."""
        if not FrontierConfig.of(crawler).mongo_item_ids_enabled:
            logger.info("ItemIdMiddleware off: MONGO_ITEM_IDS_ENABLED is False")
            raise NotConfigured  # (switched off on purpose: no WARNING)
        return cls(crawler)

    def process_spider_output(
        self, response: Response | None, result: Iterable[Any]
    ) -> Iterable[Any]:
        """Derive the ids of ``response``'s items without a key; pass everything on."""
        tag = self._tagger(response)
        for item_or_request in result:
            tag(item_or_request)
            yield item_or_request

    async def process_spider_output_async(
        self, response: Response | None, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """Asynchronous twin of :meth:`process_spider_output` (Scrapy 2.13+)."""
        tag = self._tagger(response)
        async for item_or_request in result:
            tag(item_or_request)
            yield item_or_request

    def _tagger(self, response: Response | None) -> Callable[[Any], None]:
        """A function that derives the id of each item of ``response``'s
        output in turn (one counter per collection and class)."""
        request = getattr(response, "request", None)
        spider = self.crawler.spider
        if request is None or spider is None:
            return _leave
        fingerprinter = self.crawler.request_fingerprinter
        # (derived at the first item: most pages of a crawl yield only
        # requests, and a request leased from Redis is a new object, whose
        # fingerprint Scrapy's fingerprinter has not cached)
        known: list[bytes] = []

        def fingerprint() -> bytes:
            if not known:
                known.append(fingerprinter.fingerprint(request))
            return known[0]

        ranks: dict[tuple[str, str], int] = {}
        sources = self.sources

        def tag(output: Any) -> None:
            if sources is not None and not isinstance(output, Request) and ItemAdapter.is_item(
                output
            ):
                sources.put(output, fingerprint().hex())
            if (
                isinstance(output, Request)
                or getattr(output, "key", None)
                or not ItemAdapter.is_item(output)
                or ItemAdapter(output).get("_id") is not None
            ):
                return
            cls = type(output)
            where = (collection_of(output, spider.name), f"{cls.__module__}.{cls.__qualname__}")
            rank = ranks.get(where, 0)
            ranks[where] = rank + 1
            item_id = derive_item_id(spider.name, fingerprint(), *where, rank)
            forgotten = self.ids.put(output, item_id)
            if forgotten:
                self.crawler.stats.inc_value("mongo/ids/forgotten", forgotten)

        return tag


class RevisitMiddleware:
    """Revisit every fetched page with a conditional GET (``FRONTIER_REVISIT_AFTER``).

    A downloader middleware. For each response of 2xx to a request the
    frontier leased, it sends the signal
    :data:`~crawler.frontier.signals.request_fetched` with the response's
    validators (``ETag``, ``Last-Modified``); the scheduler commits a revisit
    with the request's ack, due ``FRONTIER_REVISIT_AFTER`` seconds later
    (or the site's override, ``scrapy frontier revisit``). The revisit comes
    back with the validators in ``meta["frontier_revisit"]``, and this
    middleware sends them as ``If-None-Match`` / ``If-Modified-Since``
    (RFC 9110, sections 13.1.2 and 13.1.3).

    * **304 Not Modified** to such a conditional request: the callback is not
      run (``IgnoreRequest``); the documents the page yielded before (found
      by their :data:`~crawler.storage.SOURCE_FIELD`) get ``last_seen``
      and ``fetched_at`` raised to now (:meth:`crawler.storage.ItemStore.touch`
      of the crawl's item store, such as ``MongoPipeline``), and the next
      revisit is scheduled with the same validators. When the store fails
      for that update, the request becomes a dead letter (``scrapy
      deadletters requeue`` sends it again, conditionally).
    * **200** to a revisit: the callback runs as for any response, and the
      new validators replace the old ones.
    * A 304 to a request that was not conditional is left to Scrapy (its
      HttpErrorMiddleware drops it); a failed download to the retry and
      dead-letter path.

    Enable it near Scrapy's RedirectMiddleware (``DOWNLOADER_MIDDLEWARES``,
    570: it sees the final response of a redirect chain, before the
    retry middleware). NotConfigured when ``FRONTIER_REVISIT_AFTER`` is 0.

    Stats: ``revisit/not_modified`` (304s), ``revisit/modified`` (200s to a
    revisit), ``revisit/touched`` (documents whose ``last_seen`` a 304
    raised), ``revisit/touch_failed``.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build from ``crawler``; raise NotConfigured when revisits are off
        (their default: logged at DEBUG, where Scrapy would warn of every
        crawl that did not turn them on)."""
        if FrontierConfig.of(crawler).revisit_after <= 0:
            logger.debug("Disabled %s: FRONTIER_REVISIT_AFTER is 0", cls.__name__)
            raise NotConfigured
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        """Send a revisit's validators as conditional headers."""
        validators = request.meta.get(REVISIT_META)
        if validators:
            if validators.get("etag"):
                request.headers[b"If-None-Match"] = validators["etag"]
            if validators.get("modified"):
                request.headers[b"If-Modified-Since"] = validators["modified"]

    async def process_response(self, request: Request, response: Response) -> Response:
        """Schedule the next revisit of a fetched page; stop a 304 before the callback.

        :raises scrapy.exceptions.IgnoreRequest: for a 304 to a revisit.
        """
        stats = self.crawler.stats
        assert stats is not None
        validators: dict[str, str] = request.meta.get(REVISIT_META) or {}
        conditional = bool(validators) and (
            b"If-None-Match" in request.headers or b"If-Modified-Since" in request.headers
        )
        if response.status == 304 and conditional:
            stats.inc_value("revisit/not_modified")
            if await self._touch(request):
                self._fetched(request, validators)
            raise IgnoreRequest(f"not modified since the last visit: {request.url}")
        if 200 <= response.status < 300:
            if REVISIT_META in request.meta:
                stats.inc_value("revisit/modified")
            fresh = {}
            for name, header in (("etag", b"ETag"), ("modified", b"Last-Modified")):
                value = response.headers.get(header)
                if value:
                    fresh[name] = value.decode("latin-1")
            self._fetched(request, fresh)
        return response

    def _fetched(self, request: Request, validators: dict[str, str]) -> None:
        self.crawler.signals.send_catch_log(
            request_fetched, request=request, validators=validators
        )

    async def _touch(self, request: Request) -> bool:
        """Raise ``last_seen`` of what ``request``'s page yielded, in the
        crawl's item store (:func:`crawler.storage.store_of`; none: nothing
        to do); False (and a dead letter) when the store failed."""
        store = store_of(self.crawler)
        if store is None:
            return True
        source = self.crawler.request_fingerprinter.fingerprint(request).hex()
        try:
            changed = await asyncio.to_thread(store.touch, source, CLOCK.utcnow())
        except store.errors as exc:
            self.crawler.stats.inc_value("revisit/touch_failed")
            self.crawler.signals.send_catch_log(
                request_dead, request=request,
                reason=f"304 not recorded in {store.name}: {type(exc).__name__}: {exc}",
                error=repr(exc),
            )
            return False
        self.crawler.stats.inc_value("revisit/touched", changed)
        return True


def _leave(output: Any) -> None:
    """No id to derive (output with no response)."""
