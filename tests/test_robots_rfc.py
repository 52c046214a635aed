"""robots.txt as RFC 9309 section 2.3.1 says, for a whole cluster of workers.

2xx: its rules; 4xx: no rules; 5xx or a network error: the site is
unreachable, fully disallowed, and its requests wait (in the frontier's retry
set, not in a worker) while robots.txt is fetched again with backoff. A
robots.txt is read to its first 500 KiB (section 2.5), and a request that
waited for it still keeps its site's delay to the next. Whole crawls on a
real HTTP site, real Redis and MongoDB; the robots.txt outage is driven by
request counts, not by the clock.
"""

from __future__ import annotations

import itertools
import json
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.http.request import NO_CALLBACK

from crawler.frontier.store import Frontier
from crawler.politeness import RobotsDown, parse_down
from crawler.spiders.pages import PagesSpider
from devtools.embedded import free_port
from devtools.replay import Page, SiteServer
from tests import waiting
from tests.workers import crawl, start_worker, wait_workers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    import redis
    from scrapy.http import Response

    from devtools.replay import Hit
    from tests.conftest import SiteFactory

HTML = [("Content-Type", "text/html")]
TEXT = [("Content-Type", "text/plain")]
RULES = b"User-agent: *\nDisallow: /private\n"
#: Small robots.txt backoff: 0.5 s, 1 s, 2 s, 2 s ...
FAST = {"FRONTIER_ROBOTS_RETRY_BASE": 0.5, "FRONTIER_ROBOTS_RETRY_MAX": 2.0}
DOWN = "{pages}:robots:down"


def pages() -> dict[str, Page]:
    """``/`` links to ``/private/x`` and ``/public/y``."""
    return {
        "/": Page(200, HTML, b'<a href="/private/x">x</a> <a href="/public/y">y</a>'),
        "/private/x": Page(200, HTML, b"<title>private</title>"),
        "/public/y": Page(200, HTML, b"<title>public</title>"),
    }


def robots_failing(times: int, failure: Page, then: Page) -> Any:
    """A handler: ``/robots.txt`` answers ``failure`` its first ``times``
    requests, then ``then``."""

    def handler(path: str, nth: int) -> Page | None:
        if path == "/robots.txt":
            return failure if nth <= times else then
        return None

    return handler


def paths(site: SiteServer) -> list[str]:
    return [h.path for h in site.hits()]


def robots_hits(site: SiteServer) -> list[Hit]:
    return sorted((h for h in site.hits() if h.path == "/robots.txt"), key=lambda h: h.started)


def assert_nothing_lost(rds: redis.Redis) -> None:
    """Nothing queued, waiting, leased or dead-lettered."""
    assert Frontier(rds, "pages").audit() == {}
    assert rds.lrange("{pages}:dead", 0, -1) == []
    assert rds.zcard("{pages}:retries") == 0


def wait_for(condition: Any, timeout: float, what: str, rds: redis.Redis) -> None:
    """:func:`tests.waiting.wait_for`, naming the robots.txt keys on failure."""
    try:
        waiting.wait_for(condition, timeout, what, 0.05)
    except AssertionError as exc:
        state = {k.decode(): rds.type(k).decode() for k in rds.scan_iter("{pages}:robots*")}
        raise AssertionError(f"{exc}; keys: {state}") from None


def down_attempts(rds: redis.Redis, site: str) -> int:
    state = parse_down(rds.hget(DOWN, site))
    return state.attempt if state is not None else 0


def stat(workers: list[Any], name: str) -> int:
    return sum(w.stats.get(name, 0) for w in workers)


def html_page(*links: str) -> Page:
    """An HTML page titled ``t`` that links to ``links``."""
    body = "".join(f'<a href="{link}">{link}</a>' for link in links)
    return Page(200, HTML, f"<html><title>t</title><body>{body}</body></html>".encode())


@pytest.mark.workers
def test_robots_txt_answering_503_holds_the_site_until_it_answers(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis, db: Any
) -> None:
    """The issue's case: robots.txt answers 503 (three times here), then 200
    with ``Disallow: /private``."""
    site = site_factory(pages(), handler=robots_failing(
        3, Page(503, TEXT, b"busy"), Page(200, TEXT, RULES)))
    rds.lpush("pages:start_urls", site.url_for("/"))

    # Idle workers look at the frontier often (the gaps are measured), and
    # the 503s do not also slow the site down (AdaptiveSlowdownMiddleware).
    settings = {**FAST, "FRONTIER_IDLE_WAIT": 0.1, "FRONTIER_ADAPTIVE_ENABLED": False}
    workers = crawl("pages", env, tmp_path, workers=2, settings=settings)

    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    fetched = paths(site)
    assert "/private/x" not in fetched
    assert sorted(p for p in fetched if p != "/robots.txt") == ["/", "/public/y"]
    robots = robots_hits(site)
    assert [h.status for h in robots] == [503, 503, 503, 200]
    # Fetched again with backoff (0.5 s, 1 s, 2 s at least), never at once.
    gaps = [b.started - a.started for a, b in itertools.pairwise(robots)]
    assert all(gap >= want * 0.95 for gap, want in zip(gaps, [0.5, 1.0, 2.0], strict=True)), gaps
    assert gaps == sorted(gaps), gaps
    # The seed waited for the answer: nothing of the site before it.
    first_page = min(h.started for h in site.hits() if h.path == "/")
    assert first_page > robots[-1].started
    assert_nothing_lost(rds)
    assert db.pages.count_documents({}) == 2
    assert rds.hlen(DOWN) == 0
    assert stat(workers, "robotstxt/unreachable/deferred") == 3
    assert stat(workers, "robotstxt/forbidden") == 1
    assert stat(workers, "retry/count") == 0
    log = "".join(w.log for w in workers)
    assert f"robots.txt of {site.url[7:]} unreachable (503 Service Unavailable)" in log
    assert "Dead letter" not in log
    assert "DeprecationWarning" not in log


@pytest.mark.workers
def test_robots_txt_answering_404_means_no_rules(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis
) -> None:
    """A 4xx is "unavailable": everything is allowed, whatever its body says."""
    site = site_factory(pages(), handler=robots_failing(
        1, Page(404, TEXT, b"User-agent: *\nDisallow: /\n"), Page(200, TEXT, b"")))
    rds.lpush("pages:start_urls", site.url_for("/"))

    workers = crawl("pages", env, tmp_path, workers=2)

    assert [w.returncode for w in workers] == [0, 0]
    assert sorted(paths(site)) == ["/", "/private/x", "/public/y", "/robots.txt"]
    assert [h.status for h in robots_hits(site)] == [404]
    assert_nothing_lost(rds)


@pytest.mark.workers
def test_robots_txt_refused_then_served(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis
) -> None:
    """A network error (connection refused) makes the site unreachable until
    its server comes up; then its rules apply to the request that waited."""
    port = free_port()
    site_key = f"127.0.0.1:{port}"
    rds.lpush("pages:start_urls", f"http://{site_key}/")
    log = tmp_path / "refused.log"
    proc = start_worker("pages", env, log, {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, **FAST})
    try:
        wait_for(lambda: down_attempts(rds, site_key) >= 2, 30,
                 f"two failed robots.txt fetches of {site_key}", rds)
    except BaseException:
        proc.kill()
        raise
    # Held in the retry set meanwhile, not dropped, not dead-lettered.
    assert rds.zcard("{pages}:retries") + int(rds.get("{pages}:count") or 0) == 1
    assert rds.llen("{pages}:dead") == 0
    site = site_factory(pages(), port=port, handler=robots_failing(
        0, Page(503, TEXT, b""), Page(200, TEXT, RULES)))

    [worker] = wait_workers([proc], [log])

    assert worker.returncode == 0, worker.log[-3000:]
    assert sorted(paths(site)) == ["/", "/public/y", "/robots.txt"]
    assert worker.stats.get("robotstxt/unreachable/deferred", 0) >= 2
    assert_nothing_lost(rds)
    assert rds.hlen(DOWN) == 0


@pytest.mark.workers
def test_a_worker_killed_while_fetching_robots_txt_holds_the_others_up_only_briefly(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis
) -> None:
    """A worker takes the lock on fetching a site's robots.txt and is killed
    while robots.txt hangs. Once its lease is back (FRONTIER_LEASE_TIMEOUT
    2 s), a second worker fetches robots.txt itself within the lock's
    FRONTIER_ROBOTS_LOCK_SECONDS (1 s), not after a fixed 60 s, and obeys
    it; nothing is lost. A fetch that outlasts the lock several times over
    keeps it (renewed): the first worker's robots.txt request is the only
    one while it is alive."""
    release = threading.Event()
    asked: list[float] = []  # time.monotonic() of each robots.txt request

    def handler(path: str, nth: int) -> Page | None:
        if path == "/robots.txt":
            asked.append(time.monotonic())
            if nth == 1:
                release.wait(30)  # hangs until the test ends
        return robots_failing(0, Page(503, TEXT, b""), Page(200, TEXT, RULES))(path, nth)

    site = site_factory(pages(), handler=handler)
    lock = "{pages}:robots:lock:" + site.url.split("//")[1]
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "FRONTIER_ROBOTS_LOCK_SECONDS": 1,
                "FRONTIER_LEASE_TIMEOUT": 2, **FAST}
    rds.lpush("pages:start_urls", site.url + "/")
    # (an idle limit longer than the hang: a worker that only waits for a
    # robots.txt gives it up at its idle limit)
    first = start_worker(
        "pages", env, tmp_path / "first.log", {**settings, "MAX_IDLE_TIME_BEFORE_CLOSE": 60})
    try:
        wait_for(lambda: bool(asked), 30, "the first robots.txt request", rds)
        # Renewed while the fetch hangs: its expiry is set again (it rises)
        # six times, two lifetimes, and it is never gone in between.
        seen = {"last": rds.pttl(lock), "renewals": 0}

        def renewed_six_times() -> bool:
            ttl = rds.pttl(lock)
            assert ttl > 0, f"the lock expired while its fetch ran (PTTL {ttl})"
            if ttl > seen["last"]:
                seen["renewals"] += 1
            seen["last"] = ttl
            return seen["renewals"] >= 6

        wait_for(renewed_six_times, 10, "six renewals of the robots.txt lock", rds)
        assert len(asked) == 1
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    killed = time.monotonic()
    log = tmp_path / "second.log"
    try:
        [worker] = wait_workers([start_worker("pages", env, log, settings)], [log])
    finally:
        release.set()
    assert len(asked) == 2, asked
    # its lease back after 2 s; the lock gone 1 s after its last renewal
    assert asked[1] - killed < 15, asked[1] - killed
    assert worker.returncode == 0, worker.log[-3000:]
    assert sorted(p for p in paths(site) if p != "/robots.txt") == ["/", "/public/y"]
    assert_nothing_lost(rds)
    assert not rds.exists(lock)


def _refuses(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) != 0


@pytest.mark.workers
def test_unreachable_state_is_kept_under_the_site_key_not_host_and_port(
    env: dict[str, str], tmp_path: Path, rds: redis.Redis
) -> None:
    """``https://127.0.0.9:443/`` is the site ``127.0.0.9`` for the
    frontier; its robots.txt state must be kept under that key, or the
    site's requests never see it (the old error path used ``host:443``)."""
    host = "127.0.0.9"
    if not _refuses(host, 443):
        pytest.skip(f"something listens on {host}:443")
    rds.lpush("pages:start_urls", f"https://{host}:443/")
    log = tmp_path / "site-key.log"
    proc = start_worker("pages", env, log, {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, **FAST})
    try:
        wait_for(lambda: down_attempts(rds, host) >= 2, 30,
                 f"two failed robots.txt fetches of {host}", rds)
        proc.send_signal(signal.SIGTERM)
        [worker] = wait_workers([proc], [log], timeout=30)
    finally:
        proc.kill()

    assert worker.returncode == 0, worker.log[-3000:]
    fields = {
        key.decode(): [f.decode() for f in rds.hkeys(key)]
        for key in (b"{pages}:robots", b"{pages}:robots:down")
    }
    assert fields == {"{pages}:robots": [], "{pages}:robots:down": [host]}
    assert not any(k.endswith(b":443") for k in rds.scan_iter("{pages}:robots:lock:*"))
    # The seed waits in the retry set, whole; the site is held until the
    # next robots.txt attempt.
    assert rds.zcard("{pages}:retries") == 1
    assert rds.llen("{pages}:dead") == 0
    assert int(rds.hget("{pages}:due", host) or 0) > 0


@pytest.mark.workers
@pytest.mark.parametrize("bad", ["value", "type"])
def test_a_malformed_unreachable_state_does_not_stop_the_crawl(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis, bad: str
) -> None:
    site = site_factory(pages(), handler=robots_failing(
        0, Page(503, TEXT, b""), Page(200, TEXT, RULES)))
    site_key = site.url[len("http://"):]
    if bad == "value":
        rds.hset(DOWN, site_key, b"\xffsoon 7 x")
    else:
        rds.set(DOWN, "not a hash")
    rds.lpush("pages:start_urls", site.url_for("/"))

    workers = crawl("pages", env, tmp_path, workers=1, settings=FAST)

    assert [w.returncode for w in workers] == [0], workers[0].log[-3000:]
    assert sorted(paths(site)) == ["/", "/public/y", "/robots.txt"]
    assert_nothing_lost(rds)
    if bad == "value":
        assert rds.hlen(DOWN) == 0
        assert "Bad value in Redis: {pages}:robots:down 127.0.0.1:" in workers[0].log
    else:
        assert "Bad value in Redis: {pages}:robots:down is not a hash" in workers[0].log
    assert "Traceback" not in workers[0].log


@pytest.mark.workers
def test_stale_rules_are_kept_while_robots_txt_is_unreachable(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis
) -> None:
    """RFC 9309 2.4: past its TTL a cached robots.txt is fetched again; while
    that fails (5xx), the cached rules hold rather than disallowing all."""
    site = site_factory(pages(), handler=robots_failing(
        1000, Page(500, TEXT, b""), Page(200, TEXT, b"")))
    site_key = site.url[len("http://"):]
    rds.hset("{pages}:robots", site_key, f"{time.time() - 3 * 86400}\n".encode() + RULES)
    rds.lpush("pages:start_urls", site.url_for("/"))

    workers = crawl("pages", env, tmp_path, workers=1, settings=FAST)

    assert [w.returncode for w in workers] == [0], workers[0].log[-3000:]
    fetched = paths(site)
    assert sorted(p for p in fetched if p != "/robots.txt") == ["/", "/public/y"]
    assert fetched.count("/robots.txt") >= 1
    assert_nothing_lost(rds)
    assert workers[0].stats.get("robotstxt/unreachable/deferred", 0) == 0


@pytest.mark.workers
def test_robots_txt_unreachable_for_30_days_means_no_rules(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis
) -> None:
    """RFC 9309 2.3.1.4: unreachable for 30 days (and no rules known), the
    site may be crawled as if it had no robots.txt."""
    site = site_factory(pages(), handler=robots_failing(
        1000, Page(503, TEXT, b""), Page(200, TEXT, b"")))
    site_key = site.url[len("http://"):]
    now_ms = round(time.time() * 1000)
    rds.hset(DOWN, site_key, RobotsDown(now_ms, 40, now_ms - 31 * 86_400_000).encode())
    rds.lpush("pages:start_urls", site.url_for("/"))

    workers = crawl("pages", env, tmp_path, workers=1, settings=FAST)

    assert [w.returncode for w in workers] == [0], workers[0].log[-3000:]
    assert sorted(paths(site)) == ["/", "/private/x", "/public/y", "/robots.txt"]
    assert rds.hget("{pages}:robots", site_key).endswith(b"\n")  # stored: no rules
    assert rds.hlen(DOWN) == 0
    assert_nothing_lost(rds)


class InlineDownloadSpider(PagesSpider):
    """``pages``, whose callback also awaits ``engine.download_async`` of the
    URL in ``meta["inline"]`` (outside the scheduler), and logs its status."""

    name = "robots_inline"

    async def parse(self, response: Response, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        url = response.meta.get("inline")
        if url:
            engine = self.crawler.engine
            inline = await engine.download_async(Request(url, callback=NO_CALLBACK))
            self.logger.info("inline download: %s %s", inline.status, inline.url)
        for output in super().parse(response):
            yield output


@pytest.mark.workers
def test_a_download_outside_the_scheduler_waits_in_the_worker(
    env: dict[str, str], site_factory: SiteFactory, tmp_path: Path, rds: redis.Redis
) -> None:
    """Scrapy's engine.download_async runs a request the middleware returns
    at once, not through the scheduler: it must wait for robots.txt without
    spinning, then go on."""
    seed = site_factory({"/": Page(200, HTML, b"<title>seed</title>")})
    other = site_factory(pages(), host="127.0.0.2", handler=robots_failing(
        2, Page(503, TEXT, b""), Page(200, TEXT, RULES)))
    rds.lpush("robots_inline:start_urls", json.dumps(
        {"url": seed.url_for("/"), "meta": {"inline": other.url_for("/public/y")}}))

    workers = crawl("robots_inline", env, tmp_path, workers=1,
                    settings={**FAST, "SPIDER_MODULES": "tests.test_robots_rfc"})

    assert [w.returncode for w in workers] == [0], workers[0].log[-3000:]
    assert f"inline download: 200 {other.url_for('/public/y')}" in workers[0].log
    assert [h.status for h in robots_hits(other)] == [503, 503, 200]
    assert paths(other).count("/public/y") == 1
    assert rds.llen("{robots_inline}:dead") == 0
    # Sent back once; the copy that came straight back waited (a spinning
    # worker would have sent it back again and again).
    assert workers[0].stats.get("robotstxt/unreachable/deferred", 0) == 1


# -- the stored state, read leniently -----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"1700000000000 3 1699999990000", RobotsDown(1700000000000, 3, 1699999990000)),
        (b"1700000000000 3", RobotsDown(1700000000000, 3, 1700000000000)),
        (None, None),
        (b"", None),
        (b"soon 3 1", None),
        (b"\xff\xfe", None),
        (b"1700000000000 0 1", None),
        (b"-5 1 1", None),
        (b"1 2 3 4", None),
        (b"9" * 40 + b" 1 1", None),
        (b"nan 1 1", None),
        (b"1e3 1 1", None),
    ],
)
def test_stored_unreachable_state_is_parsed_leniently(
    raw: bytes | None, expected: RobotsDown | None
) -> None:
    assert parse_down(raw) == expected


# -- the robots.txt fetch is never a dead letter -------------------------------------


@pytest.mark.parametrize(
    "failure",
    [ConnectionRefusedError("refused"), ValueError("not retried"), 503],
    ids=["retryable-error", "other-error", "503-retries-spent"],
)
def test_a_request_whose_sender_handles_its_failure_is_no_dead_letter(failure: Any) -> None:
    from scrapy import Spider
    from scrapy.http import Response
    from scrapy.utils.test import get_crawler

    from crawler.frontier.signals import request_dead
    from crawler.middlewares import DONT_DEAD_LETTER_META, BackoffRetryMiddleware, DeadLettered

    class _Spider(Spider):
        name = "t"

    crawler = get_crawler(_Spider)
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    mw = BackoffRetryMiddleware.from_crawler(crawler)
    dead: list[str] = []

    def on_dead(request: Request, reason: str, **kwargs: Any) -> None:
        dead.append(request.url)

    crawler.signals.connect(on_dead, signal=request_dead)

    def fail(meta: dict[str, Any]) -> Any:
        # retries spent: a retryable failure is final now
        request = Request("http://a.example/robots.txt", meta={"retry_times": 2, **meta})
        if isinstance(failure, int):
            return mw.process_response(request, Response(request.url, status=failure))
        return mw.process_exception(request, failure)

    handled = fail({DONT_DEAD_LETTER_META: True})
    assert dead == []
    assert not isinstance(handled, Request)
    if isinstance(failure, int):
        fail({})
    else:
        # A dead letter's download error ends without a traceback in the log
        # (an IgnoreRequest), its reason in the one line the scheduler logs.
        with pytest.raises(DeadLettered):
            fail({})
    assert dead == ["http://a.example/robots.txt"]


@pytest.mark.workers
def test_a_request_that_waited_for_robots_txt_is_still_filtered_when_it_redirects(
    env: dict[str, str], rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    # /s and /t wait while robots.txt answers 503; then /s redirects onto
    # /t, fetched already: the redirect is filtered as a duplicate, as it
    # would be had robots.txt answered at once (the wait keeps dont_filter).
    from tests.test_request_trace import SPIDERS, _html

    served_t = threading.Event()

    def handler(path: str, nth: int) -> Page | None:
        if path == "/robots.txt":
            return Page(503, TEXT, b"") if nth == 1 else Page(200, TEXT, b"")
        if path == "/t":
            served_t.set()
            return _html()
        if path == "/s":
            served_t.wait(10)
            return Page(302, [("Location", "/t")], b"")
        return None

    b = site_factory({}, handler=handler)
    a = site_factory({"/": _html(b.url_for("/s"), b.url_for("/t"))})
    rds.lpush("request_trace:start_urls", a.url_for("/"))
    [worker] = crawl("request_trace", env, tmp_path, settings={
        **SPIDERS, **FAST, "FRONTIER_ADAPTIVE_ENABLED": False,
        "FRONTIER_STAY_ON_SEED_HOSTS": False,
    })
    assert worker.returncode == 0, worker.log[-3000:]
    assert [h.path for h in b.hits()].count("/t") == 1
    assert worker.stats.get("dupefilter/filtered") == 1
    assert worker.stats.get("robotstxt/unreachable/deferred", 0) >= 1


@pytest.mark.workers
@pytest.mark.workers
def test_the_request_that_waited_for_robots_txt_keeps_the_sites_delay_to_the_next(
    env: dict[str, str], rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    """robots.txt (no Crawl-delay) answers after 1.5 s; the site's delay is
    1 s. The seed leased before it waits for it, then is fetched; the next
    request of the site must still come a delay after that one, not at once
    (its due time ran from the lease, while robots.txt was fetched)."""
    def handler(path: str, nth: int) -> Page | None:
        if path == "/robots.txt":
            time.sleep(1.5)
            return Page(200, TEXT, b"User-agent: *\nDisallow: /private\n")
        return None

    site = site_factory({"/a": html_page(), "/b": html_page()}, handler=handler)
    rds.lpush("pages:start_urls", site.url_for("/a"), site.url_for("/b"))
    [worker] = crawl("pages", env, tmp_path, settings={"DOWNLOAD_DELAY": 1.0})
    assert worker.returncode == 0, worker.log[-3000:]
    starts = sorted((h.started, h.path) for h in site.hits())
    assert [p for _, p in starts] == ["/robots.txt", "/a", "/b"]
    assert starts[2][0] - starts[1][0] >= 1.0 * 0.95, starts


@pytest.mark.workers
@pytest.mark.workers
def test_a_robots_txt_over_500_kib_and_download_maxsize_is_read_to_its_last_whole_line(
    env: dict[str, str], rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    """A 600 KiB robots.txt, DOWNLOAD_MAXSIZE 500 KB, whose line
    ``Disallow: /private`` straddles the 500 KiB it is read to (RFC 9309
    section 2.5: what follows is ignored). The download is not cancelled
    past DOWNLOAD_MAXSIZE (the site would be unreachable and held, the
    worker never closing), and the line cut to ``Disallow: /`` does not
    forbid the whole site."""
    limit = 500 * 1024
    head = b"User-agent: *\n"
    cut = len(b"Disallow: /")
    pad = limit - cut - len(head)
    filler = b"".join(b"# " + b"x" * 97 + b"\n" for _ in range(pad // 100))
    filler += b"#" * (pad - len(filler) - 1) + b"\n"
    body = head + filler + b"Disallow: /private\n" + b"# tail\n" * 15000
    assert body[:limit].endswith(b"\nDisallow: /")
    site = site_factory({"/robots.txt": Page(200, TEXT, body), "/": html_page("/a"),
                         "/a": html_page()})
    rds.lpush("pages:start_urls", site.url_for("/"))
    settings = {"FRONTIER_SHARDS": 3, "DOWNLOAD_MAXSIZE": 512_000}
    [worker] = crawl("pages", env, tmp_path, settings=settings, timeout=60)
    assert worker.returncode == 0, worker.log[-3000:]
    assert sorted(h.path for h in site.hits()) == ["/", "/a", "/robots.txt"]
