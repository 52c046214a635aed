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
    assert data == b"https://a.example/page/2/"


def test_a_typical_request_is_its_path_callback_and_depth() -> None:
    spider = _Spider()
    request = Request(
        "https://a.example/catalog/item-1.html?ref=list",
        callback=spider.parse_item, meta={"depth": 2},
    )
    data = serializer.dumps(request.to_dict(spider=spider), "a.example")
    assert data == b"/catalog/item-1.html?ref=list\tparse_item\t2"
    back = request_from_dict(serializer.loads(data, "a.example"), spider=spider)
    assert (back.url, back.callback, back.meta) == (request.url, spider.parse_item, {"depth": 2})


@pytest.mark.parametrize(
    ("meta", "stored"),
    [
        ({"depth": 3}, "\t\t3"),
        ({"a": [1], "depth": 0}, '\t\t0\t{"m":{"a":[1]}}'),
        ({"depth": -1}, "\t\t-1"),
        # Only an int that is meta's last key leaves meta: key order is kept.
        ({"depth": 1, "a": 1}, '\t\t\t{"m":{"depth":1,"a":1}}'),
        ({"depth": True}, '\t\t\t{"m":{"depth":true}}'),
        ({"depth": 2.0}, '\t\t\t{"m":{"depth":2.0}}'),
        ({"depth": "2"}, '\t\t\t{"m":{"depth":"2"}}'),
    ],
)
def test_meta_comes_back_equal_and_in_order(meta: dict[str, object], stored: str) -> None:
    request = Request("https://a.example/x", meta=meta)
    data = serializer.dumps(request.to_dict(), "a.example")
    assert data.decode() == "/x" + stored
    back = request_from_dict(serializer.loads(data, "a.example"))
    assert list(back.meta.items()) == list(meta.items())
    assert [type(v) for v in back.meta.values()] == [type(v) for v in meta.values()]
    assert request.meta == meta  # the request's own meta is not changed


def test_entries_in_the_json_form_of_earlier_versions_still_decode() -> None:
    spider = _Spider()
    data = b'{"u":"/catalog/x?y=1","w":1,"c":"parse_item","m":{"depth":2},"p":3}'
    back = request_from_dict(serializer.loads(data, "a.example:8080"), spider=spider)
    assert back.url == "http://a.example:8080/catalog/x?y=1"
    assert (back.callback, back.meta, back.priority) == (spider.parse_item, {"depth": 2}, 3)
    back = request_from_dict(serializer.loads(b'{"u":"https://b.example/"}'))
    assert back.url == "https://b.example/"


def test_a_url_that_cannot_be_a_field_is_stored_in_the_json_form() -> None:
    spider = _Spider()
    obj = Request("https://a.example/x", callback=spider.parse_item).to_dict(spider=spider)
    for url in ("https://a.example/x\ty", "1https://a.example/"):
        data = serializer.dumps({**obj, "url": url})
        assert data.startswith(b'{"u":')
        back = serializer.loads(data)
        assert (back["url"], back["callback"]) == (url, "parse_item")


def test_a_callback_with_a_tab_stays_in_the_json_field() -> None:
    obj = Request("https://a.example/x").to_dict()
    data = serializer.dumps({**obj, "callback": "a\tb", "meta": {"depth": 1}}, "a.example")
    assert data == b'/x\t\t1\t{"c":"a\\tb"}'
    assert serializer.loads(data, "a.example")["callback"] == "a\tb"


@pytest.mark.parametrize(
    "data",
    [
        b'/catalog/x\tparse_item\t2\t{"p":1}',
        b"!/x",
        b'https://b.example/x\t\t\t{"e":"errback"}',
        b'{"u":"/x","w":1,"c":"parse_item","m":{"a":1,"depth":2}}',
        b'{"u":"https://b.example/x\\ty"}',
    ],
)
def test_entry_fields_and_pack_fields_keep_an_entry(data: bytes) -> None:
    fields = serializer.entry_fields(data)
    assert serializer.entry_fields(serializer.pack_fields(fields)) == fields
    packed = serializer.pack_fields(fields)
    assert serializer.loads(packed, "a.example") == serializer.loads(data, "a.example")
    if not data.startswith(b'{"u":"https'):
        assert not packed.startswith(b"{")  # an old entry is framed anew


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


@pytest.mark.parametrize(
    "data", [b"not json", b"[1]", b'{"url": "x"}', b"\xfe\xff", b"", b" /x", b"{"],
)
def test_foreign_entries_are_refused(data: bytes) -> None:
    with pytest.raises(DecodeError):
        serializer.loads(data)


@pytest.mark.parametrize(
    ("url", "stored"),
    [
        ("https://a.example/page/2/?q=1", "/page/2/?q=1"),
        ("http://a.example:8080/x", "!/x"),
        ("https://a.example?q=1", "/?q=1"),
        ("https://other.example/x", "https://other.example/x"),
    ],
)
def test_urls_are_stored_relative_to_the_site_of_their_queue(url: str, stored: str) -> None:
    site = "a.example:8080" if ":8080" in url else "a.example"
    data = serializer.dumps(Request(url).to_dict(), site)
    assert data.decode() == stored
    back = request_from_dict(serializer.loads(data, site))
    assert back.url == Request(url).url


@pytest.mark.parametrize("data", [b'{"u":"/x"}', b"/x", b"!/x\tparse"])
def test_a_relative_entry_needs_its_site(data: bytes) -> None:
    with pytest.raises(DecodeError, match="relative URL"):
        serializer.loads(data)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"m":' + b"[" * 100_000, "not JSON"),
        (b'/x\t\t\t{"m":' + b"[" * 100_000, "not JSON"),
        (b'{"u":"https://a.example/","h":5}', "bad field 'h'"),
        (b'{"u":"https://a.example/","b":5}', "bad field 'b'"),
        (b'{"u":"https://a.example/","zz":1}', "bad field 'zz'"),
        (b'{"u":"https://a.example/","h":{"a":[1]}}', "bad headers"),
        (b'{"u":"https://a.example/","t":"os.system"}', "not a loaded Request class"),
        (b'{"u":"https://a.example/","t":"nosuchmodule.X"}', "not a loaded Request class"),
        (b'https://a.example/\t\t\t{"t":"nosuchmodule.X"}', "not a loaded Request class"),
        (b"https://a.example/\t\tx", "bad depth field"),
        (b"https://a.example/\t\t\xd9\xa3", "bad depth field"),  # an Arabic-Indic 3
        (b"https://a.example/\t\t--1", "bad depth field"),
        (b"https://a.example/\t\t" + b"9" * 5000, "bad depth field"),
        (b'/x\t\t\t{"p":' + b"9" * 5000 + b"}", "not JSON"),
        (b'https://a.example/\t\t1\t{"m":{"depth":1}}', "bad depth field"),
        (b'https://a.example/\t\t1\t{"m":[]}', "bad depth field"),
        (b'https://a.example/\tparse\t\t{"c":"parse"}', "bad JSON field"),
        (b'/x\t\t\t{"u":"/y"}', "bad JSON field"),
        (b'/x\t\t\t{"w":1}', "bad JSON field"),
        (b"/x\t\t\t[1]", "bad JSON field"),
        (b"/x\t\t\t", "not JSON"),
        (b"!x", "no URL"),
        (b"#1#/x", "no URL"),
        (b"/x\t\xff", "not UTF-8"),
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


def _fuzzed_urls(n: int, seed: int) -> list[str]:
    """Seeded URLs, many of them ones ``Request`` would change (uppercase
    hosts, ports with leading zeros, characters to escape, an empty query)."""
    import random

    rng = random.Random(seed)
    alphabet = (
        "!$%&()*+,-./0123456789:;=@ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
        "?#'\"<> []\\^`{|}é\t"
    )
    hosts = ["ex.com", "EX.com", "127.0.0.1:8080", "u:p@h.org", "xn--bcher-kva.ch",
             "h:65535", "h:00080", "bücher.de", "a..b"]
    urls = []
    for _ in range(n):
        tail = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        urls.append(rng.choice(["http", "https"]) + "://" + rng.choice(hosts)
                    + rng.choice(["", "/", "?", "#", "/?", "/#"]) + tail)
    return urls


def test_rebuild_builds_the_request_request_from_dict_builds() -> None:
    # rebuild() skips Request's URL escaping for URLs it would not change:
    # on fuzzed URLs, taken or not, the request equals the slow path's.
    spider = _Spider()
    taken = 0
    extra = ["https://a.example/p?q=1#frag", "http://h:1/", "https://a.example"]
    for url in [*_fuzzed_urls(4000, seed=7), *extra]:
        try:
            request = Request(url, callback=spider.parse_item, meta={"depth": 1})
        except ValueError:
            continue
        data = serializer.dumps(request.to_dict(spider=spider), "a.example")
        slow = request_from_dict(serializer.loads(data, "a.example"), spider=spider)
        fast = serializer.rebuild(serializer.loads(data, "a.example"), spider)
        assert fast.to_dict(spider=spider) == slow.to_dict(spider=spider), url
        assert fast.meta == {"depth": 1}
        if serializer._UNCHANGED_URL.fullmatch(request.url):
            taken += 1
    assert taken > 1000  # (the fast path was exercised)


def test_rebuild_escapes_a_url_that_was_not_stored_escaped() -> None:
    # An entry edited by hand (a dead letter) may hold any URL: it is
    # escaped as Request escapes it.
    fields = serializer.loads(b"https://a.example/a b/\xc3\xa9?x=<1>")
    assert serializer.rebuild(fields).url == Request("https://a.example/a b/é?x=<1>").url
    assert serializer.rebuild(serializer.loads(b"https://A.example/p")).url == (
        "https://a.example/p"
    )


def test_rebuild_keeps_a_verbatim_url_and_subclasses() -> None:
    from scrapy.http import JsonRequest

    verbatim = Request("https://a.example/a%zz b", meta={"verbatim_url": True})
    back = serializer.rebuild(serializer.loads(serializer.dumps(verbatim.to_dict())))
    assert back.url == "https://a.example/a%zz b"
    assert back.meta == {"verbatim_url": True}
    data = serializer.dumps(JsonRequest("https://a.example/api", data={"q": 1}).to_dict())
    back = serializer.rebuild(serializer.loads(data))
    assert type(back) is JsonRequest
    assert back.meta == {}
