"""Politeness shared by all workers: robots.txt once per cluster, adaptive slowing.

Both downloader middlewares tell the frontier a site's inputs through its
calls (:class:`~crawler.frontier.store.Frontier`'s ``robots_fetched``,
``robots_down``, ``open_slot``, ``set_slow``), never by writing its indexes;
the frontier keeps them in per-site hashes, which the site policy
(``lua/lib.lua``'s ``site_policy``, :mod:`crawler.frontier.policy`) reads
when it paces a site:

* ``{<spider>}:rdelay``: site -> ``Crawl-delay`` of its robots.txt, ms;
* ``{<spider>}:slow``: site -> extra delay after 429/503 or slow responses, ms.

A site's delay between two requests, across all workers, is then
``max(FRONTIER_DELAY or its {s}:delay override, its Crawl-delay) + its slow
delay``, times ``1 + FRONTIER_DELAY_MARGIN`` (:class:`crawler.frontier.policy.Policy`).

robots.txt itself is kept in ``{<spider>}:robots`` (site -> ``fetched\\nbody``,
the body compacted to the rules for the crawl's user agent: :func:`compact_robots`)
and, while a site's robots.txt cannot be reached, ``{<spider>}:robots:down``
(site -> ``"<next attempt ms> <failed attempts> <first failure ms>"``, times
of the Redis server's clock): see :class:`SharedRobotsTxtMiddleware`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
import time
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from protego import _protego
from redis.exceptions import ResponseError
from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import DownloadTimeoutError, IgnoreRequest, NotConfigured
from scrapy.http.request import NO_CALLBACK
from scrapy.robotstxt import ProtegoRobotParser, decode_robotstxt
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.python import to_unicode
from scrapy.utils.response import response_status_message
from twisted.internet.defer import TimeoutError as DefTimeoutError
from twisted.internet.error import TCPTimedOutError
from twisted.internet.threads import deferToThread

from crawler.config import FrontierConfig, stop_on_config_error
from crawler.frontier.connection import (
    config_error_message,
    drop_connections,
    get_redis,
    is_no_master,
)
from crawler.frontier.health import (
    PROBE_INTERVAL,
    may_call_redis,
    note_redis_failure,
    on_running_reactor,
    spider_closing,
)
from crawler.frontier.scheduler import RETRY_DELAY_META, UNREACHABLE
from crawler.frontier.shards import FrontierShards
from crawler.frontier.sites import SLOT_META, site_of, slot_of
from crawler.frontier.slots import RobotsGate
from crawler.frontier.store import BAD_VALUE_HINT
from crawler.frontier.stuck import ROBOTS_WAIT_META
from crawler.keys import shard_count, site_prefix
from crawler.middlewares import DONT_DEAD_LETTER_META, backoff_delay

#: Longest pause, in seconds, between attempts to read robots.txt from Redis.
REDIS_BACKOFF_CAP = 30.0
#: Longest wait, in seconds, of a request in a worker while another worker
#: fetches its site's robots.txt; past it the request goes back to the
#: frontier to wait there.
LOCK_WAIT_SECONDS = 65
#: Bytes of a robots.txt parsed and shared (RFC 9309 section 2.5: at least
#: 500 KiB; what follows is ignored).
ROBOTS_MAX_BYTES = 500 * 1024
#: Least ``download_maxsize`` of a robots.txt fetch, bytes: Scrapy's default
#: DOWNLOAD_MAXSIZE (1 GiB), whatever the crawl's is (a download past it is
#: cancelled whole; only the first ROBOTS_MAX_BYTES are kept).
ROBOTS_FETCH_MAXSIZE = 1024 * 1024 * 1024
#: Redirects followed to reach robots.txt (RFC 9309 section 2.3.1.2: at
#: least five); past them it counts as unavailable (no rules).
MAX_REDIRECTS = 5
#: How long (ms) robots.txt may stay unreachable before the site is crawled
#: as if it had none (RFC 9309 section 2.3.1.4 allows it after 30 days).
GIVE_UP_MS = 30 * 86_400_000
#: Sites whose parsed robots.txt a worker keeps before it first drops the
#: expired ones (then twice the sites left): on a crawl of millions of sites
#: a worker holds the rules of the sites it used lately, not of every site
#: it ever met (about 1.5 KB each).
RULES_SWEEP_MIN = 1024

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Self

    from redis import Redis
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.robotstxt import RobotParser
    from twisted.python.failure import Failure

    from crawler.frontier.store import Frontier

T = TypeVar("T")

#: Download errors of a host that did not answer in time.
_TIMEOUTS: tuple[type[BaseException], ...] = (
    DownloadTimeoutError, TimeoutError, TCPTimedOutError, DefTimeoutError,
)

logger = logging.getLogger(__name__)

__all__ = [
    "AdaptiveSlowdownMiddleware", "RobotsDown", "SharedRobotsTxtMiddleware", "compact_robots",
    "parse_down",
]

#: Directives of a robots.txt group as protego reads them (its spellings
#: included), by the name :func:`compact_robots` writes them with.
_GROUP_DIRECTIVES: dict[str, str] = {
    **dict.fromkeys(_protego._ALLOW_DIRECTIVE, "Allow"),
    **dict.fromkeys(_protego._DISALLOW_DIRECTIVE, "Disallow"),
    **dict.fromkeys(_protego._CRAWL_DELAY_DIRECTIVE, "Crawl-delay"),
    **dict.fromkeys(_protego._REQUEST_RATE_DIRECTIVE, "Request-rate"),
    **dict.fromkeys(_protego._VISIT_TIME_DIRECTIVE, "Visit-time"),
}


def compact_robots(body: bytes, agent: str) -> bytes:
    """The part of robots.txt ``body`` that applies to ``agent``, as a
    minimal robots.txt that protego parses to the same decisions for it.

    protego picks one group for a user agent (the longest matching
    ``User-agent`` token, else ``*``); this keeps that group's rules, in
    their order, under one ``User-agent`` line: ``Allow``, ``Disallow``,
    ``Crawl-delay``, ``Request-rate`` and ``Visit-time``, every spelling
    protego accepts written in its usual one. Other groups, comments,
    ``Sitemap`` and ``Host`` lines go. The result is at most
    :data:`ROBOTS_MAX_BYTES` (cut at a line): a group that large is read no
    further, as the fetch reads no further (RFC 9309 section 2.5).

    :param body: the robots.txt as fetched (any encoding Scrapy decodes).
    :param agent: the user agent the crawl's requests are checked with
        (``ROBOTSTXT_USER_AGENT``, else the ``User-Agent`` header).
    :returns: UTF-8 text; empty when no group applies (everything allowed).
    """
    text = decode_robotstxt(body, None)
    matched = _protego.Protego.parse(text)._get_matching_rule_set(agent)
    if matched is None or matched.user_agent is None:
        return b""
    ours = matched.user_agent
    out = [f"User-agent: {ours}"]
    # Group the lines as protego does (_protego.Protego._parse_robotstxt):
    # a User-agent line after a rule starts a new group; a group applies to
    # ``ours`` when one of its User-agent lines names it.
    group: set[str] = set()
    previous: str | None = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parsed = _protego._extract_directive(line)
        if parsed is None:
            continue
        name, value = parsed
        if (
            name in _protego._USER_AGENT_DIRECTIVE
            and previous is not None
            and previous not in _protego._USER_AGENT_DIRECTIVE
        ):
            group = set()
        if name not in _protego._SITE_WIDE_DIRECTIVES:
            previous = name
        if not value:
            continue
        if name in _protego._USER_AGENT_DIRECTIVE:
            named = value.strip().lower()
            group.add(named)
            if named != "*" and "*" in named:
                group.add(named.replace("*", ""))
        elif name in _GROUP_DIRECTIVES and ours in group:
            out.append(f"{_GROUP_DIRECTIVES[name]}: {value}")
    compact = ("\n".join(out) + "\n").encode()
    if len(compact) > ROBOTS_MAX_BYTES:
        compact = compact[: compact.rfind(b"\n", 0, ROBOTS_MAX_BYTES) + 1]
    return compact

_MS = re.compile(rb"\d{1,15}")
_COUNT = re.compile(rb"[1-9]\d{0,8}")


class RobotsDown(NamedTuple):
    """A site whose robots.txt could not be reached (5xx or a network error).

    Shared by all workers in ``{s}:robots:down`` (site -> :meth:`encode`).
    Times are ms of the Redis server's clock.

    :ivar next_ms: nobody fetches the site's robots.txt again before this.
    :ivar attempt: failed fetches in a row, >= 1.
    :ivar since_ms: when the first of them failed.
    """

    next_ms: int
    attempt: int
    since_ms: int

    def encode(self) -> bytes:
        """``b"<next_ms> <attempt> <since_ms>"``."""
        return f"{self.next_ms} {self.attempt} {self.since_ms}".encode()


def parse_down(raw: bytes | str | None) -> RobotsDown | None:
    """The :class:`RobotsDown` stored as ``raw``, or None when there is none
    or it is malformed (it then counts as absent: robots.txt is fetched).

    Accepts ``"<next_ms> <attempt> <since_ms>"`` and, without the time of
    the first failure, ``"<next_ms> <attempt>"`` (``since_ms`` is then
    ``next_ms``); ms are whole numbers of at most 15 digits, ``attempt`` an
    integer from 1. Never raises.
    """
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "replace")
    fields = raw.split()
    if len(fields) not in (2, 3) or not _MS.fullmatch(fields[0]):
        return None
    if not _COUNT.fullmatch(fields[1]):
        return None
    if len(fields) == 3 and not _MS.fullmatch(fields[2]):
        return None
    next_ms = int(fields[0])
    return RobotsDown(next_ms, int(fields[1]), int(fields[2]) if len(fields) == 3 else next_ms)


class _Stored(NamedTuple):
    """What Redis holds on a site's robots.txt.

    :ivar body: its last robots.txt (None: never fetched, or unreadable).
    :ivar fetched: Unix time (s) it was fetched (None with no body).
    :ivar down: its unreachable state, if any.
    """

    body: bytes | None
    fetched: float | None
    down: RobotsDown | None


class _Read(NamedTuple):
    """What Redis holds of a site's robots.txt, read in one go.

    :ivar robots: its ``{s}:robots`` value, or None.
    :ivar down: its ``{s}:robots:down`` value, or None.
    :ivar now_ms: the Redis server's clock, ms, read when ``down`` is set.
    :ivar problems: the bad values met (a key that is not a hash).
    """

    robots: bytes | None
    down: bytes | None
    now_ms: int | None
    problems: list[str]


class _Wait(NamedTuple):
    """A request must wait: robots.txt of its site is unreachable.

    :ivar seconds: until the next attempt to fetch it.
    :ivar attempt: failed attempts so far (0: unknown).
    :ivar reason: why, when this worker knows (e.g. ``"503 Service Unavailable"``).
    """

    seconds: float
    attempt: int
    reason: str | None = None


class SharedRobotsTxtMiddleware(RobotsTxtMiddleware, RobotsGate):
    """Scrapy's RobotsTxtMiddleware with robots.txt fetched once per cluster,
    and its fetch's outcome handled as RFC 9309 section 2.3.1 says.

    The first worker to need a site's robots.txt takes a lock in Redis
    (``{s}:robots:lock:<site>``, expiring after
    ``FRONTIER_ROBOTS_LOCK_SECONDS``, default 10.0, and renewed every third
    of that while the fetch runs, so a fetch of any length is made once and
    a worker killed in the middle of it holds the lock at most that long)
    and fetches it once (no retry at once, never a dead letter; up to 5
    redirects). Other workers wait for it (up to 65 s per request, then the
    request goes back to the frontier) and obey what it stores, under the
    site's frontier key (:func:`site_of`):

    * **2xx**: the body goes to ``{s}:robots`` (site -> ``fetched\\nbody``)
      and its ``Crawl-delay`` for our user agent to ``{s}:rdelay`` (ms),
      which the frontier holds every worker to. Each worker parses the body
      itself (``ROBOTSTXT_PARSER``, protego by default). With protego the
      body stored is compact (:func:`compact_robots`): only the group that
      applies to the crawl's user agent (``ROBOTSTXT_USER_AGENT``, else the
      ``User-Agent`` header of the request that needed it), a few hundred
      bytes instead of up to 500 KiB; requests sent with another
      ``User-Agent`` are judged by that group too. A full body stored by an
      older version is read as before.
    * **4xx, or more than 5 redirects** ("unavailable"): no rules, stored as
      an empty body: everything is allowed.
    * **5xx or a network error** (DNS, refused, timeout; "unreachable"): the
      site is fully disallowed. ``{s}:robots:down`` (site ->
      ``"<next attempt ms> <failed attempts> <first failure ms>"``, Redis
      clock) says when to fetch it again: after
      ``FRONTIER_ROBOTS_RETRY_BASE`` seconds (default 2.0), doubling with
      each failure up to ``FRONTIER_ROBOTS_RETRY_MAX`` (default 300.0),
      stretched by up to ``FRONTIER_RETRY_JITTER``. The site is held
      (``{s}:due``) until then, and each of its requests that reaches a
      worker goes back to the frontier's retry set until then: a copy with
      ``dont_filter`` and ``meta["frontier_retry_delay"]``, not counted as a
      retry of it (``retry_times`` unchanged) and not dead-lettered. Once
      robots.txt answers 2xx or 4xx, its rules apply to those requests.
      While the site has no robots.txt in ``{s}:robots`` the frontier serves
      it one request at a time, so the hold bounces at most one request per
      attempt. A request downloaded outside the scheduler
      (``engine.download_async``) waits in the worker instead.
    * A worker reads a site's robots.txt from Redis again after half of
      ``FRONTIER_SITE_FORGET_AFTER`` at most (default 3600.0), so that a
      site whose state housekeeping deleted has its robots.txt fetched
      again (and its Crawl-delay applied) when it gets new work.
    * A stored robots.txt is fetched again after ``FRONTIER_ROBOTS_TTL``
      seconds (default 86400); while that fetch fails, the old rules are
      kept (RFC 9309 section 2.4) and fetched again with the same backoff.
      A site unreachable for 30 days without rules known is crawled as if
      it had no robots.txt (RFC 9309 section 2.3.1.4 allows it).
    * A worker with ``MAX_IDLE_TIME_BEFORE_CLOSE`` > 0 whose downloads all
      wait for robots.txt gives them up at its idle limit
      (:meth:`give_up_waits`): a fetch in flight counts as a failed attempt
      (``did not answer within N s``: the site is held, its requests go back
      to Redis), so a host that never answers does not keep the worker open
      for ``DOWNLOAD_TIMEOUT`` at each attempt; such sites are reported by
      :meth:`unanswered` until their rules are known.

    A malformed value in ``{s}:robots`` or ``{s}:robots:down``, or one of
    those keys holding another type, counts as absent (logged once): the
    worker fetches robots.txt again.

    Stats: Scrapy's ``robotstxt/*``, plus ``robotstxt/unreachable/count``
    (fetches that failed: 5xx or network error) and
    ``robotstxt/unreachable/deferred`` (requests sent back to wait).
    Enabled by ``ROBOTSTXT_OBEY``, as Scrapy's is.

    :raises ValueError: ``FRONTIER_ROBOTS_RETRY_BASE`` or
        ``FRONTIER_ROBOTS_LOCK_SECONDS`` is below 1 (it is renewed every
        third of it: a shorter one would keep Redis busy), or
        ``FRONTIER_ROBOTS_RETRY_MAX`` is below ``FRONTIER_ROBOTS_RETRY_BASE``.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        config = FrontierConfig.of(crawler)
        self._redis: Redis | None = None
        self._frontier: FrontierShards | None = None
        self.ttl = config.robots_ttl
        #: Seconds this worker uses a site's rules without reading Redis
        #: again at most: half of FRONTIER_SITE_FORGET_AFTER, so that a site
        #: whose state housekeeping deleted (its robots.txt and Crawl-delay
        #: among it) has its robots.txt fetched again when it gets new work,
        #: instead of being served by a local copy with no Crawl-delay and
        #: no rules in the frontier.
        self.local_max = config.site_forget_after / 2
        #: Slots (not hosts) whose robots.txt gate this worker opened, with
        #: time.monotonic() until which it trusts that it is open.
        self._gates: dict[str, float] = {}
        self.retry_base = config.robots_retry_base
        self.retry_max = config.robots_retry_max
        self.jitter = config.retry_jitter
        if not self.retry_base > 0:
            raise ValueError(
                f"FRONTIER_ROBOTS_RETRY_BASE must be a number of seconds above 0, "
                f"not {self.retry_base!r}"
            )
        #: Seconds the robots.txt lock lives unless renewed.
        self.lock_seconds = config.robots_lock_seconds
        if not self.lock_seconds >= 1:
            raise ValueError(
                f"FRONTIER_ROBOTS_LOCK_SECONDS must be a number of seconds of at least 1, "
                f"not {self.lock_seconds!r}"
            )
        if not self.retry_max >= self.retry_base:
            raise ValueError(
                f"FRONTIER_ROBOTS_RETRY_MAX ({self.retry_max!r}) must be seconds at least "
                f"FRONTIER_ROBOTS_RETRY_BASE ({self.retry_base!r})"
            )
        #: site -> (parser, time.monotonic() until which it is used unread);
        #: the expired ones are dropped once it holds ``_sweep_at`` sites
        self._rules: dict[str, tuple[RobotParser, float]] = {}
        self._sweep_at = RULES_SWEEP_MIN
        #: site -> the failed attempt whose wait this worker logged
        self._logged: dict[str, int] = {}
        self._problems: set[str] = set()
        #: requests waiting in this worker for their site's robots.txt
        #: (fetched here or by another worker), with time.monotonic() then
        self._waiting: dict[Request, float] = {}
        #: site -> (its robots.txt request, the download, time.monotonic() at start)
        self._fetches: dict[str, tuple[Request, asyncio.Future[Any], float]] = {}
        #: sites whose robots.txt fetch timed out or was given up here
        self._unanswered: set[str] = set()
        #: waits that began at or before this time.monotonic() are given up
        #: (:meth:`give_up_waits`)
        self._give_up_at = -math.inf

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the middleware; NotConfigured unless ``ROBOTSTXT_OBEY``."""
        return cls(crawler)

    @property
    def redis(self) -> Redis:
        """The Redis client, built on first use (a cluster client connects)."""
        if self._redis is None:
            self._redis = get_redis(self.crawler.settings)
        return self._redis

    @property
    def frontier(self) -> FrontierShards:
        """The crawl's frontier shards, through which this middleware tells
        a site's robots.txt state and Crawl-delay (built on first use)."""
        if self._frontier is None:
            assert self.crawler.spider is not None
            self._frontier = FrontierShards.from_crawler_settings(
                self.redis, self.crawler, self.crawler.spider.name
            )
        return self._frontier

    def _frontier_of(self, site: str) -> Frontier:
        """The frontier shard that holds ``site``."""
        return self.frontier.for_site(site)

    def _prefix(self, site: str) -> str:
        """The key prefix of the frontier shard that holds ``site``."""
        assert self.crawler.spider is not None
        return site_prefix(
            self.crawler.spider.name, site, shard_count(self.crawler.settings)
        )

    async def process_request(self, request: Request) -> Request | None:  # type: ignore[override]
        """Let ``request`` through, drop it (robots.txt forbids it), or send
        it back to wait in the frontier (its site's robots.txt is unreachable).

        :returns: None, or the copy of ``request`` that waits.
        :raises scrapy.exceptions.IgnoreRequest: robots.txt forbids it.
        """
        if request.meta.get("dont_obey_robotstxt") or request.url.startswith(("data:", "file:")):
            return None
        request.meta.pop(ROBOTS_WAIT_META, None)
        rules = await self._rules_for(request)
        while isinstance(rules, _Wait):
            if RETRY_DELAY_META not in request.meta:
                return self._defer(request, rules)
            # The copy came straight back: Scrapy's engine.download_async
            # (a spider awaiting a download itself) runs a returned request
            # at once instead of scheduling it. It waits here instead.
            await asyncio.sleep(rules.seconds)
            rules = await self._rules_for(request)
        request.meta.pop(RETRY_DELAY_META, None)
        slot = request.meta.get(SLOT_META)
        if slot is not None and slot != site_of(request):
            self._open_gate(str(slot), rules, request)
        self.process_request_2(rules, request)
        return None

    def _open_gate(self, slot: str, rules: RobotParser, request: Request) -> None:
        """The robots.txt of ``request``'s host is known: let the frontier
        serve its download slot ``slot`` (a ``meta["download_slot"]``, or a
        ``DOWNLOAD_SLOTS`` key, other than the host) at its full concurrency.

        The frontier serves a site one request at a time until
        ``{s}:robots`` has a field for it; a slot that is not a host gets
        the field ``"\t<slot>"`` (no host has a tab), value ``"1"``, and
        its Crawl-delay in ``{s}:rdelay`` when the host asks for a larger
        one than the slot has. Once per slot per worker within
        :attr:`local_max` seconds; best effort (Redis out of reach: the slot
        stays served one at a time until the next request tries again). On
        a running reactor the Redis calls run in a thread, not awaited.
        """
        now = time.monotonic()
        if self._gates.get(slot, 0.0) > now:
            return
        agent = to_unicode(
            self._robotstxt_useragent
            or request.headers.get(b"User-Agent", self._default_useragent)
            or ""
        )
        delay = rules.crawl_delay(agent)
        if len(self._gates) >= self._sweep_at:
            self._gates = {s: until for s, until in self._gates.items() if until > now}
        # (marked open at once, so that the requests met meanwhile do not
        # open it again; unmarked when the call fails)
        self._gates[slot] = now + self.local_max
        call = functools.partial(
            self._frontier_of(slot).open_slot, slot, round(delay * 1000) if delay else None
        )
        if not on_running_reactor():
            try:
                call()
            except UNREACHABLE as exc:
                self._gate_failed(slot, exc)
            return
        deferToThread(call).addErrback(self._gate_error, slot)

    def _gate_error(self, failure: Failure, slot: str) -> None:
        """The thread that opened the gate of ``slot`` failed (:meth:`_gate_failed`)."""
        self._gate_failed(slot, failure.value or RuntimeError(str(failure)))

    def _gate_failed(self, slot: str, exc: BaseException) -> None:
        """Opening the gate of ``slot`` failed: the next request of it tries
        again. Redis out of reach is logged as a warning, anything else as an
        error."""
        self._gates.pop(slot, None)
        if not isinstance(exc, UNREACHABLE):
            logger.error("Could not open the robots.txt gate of slot %s: %r", slot, exc)
        elif not self._config_error(exc):
            logger.warning(
                "Could not open the robots.txt gate of slot %s: %s (its next request tries "
                "again; check that Redis runs if this goes on)", slot, exc,
            )

    def waits_only(self, active: Iterable[Request], at_least: float = 0.0) -> bool:
        """Whether every request of ``active`` (the downloader's) has waited
        ``at_least`` seconds for robots.txt: its site's, in this middleware,
        or robots.txt's own fetch; False when ``active`` is empty."""
        since = time.monotonic() - at_least
        fetching = {id(f[0]): f[2] for f in self._fetches.values()}
        seen = False
        for request in active:
            started = self._waiting.get(request, fetching.get(id(request)))
            if started is None or started > since:
                return False
            seen = True
        return seen

    def unanswered(self) -> set[str]:
        """Sites whose robots.txt did not answer this worker (its fetch timed
        out, or was given up: :meth:`give_up_waits`) and whose rules it has
        not learnt since. A wait for another worker's fetch, given up, does
        not count: that fetch may still answer, and the worker waits for its
        outcome (an unanswered fetch is recorded in Redis by its fetcher)."""
        return set(self._unanswered)

    def give_up_waits(self) -> int:
        """Stop waiting for robots.txt now (an idle worker at its
        ``MAX_IDLE_TIME_BEFORE_CLOSE``): each fetch in flight is cancelled
        and counts as a failed attempt (``did not answer within N s``: the
        site is held, its requests go back to Redis to wait for the next
        attempt, as after any failure), and each request waiting for
        another worker's fetch goes back to Redis too.

        :returns: the robots.txt fetches cancelled.
        """
        self._give_up_at = time.monotonic()
        fetches = list(self._fetches.values())
        for _, download, _ in fetches:
            download.cancel()
        return len(fetches)

    async def _rules_for(self, request: Request) -> RobotParser | _Wait:
        """The rules of ``request``'s site: this worker's copy while fresh,
        else Redis's, else fetched once for the cluster; or a wait."""
        site = site_of(request)
        local = self._rules.get(site)
        if local is not None and time.monotonic() < local[1]:
            return local[0]
        self._waiting[request] = time.monotonic()
        try:
            return await self._wait_rules(request, site)
        finally:
            self._waiting.pop(request, None)

    async def _wait_rules(self, request: Request, site: str) -> RobotParser | _Wait:  # noqa: PLR0911
        """:meth:`_rules_for` past this worker's copy."""
        started = self._waiting.get(request, time.monotonic())
        if spider_closing(self.crawler):
            # Closing (an idle close, a stop): no fetch that would hold it up.
            return _Wait(self.retry_base, 0, "the worker is closing")
        backoff = 0.0
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        lock = self._prefix(site) + "robots:lock:" + site
        while True:
            if not may_call_redis(self.crawler):
                # Redis down (health.py): no call that would block the
                # reactor; once the spider closes, the request goes back.
                # The gate reopens once a probe is answered (every
                # PROBE_INTERVAL s while Redis fails): wait that long, not
                # this loop's backoff, which is for its own failed calls.
                if spider_closing(self.crawler):
                    return _Wait(self.retry_base, 0, "Redis unreachable at close")
                await asyncio.sleep(PROBE_INTERVAL)
                continue
            try:
                rules, stored = self._from_redis(site, await _off_reactor(self._read, site))
                if rules is not None:
                    return rules
                backoff = 0.0  # (Redis answered: a failure next starts over)
                if await _off_reactor(self._lock, lock):
                    break
            except UNREACHABLE as exc:
                if self._config_error(exc):
                    # No wait fixes it: the crawl stops; this request goes
                    # back to the frontier with the rest of the outbox.
                    return _Wait(self.retry_base, 0, "Redis refused: configuration error")
                # An outage, or a lost reply (a lock taken with it expires
                # unrenewed): the request waits; it is no download failure.
                note_redis_failure(self.crawler)
                backoff = min(REDIS_BACKOFF_CAP, max(0.5, backoff * 2))
                logger.warning(
                    "Redis unreachable reading robots.txt of %s (%s); trying again in %.1fs (the "
                    "request waits; check that Redis runs if this goes on)",
                    site, exc, backoff,
                )
                await asyncio.sleep(backoff)
                deadline = time.monotonic() + LOCK_WAIT_SECONDS
                continue
            if stored.body is not None:
                # Stale rules while another worker fetches the new ones.
                return self._keep(site, stored.body, 1.0)
            if time.monotonic() > deadline:
                # A fetch that long, or a lock set by hand without expiry.
                return _Wait(self.retry_base, 0, "another worker holds its lock")
            if started <= self._give_up_at:
                return _Wait(self.retry_base, 0, "another worker fetches it")
            await asyncio.sleep(0.1)
        renew = asyncio.ensure_future(self._renew(lock))
        try:
            return await self._fetch(request, site, stored)
        finally:
            renew.cancel()

    @property
    def _lock_ms(self) -> int:
        return max(1, round(self.lock_seconds * 1000))

    async def _renew(self, lock: str) -> None:
        """Keep ``lock`` alive while this worker fetches robots.txt: its
        expiry is set again every third of ``FRONTIER_ROBOTS_LOCK_SECONDS``
        (an idempotent ``PEXPIRE``; one that fails is tried again at the
        next turn, a cluster out of reach too: redis-py raises
        ``RedisClusterException`` then, no ``RedisError``). Runs until
        cancelled."""
        while True:
            await asyncio.sleep(self.lock_seconds / 3)
            if not may_call_redis(self.crawler):
                continue  # (Redis down: the next turn tries again)
            try:
                await _off_reactor(self.redis.pexpire, lock, self._lock_ms)
            except UNREACHABLE as exc:
                logger.debug("Could not renew the robots.txt lock %s: %s", lock, exc)

    def _lock(self, lock: str) -> bool:
        """Take the robots.txt lock ``lock`` (``SET NX``, for
        :attr:`_lock_ms`): whether this worker fetches robots.txt.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        return bool(self.redis.set(lock, "1", nx=True, px=self._lock_ms))

    def _read(self, site: str) -> _Read:
        """What Redis holds of ``site``'s robots.txt (blocking: run it off
        the reactor, :func:`_off_reactor`).

        :raises redis.exceptions.RedisError: Redis failed.
        """
        prefix = self._prefix(site)
        problems: list[str] = []
        raw = self._hget(prefix + "robots", site, problems)
        raw_down = self._hget(prefix + "robots:down", site, problems)
        now_ms = self._now_ms() if raw_down is not None else None
        return _Read(raw, raw_down, now_ms, problems)

    def _from_redis(
        self, site: str, read: _Read
    ) -> tuple[RobotParser | _Wait | None, _Stored]:
        """The rules of ``site`` as Redis holds them (``read``: fresh, or
        stale ones while robots.txt is unreachable), a wait (unreachable,
        no rules known), or None: robots.txt is to be fetched."""
        prefix = self._prefix(site)
        for problem in read.problems:
            self._problem(problem)
        raw, raw_down = read.robots, read.down
        body, fetched = None, None
        if raw is not None:
            stamp, newline, text = raw.partition(b"\n")
            try:
                fetched = float(stamp)
            except ValueError:
                fetched = math.nan
            if newline and math.isfinite(fetched):
                body = text
            else:
                self._problem(f"{prefix}robots {site} is not 'fetched\\nbody': ignored")
                fetched = None
        down = parse_down(raw_down)
        if raw_down is not None and down is None:
            self._problem(f"{prefix}robots:down {site} = {raw_down[:60]!r} is malformed: ignored")
        stored = _Stored(body, fetched, down)
        if body is not None and fetched is not None:
            age = time.time() - fetched
            if age < self.ttl:
                return self._keep(site, body, self.ttl - age), stored
        if down is None or read.now_ms is None:
            return None, stored
        now_ms = read.now_ms
        if now_ms >= down.next_ms:
            return None, stored
        wait = (down.next_ms - now_ms) / 1000
        if body is not None:
            # Unreachable, stale rules known: keep them (RFC 9309 section 2.4).
            return self._keep(site, body, wait), stored
        return _Wait(wait, down.attempt), stored

    def _hget(self, key: str, site: str, problems: list[str]) -> bytes | None:
        """``HGET key site``; a key of another type counts as no value (and
        is added to ``problems``).

        :raises redis.exceptions.RedisError: Redis failed or refused (any
            error but ``WRONGTYPE``).
        """
        try:
            value: bytes | None = self.redis.hget(key, site)  # type: ignore[assignment]
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            problems.append(f"{key} is not a hash: ignored")
            return None
        return value

    def _now_ms(self) -> int:
        """The Redis server's clock, ms."""
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def _problem(self, text: str) -> None:
        if text not in self._problems:
            self._problems.add(text)
            logger.warning("Bad value in Redis: %s%s", text, BAD_VALUE_HINT,
                           extra={"spider": self.crawler.spider})

    def _keep(self, site: str, body: bytes, seconds: float) -> RobotParser:
        """Parse ``body`` and use it for ``site`` for ``seconds`` unread
        (at most :attr:`local_max`)."""
        parserimpl: Any = self._parserimpl  # the ROBOTSTXT_PARSER class
        parser: RobotParser = build_from_crawler(parserimpl, self.crawler, body)
        now = time.monotonic()
        if len(self._rules) >= self._sweep_at:
            # Expired copies are never used again (Redis is read instead):
            # dropped, so that the worker's memory is bounded by the sites
            # it used within FRONTIER_SITE_FORGET_AFTER / 2 (amortized O(1)).
            self._rules = {s: kept for s, kept in self._rules.items() if kept[1] > now}
            self._sweep_at = max(RULES_SWEEP_MIN, 2 * len(self._rules))
        self._rules[site] = (parser, now + max(0.0, min(seconds, self.local_max)))
        self._logged.pop(site, None)  # its rules are known: no wait to log
        self._unanswered.discard(site)
        return parser

    def _robots_maxsize(self) -> int:
        """``download_maxsize`` of a robots.txt fetch, bytes: at least
        :data:`ROBOTS_FETCH_MAXSIZE` (0, no limit, stays 0). Scrapy cancels
        a download past it, keeping nothing: a lower limit would make the
        site of a robots.txt a little larger unreachable (held for 30 days)
        instead of ruled by its first :data:`ROBOTS_MAX_BYTES`."""
        limit = self.crawler.settings.getint("DOWNLOAD_MAXSIZE")
        return 0 if limit <= 0 else max(limit, ROBOTS_FETCH_MAXSIZE)

    async def _fetch(self, request: Request, site: str, stored: _Stored) -> RobotParser | _Wait:
        """Fetch robots.txt of ``request``'s site for all (this worker holds
        the lock) and share the outcome."""
        url = urlparse_cached(request)
        robots = Request(
            f"{url.scheme}://{url.netloc}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            meta={
                "dont_obey_robotstxt": True,
                # One attempt: a failure is retried here, with backoff, and
                # is no dead letter (no request of the frontier failed).
                "dont_retry": True,
                DONT_DEAD_LETTER_META: True,
                "redirect_ttl": MAX_REDIRECTS,
                # RFC 9309 section 2.5: at least 500 KiB must be read, even
                # when DOWNLOAD_MAXSIZE is lower, and a larger robots.txt
                # must not fail (Scrapy keeps nothing of a cancelled one).
                "download_maxsize": self._robots_maxsize(),
            },
            callback=NO_CALLBACK,
        )
        stats = self._stats
        failure: str | None = None
        body = b""
        engine = self.crawler.engine
        assert engine is not None
        started = time.monotonic()
        download = asyncio.ensure_future(engine.download_async(robots))
        self._fetches[site] = (robots, download, started)
        try:
            await asyncio.wait([download])
        finally:
            self._fetches.pop(site, None)
            if not download.done():
                download.cancel()
        response: Response | None = None
        try:
            response = download.result()
        except asyncio.CancelledError:  # given up (give_up_waits)
            failure = f"did not answer within {time.monotonic() - started:.0f} s"
            self._unanswered.add(site)
        except IgnoreRequest as exc:  # too many redirects: unavailable
            logger.info("robots.txt of %s unavailable (%s): no rules", site, exc)
        except Exception as exc:  # DNS, refused, timeout, ...: unreachable
            failure = f"{type(exc).__name__}: {exc}"
            stats.inc_value(f"robotstxt/exception_count/{type(exc)}")
            if isinstance(exc, _TIMEOUTS):
                self._unanswered.add(site)
        stats.inc_value("robotstxt/request_count")
        if response is not None:
            stats.inc_value("robotstxt/response_count")
            stats.inc_value(f"robotstxt/response_status_count/{response.status}")
            if response.status >= 500:
                failure = response_status_message(response.status)
            elif 200 <= response.status < 300:
                body = _first_bytes(response.body)  # RFC 9309 section 2.5
            # else 4xx (or a redirect not followed): unavailable, no rules
        if failure is not None:
            return await self._unreachable(site, stored, failure)
        agent = to_unicode(
            self._robotstxt_useragent
            or request.headers.get(b"User-Agent", self._default_useragent)
            or ""
        )
        parserimpl: Any = self._parserimpl  # the ROBOTSTXT_PARSER class
        if body and issubclass(parserimpl, ProtegoRobotParser):
            # Only our group is kept; this worker obeys what the others
            # will read, so every worker decides alike.
            body = compact_robots(body, agent)
        parser = self._keep(site, body, self.ttl)
        await self.crawler.signals.send_catch_log_async(
            signal=signals.robots_parsed, robotparser=parser, request=request
        )
        await self._store(site, body, parser.crawl_delay(agent))
        if stored.down is not None:
            logger.info(
                "robots.txt of %s answered (%s) after %d failed attempts; its requests go on",
                site, response.status if response is not None else "redirects", stored.down.attempt,
            )
        return parser

    async def _unreachable(
        self, site: str, stored: _Stored, reason: str
    ) -> RobotParser | _Wait:
        """robots.txt of ``site`` could not be fetched: share when to try
        again; keep its stale rules if any, else the request waits."""
        self._stats.inc_value("robotstxt/unreachable/count")
        prev = stored.down
        attempt = prev.attempt + 1 if prev is not None else 1
        wait = backoff_delay(attempt, self.retry_base, self.retry_max, self.jitter)
        try:
            now_ms = await _off_reactor(self._now_ms)
        except UNREACHABLE:
            now_ms = round(time.time() * 1000)
        since = prev.since_ms if prev is not None else now_ms
        down = RobotsDown(now_ms + round(wait * 1000), attempt, since)
        if stored.body is not None:
            logger.warning(
                "robots.txt of %s unreachable (%s); the rules fetched %.0fs ago are kept; "
                "next try in %.1fs (nothing to do unless the site should answer)",
                site, reason, time.time() - (stored.fetched or 0), wait,
            )
            await self._hold(site, down, hold=False)
            return self._keep(site, stored.body, wait)
        if now_ms - since >= GIVE_UP_MS:
            logger.warning(
                "robots.txt of %s unreachable (%s) for %.0f days: crawled as if it had none "
                "(RFC 9309 section 2.3.1.4; nothing to do: its robots.txt is obeyed once it "
                "answers)", site, reason, (now_ms - since) / 86_400_000,
            )
            await self._store(site, b"", None)
            return self._keep(site, b"", self.ttl)
        await self._hold(site, down, hold=True)
        return _Wait(wait, attempt, reason)

    async def _hold(self, site: str, down: RobotsDown, *, hold: bool) -> None:
        """Store ``down`` for every worker and let go of the lock; with
        ``hold``, no request of ``site`` is leased before ``down.next_ms``.
        The Redis call runs off the reactor's thread."""
        try:
            await _off_reactor(
                self._frontier_of(site).robots_down,
                site, down.encode(), down.next_ms if hold else None,
            )
        except UNREACHABLE as exc:
            # This worker's request waits all the same; the others fetch
            # robots.txt themselves once the lock expires.
            if self._config_error(exc):
                return
            logger.warning(
                "Could not share the robots.txt state of %s in Redis: %s (the other workers "
                "fetch it themselves; check that Redis runs if this goes on)", site, exc,
            )

    def _config_error(self, exc: Exception) -> bool:
        """Whether ``exc`` is a configuration error of Redis (a password, an
        ACL: see :func:`~crawler.frontier.connection.config_error`); if so
        the crawl is stopped with one line, as everywhere else. A server
        that is no master (a failover:
        :func:`~crawler.frontier.connection.is_no_master`) is an outage: the
        pooled connections are dropped, so that the next call reaches the
        master that the configured address names now."""
        if is_no_master(exc):
            drop_connections(self.redis)
            return False
        message = config_error_message(exc, self.crawler.settings)
        if message is None:
            return False
        stop_on_config_error(self.crawler, message)
        return True

    def _defer(self, request: Request, wait: _Wait) -> Request:
        """A copy of ``request`` that waits ``wait.seconds`` in the
        frontier's retry set (no retry attempt of it). Its ``dont_filter``
        is kept: the retry set skips the dupefilter anyway, and a redirect
        of the copy must still be filtered as a duplicate."""
        site = site_of(request)
        later = request.replace()
        later.meta[RETRY_DELAY_META] = max(0.0, wait.seconds)
        later.meta[ROBOTS_WAIT_META] = True
        self._stats.inc_value("robotstxt/unreachable/deferred")
        if self._logged.get(site) != wait.attempt:
            self._logged[site] = wait.attempt
            logger.warning(
                "robots.txt of %s unreachable (%s); its requests wait; next try in %.1fs "
                "(they go on once it answers; nothing to do unless the site should be up)",
                site, wait.reason or f"{wait.attempt} failed attempts", wait.seconds,
                extra={"spider": self.crawler.spider},
            )
        return later

    async def _store(self, site: str, body: bytes, delay: float | None) -> None:
        """Share the robots.txt and Crawl-delay of ``site`` with every worker.

        The site's next due time is also pushed to a whole delay from now
        (never brought forward): the larger of its delay (``{s}:delay``, else
        ``FRONTIER_DELAY``) and the Crawl-delay, plus its slow delay, stretched
        by ``FRONTIER_DELAY_MARGIN`` as ``lease.lua`` paces it. The request
        that waited for robots.txt reaches the site a moment after this; its
        due time ran from its lease, before robots.txt was fetched, so the
        next request would otherwise follow it at once. The Redis calls run
        off the reactor's thread (:func:`_off_reactor`).
        """
        try:
            await _off_reactor(self._share, site, body, delay)
        except UNREACHABLE as exc:
            # This worker obeys it already; the others fetch it themselves
            # once the lock expires.
            if self._config_error(exc):
                return
            logger.warning(
                "Could not share robots.txt of %s in Redis: %s (the other workers fetch it "
                "themselves; check that Redis runs if this goes on)", site, exc,
            )

    def _share(self, site: str, body: bytes, delay: float | None) -> None:
        delay_ms = round(delay * 1000) if delay else None
        self._frontier_of(site).robots_fetched(
            site, f"{time.time()}\n".encode() + body, delay_ms, self._now_ms()
        )
        if delay:
            logger.info("%s asks for Crawl-delay: %ss; all workers keep to it", site, delay)


class _Turn:
    """The responses of one site that adjust its delay, one at a time:
    ``lock`` is held by the one adjusting, ``users`` counts it and those
    waiting (the entry is dropped at 0)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class AdaptiveSlowdownMiddleware:
    """Slow a site down for every worker when it pushes back.

    The idea of Scrapy's AutoThrottle, held in Redis so that all workers
    slow down together (AutoThrottle acts inside one process):

    * a 429 or 503 response doubles the site's extra delay in ``{s}:slow``
      (starting at ``FRONTIER_ADAPTIVE_START``, seconds, default 1.0; at most
      ``FRONTIER_ADAPTIVE_MAX``, default 60.0);
    * a response slower than ``FRONTIER_ADAPTIVE_LATENCY`` seconds (default
      5.0) raises the extra delay to at least its download latency;
    * any other response shrinks it by a quarter, and clears it below 50 ms.

    One Redis write per response only while a site is slowed. A worker
    keeps the delay it last wrote for a site while the site is slowed; not
    heard from for half of ``FRONTIER_SITE_FORGET_AFTER`` (housekeeping may
    have forgotten the site since: it starts afresh), its copy is read from
    Redis again at the next response, and copies that old are dropped once
    it holds :data:`RULES_SWEEP_MIN` sites (then twice the sites left).
    Switched off by ``FRONTIER_ADAPTIVE_ENABLED = False``.
    """

    def __init__(self, crawler: Crawler) -> None:
        config = FrontierConfig.of(crawler)
        self.crawler = crawler
        self._redis: Redis | None = None
        self._frontier: FrontierShards | None = None
        self.start = config.adaptive_start * 1000
        self.max = config.adaptive_max * 1000
        self.latency = config.adaptive_latency
        #: Seconds this worker trusts its copy of a site's delay unread.
        self.local_max = config.site_forget_after / 2
        #: site -> (extra delay this worker last wrote, ms; time.monotonic() then)
        self._slow: dict[str, tuple[float, float]] = {}
        self._sweep_at = RULES_SWEEP_MIN
        #: site -> the turn of its responses in progress (adjusted one at a time)
        self._turns: dict[str, _Turn] = {}

    @property
    def redis(self) -> Redis:
        """The Redis client, built on first use (a cluster client connects)."""
        if self._redis is None:
            self._redis = get_redis(self.crawler.settings)
        return self._redis

    @property
    def frontier(self) -> FrontierShards:
        """The crawl's frontier shards, through which this middleware sets a
        site's slow delay (built on first use)."""
        if self._frontier is None:
            assert self.crawler.spider is not None
            self._frontier = FrontierShards.from_crawler_settings(
                self.redis, self.crawler, self.crawler.spider.name
            )
        return self._frontier

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the middleware; NotConfigured when switched off."""
        if not FrontierConfig.of(crawler).adaptive_enabled:
            logger.info("AdaptiveSlowdownMiddleware off: FRONTIER_ADAPTIVE_ENABLED is False")
            raise NotConfigured  # (switched off on purpose: no WARNING)
        return cls(crawler)

    async def process_response(self, request: Request, response: Response) -> Response:
        """Adjust the extra delay of the request's site (its download slot)
        from this response; the response goes on either way.

        The Redis calls run in the reactor's thread pool (:func:`_off_reactor`),
        one response of a site at a time in this worker (a 429 doubles what
        the one before it wrote). A response that changes nothing (the site
        not slowed here, answered in time) makes no call. While Redis is
        unreachable (the health gate of health.py is closed) the response
        waits one probe interval (``PROBE_INTERVAL``, 0.5 s) for the gate to
        reopen, then goes on unadjusted (best effort: the next response of
        the site adjusts its delay); once the spider closes, at once.
        """
        site = slot_of(request)
        latency = float(request.meta.get("download_latency") or 0.0)
        pushed_back = response.status in (429, 503)
        if not pushed_back and latency <= self.latency and site not in self._slow:
            return response  # not slowed by this worker, and nothing to slow
        if not may_call_redis(self.crawler):
            if spider_closing(self.crawler):
                return response
            await asyncio.sleep(PROBE_INTERVAL)
            if not may_call_redis(self.crawler):
                return response
        turn = self._turns.get(site)
        if turn is None:
            turn = self._turns[site] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                await self._adjust(site, pushed_back, latency)
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[site]
        return response

    async def _adjust(self, site: str, pushed_back: bool, latency: float) -> None:
        """Compute and store the new extra delay (ms) of ``site``; Redis out
        of reach is logged, never raised."""
        known = self._slow.get(site)
        now = time.monotonic()
        fresh = known is not None and now - known[1] < self.local_max
        slow = known[0] if known is not None and fresh else 0.0
        try:
            if pushed_back or (known is not None and not fresh):
                # A push back doubles what Redis holds (others may have
                # slowed the site further). Not heard from for long:
                # housekeeping may have forgotten the site (its mark
                # deleted), or others slowed it further.
                stored = _number(await _off_reactor(self._frontier_of(site).slow_of, site))
                if pushed_back:
                    slow = max(stored, slow)
                else:
                    slow = stored
            if pushed_back:
                new = min(self.max, max(self.start, 2 * slow))
                assert self.crawler.stats is not None
                self.crawler.stats.inc_value("frontier/adaptive/slowed")
            elif latency > self.latency:
                new = min(self.max, max(slow, latency * 1000))
            elif slow:
                new = slow * 0.75 if slow * 0.75 >= 50 else 0.0
            else:
                self._slow.pop(site, None)
                return
            await _off_reactor(self._frontier_of(site).set_slow, site, round(new))
        except UNREACHABLE as exc:
            # Slowing down is best effort: the response goes on either way.
            logger.warning(
                "Could not adjust the delay of %s in Redis: %s (tried again at its next "
                "response; check that Redis runs if this goes on)", site, exc,
            )
            note_redis_failure(self.crawler)
            return
        if new:
            self._remember(site, new, now)
        else:
            self._slow.pop(site, None)

    def _frontier_of(self, site: str) -> Frontier:
        """The shard of the frontier that holds ``site``."""
        return self.frontier.for_site(site)

    def _remember(self, site: str, delay: float, now: float) -> None:
        """Keep ``delay`` (ms) as this worker's copy of the site's; copies
        older than :attr:`local_max` are dropped first once there are
        ``_sweep_at`` of them (amortized O(1))."""
        if site not in self._slow and len(self._slow) >= self._sweep_at:
            self._slow = {
                s: kept for s, kept in self._slow.items() if now - kept[1] < self.local_max
            }
            self._sweep_at = max(RULES_SWEEP_MIN, 2 * len(self._slow))
        self._slow[site] = (delay, now)


async def _off_reactor(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a thread of the reactor's pool when a reactor runs
    (a blocking Redis call then does not hold the reactor), else here.

    :raises Exception: what ``call`` raises.
    """
    if not on_running_reactor():
        return call(*args)
    result: T = await maybe_deferred_to_future(deferToThread(call, *args))
    return result


def _first_bytes(body: bytes) -> bytes:
    """The first :data:`ROBOTS_MAX_BYTES` of robots.txt ``body``, less a
    last line the limit cuts short (``Disallow: /private`` cut to
    ``Disallow: /`` would forbid the whole site): what follows the limit is
    ignored (RFC 9309 section 2.5), and so is the part of a line before it."""
    if len(body) <= ROBOTS_MAX_BYTES:
        return body
    head = body[:ROBOTS_MAX_BYTES]
    if body[ROBOTS_MAX_BYTES:ROBOTS_MAX_BYTES + 1] in (b"\n", b"\r"):
        return head  # the last line ends right at the limit
    return head[: max(head.rfind(b"\n"), head.rfind(b"\r")) + 1]


def _number(raw: Any) -> float:
    """A stored delay (ms); a value that is not a number counts as 0."""
    try:
        value = float(raw or 0)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) and value >= 0 else 0.0
