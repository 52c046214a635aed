"""Fast tests of the embedded Redis/Mongo servers and the HTTP replay servers."""

from __future__ import annotations

import http.client
import io
import re
import threading
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pymongo
import pytest
import redis

from devtools.embedded import MongoServer, RedisServer, free_port
from devtools.replay import (
    EXTERNAL_LINK,
    Page,
    ReplayServer,
    SiteServer,
    default_warc_path,
    generated_site,
    load_warc,
)

if TYPE_CHECKING:
    from pathlib import Path

SiteFactory = Callable[..., SiteServer]


def _get(
    server: SiteServer, path: str, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    """One request without following redirects; returns (status, headers, body)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


# -- embedded servers ---------------------------------------------------------


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536


def test_redis_restart_keeps_aof_data(tmp_path: Path) -> None:
    with RedisServer(appendonly=True, data_dir=tmp_path / "redis") as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        try:
            client.set("crawler:test", "kept")
            client.rpush("crawler:list", "a", "b")
            port, pid = server.port, server.pid
            server.restart()
            assert server.port == port
            assert server.pid != pid
            assert client.get("crawler:test") == b"kept"
            assert client.lrange("crawler:list", 0, -1) == [b"a", b"b"]
        finally:
            client.close()
    assert not server.running


def test_redis_fixture_is_flushed(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0  # previous tests' keys were flushed
        client.set("leftover", "1")
    finally:
        client.close()


def test_redis_fixture_is_flushed_again(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.get("leftover") is None
    finally:
        client.close()


def test_redis_missing_binary_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_SERVER_BIN", "")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="apt-get install redis-server"):
        RedisServer()


def test_mongo_restart_keeps_document() -> None:
    with MongoServer() as server:
        assert server.uri.endswith(f":{server.port}/?directConnection=true")
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            server.uri, serverSelectionTimeoutMS=10000
        )
        try:
            client.crawl.items.insert_one({"_id": "q1", "text": "kept"})
            port = server.port
            server.restart()
            assert server.port == port
            assert client.crawl.items.find_one({"_id": "q1"}) == {
                "_id": "q1",
                "text": "kept",
            }
        finally:
            client.close()
    assert not server.running
    assert not server.data_dir.exists()  # temporary dir removed


def test_mongo_db_fixture(mongo_uri: str, mongo_db: str) -> None:
    assert re.fullmatch(r"test_[0-9a-f]{8}", mongo_db)
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        mongo_uri, serverSelectionTimeoutMS=10000
    )
    try:
        client[mongo_db].c.insert_one({"x": 1})
        assert client[mongo_db].c.count_documents({}) == 1
    finally:
        client.close()


# -- WARC replay --------------------------------------------------------------


def test_load_warc_counts() -> None:
    warc = default_warc_path()
    if not warc.is_file():
        pytest.skip(f"WARC capture not found at {warc}")
    pages = load_warc(warc)
    assert len(pages) == 271
    assert Counter(p.status for p in pages.values()) == {200: 215, 308: 50, 404: 6}
    for page in pages.values():
        names = {name.lower() for name, _ in page.headers}
        assert not names & {"content-length", "transfer-encoding", "connection"}


def test_replay_root_redirect_and_404(replay_server: ReplayServer) -> None:
    replay_server.clear_hits()

    status, headers, body = _get(replay_server, "/")
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    assert int(headers["content-length"]) == len(body)
    assert b"Quotes to Scrape" in body

    status, headers, _ = _get(replay_server, "/author/Albert-Einstein")
    assert status == 308
    assert headers["location"] == "/author/Albert-Einstein/"

    status, _, _ = _get(replay_server, "/login")
    assert status == 404

    status, headers, body = _get(replay_server, "/", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0

    # urllib follows the 308 to the captured author page
    with urllib.request.urlopen(
        replay_server.url_for("/author/Albert-Einstein"), timeout=10
    ) as resp:
        assert resp.status == 200
        assert b"Albert Einstein" in resp.read()

    hits = replay_server.hits()
    assert [(h.method, h.path, h.status) for h in hits] == [
        ("GET", "/", 200),
        ("GET", "/author/Albert-Einstein", 308),
        ("GET", "/login", 404),
        ("HEAD", "/", 200),
        ("GET", "/author/Albert-Einstein", 308),
        ("GET", "/author/Albert-Einstein/", 200),
    ]
    assert hits[0].host == f"127.0.0.1:{replay_server.port}"
    assert all(h.finished >= h.started for h in hits)


def test_replay_keep_alive(replay_server: ReplayServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", replay_server.port, timeout=10)
    try:
        for path in ("/page/1/", "/page/2/", "/static/main.css"):
            conn.request("GET", path)
            resp = conn.getresponse()
            assert resp.status == 200
            assert resp.read()
            assert not resp.will_close
    finally:
        conn.close()


def test_replay_cache_shares_pages() -> None:
    warc = default_warc_path()
    if not warc.is_file():
        pytest.skip(f"WARC capture not found at {warc}")
    assert ReplayServer(warc).pages is ReplayServer(warc).pages


# -- SiteServer ---------------------------------------------------------------


def test_handler_503_then_200(site_factory: SiteFactory) -> None:
    def flaky(path: str, nth: int) -> Page | None:
        if path != "/flaky":
            return None
        if nth <= 2:
            return Page(503, [("Retry-After", "0")], b"busy")
        return Page(200, [("Content-Type", "text/plain")], b"ok")

    server = site_factory({"/": Page(200, [], b"home")}, handler=flaky)
    assert [_get(server, "/flaky")[0] for _ in range(3)] == [503, 503, 200]
    assert _get(server, "/flaky")[2] == b"ok"
    assert _get(server, "/")[2] == b"home"
    assert _get(server, "/nope")[0] == 404
    assert [h.status for h in server.hits()] == [503, 503, 200, 200, 200, 404]
    server.clear_hits()
    assert server.hits() == []
    assert _get(server, "/flaky")[0] == 503  # counters were reset too


def _fetch_parallel(server: SiteServer, paths: list[str]) -> list[int]:
    results: list[int] = []
    lock = threading.Lock()

    def fetch(path: str) -> None:
        status = _get(server, path)[0]
        with lock:
            results.append(status)

    threads = [threading.Thread(target=fetch, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_latency_honoured(site_factory: SiteFactory) -> None:
    latency = 0.2
    server = site_factory(generated_site(10), host="127.0.0.2", latency=latency)
    assert server.url.startswith("http://127.0.0.2:")
    assert _fetch_parallel(server, [f"/p/{i}" for i in range(3)]) == [200] * 3
    hits = server.hits()
    assert len(hits) == 3
    assert all(h.duration >= latency for h in hits)


def test_max_concurrency(site_factory: SiteFactory) -> None:
    n = 4
    barrier = threading.Barrier(n, timeout=10)

    def wait_for_all(path: str, nth: int) -> Page:
        barrier.wait()  # returns only once n requests are in flight together
        return Page(200, [], path.encode())

    server = site_factory(handler=wait_for_all)
    assert _fetch_parallel(server, [f"/w/{i}" for i in range(n)]) == [200] * n
    assert server.max_concurrency() == n
    hits = server.hits()
    assert max(h.started for h in hits) < min(h.finished for h in hits)
    server.clear_hits()
    assert server.max_concurrency() == 0


def test_stop_closes_keep_alive_connections() -> None:
    server = SiteServer({"/": Page(200, [], b"x")})
    server.start()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"x"
    server.stop()  # must not hang on the idle keep-alive connection
    with pytest.raises((OSError, http.client.HTTPException)):
        conn.request("GET", "/")
        conn.getresponse()
    conn.close()


# -- generated site -----------------------------------------------------------

_HREF = re.compile(rb'href="([^"]+)"')


def test_generated_site_reachable() -> None:
    site = generated_site(50)
    assert len(site) == 51
    assert b"<title>Page 7</title>" in site["/p/7"].body
    assert b'<meta name="description"' in site["/p/7"].body
    seen = {"/"}
    queue = deque(["/"])
    external: set[str] = set()
    while queue:
        path = queue.popleft()
        for raw in _HREF.findall(site[path].body):
            href = raw.decode()
            if urlsplit(href).netloc:
                external.add(href)
                continue
            assert href in site, href
            if href not in seen:
                seen.add(href)
                queue.append(href)
    assert seen == set(site)
    assert external == {EXTERNAL_LINK}
    assert generated_site(50) == site  # deterministic


def test_generated_site_served(site_factory: SiteFactory) -> None:
    server = site_factory(generated_site(3))
    with urllib.request.urlopen(server.url_for("/p/2"), timeout=10) as resp:
        assert resp.status == 200
        assert b"<title>Page 2</title>" in resp.read()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.url_for("/p/3"), timeout=10)
    assert err.value.code == 404
    err.value.close()


def test_the_replay_of_a_crawls_warc_serves_the_page_not_a_retried_5xx_or_a_304(
    tmp_path: Path,
) -> None:
    # A crawl's WARC files hold a 500 (then retried) and a 304 (a revisit)
    # before the page: the replay serves the page.
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    from devtools.replay import load_warcs

    with (tmp_path / "a.warc.gz").open("wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        for status, body in (("500 Internal Server Error", b"oops"), ("304 Not Modified", b""),
                             ("200 OK", b"<html>page</html>")):
            http = StatusAndHeaders(status, [("Content-Type", "text/html")], protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(
                "http://example.com/b", "response", payload=io.BytesIO(body), http_headers=http
            ))
    page = load_warcs(tmp_path)["/b"]
    assert (page.status, page.body) == (200, b"<html>page</html>")
