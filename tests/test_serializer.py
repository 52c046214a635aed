"""JSON encoding of frontier requests (pure logic)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import io
import json
import pickle
import zoneinfo
from typing import Any

import attrs
import pytest
from scrapy import Field, Item, Request, Spider
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
    request = Request("https://a.example/y", cb_kwargs={"b": [1, (2, len)]})
    with pytest.raises(
        EncodeError, match=r"https://a.example/y.*cb_kwargs\['b'\]\[1\]\[1\] is a builtin_"
    ):
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


# -- values of meta and cb_kwargs keep their types (a tagged encoding, version 1) ------


class BookItem(Item):
    title = Field()
    price = Field()


@dataclasses.dataclass
class PageItem:
    url: str
    seen: datetime.date
    links: tuple[str, ...] = ()
    count: int = dataclasses.field(init=False, default=0)


@attrs.define
class AttrsItem:
    name: str
    _secret: bytes = b""
    tags: frozenset[str] = frozenset()


PARIS = zoneinfo.ZoneInfo("Europe/Paris")

#: Values a Scrapy queue (pickle) keeps, JSON does not.
TYPED_VALUES: dict[str, Any] = {
    "datetime": datetime.datetime(2024, 5, 1, 12, 30, 1, 123456),
    "datetime_utc": datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC),
    "datetime_offset": datetime.datetime(
        2024, 5, 1, 12, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=-3, minutes=-30))
    ),
    "datetime_zone": datetime.datetime(2024, 10, 27, 2, 30, tzinfo=PARIS, fold=1),
    "date": datetime.date(2024, 2, 29),
    "time": datetime.time(23, 59, 59, 999999),
    "time_offset": datetime.time(8, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
    "timedelta": datetime.timedelta(days=-2, seconds=5, microseconds=7),
    "decimal": decimal.Decimal("1.10"),
    "decimal_inf": decimal.Decimal("-Infinity"),
    "bytes": b"\x00\xffraw",
    "bytearray": bytearray(b"ab"),
    "set": {1, "a", (2, 3)},
    "frozenset": frozenset({b"x", None}),
    "empty_set": set(),
    "tuple": (1, [2, (3,)], {"k": (4,)}),
    "empty_tuple": (),
    "int_keys": {1: "a", 2: {3: "b"}},
    "mixed_keys": {None: 1, True: 2, 1.5: 3, (1, "a"): 4, frozenset({1}): 5, "s": 6},
    "date_keys": {datetime.date(2024, 1, 1): "new year"},
    "looks_like_a_tag": {"!t": [1, 2]},
    "looks_like_a_tag_nested": [{"!dt": "2024-01-01"}, {"!x": 1, "other": 2}],
    "scrapy_item": BookItem(title="T", price=decimal.Decimal("9.99")),
    "empty_item": BookItem(),
    "dataclass_item": PageItem("https://a.example/", datetime.date(2024, 1, 2), ("x",)),
    "attrs_item": AttrsItem("n", b"s", frozenset({"t"})),
    "items_in_items": [BookItem(title=PageItem("u", datetime.date(2000, 1, 1)))],
}


def _typed(value: Any) -> Any:
    """``value`` with the type of every part beside it, for comparisons that
    ``==`` would pass (``1 == 1.0 == True``, ``(1,) != [1]`` only by type)."""
    if isinstance(value, dict):
        return ("dict", sorted((repr(_typed(k)), _typed(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, sorted(repr(_typed(v)) for v in value))
    if isinstance(value, Item) or dataclasses.is_dataclass(value) or attrs.has(type(value)):
        names = (list(value) if isinstance(value, Item)
                 else [f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value)
                 else [a.name for a in attrs.fields(type(value))])
        fields = {k: value[k] if isinstance(value, Item) else getattr(value, k) for k in names}
        return (type(value).__qualname__, _typed(fields))
    if isinstance(value, datetime.datetime):
        return ("datetime", value.isoformat(), value.tzinfo, value.fold)
    return (type(value).__name__, repr(value))


@pytest.mark.parametrize("name", list(TYPED_VALUES))
def test_meta_and_cb_kwargs_values_keep_their_types_through_the_encoding(name: str) -> None:
    spider = _Spider()
    value = TYPED_VALUES[name]
    request = Request(
        "https://a.example/x", callback=spider.parse_item,
        meta={name: value, "depth": 1}, cb_kwargs={"arg": value},
    )
    data = serializer.dumps(request.to_dict(spider=spider), "a.example")
    assert b"\n" not in data and b"\r" not in data
    fields = serializer.loads(data, "a.example")
    back = serializer.rebuild(fields, spider)
    assert _typed(back.meta) == _typed(request.meta)
    assert _typed(back.cb_kwargs) == _typed(request.cb_kwargs)
    assert list(back.meta) == [name, "depth"]
    assert data.startswith(b"/x\tparse_item\t1\t")  # depth still has its own field


def test_a_dict_with_int_keys_and_a_tuple_come_back_as_themselves() -> None:
    request = Request("https://a.example/x", meta={"pages": {1: "a", 2: "b"}, "at": (3, 4)})
    back = request_from_dict(serializer.loads(serializer.dumps(request.to_dict())))
    assert back.meta == {"pages": {1: "a", 2: "b"}, "at": (3, 4)}
    assert type(back.meta["at"]) is tuple


def test_tagged_values_are_written_with_the_version_of_the_encoding() -> None:
    request = Request(
        "https://a.example/x", meta={"when": datetime.date(2024, 1, 2), "depth": 3},
    )
    data = serializer.dumps(request.to_dict(), "a.example")
    assert data == b'/x\t\t3\t{"m":{"when":{"!d":"2024-01-02"}},"v":1}'


@pytest.mark.parametrize(
    "meta",
    [
        {"depth": 2},
        {"seed_hosts": ["a.example"], "nested": {"x": [1, None, 2.5, True]}, "depth": 1},
        {"s": "é\u2028", "n": -(10**30), "f": float("inf"), "l": []},
        {"dont_cache": True, "download_slot": "a.example", "!bang": 1, "ok": 2},
    ],
)
def test_plain_json_values_cost_no_more_bytes_than_plain_json(meta: dict[str, Any]) -> None:
    # What earlier versions wrote: the compact JSON of meta (depth in its field).
    request = Request("https://a.example/x", meta=meta, cb_kwargs={"page": [1, {"a": None}]})
    data = serializer.dumps(request.to_dict(), "a.example")
    rest = {k: v for k, v in meta.items() if k != "depth"}
    before = {"m": rest} if rest else {}
    before["a"] = {"page": [1, {"a": None}]}
    depth = str(meta["depth"]) if "depth" in meta else ""
    assert data == (f"/x\t\t{depth}\t".encode()
                    + json.dumps(before, separators=(",", ":"), ensure_ascii=False).encode())


def test_entries_without_a_version_hold_plain_json_even_where_it_looks_like_a_tag() -> None:
    data = b'/x\t\t2\t{"m":{"!t":[1]},"a":{"k":{"!b":"AA=="}}}'
    back = request_from_dict(serializer.loads(data, "a.example"))
    assert back.meta == {"!t": [1], "depth": 2}
    assert back.cb_kwargs == {"k": {"!b": "AA=="}}


def test_an_entry_of_an_unknown_version_is_refused() -> None:
    with pytest.raises(DecodeError, match="version 2 of the encoding"):
        serializer.loads(b'/x\t\t\t{"m":{"a":1},"v":2}', "a.example")


def _local_item() -> Any:
    @dataclasses.dataclass
    class Local:
        x: int = 1

    return Local()


def _closure() -> None:
    pass


@pytest.mark.parametrize(
    ("meta", "where", "what"),
    [
        ({"callback": _closure}, "meta['callback']", "a function"),
        ({"f": io.BytesIO(b"x")}, "meta['f']", "a BytesIO"),
        ({"x": object()}, "meta['x']", "a object"),
        ({"x": (1, [2, {"k": _closure}])}, "meta['x'][1][1]['k']", "a function"),
        ({"x": {1: _closure}}, "meta['x'][1]", "a function"),
        ({"x": {frozenset({1, complex(1, 2)})}}, "meta['x'] element element", "a complex"),
        ({"x": BookItem(title=iter([]))}, "meta['x']['title']", "a list_iterator"),
        ({"x": _local_item()}, "meta['x']", "a Local item, whose class cannot be found"),
        ({"x": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone(
            datetime.timedelta(0), "Z0"))}, "meta['x']", "a datetime in the zone"),
        ({"x": datetime.time(1, tzinfo=PARIS)}, "meta['x']", "a time in the zone"),
        ({"x": range(3)}, "meta['x']", "a range"),
    ],
)
def test_a_value_with_no_faithful_encoding_is_refused_naming_its_key(
    meta: dict[str, Any], where: str, what: str
) -> None:
    request = Request("https://a.example/x", meta=meta)
    with pytest.raises(EncodeError) as info:
        serializer.dumps(request.to_dict())
    assert str(info.value).startswith(
        f"cannot store request https://a.example/x in Redis: {where} is {what}"
    )


def test_a_value_that_holds_itself_is_refused() -> None:
    loop: list[Any] = [1]
    loop.append({"again": loop})
    with pytest.raises(EncodeError, match=r"meta\['loop'\]\[1\]\['again'\] is a list that "
                                          r"holds itself"):
        serializer.dumps(Request("https://a.example/x", meta={"loop": loop}).to_dict())
    shared = [1]
    data = serializer.dumps(Request("https://a.example/x", meta={"a": shared, "b": shared})
                            .to_dict())
    assert serializer.loads(data)["meta"] == {"a": [1], "b": [1]}  # (shared, not a cycle)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ('{"!nosuch":1}', "unknown tag"),
        ('{"!b":"not base64!"}', "bad '!b' value"),
        ('{"!b":5}', "bad '!b' value"),
        ('{"!dt":"yesterday"}', "bad '!dt' value"),
        ('{"!dt":["2024-01-01T00:00:00","../../etc/passwd"]}', "bad '!dt' value"),
        ('{"!dt":["2024-01-01T00:00:00","Europe/Paris",2]}', "bad '!dt' value"),
        ('{"!td":[1,2]}', "unknown tag or a malformed value"),
        ('{"!D":"1,5"}', "bad '!D' value"),
        ('{"!s":[[1]]}', "bad '!s' value"),
        ('{"!m":[[1]]}', "malformed"),
        ('{"!m":[[[1],2]]}', "bad '!m' value"),
        ('{"!i":["nosuchmodule:X",{}]}', "not a loaded item class"),
        ('{"!i":["os:system",{}]}', "not a loaded item class"),
        ('{"!i":["tests.test_serializer:BookItem",{"nosuch":1}]}', "cannot build from its"),
        ('{"!i":["tests.test_serializer:PageItem",{"url":"u"}]}', "cannot build from its"),
        ("[" * 100_000 + "]" * 100_000, "not JSON|nested too deeply"),
    ],
)
def test_malformed_tags_read_from_redis_are_refused_without_importing_anything(
    value: str, reason: str
) -> None:
    import sys

    data = ('/x\t\t\t{"m":{"k":' + value + '},"v":1}').encode()
    with pytest.raises(DecodeError, match=reason):
        serializer.loads(data, "a.example")
    assert "nosuchmodule" not in sys.modules


def test_meta_that_is_not_a_dict_once_decoded_is_refused() -> None:
    with pytest.raises(DecodeError, match="bad field 'm'"):
        serializer.loads(b'/x\t\t\t{"m":{"!t":[1]},"v":1}', "a.example")


def test_tagged_entries_keep_their_values_through_entry_fields_and_pack_fields() -> None:
    meta = {"when": datetime.date(2024, 1, 2), "k": {1: (2,)}, "retry_times": 2}
    request = Request("https://a.example/x", meta=meta, cb_kwargs={"b": b"\x00"})
    data = serializer.dumps(request.to_dict(), "a.example")
    fields = serializer.entry_fields(data)
    assert serializer.loads(serializer.pack_fields(fields), "a.example") == serializer.loads(
        data, "a.example"
    )
    assert serializer.entry_meta(fields) == meta
    serializer.set_entry_meta(fields, {"when": meta["when"]})
    back = serializer.loads(serializer.pack_fields(fields), "a.example")
    assert (back["meta"], back["cb_kwargs"]) == ({"when": meta["when"]}, {"b": b"\x00"})


def test_an_old_entry_given_tagged_meta_keeps_its_other_values_literal() -> None:
    fields = serializer.entry_fields(b'/x\t\t\t{"a":{"k":{"!t":[1]}}}')
    serializer.set_entry_meta(fields, {"when": datetime.date(2024, 1, 2)})
    back = serializer.loads(serializer.pack_fields(fields), "a.example")
    assert back["cb_kwargs"] == {"k": {"!t": [1]}}
    assert back["meta"] == {"when": datetime.date(2024, 1, 2)}


def test_a_requeued_dead_letter_keeps_the_types_of_its_meta() -> None:
    from crawler.commands.deadletters import requeue_push

    meta = {"when": datetime.date(2024, 1, 2), "pages": {1: 2}, "retry_times": 2}
    request = Request("https://a.example/x", meta=meta, priority=3)
    push = requeue_push({"request": serializer.dumps(request.to_dict()).decode()})
    assert push is not None
    back = serializer.loads(push.data, "a.example")
    assert back["meta"] == {"when": datetime.date(2024, 1, 2), "pages": {1: 2}}
    assert (push.priority, back["priority"]) == (5, 5)
