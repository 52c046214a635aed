"""Whole crawls: real worker processes, real Redis, MongoDB and HTTP."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from devtools.replay import Page
from tests.workers import assert_quotes_crawled, crawl

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from devtools.replay import ReplayServer
    from tests.conftest import SiteFactory


pytestmark = pytest.mark.workers


def no_deprecations(log: str) -> bool:
    return "DeprecationWarning" not in log


def test_two_workers_share_the_quotes_crawl_and_fetch_nothing_twice(
    env: dict[str, str], db: Any, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    replay_server.clear_hits()
    rds.lpush("quotes:start_urls", replay_server.url_for("/"))

    workers = crawl("quotes", env, tmp_path, workers=2)

    assert len(workers) == 2
    assert_quotes_crawled(workers, db, replay_server)
    assert all(no_deprecations(w.log) for w in workers)
    einstein = db.authors.find_one({"name": "Albert Einstein"})
    assert einstein["birth_date"] == "1879-03-14"
    assert einstein["birth_place"] == "Ulm, Germany"
    assert einstein["url"].endswith("/author/Albert-Einstein/")
    quote = db.quotes.find_one({"author": "Albert Einstein", "tags": "change"})
    assert quote["text"].startswith("“The world as we have created it")
    assert set(quote["tags"]) == {"change", "deep-thoughts", "thinking", "world"}


def test_recrawl_after_clearing_the_dupefilter_updates_without_duplicates(
    env: dict[str, str], db: Any, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    rds.lpush("quotes:start_urls", replay_server.url_for("/"))
    crawl("quotes", env, tmp_path, workers=2)
    first = {d["text"]: d["last_seen"] for d in db.quotes.find()}

    rds.delete("{quotes}:dupefilter")
    rds.lpush("quotes:start_urls", replay_server.url_for("/"))
    workers = crawl("quotes", env, tmp_path, workers=2)

    assert [w.returncode for w in workers] == [0, 0]
    assert db.quotes.count_documents({}) == 100
    assert db.authors.count_documents({}) == 50
    for doc in db.quotes.find():
        assert doc["last_seen"] > first[doc["text"]]
        assert doc["first_seen"] < doc["last_seen"]
    unique = [i for i in db.quotes.index_information().values() if i.get("unique")]
    assert [dict(i["key"]) for i in unique] == [{"text": 1, "author": 1}]


def test_pages_stores_every_html_page_under_its_final_url(
    env: dict[str, str], db: Any, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    replay_server.clear_hits()
    rds.lpush("pages:start_urls", replay_server.url_for("/"))

    workers = crawl("pages", env, tmp_path, workers=2)

    assert [w.returncode for w in workers] == [0, 0]
    docs = list(db.pages.find())
    assert len(docs) == 213
    assert {d["status"] for d in docs} == {200}
    assert len({d["final_url"] for d in docs}) == 213
    authors = [d for d in docs if "/author/" in d["final_url"]]
    assert len(authors) == 50
    # The 50 /author/NAME redirects are resolved to /author/NAME/.
    assert all(d["final_url"].endswith("/") for d in authors)
    assert all(d["requested_url"] != d["final_url"] for d in authors)
    root = db.pages.find_one({"final_url": replay_server.url_for("/")})
    assert root["title"] == "Quotes to Scrape"
    assert "Albert Einstein" in root["text"]
    assert "https://www.goodreads.com/quotes" in root["links"]
    assert root["fetched_at"].tzinfo is not None
    # Links to goodreads.com and zyte.com were filtered, not fetched.
    assert sum(w.stats.get("offsite/filtered", 0) for w in workers) > 0
    downloads = sum(w.stats.get("downloader/request_count", 0) for w in workers)
    assert downloads == len(replay_server.hits())
    assert all(no_deprecations(w.log) for w in workers)


def test_bad_seeds_are_logged_and_skipped_good_ones_are_crawled(
    env: dict[str, str], rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    replay_server.clear_hits()
    bad = ["not a url", "ftp://example.com/", '{"url": 5}', '{"url": "http://', ""]
    good = ["/page/1/", "/page/2/", "/tag/love/", "/author/Albert-Einstein/", "/page/3/", "/"]
    seeds = [replay_server.url_for(good[0])]
    for b, g in zip(bad, good[1:], strict=True):
        seeds += [b, replay_server.url_for(g) if g != "/page/2/" else json.dumps(
            {"url": replay_server.url_for(g), "priority": 9, "meta": {"x": 1}})]
    rds.lpush("pages:start_urls", *seeds)

    [worker] = crawl("pages", env, tmp_path, settings={"DEPTH_LIMIT": 1})

    assert worker.returncode == 0
    assert worker.stats["frontier/seeds/bad"] == 5
    assert "not an http(s) URL: 'not a url'" in worker.log
    assert "not an http(s) URL: 'ftp://example.com/'" in worker.log
    assert "JSON seed has no string 'url' (got int)" in worker.log
    assert "not valid JSON" in worker.log
    assert "empty seed" in worker.log
    fetched = {h.path for h in replay_server.hits()}
    assert set(good) <= fetched
    assert rds.llen("pages:start_urls") == 0


def chain_site(length: int) -> dict[str, Page]:
    """``/0`` links to ``/1`` ... to ``/length-1``: one request at a time."""
    pages = {}
    for i in range(length):
        link = f'<a href="/{i + 1}">next</a>' if i + 1 < length else ""
        body = f"<html><head><title>{i}</title></head><body>{link}</body></html>"
        pages[f"/{i}"] = Page(200, [("Content-Type", "text/html")], body.encode())
    return pages


def test_a_crawl_longer_than_the_idle_time_is_not_cut_short(
    env: dict[str, str], db: Any, rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    # 12 pages fetched one after the other, 0.4 s each: about 5 s of work,
    # more than twice MAX_IDLE_TIME_BEFORE_CLOSE.
    site = site_factory(chain_site(12), latency=0.4)
    rds.lpush("pages:start_urls", site.url_for("/0"))

    [worker] = crawl("pages", env, tmp_path, settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2})

    assert worker.returncode == 0
    assert db.pages.count_documents({}) == 12
    hits = site.hits()
    assert hits[-1].finished - hits[0].started > 4
    # The worker closed only after having nothing to do for the idle time.
    assert worker.ended - hits[-1].finished >= 2
    assert "Idle for 2s with nothing to do" in worker.log


def test_seeds_spread_over_workers(
    env: dict[str, str], db: Any, rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    pages = {
        f"/{i}": Page(200, [("Content-Type", "text/html")], b"<title>x</title>")
        for i in range(40)
    }
    site = site_factory(pages, latency=0.2)
    rds.lpush("pages:start_urls", *[site.url_for(f"/{i}") for i in range(40)])

    workers = crawl("pages", env, tmp_path, workers=2, settings={"CONCURRENT_REQUESTS": 4})

    assert db.pages.count_documents({}) == 40
    assert sum(w.stats.get("frontier/seeds/read", 0) for w in workers) == 40
    # Seeds go to the shared frontier; each worker leases only what it can
    # start, so both fetch a share of them.
    fetched = [w.stats.get("response_received_count", 0) for w in workers]
    # Each page once, and robots.txt once for the cluster.
    assert sorted(h.path for h in site.hits()) == sorted(["/robots.txt", *pages])
    assert sum(fetched) == 41
    assert min(fetched) >= 5, fetched
    assert site.max_concurrency() <= 8
