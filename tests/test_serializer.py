"""JSON encoding of frontier requests (pure logic)."""

from __future__ import annotations

import pickle

import pytest
from scrapy import Request, Spider
from scrapy.utils.request import request_from_dict

from crawler.frontier import serializer
from crawler.frontier.serializer import DecodeError, EncodeError


class _Spider(Spider):
    name = "s"

    def parse_item(self, response: object) -> None:
        pass


def roundtrip(request: Request, spider: Spider) -> Request:
    data = serializer.dumps(request.to_dict(spider=spider))
    return request_from_dict(serializer.loads(data), spider=spider)


def test_a_full_request_survives_the_roundtrip() -> None:
    spider = _Spider()
    request = Request(
        "https://a.example/p?q=1",
        callback=spider.parse_item,
        method="POST",
        headers={"X-Token": "abc"},
        body=b"\xff\x00binary",
        cookies={"c": "1"},
        meta={"depth": 2, "seed_hosts": ["a.example"], "nested": {"x": [1, None]}},
        cb_kwargs={"page": 3},
        priority=-4,
        dont_filter=True,
        flags=["f"],
        encoding="latin-1",
    )
    back = roundtrip(request, spider)
    assert back.url == request.url
    assert back.callback == spider.parse_item
    assert back.method == "POST"
    assert back.headers.getlist("X-Token") == [b"abc"]
    assert back.body == request.body
    assert back.cookies == {"c": "1"}
    assert back.meta == request.meta
    assert back.cb_kwargs == {"page": 3}
    assert (back.priority, back.dont_filter, back.flags, back.encoding) == (
        -4, True, ["f"], "latin-1",
    )


def test_defaults_are_not_stored() -> None:
    data = serializer.dumps(Request("https://a.example/page/2/").to_dict())
    assert data == b'{"u":"https://a.example/page/2/"}'


def test_unencodable_meta_names_the_url_and_key() -> None:
    request = Request("https://a.example/x", meta={"ok": 1, "item": object()})
    with pytest.raises(EncodeError, match=r"https://a.example/x.*meta\['item'\] is a object"):
        serializer.dumps(request.to_dict())
    request = Request("https://a.example/y", cb_kwargs={"b": b"bytes"})
    with pytest.raises(EncodeError, match=r"https://a.example/y.*cb_kwargs\['b'\] is a bytes"):
        serializer.dumps(request.to_dict())


def test_a_pickled_payload_is_refused_not_unpickled() -> None:
    payload = pickle.dumps({"url": "https://a.example/"})
    with pytest.raises(DecodeError, match="pickled payload"):
        serializer.loads(payload)


@pytest.mark.parametrize("data", [b"not json", b"[1]", b'{"url": "x"}', b"\xfe\xff"])
def test_foreign_entries_are_refused(data: bytes) -> None:
    with pytest.raises(DecodeError):
        serializer.loads(data)


@pytest.mark.parametrize(
    ("url", "stored"),
    [
        ("https://a.example/page/2/?q=1", '"u":"/page/2/?q=1"'),
        ("http://a.example:8080/x", '"u":"/x","w":1'),
        ("https://a.example?q=1", '"u":"/?q=1"'),
        ("https://other.example/x", '"u":"https://other.example/x"'),
    ],
)
def test_urls_are_stored_relative_to_the_site_of_their_queue(url: str, stored: str) -> None:
    site = "a.example:8080" if ":8080" in url else "a.example"
    data = serializer.dumps(Request(url).to_dict(), site)
    assert stored in data.decode()
    back = request_from_dict(serializer.loads(data, site))
    assert back.url == Request(url).url


def test_a_relative_entry_needs_its_site() -> None:
    with pytest.raises(DecodeError, match="relative URL"):
        serializer.loads(b'{"u":"/x"}')


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[" * 100_000, "not JSON"),
        (b'{"u":"https://a.example/","h":5}', "bad field 'h'"),
        (b'{"u":"https://a.example/","b":5}', "bad field 'b'"),
        (b'{"u":"https://a.example/","zz":1}', "bad field 'zz'"),
        (b'{"u":"https://a.example/","h":{"a":[1]}}', "bad headers"),
        (b'{"u":"https://a.example/","t":"os.system"}', "not a loaded Request class"),
        (b'{"u":"https://a.example/","t":"nosuchmodule.X"}', "not a loaded Request class"),
    ],
)
def test_poison_entries_are_refused_without_importing_anything(data: bytes, reason: str) -> None:
    import sys

    with pytest.raises(DecodeError, match=reason):
        serializer.loads(data)
    assert "nosuchmodule" not in sys.modules


def test_a_request_subclass_survives_the_roundtrip() -> None:
    from scrapy.http import JsonRequest

    data = serializer.dumps(JsonRequest("https://a.example/api", data={"q": 1}).to_dict())
    back = request_from_dict(serializer.loads(data))
    assert type(back) is JsonRequest
