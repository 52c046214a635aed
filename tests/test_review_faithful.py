"""Held-back cases of issues 12 and 14 on a sharded frontier (review).

Requests of every kind round-trip whole through a frontier of several shards
on one plain Redis; redirects across sites of different shards; robots.txt
cases of RFC 9309 not covered elsewhere. Real ``scrapy crawl`` workers, a
real Redis and MongoDB, small HTTP servers on 127.0.0.1.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.http import FormRequest, JsonRequest

from crawler.frontier.spider import FrontierSpider
from crawler.keys import shard_of, shard_prefixes
from devtools.replay import Page
from tests.workers import crawl

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import redis
    from scrapy.http import Response
    from twisted.python.failure import Failure

SPIDERS = {"SPIDER_MODULES": "crawler.spiders,tests.test_review_faithful"}

#: Meta keys Scrapy's own components add on the way (not the spider's).
_ADDED_META = {
    "depth", "download_timeout", "download_slot", "download_latency", "retry_times",
    "_frontier_lease", "priority_adjust",
}


class EchoServer:
    """Answers any method with JSON of what it got: method, path, headers, body."""

    def __init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                got = {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): self.headers.get_all(k) for k in self.headers},
                    "body": body.hex(),
                }
                with server.lock:
                    server.hits.append(got)
                if self.path.startswith("/flaky") and server.failing:
                    out, status, ctype = b"down", 500, "text/plain"
                elif self.path == "/robots.txt":
                    out, status, ctype = b"", 404, "text/plain"
                elif self.path.startswith("/fail"):
                    out, status, ctype = b"no", 404, "text/plain"
                else:
                    out, status, ctype = json.dumps(got).encode(), 200, "application/json"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

        self.lock = threading.Lock()
        #: Paths starting with /flaky answer 500 while this is true.
        self.failing = True
        self.hits: list[dict[str, Any]] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.site = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://{self.site}{path}"

    def __enter__(self) -> EchoServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class TaggedRequest(Request):
    """A user subclass with two attributes of its own."""

    attributes = (*Request.attributes, "tag", "ref")

    def __init__(self, *args: Any, tag: Any = None, ref: Any = None, **kwargs: Any) -> None:
        self.tag = tag
        self.ref = ref
        super().__init__(*args, **kwargs)


def _view(request: Request, spider: Any) -> dict[str, Any]:
    """``request.to_dict`` without what Scrapy's components add on the way."""
    out = request.to_dict(spider=spider)
    out["meta"] = {k: v for k, v in out["meta"].items() if k not in _ADDED_META}
    out["headers"] = {
        k.decode("latin-1"): [v.decode("latin-1") for v in vs] for k, vs in out["headers"].items()
    }
    out["body"] = out["body"].hex()
    out["class"] = type(request).__name__
    return out


class RoundTripSpider(FrontierSpider):
    """From its seed (``?sites=a,b,c``) yields requests of every kind, each to
    a site given, and logs each as sent and as its callback/errback gets it."""

    name = "rv_roundtrip"

    def requests(self, sites: list[str]) -> Iterator[tuple[str, Request]]:
        a, b, c = (f"http://{s}" for s in sites)
        yield "form", FormRequest(
            f"{a}/form", formdata={"a": "1", "b": "é x"}, callback=self.got,
            cb_kwargs={"k": "form"}, meta={"x": [1, 2], "y": {"z": None}}, priority=5,
        )
        yield "form_get", FormRequest(
            f"{b}/formget", method="GET", formdata={"q": "ü"}, callback=self.got,
            cb_kwargs={"k": "form_get"},
        )
        yield "json", JsonRequest(
            f"{c}/json", data={"q": [1, {"z": None}]}, dumps_kwargs={"sort_keys": True},
            callback=self.got, cb_kwargs={"k": "json"},
        )
        yield "tag", TaggedRequest(
            f"{a}/tag?x=1", tag={"deep": [1, "x", None]}, ref="r-7", method="PUT",
            body=b"\xff\x00bin", headers={"X-Multi": ["a", "b"], "X-One": "1"},
            cookies={"c1": "v1"}, priority=-3, callback=self.got, errback=self.failed,
            cb_kwargs={"k": "tag"}, flags=["f1"], encoding="latin-1",
        )
        yield "errback", Request(
            f"{b}/fail", callback=self.got, errback=self.failed, cb_kwargs={"k": "errback"},
            meta={"handle_httpstatus_list": [], "k": "errback"},
        )
        yield "again", Request(
            f"{a}/?sites={','.join(sites)}", dont_filter=True, callback=self.got,
            cb_kwargs={"k": "again"}, cookies=[{"name": "c2", "value": "v2", "path": "/"}],
        )

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Request]:
        if "sites=" not in response.url:  # a plain page: follow its links
            yield from response.follow_all(css="a")
            return
        sites = response.url.split("sites=", 1)[1].split(",")
        for key, request in self.requests(sites):
            self.logger.info("SENT %s %s", key, json.dumps(_view(request, self)))
            yield request

    def got(self, response: Response, k: str) -> None:
        assert response.request is not None
        self.logger.info("GOT %s %s", k, json.dumps(_view(response.request, self)))
        self.logger.info("ECHO %s %s", k, response.text)

    def failed(self, failure: Failure) -> None:
        request = failure.request  # type: ignore[attr-defined]
        self.logger.info("ERRBACK %s %s", request.meta.get("k") or request.cb_kwargs.get("k"),
                         json.dumps(_view(request, self)))


class RequeueSpider(RoundTripSpider):
    """:class:`RoundTripSpider` whose requests go to ``/flaky...`` paths."""

    name = "rv_requeue"

    def requests(self, sites: list[str]) -> Iterator[tuple[str, Request]]:
        for key, request in super().requests(sites):
            scheme, _, rest = request.url.partition("://")
            host, _, path = rest.partition("/")
            yield key, request.replace(url=f"{scheme}://{host}/flaky/{path}")


def _lines(log: str, tag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in log.splitlines():
        marker = f" {tag} "
        if marker in line:
            key, _, data = line.split(marker, 1)[1].partition(" ")
            out[key] = json.loads(data)
    return out


def test_requests_of_every_kind_round_trip_whole_through_four_shards(
    env: dict[str, str], rds: redis.Redis, tmp_path: Path
) -> None:
    with EchoServer() as a, EchoServer() as b, EchoServer() as c:
        shards = {shard_of(s.site, 4) for s in (a, b, c)}
        sites = ",".join(s.site for s in (a, b, c))
        rds.lpush("rv_roundtrip:start_urls", a.url(f"/?sites={sites}"))
        [worker] = crawl("rv_roundtrip", env, tmp_path, settings={
            **SPIDERS, "FRONTIER_SHARDS": 4, "RETRY_TIMES": 0,
            "FRONTIER_STAY_ON_SEED_HOSTS": False,
        })
    assert worker.returncode == 0, worker.log[-3000:]
    assert "ERROR" not in worker.log, worker.log[-5000:]
    sent = _lines(worker.log, "SENT")
    got = {**_lines(worker.log, "GOT"), **_lines(worker.log, "ERRBACK")}
    assert sorted(got) == sorted(sent), (shards, worker.log[-5000:])
    for key, want in sent.items():
        # Headers the downloader middlewares add on the way (User-Agent,
        # Referer, Cookie, ...) are no loss; those the spider set must stay.
        headers = got[key].pop("headers")
        assert {k: headers.get(k) for k in want["headers"]} == want.pop("headers"), key
        if isinstance(want["cookies"], list):  # CookiesMiddleware adds "secure" in place
            for cookie in got[key]["cookies"]:
                cookie.pop("secure", None)
        assert got[key] == want, key


# --- redirects across the sites of different shards ---------------------------------

HTML = [("Content-Type", "text/html")]
TEXT = [("Content-Type", "text/plain")]


def _html(*links: str) -> Page:
    body = "".join(f'<a href="{link}">{link}</a>' for link in links)
    return Page(200, HTML, f"<html><title>t</title><body>{body}</body></html>".encode())


def _moved(to: str, status: int = 302) -> Page:
    return Page(status, [("Location", to)], b"")


def test_redirects_across_shards_keep_politeness_dedup_and_robots(
    env: dict[str, str], rds: redis.Redis, db: Any, site_factory: Any, tmp_path: Path
) -> None:
    """A chain A -> B -> C, a loop A -> B -> A, two redirects onto one page of
    B, and a redirect onto a page C's robots.txt disallows, on a frontier of
    5 shards served by 2 workers: every page fetched once, the item under
    its final URL, each site's robots.txt fetched once, no site ever served
    two at once or within its delay, nothing left in the frontier."""
    b_pages: dict[str, Page] = {}  # filled below: the server reads this dict
    b = site_factory(b_pages)
    c = site_factory({
        "/robots.txt": Page(200, TEXT, b"User-agent: *\nDisallow: /private\n"),
        "/final": _html(), "/private/x": _html(),
    })
    a = site_factory({
        "/": _html("/r1", "/loop", "/dup1", "/dup2", "/todis"),
        "/r1": _moved(b.url_for("/t")),
        "/loop": _moved(b.url_for("/loop")),
        "/dup1": _moved(b.url_for("/page")),
        "/dup2": _moved(b.url_for("/page"), 301),
        "/todis": _moved(c.url_for("/private/x"), 307),
        "/robots.txt": Page(404, TEXT, b""),
    })
    b_pages.update({
        "/robots.txt": Page(404, TEXT, b""),
        "/t": _moved(c.url_for("/final"), 301),
        "/loop": _moved(a.url_for("/loop")),
        "/page": _html(),
    })
    rds.lpush("pages:start_urls", a.url_for("/"))
    workers = crawl("pages", env, tmp_path, workers=2, settings={
        "FRONTIER_SHARDS": 5, "FRONTIER_STAY_ON_SEED_HOSTS": False,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1, "DOWNLOAD_DELAY": 0.5,
    })
    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    log = "".join(w.log for w in workers)
    assert "ERROR" not in log, log[-5000:]
    hits = {s: sorted(h.path for h in s.hits()) for s in (a, b, c)}
    assert hits[a] == sorted(["/", "/r1", "/loop", "/dup1", "/dup2", "/todis", "/robots.txt"])
    assert hits[b] == sorted(["/t", "/loop", "/page", "/robots.txt"])
    assert hits[c] == sorted(["/final", "/robots.txt"])
    for site in (a, b, c):
        starts = sorted((h.started, h.finished) for h in site.hits() if h.path != "/robots.txt")
        for (s0, f0), (s1, _) in itertools.pairwise(starts):
            assert s1 >= f0, site.url  # one at a time
            # (the lag from a lease to its download, on a loaded machine)
            assert s1 - s0 >= 0.5 * 0.8, (site.url, s1 - s0, str([
                (h.path, round(h.started, 3), h.client) for h in site.hits()]))
    finals = sorted(d["final_url"] for d in db.pages.find())
    assert finals == sorted([a.url_for("/"), c.url_for("/final"), b.url_for("/page")])
    doc = db.pages.find_one({"final_url": c.url_for("/final")})
    assert doc["requested_url"] == a.url_for("/r1")
    assert sum(w.stats.get("robotstxt/forbidden", 0) for w in workers) == 1
    # A/loop again (the loop) and B/page again (the second redirect onto it),
    # each found in its site's shard: counted, not dropped silently.
    assert sum(w.stats.get("dupefilter/filtered", 0) for w in workers) == 2
    for prefix in shard_prefixes("pages", 5):
        assert rds.zcard(prefix + "leases") == 0, prefix
        assert rds.zcard(prefix + "retries") == 0, prefix
        assert rds.llen(prefix + "dead") == 0, prefix


def test_the_request_that_waited_for_robots_txt_keeps_the_sites_delay_to_the_next(
    env: dict[str, str], rds: redis.Redis, site_factory: Any, tmp_path: Path
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

    site = site_factory({"/a": _html(), "/b": _html()}, handler=handler)
    rds.lpush("pages:start_urls", site.url_for("/a"), site.url_for("/b"))
    [worker] = crawl("pages", env, tmp_path, settings={"DOWNLOAD_DELAY": 1.0})
    assert worker.returncode == 0, worker.log[-3000:]
    starts = sorted((h.started, h.path) for h in site.hits())
    assert [p for _, p in starts] == ["/robots.txt", "/a", "/b"]
    assert starts[2][0] - starts[1][0] >= 1.0 * 0.95, starts


# --- robots.txt: redirects (RFC 9309 section 2.3.1.2) -----------------------------


def test_robots_txt_redirects_followed_five_hops_across_shards_not_six(
    env: dict[str, str], rds: redis.Redis, site_factory: Any, tmp_path: Path
) -> None:
    """A's robots.txt reaches B's after 5 redirects (4 on A, the last to B,
    a site of another shard): B's rules apply to A. C's robots.txt
    redirects 6 times: unavailable, no rules. Two workers, 6 shards; each
    robots.txt URL fetched once."""
    rules = Page(200, TEXT, b"User-agent: *\nDisallow: /private\n")
    b = site_factory({"/robots.txt": rules})
    a_pages = {"/": _html(), "/private/x": _html(), "/robots.txt": _moved("/r1", 301)}
    for i in range(1, 4):
        a_pages[f"/r{i}"] = _moved(f"/r{i + 1}", 302)
    a_pages["/r4"] = _moved(b.url_for("/robots.txt"), 308)
    a = site_factory(a_pages)
    c_pages = {"/": _html(), "/private/x": _html(), "/robots.txt": _moved("/r1", 301)}
    for i in range(1, 6):
        c_pages[f"/r{i}"] = _moved(f"/r{i + 1}", 302)
    c_pages["/r6"] = rules
    c = site_factory(c_pages)
    rds.lpush("pages:start_urls", a.url_for("/"), a.url_for("/private/x"),
              c.url_for("/"), c.url_for("/private/x"))
    workers = crawl("pages", env, tmp_path, workers=2, settings={"FRONTIER_SHARDS": 6})
    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    assert sorted(h.path for h in a.hits()) == sorted(
        ["/robots.txt", "/r1", "/r2", "/r3", "/r4", "/"])
    assert sorted(h.path for h in b.hits()) == ["/robots.txt"]
    assert sorted(h.path for h in c.hits()) == sorted(
        ["/robots.txt", "/r1", "/r2", "/r3", "/r4", "/r5", "/", "/private/x"])


def test_each_sites_robots_txt_is_fetched_once_by_three_workers_on_eight_shards(
    env: dict[str, str], rds: redis.Redis, site_factory: Any, tmp_path: Path
) -> None:
    """Ten sites, each with a Crawl-delay of 0.4 s and four pages, seeded
    all at once to three workers on 8 shards: each robots.txt fetched once,
    each site's pages at least the Crawl-delay apart, /private never."""
    robots = Page(200, TEXT, b"User-agent: *\nCrawl-delay: 0.4\nDisallow: /private\n")
    sites = [
        site_factory({"/robots.txt": robots, "/": _html("/1", "/2", "/private/x"),
                      "/1": _html(), "/2": _html(), "/private/x": _html()})
        for _ in range(10)
    ]
    rds.lpush("pages:start_urls", *(s.url_for("/") for s in sites))
    workers = crawl("pages", env, tmp_path, workers=3, settings={
        "FRONTIER_SHARDS": 8, "FRONTIER_IDLE_WAIT": 0.2})
    assert [w.returncode for w in workers] == [0, 0, 0], [w.log[-3000:] for w in workers]
    for site in sites:
        assert sorted(h.path for h in site.hits()) == ["/", "/1", "/2", "/robots.txt"], site.url
        starts = sorted(h.started for h in site.hits() if h.path != "/robots.txt")
        gaps = [round(t1 - t0, 3) for t0, t1 in itertools.pairwise(starts)]
        # Crawl-delay 0.4 s stretched by 10%; less the lag from the robots.txt
        # answer (or a lease) to the download, on a loaded machine.
        assert min(gaps) >= 0.4 * 0.85, (site.url, gaps)



# --- configuration errors ---------------------------------------------------------


def test_a_warc_dir_that_cannot_be_written_is_a_bad_setting(
    env: dict[str, str], rds: redis.Redis, site_factory: Any, tmp_path: Path
) -> None:
    """WARC_DIR under a regular file: one line naming the setting, exit 2,
    nothing crawled (before: one ERROR, the crawl ran without an archive and
    exited 0)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    site = site_factory({"/": _html()})
    rds.lpush("pages:start_urls", site.url_for("/"))
    [worker] = crawl("pages", env, tmp_path, settings={
        "WARC_DIR": blocker / "warc", "FRONTIER_SHARDS": 3})
    assert worker.returncode == 2, worker.log[-3000:]
    assert f"Bad setting: WARC_DIR='{blocker / 'warc'}': must be a directory" in worker.log
    assert "Traceback" not in worker.log, worker.log[-3000:]
    assert site.hits() == []


# --- pause, stop, resume on a sharded crawl, with WARC files -------------------------


def test_pause_stop_resume_across_two_workers_on_five_shards_with_warc(
    env: dict[str, str], rds: redis.Redis, db: Any, site_factory: Any, tmp_path: Path
) -> None:
    """Eight sites of six pages (0.15 s each) on 5 shards, two workers
    writing WARC files. Paused: no fetch starts a second after. Stopped:
    both exit 0, no lease left to expire in any shard. Resumed: a new worker
    finishes; every page fetched and stored once, each response archived."""
    from warcio.archiveiterator import ArchiveIterator

    from tests.waiting import wait_for
    from tests.workers import start_worker, wait_workers

    sites = [
        site_factory({"/": _html(*(f"/{i}" for i in range(1, 6))),
                      **{f"/{i}": _html() for i in range(1, 6)}}, latency=0.15)
        for _ in range(8)
    ]
    rds.lpush("pages:start_urls", *(s.url_for("/") for s in sites))
    warc_dir = tmp_path / "warc"
    settings = {"FRONTIER_SHARDS": 5, "FRONTIER_CONTROL_INTERVAL": 0.2,
                "MAX_IDLE_TIME_BEFORE_CLOSE": 2, "WARC_DIR": warc_dir,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 1}

    def hits() -> list[Any]:
        return [h for s in sites for h in s.hits()]

    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    procs = [start_worker("pages", env, logs[i], settings) for i in range(2)]
    try:
        wait_for(lambda: len(hits()) >= 12, 60, "the crawl to be under way")
        rds.set("{pages}:control", "paused")
        paused = time.monotonic()
        time.sleep(2.5)  # the absence of fetches is what is checked
        late = [h.path for h in hits() if h.started > paused + 1.0]
        assert late == [], late
        assert [p.poll() for p in procs] == [None, None]
        rds.set("{pages}:control", "stopped")
        stopped = wait_workers(procs, logs[:2], timeout=30)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    assert [w.returncode for w in stopped] == [0, 0], [w.log[-2000:] for w in stopped]
    assert all("'finish_reason': 'stopped'" in w.log for w in stopped)
    for prefix in shard_prefixes("pages", 5):
        live = [m for m, s in rds.zrange(prefix + "leases", 0, -1, withscores=True) if s > 0]
        assert live == [], prefix
    fetched_before = len(hits())
    assert fetched_before < 8 * 7
    rds.delete("{pages}:control")
    [last] = wait_workers([start_worker("pages", env, logs[2], settings)], logs[2:], timeout=60)
    assert last.returncode == 0, last.log[-2000:]
    pages = [(s.url, h.path) for s in sites for h in s.hits() if h.path != "/robots.txt"]
    assert len(pages) == len(set(pages)) == 8 * 6
    assert db.pages.count_documents({}) == 8 * 6
    for prefix in shard_prefixes("pages", 5):
        assert rds.zcard(prefix + "leases") == rds.llen(prefix + "dead") == 0, prefix
    archived = set()
    for path in warc_dir.iterdir():
        assert not path.name.endswith(".open"), path
        with path.open("rb") as fh:
            archived |= {r.rec_headers.get_header("WARC-Target-URI")
                         for r in ArchiveIterator(fh) if r.rec_type == "response"}
    assert {f"{url}{path}" for url, path in pages} <= archived


# --- revisits on a sharded crawl ----------------------------------------------------


def test_revisits_on_four_shards_are_conditional_and_a_site_at_zero_is_not_revisited(
    env: dict[str, str], rds: redis.Redis, db: Any, site_factory: Any, tmp_path: Path
) -> None:
    """Four sites of three pages, 4 shards, FRONTIER_REVISIT_AFTER=2 and one
    site at 0 in FRONTIER_SITE_REVISITS: a second run with no seed asks for
    every page of the other three again, each conditional (304), and none
    of the fourth; every document's last_seen advances but the fourth's."""
    sites = [site_factory({"/": _html("/1", "/2"), "/1": _html(), "/2": _html()})
             for _ in range(4)]
    never = sites[3]
    rds.lpush("pages:start_urls", *(s.url_for("/") for s in sites))
    settings = {"FRONTIER_SHARDS": 4, "FRONTIER_REVISIT_AFTER": 2,
                "FRONTIER_SITE_REVISITS": json.dumps({never.url: 0})}
    [first] = crawl("pages", env, tmp_path, settings=settings)
    assert first.returncode == 0, first.log[-3000:]
    before = {d["url"]: d["last_seen"] for d in db.pages.find()}
    assert len(before) == 12
    keys = [p + "revisits" for p in shard_prefixes("pages", 4)]
    assert sum(rds.zcard(k) for k in keys) == 9
    last = max(s for k in keys for _, s in rds.zrange(k, -1, -1, withscores=True))
    seconds, micros = rds.time()
    time.sleep(max(0.0, (last - (seconds * 1000 + micros // 1000)) / 1000 + 0.05))
    for s in sites:
        s.clear_hits()
    [second] = crawl("pages", env, tmp_path, settings=settings)
    assert second.returncode == 0, second.log[-3000:]
    for s in sites[:3]:
        hits = [h for h in s.hits() if h.path != "/robots.txt"]
        assert sorted(h.path for h in hits) == ["/", "/1", "/2"], s.url
        assert all(h.conditional and h.status == 304 for h in hits), s.url
    assert never.hits() == []
    after = {d["url"]: d["last_seen"] for d in db.pages.find()}
    assert after.keys() == before.keys()
    for url, seen in after.items():
        if url.startswith(never.url):
            assert seen == before[url], url
        else:
            assert seen > before[url], url


# --- on a three-master Redis Cluster (default 16 shards) ----------------------------


def test_on_a_cluster_requests_round_trip_and_robots_503_holds_its_site(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, site_factory: Any, tmp_path: Path
) -> None:
    """The round trip of every kind of request, and a site whose robots.txt
    answers 503 twice then disallows /private, crawled together by two
    workers on a three-master cluster with the default shards."""
    from redis.cluster import RedisCluster

    from tests.workers import worker_env

    def robots(path: str, nth: int) -> Page | None:
        if path == "/robots.txt":
            return Page(503, TEXT, b"") if nth <= 2 else Page(
                200, TEXT, b"User-agent: *\nDisallow: /private\n")
        return None

    held = site_factory({"/": _html("/private/x", "/ok"), "/private/x": _html(),
                         "/ok": _html()}, handler=robots)
    env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        with EchoServer() as a, EchoServer() as b, EchoServer() as c:
            sites = ",".join(s.site for s in (a, b, c))
            rc.lpush("rv_roundtrip:start_urls", a.url(f"/?sites={sites}"))
            rc.lpush("rv_roundtrip:start_urls", held.url_for("/"))
            workers = crawl("rv_roundtrip", env, tmp_path, workers=2, settings={
                **SPIDERS, "RETRY_TIMES": 0, "FRONTIER_STAY_ON_SEED_HOSTS": False,
                "FRONTIER_ROBOTS_RETRY_BASE": 1, "FRONTIER_ROBOTS_RETRY_MAX": 1,
            })
    finally:
        rc.close()
    assert [w.returncode for w in workers] == [0, 0], [w.log[-3000:] for w in workers]
    log = "".join(w.log for w in workers)
    assert "] ERROR:" not in log and "Traceback" not in log, log[-5000:]
    sent = _lines(log, "SENT")
    got = {**_lines(log, "GOT"), **_lines(log, "ERRBACK")}
    assert sorted(got) == sorted(sent)
    for key, want in sent.items():
        headers = got[key].pop("headers")
        assert {k: headers.get(k) for k in want["headers"]} == want.pop("headers"), key
        if isinstance(want["cookies"], list):
            for cookie in got[key]["cookies"]:
                cookie.pop("secure", None)
        assert got[key] == want, key
    assert sorted(h.path for h in held.hits()) == ["/", "/ok", *["/robots.txt"] * 3]


def test_dead_letters_of_every_kind_of_request_are_requeued_whole_on_three_shards(
    env: dict[str, str], rds: redis.Redis, tmp_path: Path
) -> None:
    """The requests of every kind answer 500 (no retries): each is a dead
    letter in its site's shard (those with an errback also go to it). Once
    the sites answer, ``deadletters requeue`` and a new worker: each
    callback gets its request whole."""
    import subprocess
    import sys

    from tests.workers import PROJECT_DIR

    settings = {**SPIDERS, "FRONTIER_SHARDS": 3, "RETRY_TIMES": 0,
                "FRONTIER_STAY_ON_SEED_HOSTS": False}
    with EchoServer() as a, EchoServer() as b, EchoServer() as c:
        sites = ",".join(s.site for s in (a, b, c))
        rds.lpush("rv_requeue:start_urls", a.url(f"/?sites={sites}"))
        [first] = crawl("rv_requeue", env, tmp_path, settings=settings)
        assert first.returncode == 0, first.log[-3000:]
        dead = sum(rds.llen(p + "dead") for p in shard_prefixes("rv_requeue", 3))
        # (the two with an errback too: they ran out of retries)
        assert dead == 6, first.log[-3000:]
        for server in (a, b, c):
            server.failing = False
        args = [sys.executable, "-m", "scrapy", "deadletters", "requeue", "rv_requeue"]
        for name, value in SPIDERS.items():
            args += ["-s", f"{name}={value}"]
        done = subprocess.run(args, cwd=PROJECT_DIR, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        [second] = crawl("rv_requeue", env, tmp_path, settings=settings)
    assert second.returncode == 0, second.log[-3000:]
    sent = _lines(first.log, "SENT")
    got = _lines(second.log, "GOT")
    assert sorted(got) == sorted(sent), second.log[-3000:]
    for key, back in got.items():
        want = sent[key]
        headers = back.pop("headers")
        assert {k: headers.get(k) for k in want["headers"]} == want.pop("headers"), key
        if isinstance(want["cookies"], list):
            for cookie in back["cookies"]:
                cookie.pop("secure", None)
        assert back == want, key


def test_the_cluster_switch_on_a_single_redis_is_a_configuration_error(
    env: dict[str, str], rds: redis.Redis, tmp_path: Path
) -> None:
    """FRONTIER_REDIS_CLUSTER=1 with REDIS_URL at one Redis server: one line,
    exit 1 (before: asyncio's "Task exception was never retrieved" and a
    traceback)."""
    rds.lpush("pages:start_urls", "http://127.0.0.1:9/")
    [worker] = crawl("pages", {**env, "FRONTIER_REDIS_CLUSTER": "1"}, tmp_path)
    assert worker.returncode == 1, worker.log[-3000:]
    assert "Traceback" not in worker.log, worker.log[-3000:]
    assert "Configuration error: Redis at redis://127.0.0.1:" in worker.log
    assert "FRONTIER_REDIS_CLUSTER is on but the server is no Redis Cluster node" in worker.log


def test_a_cluster_node_without_the_cluster_switch_is_a_configuration_error(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, tmp_path: Path
) -> None:
    """REDIS_URL at a node of a Redis Cluster, FRONTIER_REDIS_CLUSTER unset:
    the node's MOVED is no outage; the worker stops within seconds, exit 1
    (before: "Redis unreachable" with backoff for ever)."""
    from tests.workers import worker_env

    env = worker_env(redis_cluster_url, mongo_uri, mongo_db)
    env.pop("FRONTIER_REDIS_CLUSTER", None)
    started = time.monotonic()
    [worker] = crawl("pages", env, tmp_path, timeout=60)
    assert worker.returncode == 1, worker.log[-3000:]
    assert worker.ended - started < 20
    assert "Traceback" not in worker.log, worker.log[-3000:]
    assert "the server is a node of a Redis Cluster (it answered MOVED/ASK" in worker.log, (
        worker.log[-3000:])


@pytest.mark.parametrize("maxsize", [None, 512_000])
def test_a_robots_txt_cut_at_500_kib_does_not_obey_the_line_it_cuts(
    env: dict[str, str], rds: redis.Redis, site_factory: Any, tmp_path: Path,
    maxsize: int | None,
) -> None:
    """A 600 KiB robots.txt whose line ``Disallow: /private`` straddles the
    500 KiB it is read to: the cut ``Disallow: /`` must not disallow the
    whole site (RFC 9309 section 2.5: what follows the limit is ignored,
    not a line cut short)."""
    limit = 500 * 1024
    head = b"User-agent: *\n"
    rule = b"Disallow: /private\n"
    cut = len(b"Disallow: /")
    pad = limit - cut - len(head)
    filler = b"".join(b"# " + b"x" * 97 + b"\n" for _ in range(pad // 100))
    filler += b"#" * (pad - len(filler) - 1) + b"\n"
    body = head + filler + rule + b"# tail\n" * 15000
    assert body[:limit].endswith(b"\nDisallow: /")
    site = site_factory({"/robots.txt": Page(200, TEXT, body), "/": _html("/a"), "/a": _html()})
    rds.lpush("pages:start_urls", site.url_for("/"))
    settings: dict[str, object] = {"FRONTIER_SHARDS": 3}
    if maxsize is not None:  # below the robots.txt's size
        settings["DOWNLOAD_MAXSIZE"] = maxsize
    [worker] = crawl("pages", env, tmp_path, settings=settings)
    assert worker.returncode == 0, worker.log[-3000:]
    assert sorted(h.path for h in site.hits()) == ["/", "/a", "/robots.txt"]


def test_a_spill_dir_that_cannot_be_made_is_a_bad_setting(
    env: dict[str, str], tmp_path: Path
) -> None:
    """MONGO_SPILL_DIR under a regular file: one line, exit 2 (before:
    accepted; found only when MongoDB was down and items had to spill, and
    those items were lost with the OSError)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    [worker] = crawl("pages", env, tmp_path, settings={"MONGO_SPILL_DIR": blocker / "spill"})
    assert worker.returncode == 2, worker.log[-3000:]
    assert (
        f"Bad setting: MONGO_SPILL_DIR={blocker / 'spill'}: must be a directory the worker "
        f"can create and write in ({blocker} is not a directory)"
    ) in worker.log, worker.log[-3000:]
    assert "Traceback" not in worker.log
