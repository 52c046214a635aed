"""Every request that enters the frontier leaves a trace, and comes back whole.

Issue 12, cases 2 and 3. A request filtered as a duplicate, by this
worker's memory of fingerprints (``FRONTIER_LOCAL_SEEN``) or by the shared
dupefilter in Redis, is counted in ``dupefilter/filtered`` and logged as
Scrapy logs filtered duplicates. A :class:`scrapy.Request` subclass comes
back from Redis as itself with every attribute it declares, or is refused
when it is scheduled, naming the class and the attribute.

Whole crawls run real ``scrapy crawl`` workers against a real HTTP server
and Redis; the spiders below are loaded by the workers through
``SPIDER_MODULES``. The scheduler tests run it in process against a real
Redis (``tests/scheduler_harness.py``).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider, signals
from scrapy.http import FormRequest, JsonRequest, XmlRpcRequest
from scrapy.utils.request import request_from_dict

import crawler.frontier as frontier_package
from crawler.frontier import serializer
from crawler.frontier.serializer import DecodeError, EncodeError
from crawler.frontier.sites import site_of
from crawler.frontier.spider import FrontierSpider
from devtools.replay import Page
from tests import scheduler_harness as harness
from tests.faultproxy import FaultProxy
from tests.workers import crawl

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis
    from scrapy.http import Response

    from tests.conftest import SiteFactory

SPIDERS = {"SPIDER_MODULES": "crawler.spiders,tests.test_request_trace", "LOG_LEVEL": "DEBUG"}
HTML = [("Content-Type", "text/html")]
FIRST_DUPLICATE = (
    "Filtered duplicate request: <GET {}> - no more duplicates will be shown "
    "(see DUPEFILTER_DEBUG to show all duplicates)"
)


class TaggedRequest(Request):
    """A Request subclass with an attribute of its own, as Scrapy documents."""

    attributes = (*Request.attributes, "tag")

    def __init__(self, *args: Any, tag: Any = None, **kwargs: Any) -> None:
        self.tag = tag
        super().__init__(*args, **kwargs)


class TraceSpider(FrontierSpider):
    """Follows every link of a page."""

    name = "request_trace"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield from response.follow_all(css="a")


def _no_encoding() -> None:
    """A value no encoding can carry (a function)."""


class TaggedSpider(FrontierSpider):
    """From its seed, yields a TaggedRequest the frontier can carry and one it cannot."""

    name = "request_trace_tagged"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield TaggedRequest(
            response.urljoin("/a"), tag="t-42", callback=self.parse_tagged, cb_kwargs={"n": 7}
        )
        yield TaggedRequest(
            response.urljoin("/bad"), tag=_no_encoding, callback=self.parse_tagged,
            cb_kwargs={"n": 8},
        )

    def parse_tagged(self, response: Response, n: int) -> None:
        request = response.request
        assert request is not None
        self.logger.info(
            "Callback got a %s with tag %r and n=%r",
            type(request).__name__, getattr(request, "tag", None), n,
        )


def _html(*links: str) -> Page:
    body = "".join(f'<a href="{link}">{link}</a>' for link in links)
    return Page(200, HTML, f"<html><body>{body}</body></html>".encode())


def _fetched(site: Any) -> list[str]:
    return sorted(h.path for h in site.hits() if h.path != "/robots.txt")


# --- case 2: duplicates, in whole crawls ---------------------------------------------


@pytest.mark.workers
def test_a_redirect_onto_a_dead_lettered_fingerprint_is_counted_and_logged(
    env: dict[str, str], rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    # /t?a=1&b=2 answers 500 until its retries run out (a dead letter);
    # only then does /r redirect to /t?b=2&a=1, the same fingerprint.
    given_up = threading.Event()

    def handler(path: str, nth: int) -> Page | None:
        if path == "/t?a=1&b=2":
            if nth == 2:
                given_up.set()
            return Page(500, HTML, b"down")
        if path == "/r":
            given_up.wait(30)
            return Page(302, [("Location", "/t?b=2&a=1")], b"")
        return None

    site = site_factory({"/": _html("/t?a=1&b=2", "/r")}, handler=handler)
    rds.lpush("request_trace:start_urls", site.url_for("/"))

    settings = {**SPIDERS, "RETRY_TIMES": 1, "FRONTIER_RETRY_BACKOFF_BASE": 0.05,
                "FRONTIER_RETRY_JITTER": 0}
    [worker] = crawl("request_trace", env, tmp_path, settings=settings)

    assert worker.returncode == 0, worker.log[-3000:]
    assert "DeprecationWarning" not in worker.log, worker.log[-3000:]
    # Fetched, dead-lettered, or filtered as a duplicate: nothing else.
    assert _fetched(site) == ["/", "/r", "/t?a=1&b=2", "/t?a=1&b=2"]
    dead = [json.loads(d) for d in rds.lrange("{request_trace}:dead", 0, -1)]
    assert [d["url"] for d in dead] == [site.url_for("/t?a=1&b=2")]
    assert worker.stats.get("dupefilter/filtered") == 1, worker.log[-5000:]
    assert FIRST_DUPLICATE.format(site.url_for("/t?b=2&a=1")) in worker.log, worker.log[-5000:]


@pytest.mark.workers
def test_every_duplicate_the_spider_yields_is_logged_with_dupefilter_debug(
    env: dict[str, str], rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    site = site_factory({
        "/": _html("/d?x=1&y=2", "/d?y=2&x=1", "/p"),
        "/p": _html("/d?x=1&y=2", "/"),
        "/d?x=1&y=2": _html(),
    })
    rds.lpush("request_trace:start_urls", site.url_for("/"))

    settings = {**SPIDERS, "DUPEFILTER_DEBUG": True}
    [worker] = crawl("request_trace", env, tmp_path, settings=settings)

    assert worker.returncode == 0, worker.log[-3000:]
    assert "DeprecationWarning" not in worker.log, worker.log[-3000:]
    assert _fetched(site) == ["/", "/d?x=1&y=2", "/p"]
    assert worker.stats.get("dupefilter/filtered") == 3, worker.log[-5000:]
    for url, referer in (("/d?y=2&x=1", "/"), ("/d?x=1&y=2", "/p"), ("/", "/p")):
        line = (
            f"Filtered duplicate request: <GET {site.url_for(url)}> "
            f"(referer: {site.url_for(referer)})"
        )
        assert line in worker.log, worker.log[-5000:]


# --- case 2: duplicates the shared dupefilter in Redis finds --------------------------


class _Spider(Spider):
    name = "trace"


@pytest.mark.usefixtures("stop_heartbeats")
def test_a_duplicate_found_in_redis_is_logged_counted_and_dropped_once(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Another worker recorded the fingerprint: this worker's memory does not
    # hold it, so commit.lua's reply says the push was filtered.
    first, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_LOCAL_SEEN=0)
    assert first.enqueue_request(Request("https://a.example/t?a=1&b=2"))
    assert first.flush_outbox()
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider, FRONTIER_LOCAL_SEEN=0)
    dropped: list[Request] = []
    crawler.signals.connect(
        lambda request, **kw: dropped.append(request), signal=signals.request_dropped, weak=False
    )
    caplog.set_level(logging.DEBUG, logger="crawler.frontier.dupefilter")
    duplicates = [Request("https://a.example/t?b=2&a=1"), Request("https://a.example/t?a=1&b=2")]

    for request in duplicates:
        assert scheduler.enqueue_request(request)  # filtered once the outbox is sent
        assert scheduler.flush_outbox()

    assert crawler.stats.get_value("dupefilter/filtered") == 2
    assert crawler.stats.get_value("scheduler/enqueued/redis") is None
    assert dropped == duplicates
    # Scrapy's message, once without DUPEFILTER_DEBUG.
    assert [r.getMessage() for r in caplog.records] == [
        FIRST_DUPLICATE.format("https://a.example/t?b=2&a=1")
    ]


@pytest.mark.usefixtures("stop_heartbeats")
def test_a_commit_whose_reply_was_lost_says_its_duplicates_are_not_known(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    first, _ = harness.open_scheduler(redis_url, _Spider, FRONTIER_LOCAL_SEEN=0)
    assert first.enqueue_request(Request("https://a.example/x"))
    assert first.flush_outbox()
    rds.script_flush()  # the proxy learns the scripts as the worker loads them
    with FaultProxy(redis_url) as proxy:
        scheduler, crawler = harness.open_scheduler(proxy.url, _Spider, FRONTIER_LOCAL_SEEN=0)
        commit = (Path(frontier_package.__file__).parent / "lua" / "commit.lua").read_bytes()
        rule = proxy.lose_replies(script=commit)
        scheduler.enqueue_request(Request("https://a.example/x"))
        scheduler.enqueue_request(Request("https://a.example/y"))
        assert not scheduler.flush_outbox()  # ran, but its reply was lost
        assert rule.acted == 1
        scheduler.session.down_until = 0.0  # retry now rather than after the backoff
        caplog.set_level(logging.INFO, logger="crawler.frontier")
        assert scheduler.flush_outbox()  # found out that it ran

    assert int(rds.get("{trace}:count") or 0) == 2  # /x once, /y
    assert crawler.stats.get_value("dupefilter/filtered") is None  # not guessed
    assert any(
        "which of its 2 new requests were queued and which were filtered as duplicates "
        "is not known" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


# --- case 3: Request subclasses ----------------------------------------------------


@pytest.mark.workers
def test_a_request_subclass_reaches_its_callback_whole_or_is_refused_by_name(
    env: dict[str, str], rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    site = site_factory({"/": _html(), "/a": _html(), "/bad": _html()})
    rds.lpush("request_trace_tagged:start_urls", site.url_for("/"))

    [worker] = crawl("request_trace_tagged", env, tmp_path, settings=SPIDERS)

    assert worker.returncode == 0, worker.log[-3000:]
    assert "DeprecationWarning" not in worker.log, worker.log[-3000:]
    assert "Callback got a TaggedRequest with tag 't-42' and n=7" in worker.log, worker.log[-5000:]
    assert _fetched(site) == ["/", "/a"]
    assert (
        f"ERROR: cannot store request {site.url_for('/bad')} in Redis: "
        "TaggedRequest attribute 'tag' is a function, which has no faithful encoding"
    ) in worker.log, worker.log[-5000:]
    assert worker.stats.get("scheduler/unencodable") == 1
    assert "Traceback" not in worker.log, worker.log[-5000:]


SUBCLASSES = [
    TaggedRequest("https://a.example/x", tag="t-42", cb_kwargs={"n": 7}, meta={"m": 1}),
    TaggedRequest("https://a.example/none"),  # tag None
    TaggedRequest("https://a.example/nested", tag={"k": [1, "two", None]}, priority=3),
    JsonRequest("https://a.example/api", data={"q": 1}, dumps_kwargs={"indent": 1}),
    JsonRequest("https://a.example/get", method="GET"),
    FormRequest("https://a.example/f", formdata={"a": "b"}),
    FormRequest("https://a.example/g", method="GET", formdata={"a": "b"}),
    XmlRpcRequest("https://a.example/rpc", params=(1,), methodname="m"),
    # XmlRpcRequest's __init__ makes a request POST and dont_filter unless told.
    XmlRpcRequest("https://a.example/rpc", params=(1,), methodname="m", method="GET",
                  dont_filter=False),
]


@pytest.mark.parametrize("request_", SUBCLASSES, ids=lambda r: f"{type(r).__name__}:{r.url}")
@pytest.mark.parametrize("site", [None, "a.example"])
def test_request_subclasses_round_trip_whole(request_: Request, site: str | None) -> None:
    data = serializer.dumps(request_.to_dict(), site)
    back = request_from_dict(serializer.loads(data, site))
    assert type(back) is type(request_)
    assert back.to_dict() == request_.to_dict()


@pytest.mark.usefixtures("stop_heartbeats")
def test_the_queue_round_trips_request_subclasses_whole(redis_url: str) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Spider)
    queue = scheduler.queue
    for request in SUBCLASSES:
        back = queue.decode(queue.encode(request), site_of(request))
        assert type(back) is type(request)
        # (with its site as its download slot, as Scrapy's downloader sets it)
        sent = request.to_dict()
        assert back.to_dict() == {**sent, "meta": {**sent["meta"], "download_slot": "a.example"}}


def test_a_plain_request_is_stored_as_compactly_as_before() -> None:
    data = serializer.dumps(Request("https://a.example/page/2/").to_dict(), "a.example")
    assert data == b"/page/2/"
    data = serializer.dumps(TaggedRequest("https://a.example/", tag="t").to_dict(), "a.example")
    assert data == b'/\t\t\t{"t":"tests.test_request_trace.TaggedRequest","X":{"tag":"t"}}'


@pytest.mark.parametrize(
    ("tag", "where", "kind"),
    [
        (object(), "'tag'", "object"),
        ({"k": [1, {2, _no_encoding}]}, "'tag'['k'][1] element", "function"),
    ],
)
def test_an_attribute_with_no_faithful_encoding_is_refused_naming_the_class_and_attribute(
    tag: Any, where: str, kind: str
) -> None:
    request = TaggedRequest("https://a.example/x", tag=tag)
    with pytest.raises(EncodeError) as info:
        serializer.dumps(request.to_dict())
    assert str(info.value) == (
        f"cannot store request https://a.example/x in Redis: TaggedRequest attribute "
        f"{where} is a {kind}, which has no faithful encoding"
    )


@pytest.mark.parametrize("tag", [{"t-42"}, b"t-42", {"k": [1, {2}]}, (1, 2)])
def test_an_attribute_json_cannot_carry_keeps_its_type(tag: Any) -> None:
    request = TaggedRequest("https://a.example/x", tag=tag)
    back = serializer.rebuild(serializer.loads(serializer.dumps(request.to_dict())))
    assert type(back) is TaggedRequest
    assert back.tag == tag and type(back.tag) is type(tag)


def test_keys_of_no_request_attribute_are_refused_without_a_class() -> None:
    with pytest.raises(EncodeError, match="Request has no attribute 'tag'"):
        serializer.dumps({**Request("https://a.example/").to_dict(), "tag": "t"})


TAGGED = {"u": "https://a.example/", "t": "tests.test_request_trace.TaggedRequest"}
FORM = {"u": "https://a.example/", "t": "scrapy.http.request.form.FormRequest"}


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({**TAGGED, "X": 5}, "bad field 'X'"),
        ({**TAGGED, "X": ["tag"]}, "bad field 'X'"),
        ({"u": "https://a.example/", "X": {"tag": "t"}}, "'X' but no Request subclass 't'"),
        ({**TAGGED, "X": {"nosuch": 1}}, "'nosuch' is not an attribute that TaggedRequest adds"),
        ({**TAGGED, "X": {"url": "https://b.example/"}}, "'url' is not an attribute that"),
        ({**TAGGED, "X": {"_class": "os.system"}}, "'_class' is not an attribute that"),
        ({**FORM, "X": {"dumps_kwargs": {}}}, "'dumps_kwargs' is not an attribute that FormRe"),
    ],
)
@pytest.mark.parametrize("framed", [False, True], ids=["json-form", "framed"])
def test_a_malformed_extra_attributes_field_read_from_redis_is_refused(
    entry: dict[str, Any], reason: str, framed: bool
) -> None:
    data = serializer.pack_fields(entry) if framed else json.dumps(entry).encode()
    assert data.startswith(b"https://" if framed else b"{")
    with pytest.raises(DecodeError, match=reason):
        serializer.loads(data)


class PositionalRequest(Request):
    """A subclass whose ``__init__`` does not take back what ``to_dict`` gives."""

    attributes = (*Request.attributes, "kind")

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        super().__init__(url)


def test_a_subclass_that_cannot_be_rebuilt_is_refused_when_scheduled(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider)
    assert not scheduler.enqueue_request(PositionalRequest("k", "https://a.example/p"))
    assert crawler.stats.get_value("scheduler/unencodable") == 1
    assert (
        "cannot store request https://a.example/p in Redis: PositionalRequest cannot be "
        "rebuilt from its stored form (TypeError" in caplog.text
    )
    assert scheduler.enqueue_request(TaggedRequest("https://a.example/t", tag="t-1"))  # fine
