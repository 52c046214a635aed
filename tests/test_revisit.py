"""Revisits with conditional GETs (``FRONTIER_REVISIT_AFTER``): real workers,
Redis, MongoDB and HTTP servers that send ETags and answer 304."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from pymongo.errors import ServerSelectionTimeoutError
from redis.exceptions import ResponseError
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from crawler.frontier.scheduler import REVISIT_META
from crawler.frontier.serializer import entry_fields
from crawler.frontier.signals import request_dead, request_fetched
from crawler.frontier.sites import site_of
from crawler.frontier.store import Commit, Frontier, NotDue, Revisit
from crawler.middlewares import RevisitMiddleware
from crawler.overrides import parse_site_settings
from crawler.pipelines import MongoPipeline
from crawler.storage import register_store
from devtools.replay import Page
from tests import scheduler_harness as harness
from tests.faultproxy import FaultProxy
from tests.test_overrides import frontier as frontier_cli
from tests.workers import crawl

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from devtools.replay import ReplayServer
    from tests.conftest import SiteFactory

def redis_ms(rds: redis.Redis) -> int:
    """The Redis server's clock, ms (the scripts' clock)."""
    seconds, micros = rds.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_until_due(rds: redis.Redis, key: str) -> None:
    """Return once the last revisit in zset ``key`` is due on Redis's clock."""
    [(_, last)] = rds.zrange(key, -1, -1, withscores=True)
    time.sleep(max(0.0, (last - redis_ms(rds)) / 1000 + 0.05))


def make_due(rds: redis.Redis, key: str) -> None:
    """Bring every revisit in zset ``key`` due now on Redis's clock (as if
    their interval had passed: the scripts read nothing else)."""
    now = redis_ms(rds)
    rds.zadd(key, dict.fromkeys(rds.zrange(key, 0, -1), now), xx=True)


@pytest.mark.workers
def test_second_run_revisits_every_page_conditionally_and_advances_last_seen(
    env: dict[str, str], db: Any, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    replay_server.clear_hits()
    rds.lpush("pages:start_urls", replay_server.url_for("/"))
    # An hour: longer than the first run lasts, however slow the machine
    # (it revisits nothing itself); then the revisits are brought due.
    settings = {"FRONTIER_REVISIT_AFTER": 3600, "MAX_IDLE_TIME_BEFORE_CLOSE": 2}

    [first] = crawl("pages", env, tmp_path, settings=settings)
    first_done = redis_ms(rds)

    assert first.returncode == 0
    assert "Idle for 2s with nothing to do: closing" in first.log
    before = {d["url"]: d for d in db.pages.find()}
    assert len(before) == 213
    # One revisit per page fetched, none due yet: the worker closed on
    # MAX_IDLE_TIME_BEFORE_CLOSE although they wait.
    assert first.stats["frontier/revisits/scheduled"] == 213
    assert rds.zcard("{pages}:revisits") == 213
    [(_, earliest)] = rds.zrange("{pages}:revisits", 0, 0, withscores=True)
    assert earliest > first_done
    assert not any(h.conditional for h in replay_server.hits())
    # Stored as queued: none of the headers the downloader middlewares add
    # for one download (User-Agent, Accept-Encoding, ...) rides along.
    entries = rds.hvals("{pages}:rdata")
    assert not [e for e in entries if b"User-Agent" in e or b"Accept-Encoding" in e]

    make_due(rds, "{pages}:revisits")
    replay_server.clear_hits()
    [second] = crawl("pages", env, tmp_path, settings=settings)  # no new seed

    assert second.returncode == 0
    hits = [h for h in replay_server.hits() if h.path != "/robots.txt"]
    assert len(hits) == 213
    assert len({h.path for h in hits}) == 213
    assert all(h.conditional and h.status == 304 for h in hits)
    assert second.stats["frontier/revisits/leased"] == 213
    assert second.stats["revisit/not_modified"] == 213
    assert second.stats["revisit/touched"] == 213
    assert "item_scraped_count" not in second.stats  # no callback ran
    after = {d["url"]: d for d in db.pages.find()}
    assert db.pages.count_documents({}) == 213
    assert after.keys() == before.keys()
    for url, doc in after.items():
        assert doc["last_seen"] > before[url]["last_seen"]
        assert doc["fetched_at"] > before[url]["fetched_at"]
        assert doc["first_seen"] == before[url]["first_seen"]
    # Each 304 scheduled the next revisit, with the same validators.
    assert second.stats["frontier/revisits/scheduled"] == 213
    assert rds.zcard("{pages}:revisits") == 213


# -- the scripts -------------------------------------------------------------------


def _frontier(rds: redis.Redis, revisit_after: float = 0.05) -> Frontier:
    frontier = Frontier(rds, "t", default_concurrency=8, revisit_after=revisit_after)
    frontier.load_scripts()
    return frontier


def _revisit(url: str) -> Revisit:
    return Revisit(url.encode(), url.split("/")[2], 0, url.encode())


def _lease_all(frontier: Frontier) -> tuple[list[bytes], list[str]]:
    """Lease and acknowledge what is due; return the requests and the problems."""
    got, problems, n = [], [], 0
    while isinstance(result := frontier.lease_many([f"w#x:{n}"]), list):
        got += [lease.data for lease in result]
        problems += result[0].problems
        frontier.ack([lease.lease_id for lease in result])
        n += 1
    return got, problems + list(result.problems)


def test_a_due_revisit_is_queued_past_the_dupefilter_once_and_not_pending_before(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds, revisit_after=0.3)
    assert frontier.push(b"https://a.example/1", site="a.example", priority=0,
                         fingerprint=b"https://a.example/1", dont_filter=False)
    assert _lease_all(frontier)[0] == [b"https://a.example/1"]
    frontier.commit(Commit(revisits=[_revisit("https://a.example/1")] * 2))  # newest wins

    assert rds.zcard("{t}:revisits") == 1
    assert rds.hget("{t}:rdata", b"https://a.example/1") == b"0\ta.example\thttps://a.example/1"
    assert frontier.pending() == 0  # not due: no work
    not_due = frontier.lease_many(["w#y:0"])
    assert isinstance(not_due, NotDue)
    assert not_due.wait is not None and 0 < not_due.wait <= 0.3  # when to look again
    wait_until_due(rds, "{t}:revisits")
    assert _lease_all(frontier)[0] == [b"https://a.example/1"]  # seen, queued all the same
    assert rds.exists("{t}:revisits", "{t}:rdata") == 0
    assert frontier.audit() == {}


def test_revisit_intervals_per_site_override_the_default(rds: redis.Redis) -> None:
    frontier = _frontier(rds, revisit_after=100)
    rds.hset("{t}:revisit", mapping={"never.example": 0, "soon.example": 50, "bad.example": "2s"})
    frontier.commit(Commit(revisits=[
        _revisit(f"https://{site}.example/") for site in ("never", "soon", "bad", "plain")
    ]))
    now = redis_ms(rds)
    due = {k.decode(): v - now for k, v in rds.zrange("{t}:revisits", 0, -1, withscores=True)}
    assert due.keys() == {"https://soon.example/", "https://bad.example/", "https://plain.example/"}
    assert due["https://soon.example/"] <= 50
    assert 99_000 < due["https://bad.example/"] <= 100_000  # a bad value: the default
    assert 99_000 < due["https://plain.example/"] <= 100_000


def test_malformed_revisit_entries_are_dead_lettered_and_good_ones_queued(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    frontier.commit(Commit(revisits=[_revisit("https://a.example/ok")]))
    rds.zadd("{t}:revisits", {"fp-garbled": 0, "fp-missing": 0})
    rds.hset("{t}:rdata", "fp-garbled", "no tabs here")
    wait_until_due(rds, "{t}:revisits")

    got, problems = _lease_all(frontier)

    assert got == [b"https://a.example/ok"]
    [dead] = [json.loads(d) for d in rds.lrange("{t}:dead", 0, -1)]
    assert dead["reason"] == "malformed revisit entry"
    assert dead["entry"] == "no tabs here"
    assert any("{t}:rdata holds a malformed entry" in p for p in problems)
    assert any("fingerprint without an entry in {t}:rdata" in p for p in problems)
    assert rds.exists("{t}:revisits", "{t}:rdata") == 0


def test_revisit_keys_of_the_wrong_type_refuse_the_call_before_any_write(
    rds: redis.Redis,
) -> None:
    frontier = _frontier(rds)
    rds.set("{t}:rdata", "oops")
    with pytest.raises(ResponseError, match=r"\{t\}:rdata holds a string"):
        frontier.commit(Commit(revisits=[_revisit("https://a.example/")], dead=[b"{}"]))
    assert rds.exists("{t}:revisits", "{t}:dead") == 0  # nothing written
    with pytest.raises(ResponseError, match=r"\{t\}:rdata holds a string"):
        frontier.lease_many(["w#z:0"])


# -- whole crawls ------------------------------------------------------------------


def _two_pages(version: dict[str, str]) -> Any:
    """A handler: ``/`` links to ``/b``, whose title is ``b <version["b"]>``."""

    def handle(path: str, nth: int) -> Page | None:
        html = [("Content-Type", "text/html")]
        if path == "/":
            return Page(200, html, b'<html><title>root</title><a href="/b">b</a></html>')
        if path == "/b":
            return Page(200, html, f"<html><title>b {version['b']}</title></html>".encode())
        return None

    return handle


@pytest.mark.workers
def test_a_changed_page_is_parsed_again_and_a_sites_override_sets_its_interval(
    env: dict[str, str], db: Any, rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    version = {"b": "one"}
    site = site_factory(handler=_two_pages(version))
    # The default (10 minutes) would never come due here; the site's 2 s do.
    done = frontier_cli(env["REDIS_URL"], "revisit", "pages", site.url, "2")
    assert done.returncode == 0, done.stderr
    assert rds.hget("{pages}:revisit", site_of(Request(site.url))) == b"2000"
    rds.lpush("pages:start_urls", site.url_for("/"))
    settings = {"FRONTIER_REVISIT_AFTER": 600, "MAX_IDLE_TIME_BEFORE_CLOSE": 1}

    [first] = crawl("pages", env, tmp_path, settings=settings)
    assert first.returncode == 0
    wait_until_due(rds, "{pages}:revisits")
    # Read at each commit: the revisits the second run schedules are due in
    # 10 minutes, so it does not revisit /b again itself.
    rds.hset("{pages}:revisit", site_of(Request(site.url)), 600_000)
    site.clear_hits()
    version["b"] = "two"
    [second] = crawl("pages", env, tmp_path, settings=settings)

    assert second.returncode == 0
    hits = {h.path: h for h in site.hits() if h.path != "/robots.txt"}
    assert hits.keys() == {"/", "/b"}
    assert all(h.conditional for h in hits.values())
    assert (hits["/"].status, hits["/b"].status) == (304, 200)
    assert second.stats["revisit/not_modified"] == 1
    assert second.stats["revisit/modified"] == 1
    assert db.pages.find_one({"final_url": site.url_for("/b")})["title"] == "b two"
    assert db.pages.count_documents({}) == 2
    # The new validators replace the old: the next revisit of /b sends them.
    entries = [entry_fields(v.split(b"\t", 2)[2]) for v in rds.hvals("{pages}:rdata")]
    [entry] = [e for e in entries if e["u"] == "/b"]
    etag = entry["m"][REVISIT_META]["etag"]
    assert etag == '"' + hashlib.sha1(b"<html><title>b two</title></html>").hexdigest()[:20] + '"'


# -- faults ------------------------------------------------------------------------


class _Spider(Spider):
    name = "t"


@pytest.mark.usefixtures("stop_heartbeats")
def test_a_commit_carrying_revisits_whose_reply_was_lost_runs_once(
    redis_url: str, rds: redis.Redis
) -> None:
    with FaultProxy(redis_url) as proxy:
        scheduler, crawler = harness.open_scheduler(
            proxy.url, _Spider, FRONTIER_REVISIT_AFTER=60
        )
        scheduler.enqueue_request(Request("https://a.example/x"))
        assert scheduler.flush_outbox()
        [request] = harness.lease_all(scheduler)
        crawler.signals.send_catch_log(
            request_fetched, request=request, validators={"etag": '"v1"'}
        )
        crawler.signals.send_catch_log(  # robots.txt, say: not leased, not revisited
            request_fetched, request=Request("https://a.example/robots.txt"), validators={}
        )
        crawler.engine._slot.remove_request(request)  # handled: acked with the revisit
        rule = proxy.lose_replies(script="Revisits: one entry per fingerprint")

        assert not scheduler.flush_outbox()  # ran, but its reply was lost
        assert rule.acted == 1
        [(fp, due)] = rds.zrange("{t}:revisits", 0, -1, withscores=True)
        scheduler.session.down_until = 0.0  # Redis answers again
        assert scheduler.flush_outbox()  # found out that it ran: not sent again

        sent = [
            c for c in proxy.commands(script="Revisits: one entry per fingerprint")
            if any(REVISIT_META.encode() in arg for arg in c.args)
        ]
        assert len(sent) == 1
        assert rds.zrange("{t}:revisits", 0, -1, withscores=True) == [(fp, due)]
        entry = rds.hget("{t}:rdata", fp)
        assert entry is not None
        revisit = entry_fields(entry.split(b"\t", 2)[2])
        assert revisit["u"] == "/x"
        assert revisit["m"][REVISIT_META] == {"etag": '"v1"'}
        assert rds.zcard("{t}:leases") == 0  # the ack went with it
        assert crawler.stats.get_value("frontier/revisits/scheduled") == 1
        assert scheduler.queue.frontier.audit() == {}


# -- the middleware, alone -------------------------------------------------------------


class _FailingPipeline(MongoPipeline):
    def __init__(self) -> None:  # never opened: only touch() is called
        pass

    def touch(self, source: str, when: Any) -> int:
        raise ServerSelectionTimeoutError("MongoDB down (test)")


def _middleware() -> tuple[RevisitMiddleware, list[tuple[Any, ...]]]:
    crawler = get_crawler(Spider, {"FRONTIER_REVISIT_AFTER": 5})
    sent: list[tuple[Any, ...]] = []
    crawler.signals.connect(
        lambda request, validators, **_: sent.append(("fetched", request.url, validators)),
        signal=request_fetched, weak=False,
    )
    crawler.signals.connect(
        lambda request, reason, **_: sent.append(("dead", request.url, reason)),
        signal=request_dead, weak=False,
    )
    return RevisitMiddleware.from_crawler(crawler), sent


def test_the_middleware_is_off_without_revisits() -> None:
    with pytest.raises(NotConfigured):
        RevisitMiddleware.from_crawler(get_crawler(Spider, {"FRONTIER_REVISIT_AFTER": 0}))


def test_a_200_reports_its_validators_and_a_304_to_a_revisit_stops_before_the_callback(
) -> None:
    mw, sent = _middleware()
    fresh = Request("https://a.example/p")
    mw.process_request(fresh)
    assert b"If-None-Match" not in fresh.headers
    ok = HtmlResponse(fresh.url, headers={"ETag": '"e1"', "Last-Modified": "Mon, 01 Jan 2024 "
                                          "00:00:00 GMT"}, request=fresh)
    assert asyncio.run(mw.process_response(fresh, ok)) is ok
    validators = {"etag": '"e1"', "modified": "Mon, 01 Jan 2024 00:00:00 GMT"}
    assert sent == [("fetched", fresh.url, validators)]

    revisit = Request(fresh.url, meta={REVISIT_META: validators})
    mw.process_request(revisit)
    assert revisit.headers[b"If-None-Match"] == b'"e1"'
    assert revisit.headers[b"If-Modified-Since"] == b"Mon, 01 Jan 2024 00:00:00 GMT"
    with pytest.raises(IgnoreRequest):
        asyncio.run(mw.process_response(revisit, HtmlResponse(fresh.url, status=304)))
    assert sent[1:] == [("fetched", fresh.url, validators)]  # the same validators again
    assert mw.crawler.stats.get_value("revisit/not_modified") == 1


def test_a_304_to_a_request_that_was_not_conditional_is_left_to_scrapy() -> None:
    mw, sent = _middleware()
    plain = Request("https://a.example/p")
    response = HtmlResponse(plain.url, status=304)
    assert asyncio.run(mw.process_response(plain, response)) is response
    assert sent == []


def test_a_304_that_mongodb_could_not_record_becomes_a_dead_letter() -> None:
    mw, sent = _middleware()
    register_store(mw.crawler, _FailingPipeline())
    revisit = Request("https://a.example/p", meta={REVISIT_META: {"etag": '"e1"'}})
    mw.process_request(revisit)
    with pytest.raises(IgnoreRequest):
        asyncio.run(mw.process_response(revisit, HtmlResponse(revisit.url, status=304)))
    [(what, url, reason)] = sent  # no revisit scheduled: the dead letter's requeue sends it
    assert (what, url) == ("dead", revisit.url)
    assert reason.startswith("304 not recorded in MongoDB: ServerSelectionTimeoutError")


@pytest.mark.usefixtures("stop_heartbeats")
def test_the_per_site_revisit_setting_is_stored_as_the_command_would(
    redis_url: str, rds: redis.Redis
) -> None:
    harness.open_scheduler(
        redis_url, _Spider, FRONTIER_REVISIT_AFTER=60,
        FRONTIER_SITE_REVISITS={"https://A.example/": 0.5, "b.example": 0},
    )
    assert rds.hgetall("{t}:revisit") == {b"a.example": b"500", b"b.example": b"0"}
    with pytest.raises(ValueError, match=r"FRONTIER_SITE_REVISITS\['c.example'\]"):
        parse_site_settings("revisit", {"c.example": "1h"}, "FRONTIER_SITE_REVISITS")
