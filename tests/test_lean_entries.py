"""The ``pages`` spider's requests are stored lean (their Referer relative to
their site, their depth and seed hosts in the META field) and come back from
Redis equal, key order included; entries written before still decode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy.utils.test import get_crawler

from crawler.commands.deadletters import requeue_push
from crawler.frontier import serializer
from crawler.frontier.queue import LeasedPriorityQueue
from crawler.frontier.serializer import DecodeError
from crawler.spiders.pages import PagesSpider

PROJECT_DIR = Path(__file__).resolve().parent.parent
SITE = "127.0.0.1:8080"


def _queue(redis_url: str) -> LeasedPriorityQueue:
    crawler = get_crawler(PagesSpider, {"REDIS_URL": redis_url, "FRONTIER_DELAY": 0.0,
                                        "FRONTIER_CONCURRENCY": 100_000})
    spider = PagesSpider()
    spider._set_crawler(crawler)
    crawler.spider = spider
    return LeasedPriorityQueue(redis.Redis.from_url(redis_url), spider, "{pages}")


def _same(back: Request, sent: Request, slot: str | None = None) -> None:
    """``back`` is ``sent``, meta and headers in order (with ``slot``, its
    download slot last, as ``LeasedPriorityQueue.decode`` adds it)."""
    meta = dict(sent.meta)
    if slot is not None:
        meta.setdefault("download_slot", slot)
    assert list(back.meta.items()) == list(meta.items())
    assert list(back.headers.items()) == list(sent.headers.items())
    assert {**back.to_dict(), "meta": None} == {**sent.to_dict(), "meta": None}


def _pages_request(path: str, depth: int, referer: str, **kwargs: Any) -> Request:
    """A request as the pages spider yields it: depth, seed hosts, Referer."""
    return Request(f"http://{SITE}{path}", headers={"Referer": referer},
                   meta={"depth": depth, "seed_hosts": [SITE]}, **kwargs)


def test_a_pages_request_is_its_path_depth_and_referer_path() -> None:
    request = _pages_request("/tag/love/page/2/", 3, f"http://{SITE}/tag/love/")
    data = serializer.dumps(request.to_dict(), SITE)
    assert data == b"!/tag/love/page/2/\t\t3s\t\t!/tag/love/"
    back = serializer.rebuild(serializer.loads(data, SITE))
    _same(back, request)
    assert back.meta == {"depth": 3, "seed_hosts": [SITE]}


@pytest.mark.parametrize(
    ("meta", "referer", "stored"),
    [
        ({"depth": 1, "seed_hosts": [SITE]}, f"https://{SITE}/a?b=1", "1s\t\t/a?b=1"),
        ({"seed_hosts": [SITE], "depth": 0}, f"http://{SITE}/", "s0\t\t!/"),
        ({"seed_hosts": [SITE]}, "https://other.example/x", "s\t\thttps://other.example/x"),
        ({"depth": 2, "seed_hosts": ["other.example"]}, f"http://{SITE}:81/",
         '\t{"m":{"depth":2,"seed_hosts":["other.example"]}}\thttp://127.0.0.1:8080:81/'),
        ({"depth": 2, "seed_hosts": [SITE, "b.example"]}, "/relative", '\t{"m":{"depth":2,'
         '"seed_hosts":["127.0.0.1:8080","b.example"]}}\t=/relative'),
        ({"seed_hosts": [SITE], "x": 1}, "=odd", '\t{"m":{"seed_hosts":["127.0.0.1:8080"],'
         '"x":1}}\t==odd'),
        ({"!x": 1, "depth": 4}, "!no", '\t{"m":{"!x":1,"depth":4}}\t=!no'),
        ({"depth": True, "seed_hosts": [SITE]}, "é", 's\t{"m":{"depth":true}}\t=Ã©'),
    ],
)
def test_the_meta_tail_and_the_referer_come_back_equal_and_in_order(
    meta: dict[str, Any], referer: str, stored: str
) -> None:
    request = Request(f"http://{SITE}/x", meta=meta, headers={"Referer": referer})
    data = serializer.dumps(request.to_dict(), SITE)
    assert data.decode() == "!/x\t\t" + stored
    back = serializer.rebuild(serializer.loads(data, SITE))
    _same(back, request)
    assert request.meta == meta  # the request's own meta is not changed


@pytest.mark.parametrize(
    "headers",
    [
        {"Referer": "https://a.example/", "Accept": "x"},  # not the last header: JSON
        {"Accept": "x", "Referer": "https://a.example/"},
        {"Referer": ["https://a.example/", "https://b.example/"]},
        {"Referer": ""},
        {"Referer": "https://a.example/\tx"},
        {"Referer": b"https://a.example/\xff"},
    ],
)
def test_any_referer_comes_back_with_the_other_headers_in_order(
    headers: dict[str, Any]
) -> None:
    request = Request("https://a.example/x", headers=headers, meta={"depth": 1})
    for site in ("a.example", None):
        data = serializer.dumps(request.to_dict(), site)
        _same(serializer.rebuild(serializer.loads(data, site)), request)


def test_without_its_site_an_entry_keeps_what_is_relative_to_it_and_packs_back() -> None:
    request = _pages_request("/p", 2, f"http://{SITE}/q", priority=3)
    data = serializer.dumps(request.to_dict(), SITE)
    fields = serializer.entry_fields(data)
    assert fields == {"u": "/p", "w": 1, "p": 3, "T": "2s", "r": "!/q"}
    assert serializer.pack_fields(fields) == data
    with pytest.raises(DecodeError, match="relative to its site and no site"):
        serializer.loads(data)
    whole = serializer.entry_fields(data, SITE)
    assert whole["m"] == {"depth": 2, "seed_hosts": [SITE]}
    assert whole["h"] == {"Referer": [f"http://{SITE}/q"]}
    assert serializer.pack_fields(whole, SITE) == data
    _same(serializer.rebuild(serializer.loads(serializer.pack_fields(whole), SITE)), request)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"/x\t\t1ss", "bad depth field"),
        (b"/x\t\t1s2", "bad depth field"),
        (b"/x\t\tt", "bad depth field"),
        (b'/x\t\ts\t{"m":{"seed_hosts":[]}}', "bad depth field"),
        (b"/x\t\t1\t\t", "bad Referer field"),
        (b"/x\t\t1\t\t!x", "bad Referer field"),
        (b"/x\t\t1\t\t1x", "bad Referer field"),
        (b"/x\t\t1\t\t/a\tb", "bad Referer field"),
        (b'/x\t\t1\t{"h":{"Referer":["a:b"]}}\t/y', "Referer in its headers and in its field"),
        (b'{"u":"/x","T":"s"}', "bad field 'T' or 'r'"),
    ],
)
def test_malformed_lean_fields_read_from_redis_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        serializer.loads(data, SITE)


#: Entries of the pages spider as the previous version of the encoding wrote
#: them (meta and headers in the JSON field), and the requests they hold.
OLD_ENTRIES = [
    (b'!/tag/love/\t\t\t{"m":{"depth":2,"seed_hosts":["127.0.0.1:8080"]},'
     b'"h":{"Referer":["http://127.0.0.1:8080/"]}}',
     _pages_request("/tag/love/", 2, f"http://{SITE}/")),
    (b'!/\t\t\t{"m":{"seed_hosts":["127.0.0.1:8080"]},"f":1}',
     Request(f"http://{SITE}/", meta={"seed_hosts": [SITE]}, dont_filter=True)),
    (b'!/page/2/\t\t3\t{"h":{"Referer":["http://127.0.0.1:8080/page/1/"]}}',
     Request(f"http://{SITE}/page/2/", meta={"depth": 3},
             headers={"Referer": f"http://{SITE}/page/1/"})),
]


def _lease_all(queue: LeasedPriorityQueue) -> list[Any]:
    """Every queued request's lease, in queue order."""
    out: list[Any] = []
    while True:
        leases = queue.frontier.lease_many([f"t#0:{len(out) + i}" for i in range(64)])
        if not isinstance(leases, list) or not leases:
            return out
        out.extend(leases)


def test_entries_queued_before_decode_from_redis_as_before(redis_url: str) -> None:
    """A rolling upgrade: entries already in the queue, in the earlier
    encoding, are leased and decoded into the requests they held."""
    queue = _queue(redis_url)
    for data, _ in OLD_ENTRIES:
        assert queue.frontier.push(data, site=SITE, priority=0, fingerprint=None,
                                   dont_filter=True)
    backs = [queue.decode(lease.data, lease.site) for lease in _lease_all(queue)]
    for back, (_, sent) in zip(backs, OLD_ENTRIES, strict=True):
        _same(back, sent, SITE)
    # and each is now stored lean
    assert [len(queue.encode(sent)) for _, sent in OLD_ENTRIES] == [19, 13, 23]


def test_a_lean_dead_letter_entry_is_requeued_whole() -> None:
    request = _pages_request("/p", 2, f"http://{SITE}/q")
    request.meta["retry_times"] = 2
    data = serializer.dumps(request.to_dict(), SITE)
    push = requeue_push({"entry": data.decode(), "site": SITE, "priority": 0})
    assert push is not None and push.site == SITE
    back = serializer.rebuild(serializer.loads(push.data, SITE))
    del request.meta["retry_times"]
    assert push.priority == 2  # before Scrapy's retries lowered it
    _same(back, request.replace(priority=2))


_CRAWL_AND_ROUNDTRIP = """
import json, sys
from bench.pages_memory import crawl_requests
from tests.test_lean_entries import _lease_all, _queue, _same

url = sys.argv[1]
requests = crawl_requests(url)
queue = _queue(url)
fingerprint = queue.spider.crawler.request_fingerprinter.fingerprint
distinct = {fingerprint(r): r for r in reversed(requests)}
for request in distinct.values():
    queue.push(request)
out = {"own": 0, "redirects": 0, "bytes": []}
leases = _lease_all(queue)
assert len(leases) == len(distinct)
for lease in leases:
    back = queue.decode(lease.data, lease.site)
    sent = distinct.pop(fingerprint(back))
    if "redirect_urls" in sent.meta:  # (the downloader set download_slot mid-meta)
        assert back.to_dict(spider=queue.spider) == sent.to_dict(spider=queue.spider)
        out["redirects"] += 1
    else:
        _same(back, sent, lease.site)
        out["own"] += 1
        out["bytes"].append(len(lease.data))
print(json.dumps(out))
"""


@pytest.mark.workers
def test_the_pages_spiders_own_requests_come_back_from_redis_exactly(redis_url: str) -> None:
    """A real crawl of the quotes capture: every request the spider yields
    (depth, Referer, seed hosts, as Scrapy's middlewares and ours set them)
    is queued, leased and decoded equal, in order; each entry is short."""
    done = subprocess.run(
        [sys.executable, "-c", _CRAWL_AND_ROUNDTRIP, redis_url],
        cwd=PROJECT_DIR, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["own"] >= 200 and out["redirects"] >= 40
    assert max(out["bytes"]) <= 80
