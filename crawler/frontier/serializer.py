"""Compact, pickle-free, versioned encoding of requests for the Redis frontier.

This module is a scrapy-redis *serializer* (it has ``dumps`` and ``loads``):
scrapy-redis's queues pass it the dict of
:meth:`scrapy.Request.to_dict` and store what ``dumps`` returns. It replaces
scrapy-redis's default, pickle, so that nothing read from Redis can run code
on a worker.

Encoded form: one line of UTF-8 text, up to five fields separated by tabs,
trailing empty fields left out::

    URL [TAB CALLBACK [TAB META [TAB JSON [TAB REFERER]]]]

The common request costs only its path, its callback and its depth
(``/catalog/books/item-0000001.html?ref=list<TAB>parse_item<TAB>2``: 54
bytes, where the JSON object of earlier versions took 82). Every queued
request pays for its entry in Redis memory, and an entry under 64 bytes
also takes one byte less of list overhead (56 bytes in all here). What
every request of a crawl repeats is stored in a few bytes: a request the
``pages`` spider yields (its depth, the ``seed_hosts`` of
:class:`~crawler.middlewares.SeedHostsMiddleware`, the Referer of Scrapy's
RefererMiddleware) is ``!/tag/love/page/2/<TAB><TAB>3s<TAB><TAB>!/tag/love/``
(35 bytes on the site ``127.0.0.1:8080``, where earlier versions wrote
122, all but the path and the tabs in the JSON field).

==========  =========================================================
field       content
==========  =========================================================
URL         the ``url``: relative to its site (``/path?query``) when
            the entry is stored under the site's key and the URL is on
            that site: ``/...`` for ``https``, ``!/...`` for ``http``;
            else the whole URL (it starts with its scheme)
CALLBACK    the ``callback``'s spider method name; empty for none
META        the last keys of ``meta`` (as Scrapy's DepthMiddleware and
            our SeedHostsMiddleware add them), one item each, in their
            order: ``meta["depth"]`` as a decimal integer when it is an
            int; ``s`` for ``meta["seed_hosts"]`` when it is ``[site]``,
            the site the entry is stored under (``3s``: depth 3, then
            seed hosts). It holds the longest such run at the end of
            ``meta`` (none when what stays in ``meta`` would be one key
            starting with ``!``); empty when it holds none. (Earlier
            versions wrote a depth alone here: the same reading.)
JSON        a compact JSON object of the other attributes that differ
            from Scrapy's defaults, keys in the table below (``u``,
            ``w`` and ``c`` are never in it); left out when empty, and
            empty when a REFERER field follows
REFERER     the ``Referer`` header, when it is the last header and has
            one value, non-empty, with no control character: ``/...``
            for an ``https`` URL on the entry's site, ``!/...`` for an
            ``http`` one (as the URL field), the value itself when it
            starts with a scheme, else ``=`` and the value. Left out
            (the header stays in ``h``) otherwise
==========  =========================================================

The META and REFERER fields store what the spider middlewares set on
every request in a few bytes, rather than relying on anything being
derived again when the request is read: nothing re-derives a Referer or
seed hosts on dequeue, so they are stored, and the request read back is
equal to the one written, the order of ``meta``'s keys and of the headers
included. Entries of earlier versions (no REFERER field, a depth alone in
META) read as before; a worker of an earlier version refuses an entry with
``s`` or a REFERER field as malformed (it never misreads it).

An entry that cannot be framed so (a URL holding a tab, or a whole URL
that does not start with a scheme) is the JSON object alone, with ``u`` (and
``w``) and ``c`` in it: the form of entries written by earlier versions,
which :func:`loads` still reads (it starts with ``{``). Field names are
short because every queued request pays for them:

=====  =====================  =====================================
key    Request attribute      encoding
=====  =====================  =====================================
``u``  ``url``                string (JSON form only); relative to
                              its site as in the URL field
``w``  (scheme)               ``1`` for a relative ``http`` URL
                              (JSON form only)
``c``  ``callback``           spider method name (JSON form, or a
                              name the CALLBACK field cannot hold)
``e``  ``errback``            spider method name
``M``  ``method``             string, left out when ``GET``
``h``  ``headers``            ``{name: [value, ...]}``, latin-1 strings
``b``  ``body``               UTF-8 string; ``B``: base64 when not UTF-8
``k``  ``cookies``            JSON as given
``m``  ``meta``               JSON object (without the ``depth`` the
                              DEPTH field holds), tagged values
``a``  ``cb_kwargs``          JSON object, tagged values
``x``  ``encoding``           left out when ``utf-8``
``p``  ``priority``           integer, left out when 0
``f``  ``dont_filter``        ``1`` when true
``g``  ``flags``              list of strings
``t``  ``_class``             import path of a Request subclass
``X``  the other names in     ``{name: value}``, tagged values, only
       the subclass's         with ``t``: what a subclass adds to
       ``attributes``         ``Request.attributes`` (e.g.
                              ``JsonRequest.dumps_kwargs``)
``v``  (encoding version)     ``1`` when a value in ``m``, ``a`` or
                              ``X`` is tagged; left out otherwise
=====  =====================  =====================================

Tagged values (version 1)
-------------------------

The values of ``meta``, ``cb_kwargs`` and a subclass's attributes keep
their types, as in Scrapy's own (pickled) queues, without pickle: a value
JSON carries faithfully (``str``, ``int``, ``float``, ``bool``, ``None``, a
list, a dict with string keys) is stored as plain JSON, byte for byte as an
entry without tags; any other is a JSON object of one key, its tag, and the
entry gets ``"v":1``:

==========  ==============================  ===============================
tag         Python value                    JSON value
==========  ==============================  ===============================
``!t``      ``tuple``                       list of tagged values
``!s``      ``set``                         list of tagged values
``!fs``     ``frozenset``                   list of tagged values
``!b``      ``bytes``                       base64 text
``!ba``     ``bytearray``                   base64 text
``!dt``     ``datetime.datetime``           ISO 8601 text (naive, or a fixed
                                            offset); ``[wall time, zone
                                            key]`` (``, 1`` when ``fold``)
                                            in a ``zoneinfo.ZoneInfo`` zone
``!d``      ``datetime.date``               ISO 8601 text
``!tm``     ``datetime.time``               ISO 8601 text (naive, or a
                                            fixed offset)
``!td``     ``datetime.timedelta``          ``[days, seconds, microseconds]``
``!D``      ``decimal.Decimal``             its ``str`` (``"1.10"``,
                                            ``"NaN"``)
``!m``      a dict with a key that is not   ``[[key, value], ...]``, both
            a string, or that could be      tagged
            read as a tag (one key,
            starting with ``!``)
``!i``      an item of a kind itemadapter   ``["module:QualName", {field:
            supports (``scrapy.Item``,      tagged value}]``; its class is
            dataclass, attrs, ...): not a   looked up in modules already
            dict                            imported, never imported
==========  ==============================  ===============================

Subclasses of ``dict``, ``list``, ``tuple``, ``str``, ``int`` and ``float``
come back as their base type (a named tuple as a tuple). Anything else (a
function, an open file, a Response, an arbitrary object, a ``datetime`` in a
pytz or dateutil zone, an item whose class is defined in a function, a
container that holds itself) has no faithful encoding: :func:`dumps` raises
:class:`EncodeError` naming the key (``meta['x'][1]``). An entry without
``v`` (every entry of earlier versions) holds plain JSON values only; an
entry whose ``v`` is not :data:`VALUES_VERSION` is refused (a newer worker
wrote it).

:func:`entry_fields` gives any entry as that JSON object (``u``, ``w``,
``c``, the whole ``meta`` and every header in it, given the entry's site)
and :func:`pack_fields` frames such an object again, for tools that edit a
stored entry (``scrapy deadletters requeue``). Read without its site, an
entry keeps what is relative to the site as it is: ``u`` relative, and a
META field holding ``s`` under ``T``, a relative REFERER field under ``r``
(never in an entry itself; :func:`pack_fields` puts them back). Nothing in
an entry is ever unpickled.

So a :class:`scrapy.Request` subclass comes back as itself with every
attribute it declares in ``attributes`` (as Scrapy documents for
subclasses), as with Scrapy's own :meth:`~scrapy.Request.to_dict` and
:func:`~scrapy.utils.request.request_from_dict`; a subclass whose attribute
holds a value with no faithful encoding is refused when it is encoded,
naming the class and the attribute.

:func:`loads` gives every attribute of ``Request`` (defaults filled in),
as ``Request.to_dict`` does, so a subclass whose ``__init__`` fills in
arguments it is not given (``XmlRpcRequest``'s method POST) gets the
values stored.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import json
import re
import sys
import zoneinfo
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from scrapy import Request
from scrapy.utils.request import request_from_dict

if TYPE_CHECKING:
    from collections.abc import Callable

try:
    import attrs as _attrs
except ImportError:  # attrs items are then simply not met
    _attrs = None  # type: ignore[assignment]

__all__ = [
    "VALUES_VERSION", "DecodeError", "EncodeError", "dumps", "entry_fields", "entry_meta",
    "loads", "pack_fields", "rebuild", "set_entry_meta",
]


class EncodeError(ValueError):
    """A request holds a value that JSON cannot carry.

    The message names the request's URL and the offending key, e.g.
    ``cannot store request https://a/ in Redis: meta['item'] is a Item``.
    """


class DecodeError(ValueError):
    """Bytes read from the frontier are not a request in our JSON form.

    Raised, for instance, for a pickled payload: it is never unpickled.
    """


_PLAIN: dict[str, tuple[str, Any]] = {
    # Request attribute -> (short key, default value)
    "callback": ("c", None),
    "errback": ("e", None),
    "method": ("M", "GET"),
    "cookies": ("k", {}),
    "meta": ("m", {}),
    "cb_kwargs": ("a", {}),
    "encoding": ("x", "utf-8"),
    "priority": ("p", 0),
    "flags": ("g", []),
    "_class": ("t", None),
}
#: ``Request.to_dict`` keys with a field of their own; other keys are the
#: extra attributes of a subclass (field ``X``).
_OWN = frozenset({"url", "headers", "body", "dont_filter", *_PLAIN})


def _check_json(value: Any, where: str, url: str) -> None:
    """Raise :class:`EncodeError` naming ``where`` if ``value`` is not JSON."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]", url)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise EncodeError(
                    f"cannot store request {url} in Redis: {where} has a "
                    f"non-string key {k!r}"
                )
            _check_json(v, f"{where}[{k!r}]", url)
        return
    raise EncodeError(
        f"cannot store request {url} in Redis: {where} is a "
        f"{type(value).__name__}, which JSON cannot carry"
    )


def dumps(obj: dict[str, Any], site: str | None = None) -> bytes:
    """Encode the dict of :meth:`scrapy.Request.to_dict` as one entry.

    :param obj: the request's dict (``url``, ``callback``, ``headers``, ...).
    :param site: the site (``host`` or ``host:port``) the entry is stored
        under; an http(s) URL on that site is then stored without its
        ``scheme://site`` part, which :func:`loads` needs the site to restore.
    :returns: the entry, UTF-8 bytes: ``URL<TAB>CALLBACK<TAB>DEPTH<TAB>JSON``
        with trailing empty fields left out, or the JSON object alone (see
        the module), defaults left out.
    :raises EncodeError: when meta, cb_kwargs or an attribute a Request
        subclass adds hold a value with no faithful encoding (see the
        module), or cookies one JSON cannot carry; the message names the URL
        and the key (``cannot store request https://a/ in Redis:
        meta['x'][1] is a function, which has no faithful encoding``); or
        when ``obj`` has keys of no Request attribute without a ``_class``.
    """
    url = obj["url"]
    head, http = url, False
    if site is not None:
        for scheme in ("https", "http"):
            prefix = f"{scheme}://{site}"
            rest = url[len(prefix):]
            if url.startswith(prefix) and rest[:1] in ("/", "?"):
                head = rest if rest[0] == "/" else "/" + rest
                http = scheme == "http"
                break
    out = _encode_fields(obj, url)
    headers = obj.get("headers") or {}
    if headers:
        out["h"] = {
            _latin1(k): [_latin1(v) for v in vs] for k, vs in headers.items()
        }
    body = obj.get("body") or b""
    if body:
        try:
            out["b"] = body.decode("utf-8")
        except UnicodeDecodeError:
            out["B"] = base64.b64encode(body).decode("ascii")
    try:
        return _frame(head, http, out, site)
    except (TypeError, ValueError) as exc:  # e.g. NaN is fine, circular is not
        raise EncodeError(f"cannot store request {url} in Redis: {exc}") from exc


def _encode_fields(obj: dict[str, Any], url: str) -> dict[str, Any]:
    """The JSON keys of the module table for the attributes of ``obj`` that
    differ from their defaults (not ``u``, ``w``, ``h``, ``b``, ``B``), with
    ``v`` when a value is tagged.

    :raises EncodeError: see :func:`dumps`.
    """
    out: dict[str, Any] = {}
    tagged = False
    for name, (short, default) in _PLAIN.items():
        value = obj.get(name, default)
        if value is None or value == default:
            continue
        if name in _VALUES:
            encoded = _encode_field(value, name, url)
            tagged = tagged or encoded is not value
            value = encoded
        else:
            _check_json(value, name, url)
        out[short] = value
    if obj.get("dont_filter"):
        out["f"] = 1
    if extra := _extra_attributes(obj, url):
        cls_name = str(obj["_class"]).rpartition(".")[2]
        for name, value in extra.items():
            extra[name] = _encode_field(value, f"{cls_name} attribute {name!r}", url)
            tagged = tagged or extra[name] is not value
        out["X"] = extra
    if tagged:
        out["v"] = VALUES_VERSION
    return out


#: An absolute URL's scheme and colon: what the URL field holds when it
#: does not start with ``/`` (or ``!/``).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def _frame(url: str, http: bool, rest: dict[str, Any], site: str | None = None) -> bytes:
    """The entry for ``url`` (relative when it starts with ``/``; ``http``:
    its scheme is http) and the other fields ``rest`` (JSON keys of the
    module table, no ``u``/``w``; ``c``, the tail of ``m`` and the last
    header ``Referer`` of ``h`` are moved to their fields when they fit,
    without changing the dicts given). With ``site`` (the site the entry is
    stored under), a Referer on that site is stored relative to it and a
    ``seed_hosts`` of ``[site]`` as ``s``.

    :raises TypeError, ValueError: ``rest`` is not JSON.
    """
    if "\t" in url or not (url[:1] == "/" or _SCHEME.match(url)) or (http and url[0] != "/"):
        return _json_form({"u": url, "w": 1, **rest} if http else {"u": url, **rest})
    callback = rest.get("c")
    if isinstance(callback, str) and callback and "\t" not in callback:
        rest = {k: v for k, v in rest.items() if k != "c"}
    else:
        callback = ""
    tail = rest.get("T", "")
    if tail:  # (fields read without their site: the META field as it was)
        rest = {k: v for k, v in rest.items() if k != "T"}
    meta = rest.get("m")
    if not tail and type(meta) is dict and meta:
        tail, kept = _meta_tail(meta, site)
        if tail:
            rest = {k: kept if k == "m" else v for k, v in rest.items() if k != "m" or kept}
    referer = rest.get("r", "")
    if referer:  # (fields read without their site: the REFERER field as it was)
        rest = {k: v for k, v in rest.items() if k != "r"}
    headers = rest.get("h")
    if not referer and type(headers) is dict and headers:
        referer = _referer_field(headers, site)
        if referer:
            others = {k: v for k, v in headers.items() if k != _REFERER}
            rest = {k: others if k == "h" else v for k, v in rest.items() if k != "h" or others}
    line = f"!{url}\t{callback}\t{tail}" if http else f"{url}\t{callback}\t{tail}"
    if referer:
        return f"{line}\t".encode() + (_json_form(rest) if rest else b"") + f"\t{referer}".encode()
    if rest:
        return line.encode() + b"\t" + _json_form(rest)
    return line.rstrip("\t").encode()


#: The header the REFERER field holds.
_REFERER = "Referer"
#: The meta key the ``s`` of the META field stands for, with ``[site]``.
_SEED_HOSTS = "seed_hosts"
#: One item of the META field: a depth, or ``s``.
_TAIL_ITEM = re.compile(r"-?[0-9]+|s")


def _meta_tail(meta: dict[str, Any], site: str | None) -> tuple[str, dict[str, Any]]:
    """The META field for the last keys of ``meta`` (encoded meta: a JSON
    object) that it can hold, and the meta without them (a new dict, or
    ``meta`` itself when the field is empty).

    The field holds, in their order, the longest run of keys at the end of
    ``meta`` that are ``depth`` with an int and (with ``site``)
    ``seed_hosts`` with ``[site]``; none when what stays would be one key
    starting with ``!`` (it would read as a tag).
    """
    if len(meta) == 1 and type(meta.get("depth")) is int:  # the common case, fast
        return str(meta["depth"]), {}
    items: list[str] = []
    keys = list(meta)
    while keys:
        key = keys[-1]
        value = meta[key]
        if key == "depth" and type(value) is int:
            items.append(str(value))
        elif (key == _SEED_HOSTS and site is not None and type(value) is list
              and len(value) == 1 and value[0] == site and type(value[0]) is str):
            items.append("s")
        else:
            break
        keys.pop()
    if not items or (len(keys) == 1 and keys[0][:1] == "!"):
        return "", meta
    return "".join(reversed(items)), {k: meta[k] for k in keys}


def _referer_field(headers: dict[str, Any], site: str | None) -> str:
    """The REFERER field for ``headers`` (encoded: ``{name: [value, ...]}``),
    or ``""`` when it cannot hold their ``Referer``: it must be their last
    header, with one value, non-empty, with no control character.

    The field is the value's path (``/...``) for an https URL on ``site``,
    ``!`` and its path for an http one, the value itself when it starts
    with a scheme, else ``=`` and the value.
    """
    name = next(reversed(headers))
    values = headers[name]
    if name != _REFERER or type(values) is not list or len(values) != 1:
        return ""
    value = values[0]
    if type(value) is not str or not value or min(value) < " ":
        return ""
    if site is not None:
        for scheme, mark in (("https://", ""), ("http://", "!")):
            prefix = scheme + site
            if value.startswith(prefix) and value[len(prefix):len(prefix) + 1] == "/":
                return mark + value[len(prefix):]
    if _SCHEME.match(value):
        return value
    return "=" + value


def _extra_attributes(obj: dict[str, Any], url: str) -> dict[str, Any]:
    """The attributes a Request subclass adds (the keys of ``obj`` without a
    field of their own; a new dict), not yet encoded.

    :raises EncodeError: such keys without a ``_class``.
    """
    extra = {name: value for name, value in obj.items() if name not in _OWN}
    if not extra:
        return extra
    cls = obj.get("_class")
    if not cls:
        raise EncodeError(
            f"cannot store request {url} in Redis: Request has no attribute "
            f"{next(iter(extra))!r} (a subclass's dict needs its '_class')"
        )
    return extra


def loads(data: bytes | str, site: str | None = None) -> dict[str, Any]:
    """Decode an entry written by :func:`dumps` (or by an earlier version,
    the JSON form) into a ``Request.to_dict`` dict.

    :param data: one frontier entry.
    :param site: the site it was stored under (needed for a relative URL).
    :returns: a dict that :func:`scrapy.utils.request.request_from_dict`
        accepts, with every ``Request`` attribute (defaults filled in), the
        ``_class`` of a subclass and the attributes it adds.
    :raises DecodeError: the entry is not one of ours (a pickled payload is
        named as such and never unpickled), or a field is malformed: of the
        wrong type, unknown, (``X``) naming no attribute the entry's class
        adds to ``Request.attributes``, (``v``) a version of the value tags
        other than :data:`VALUES_VERSION`, or a tagged value malformed (an
        unknown tag, an item class not loaded).
    """
    enc = entry_fields(data, site)
    if "T" in enc or "r" in enc:
        raise DecodeError(
            "entry has a bad field 'T' or 'r'" if site is not None or data[:1] in (b"{", "{")
            else "entry has values relative to its site and no site to resolve them"
        )
    _check_fields(enc)
    if "v" in enc:
        _decode_values(enc)
    url = enc["u"]
    if url.startswith("/"):
        if site is None:
            raise DecodeError("entry has a relative URL and no site to resolve it")
        url = ("http://" if enc.get("w") else "https://") + site + url
    out: dict[str, Any] = {"url": url}
    for name, (short, default) in _PLAIN.items():
        if short in enc:
            out[name] = enc[short]
        elif name != "_class":
            # A fresh {} or [] per request: Request keeps what it is given.
            out[name] = type(default)() if isinstance(default, (dict, list)) else default
    out["dont_filter"] = bool(enc.get("f"))
    out["headers"] = {
        k.encode("latin-1"): [v.encode("latin-1") for v in vs]
        for k, vs in enc.get("h", {}).items()
    }
    if "b" in enc:
        out["body"] = enc["b"].encode("utf-8")
    elif "B" in enc:
        out["body"] = base64.b64decode(enc["B"])
    else:
        out["body"] = b""
    out.update(enc.get("X", {}))
    return out


#: URLs that :func:`w3lib.url.safe_url_string` (what ``Request.__init__``
#: applies to every URL) gives back unchanged: http(s), a lowercase host of
#: letters, digits, dots and hyphens, a port without leading zeros, then a
#: path of characters it never escapes, and a query and a fragment, each
#: non-empty, of those and ``?`` and ``/``. A seeded fuzz of 190,000 such
#: URLs (w3lib 2.3) found none that ``Request(url).url`` changes
#: (``tests/test_serializer.py`` checks a sample of them).
_UNCHANGED_URL = re.compile(
    r"https?://[a-z0-9.\-]+(?::([1-9][0-9]{0,4}))?"
    r"(?:/[!$%&()*+,\-./0-9:;=@A-Z_a-z~]*"
    r"(?:\?[!$%&()*+,\-./0-9:;=@A-Z_a-z~?]+)?(?:#[!$%&()*+,\-./0-9:;=@A-Z_a-z~?]+)?)?"
)


def rebuild(fields: dict[str, Any], spider: Any = None) -> Request:
    """The request of :func:`loads`'s dict: what
    :func:`scrapy.utils.request.request_from_dict` builds, made faster for
    the common case.

    ``Request.__init__`` passes every URL through
    :func:`w3lib.url.safe_url_string` (about a third of the cost of a
    decode). A stored URL is a ``Request.url`` already, so for a plain
    ``Request`` whose URL matches ``_UNCHANGED_URL`` (most crawled URLs) the
    request is built with Scrapy's ``verbatim_url`` meta key, which skips
    that step, and the key is taken out of ``meta`` again: the request is
    the one ``request_from_dict`` builds, but for a request in an encoding
    that is not ASCII-compatible (utf-16, utf-32, cp037), whose query
    ``request_from_dict`` escapes once more on every decode (the URL grows
    and no longer matches its fingerprint): here it stays the stored URL.
    A subclass (``_class``), a
    ``meta`` that sets ``verbatim_url`` itself, or any other URL (an edited
    dead letter, a URL with characters to escape) goes through
    ``request_from_dict`` unchanged.

    :param fields: a dict of :func:`loads` (it may be changed).
    :param spider: the spider whose methods the callback names refer to.
    :raises ValueError: (or a subclass, ``TypeError``, ``AttributeError``)
        what ``request_from_dict`` raises for the dict.
    """
    meta = fields.get("meta")
    match = _UNCHANGED_URL.fullmatch(fields["url"]) if "_class" not in fields else None
    if (
        match is None
        or (match.group(1) is not None and int(match.group(1)) > 65535)
        or not isinstance(meta, dict)
        or "verbatim_url" in meta
    ):
        return request_from_dict(fields, spider=spider)
    meta["verbatim_url"] = True
    request = request_from_dict(fields, spider=spider)
    del request.meta["verbatim_url"]  # (Request keeps a copy of the dict it is given)
    return request


def entry_fields(data: bytes | str, site: str | None = None) -> dict[str, Any]:
    """An entry (either form) as the JSON object of the module table, with
    ``u`` (and ``w``), ``c``, the whole ``meta`` and every header in it: what
    a tool that edits a stored entry changes before :func:`pack_fields`.

    Only the framing is checked; :func:`loads` checks the fields.

    :param site: the site the entry is stored under: needed for an entry
        whose META or REFERER field is relative to it (``u`` stays relative).
    :raises DecodeError: the entry is not one of ours (a pickled payload is
        named as such and never unpickled), or it has a field relative to
        its site and ``site`` is None.
    """
    raw = data.encode() if isinstance(data, str) else data
    first = raw[:1]
    if first == b"{":
        try:
            enc = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # ValueError: also too long an int
            raise DecodeError(f"entry is not JSON: {exc}") from None
        if not isinstance(enc, dict) or not isinstance(enc.get("u"), str):
            raise DecodeError("entry is not a JSON request object with a 'u' url")
        return enc
    if first == b"\x80":
        raise DecodeError(
            "entry is a pickled payload; pickled requests are not loaded "
            "(set SCHEDULER_SERIALIZER to a pickle serializer to allow them)"
        )
    return _framed_fields(raw, site)


#: Most digits of a depth in the META field (Python refuses to read much
#: longer ints).
_MAX_DIGITS = 4000


def _framed_fields(raw: bytes, site: str | None) -> dict[str, Any]:
    """:func:`entry_fields` of an entry in the ``URL<TAB>...`` form."""
    try:
        parts = raw.decode().split("\t", 4)
    except UnicodeDecodeError as exc:
        raise DecodeError(f"entry is not UTF-8: {exc}") from None
    url = parts[0]
    if url[:1] == "!" and url[1:2] == "/":
        enc: dict[str, Any] = {"u": url[1:], "w": 1}
    elif url[:1] == "/" or _SCHEME.match(url):
        enc = {"u": url}
    else:
        raise DecodeError(f"entry is not a request (no URL): {raw[:80]!r}")
    n = len(parts)
    if n > 1 and parts[1]:
        enc["c"] = parts[1]
    if n > 3 and (parts[3] or n == 4):
        try:
            rest = json.loads(parts[3])
        except (ValueError, RecursionError) as exc:
            raise DecodeError(f"entry's JSON field is not JSON: {exc}") from None
        if not isinstance(rest, dict) or any(k in enc or k in ("u", "w") for k in rest):
            raise DecodeError(f"entry has a bad JSON field: {parts[3][:80]!r}")
        enc.update(rest)
    if n > 2 and parts[2]:
        _add_meta_tail(enc, parts[2], site)
    if n > 4:
        _add_referer(enc, parts[4], site)
    return enc


def _add_meta_tail(enc: dict[str, Any], field: str, site: str | None) -> None:
    """Add the META field ``field`` to the fields ``enc``: to ``m``; under
    ``T`` as it is when it holds ``s`` and ``site`` is None.

    :raises DecodeError: a malformed field.
    """
    if site is None and "s" in field:
        _read_meta_tail(field, {}, "")  # (checks it)
        enc["T"] = field
    else:
        enc["m"] = _read_meta_tail(field, enc.get("m", {}), site)


def _add_referer(enc: dict[str, Any], field: str, site: str | None) -> None:
    """Add the REFERER field ``field`` to the fields ``enc``: last in ``h``;
    under ``r`` as it is when it is relative and ``site`` is None.

    :raises DecodeError: a malformed field, or ``h`` holding a Referer too.
    """
    if not field or min(field) < " ":
        raise DecodeError(f"entry has a bad Referer field: {field[:80]!r}")
    if site is None and field[0] in "/!":
        enc["r"] = field
        return
    headers = enc.get("h", {})
    if not isinstance(headers, dict) or _REFERER in headers:
        raise DecodeError("entry has a Referer in its headers and in its field")
    enc["h"] = {**headers, _REFERER: [_read_referer(field, site)]}


def _read_meta_tail(field: str, meta: Any, site: str | None) -> dict[str, Any]:
    """``meta`` (the JSON field's, a new dict) with the keys of the META
    field ``field`` added last, in their order.

    :raises DecodeError: a malformed field, a key also in ``meta``, or
        ``s`` without a site.
    """
    digits = field[1:] if field[0] == "-" else field
    if digits.isascii() and digits.isdigit():  # a depth alone: the common case, fast
        if len(digits) > _MAX_DIGITS or not isinstance(meta, dict) or "depth" in meta:
            raise DecodeError(f"entry has a bad depth field: {field[:80]!r}")
        return {**meta, "depth": int(field)}
    items = _TAIL_ITEM.findall(field)
    if not (isinstance(meta, dict) and "".join(items) == field):
        raise DecodeError(f"entry has a bad depth field: {field[:80]!r}")
    out = dict(meta)
    value: Any
    for item in items:
        if item == "s":
            if site is None:
                raise DecodeError(
                    "entry's seed_hosts are its site's, and no site is given to read them"
                )
            key, value = _SEED_HOSTS, [site]
        else:
            digits = item.lstrip("-")
            if len(digits) > _MAX_DIGITS:
                raise DecodeError(f"entry has a bad depth field: {field[:80]!r}")
            key, value = "depth", int(item)
        if key in out:
            raise DecodeError(f"entry has a bad depth field: {field[:80]!r}")
        out[key] = value
    return out


def _read_referer(field: str, site: str | None) -> str:
    """The Referer (latin-1 text) of a non-empty REFERER field with no
    control character; ``site`` is needed for a relative one.

    :raises DecodeError: a malformed field.
    """
    if field[0] == "=":
        return field[1:]
    if site is not None and (field[0] == "/" or field[:2] == "!/"):
        return ("http://" if field[0] == "!" else "https://") + site + field[field[0] == "!":]
    if _SCHEME.match(field):
        return field
    raise DecodeError(f"entry has a bad Referer field: {field[:80]!r}")


def pack_fields(fields: dict[str, Any], site: str | None = None) -> bytes:
    """Frame the JSON object of an entry (as :func:`entry_fields` gives it)
    as :func:`dumps` would.

    :param fields: ``u`` (a string) and the other keys of the module table.
    :param site: the site the entry will be stored under, to store values
        relative to it (as :func:`dumps`); None for an entry that needs no
        site but for a relative ``u``.
    :raises DecodeError: ``fields`` has no string ``u``.
    :raises EncodeError: a value JSON cannot carry.
    """
    url = fields.get("u")
    if not isinstance(url, str):
        raise DecodeError("entry fields have no string 'u' url")
    w = fields.get("w")
    http = url[:1] == "/" and type(w) is int and w == 1
    rest = {k: v for k, v in fields.items() if k != "u" and not (http and k == "w")}
    try:
        return _frame(url, http, rest, site) if "w" not in rest else _json_form(fields)
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"cannot store request {url} in Redis: {exc}") from exc


def entry_meta(fields: dict[str, Any]) -> dict[str, Any]:
    """The ``meta`` of an entry's fields (as :func:`entry_fields` gives
    them), its tagged values decoded: a new dict.

    :raises DecodeError: ``m`` is malformed, or of an unknown version.
    """
    meta = fields.get("m", {})
    if type(meta) is not dict:
        raise DecodeError(f"entry has a bad field 'm': {str(meta)[:80]!r}")
    if "v" not in fields:
        return dict(meta)
    _check_fields({"v": fields["v"]})
    decoded = _decode_value(meta)
    if type(decoded) is not dict:
        raise DecodeError("entry has a bad field 'm': not a dict")
    return decoded


def set_entry_meta(fields: dict[str, Any], meta: dict[str, Any]) -> None:
    """Store ``meta`` in an entry's fields (as :func:`entry_fields` gives
    them), encoded as :func:`dumps` encodes it; ``m`` is left out when
    ``meta`` is empty. An entry without ``v`` whose new meta needs tags
    gets ``v``, and its other values (``a``, ``X``) are encoded anew.

    :raises EncodeError: a value in ``meta`` has no faithful encoding.
    """
    url = str(fields.get("u"))
    encoded = _encode_field(meta, "meta", url)
    if encoded is not meta and "v" not in fields:
        if "a" in fields:
            fields["a"] = _encode_field(fields["a"], "cb_kwargs", url)
        if isinstance(fields.get("X"), dict):
            fields["X"] = {
                k: _encode_field(v, f"attribute {k!r}", url) for k, v in fields["X"].items()
            }
        fields["v"] = VALUES_VERSION
    if meta:
        fields["m"] = encoded
    else:
        fields.pop("m", None)


def _json_form(fields: dict[str, Any]) -> bytes:
    """The JSON form of an entry (``u`` and all in one object)."""
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()


#: Types of the encoded fields; anything else is refused.
_TYPES: dict[str, tuple[type, ...]] = {
    "u": (str,), "w": (int,), "c": (str,), "e": (str,), "M": (str,), "h": (dict,),
    "b": (str,), "B": (str,), "k": (dict, list), "m": (dict,), "a": (dict,),
    "x": (str,), "p": (int,), "f": (int,), "g": (list,), "t": (str,), "X": (dict,),
    "v": (int,),
}

#: Request attributes whose values are encoded with tags (field ``v``).
_VALUES = frozenset({"meta", "cb_kwargs"})


def _check_fields(enc: dict[str, Any]) -> None:
    """Refuse an entry with unknown fields, wrong types or a foreign class.

    :raises DecodeError: saying which field is wrong.
    """
    for key, value in enc.items():
        expected = _TYPES.get(key)
        if expected is None or not isinstance(value, expected) or (
            isinstance(value, bool) and bool not in expected
        ):
            raise DecodeError(f"entry has a bad field {key!r}: {str(value)[:80]!r}")
    if "h" in enc and not all(
        isinstance(k, str) and isinstance(vs, list) and all(isinstance(v, str) for v in vs)
        for k, vs in enc["h"].items()
    ):
        raise DecodeError("entry has bad headers")
    version = enc.get("v", VALUES_VERSION)
    if version != VALUES_VERSION:
        raise DecodeError(
            f"entry's values are in version {version} of the encoding; this "
            f"worker reads version {VALUES_VERSION} (was it written by a newer one?)"
        )
    path = enc.get("t")
    cls = None if path is None else _request_class(path)
    if path is not None and cls is None:
        raise DecodeError(f"entry names {path!r}, which is not a loaded Request class")
    extra = enc.get("X")
    if extra is not None:
        if cls is None:
            raise DecodeError("entry has extra attributes 'X' but no Request subclass 't'")
        for name in extra:
            if name in _OWN or name not in cls.attributes:
                raise DecodeError(
                    f"entry has a bad field 'X': {name!r} is not an attribute that "
                    f"{cls.__name__} adds to Request.attributes"
                )


def _decode_values(enc: dict[str, Any]) -> None:
    """Decode the tagged values of ``meta``, ``cb_kwargs`` and ``X`` of a
    checked entry of version :data:`VALUES_VERSION`, in place.

    :raises DecodeError: a tag or its value is malformed, or meta or
        cb_kwargs is not a dict once decoded.
    """
    try:
        for short in ("m", "a"):
            if short in enc:
                enc[short] = value = _decode_value(enc[short])
                if type(value) is not dict:
                    raise DecodeError(f"entry has a bad field {short!r}: not a dict")
        if "X" in enc:
            enc["X"] = {k: _decode_value(v) for k, v in enc["X"].items()}
    except RecursionError:
        raise DecodeError("entry's values are nested too deeply") from None


def _request_class(path: str) -> type[Request] | None:
    """The Request subclass ``path`` names in an already imported module, or None.

    Nothing is imported on the word of Redis: importing a module runs code.
    """
    module, _, name = path.rpartition(".")
    obj = getattr(sys.modules.get(module), name, None)
    return obj if isinstance(obj, type) and issubclass(obj, Request) else None


def _latin1(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


# -- values of meta, cb_kwargs and a subclass's attributes ---------------------------

#: The version of the value tags (the ``v`` field) this module writes and reads.
VALUES_VERSION = 1


class _Unencodable(Exception):
    """A value with no faithful encoding: ``what`` it is, and ``path``, the
    keys that lead to it (innermost first), collected as the error unwinds."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.path: list[str] = []


def _encode_field(value: Any, where: str, url: str) -> Any:
    """``value`` (meta, cb_kwargs or a subclass's attribute) as a JSON value:
    ``value`` itself when it is plain JSON, else a copy with tags.

    :raises EncodeError: naming ``where`` and the key of the value that has
        no faithful encoding, e.g. ``meta['x'][0]``.
    """
    try:
        return _encode_value(value, set())
    except _Unencodable as exc:
        raise EncodeError(
            f"cannot store request {url} in Redis: {where}{''.join(reversed(exc.path))} "
            f"is {exc.what}, which has no faithful encoding"
        ) from None
    except RecursionError:
        raise EncodeError(
            f"cannot store request {url} in Redis: {where} is nested too deeply"
        ) from None


def _encode_value(value: Any, seen: set[int]) -> Any:
    """``value`` as a JSON value: the object itself when it is plain JSON (no
    copy is made), else a copy with tags (see the module's table).

    :param seen: ids of the containers being encoded, to refuse a cycle.
    :raises _Unencodable: a value with no faithful encoding.
    """
    if value is None or isinstance(value, (str, int, float)):  # bool is an int
        return value
    encode = _ENCODERS.get(type(value)) or _encoder_of(value)
    return encode(value, seen)


def _encoder_of(value: Any) -> Callable[[Any, set[int]], Any]:
    """The encoder of a value of no type of ``_ENCODERS``: that of its base
    for a subclass of dict, list or tuple (it comes back as its base type),
    of items for an item.

    :raises _Unencodable: a value with no faithful encoding.
    """
    for base in (dict, list, tuple):
        if isinstance(value, base):
            return _ENCODERS[base]
    if ItemAdapter.is_item(value):
        return _encode_item
    raise _Unencodable(f"a {type(value).__name__}")


def _encode_time(value: datetime.time, seen: set[int]) -> Any:
    if value.tzinfo is not None and not _fixed_zone(value.tzinfo):
        raise _Unencodable(f"a time in the zone {value.tzinfo!r} (only fixed offsets)")
    return {"!tm": value.isoformat()}


def _b64encode(value: bytes | bytearray) -> str:
    return base64.b64encode(value).decode("ascii")


def _enter(container: Any, seen: set[int]) -> int:
    key = id(container)
    if key in seen:
        raise _Unencodable(f"a {type(container).__name__} that holds itself")
    seen.add(key)
    return key


def _encode_list(values: list[Any], seen: set[int]) -> list[Any]:
    """``values`` itself when no item changes, else a list of the encodings."""
    key = _enter(values, seen)
    out: list[Any] | None = None
    for i, v in enumerate(values):
        try:
            e = _encode_value(v, seen)
        except _Unencodable as exc:
            exc.path.append(f"[{i}]")
            raise
        if out is None:
            if e is v:
                continue
            out = values[:i]
        out.append(e)
    seen.discard(key)
    return values if out is None else out


def _encode_all(values: Any, seen: set[int], step: str) -> list[Any]:
    """The encodings of ``values`` (a tuple, set or frozenset) as a list;
    ``step`` names an item in an error (``[{}]``: its index)."""
    key = _enter(values, seen)
    out = []
    for i, v in enumerate(values):
        try:
            out.append(_encode_value(v, seen))
        except _Unencodable as exc:
            exc.path.append(step.format(i))
            raise
    seen.discard(key)
    return out


def _encode_dict(d: dict[Any, Any], seen: set[int]) -> Any:
    """``d`` itself when plain JSON; a copy when a value changes; ``{"!m":
    [[key, value], ...]}`` when a key is not a string or ``d`` could be
    read as a tag (one key, starting with ``!``)."""
    key = _enter(d, seen)
    out: dict[str, Any] | None = None
    for k, v in d.items():
        if not isinstance(k, str) or (k[:1] == "!" and len(d) == 1):
            seen.discard(key)
            return _encode_pairs(d, seen)
        try:
            e = _encode_value(v, seen)
        except _Unencodable as exc:
            exc.path.append(f"[{k!r}]")
            raise
        if out is None:
            if e is v:
                continue
            out = {}
            for k2, v2 in d.items():
                if k2 is k:
                    break
                out[k2] = v2
        out[k] = e
    seen.discard(key)
    return d if out is None else out


def _encode_pairs(d: dict[Any, Any], seen: set[int]) -> dict[str, Any]:
    """``{"!m": [[key, value], ...]}``, keys and values encoded."""
    key = _enter(d, seen)
    pairs = []
    for k, v in d.items():
        try:
            pairs.append([_encode_value(k, seen), _encode_value(v, seen)])
        except _Unencodable as exc:
            exc.path.append(f"[{k!r}]")
            raise
    seen.discard(key)
    return {"!m": pairs}


def _fixed_zone(tz: datetime.tzinfo) -> bool:
    """``tz`` is a fixed offset that ISO 8601 text gives back whole."""
    return type(tz) is datetime.timezone and str(tz) == str(
        datetime.timezone(tz.utcoffset(None))
    )


def _encode_datetime(value: datetime.datetime) -> str | list[Any]:
    """ISO 8601 text (naive, or a fixed offset); ``[wall time, zone key]``
    (and ``1`` for ``fold``) in a :class:`zoneinfo.ZoneInfo` zone."""
    tz = value.tzinfo
    if tz is None or _fixed_zone(tz):
        return value.isoformat()
    if type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
        out: list[Any] = [value.replace(tzinfo=None, fold=0).isoformat(), tz.key]
        return [*out, 1] if value.fold else out
    raise _Unencodable(
        f"a datetime in the zone {tz!r} (only fixed offsets and zoneinfo zones)"
    )


def _encode_item(item: Any, seen: set[int]) -> dict[str, Any]:
    """``{"!i": [class path, {field: encoded value}]}`` of an item of a
    class that :func:`_item_class` finds by that path."""
    cls = type(item)
    path = f"{cls.__module__}:{cls.__qualname__}"
    if _item_class(path) is not cls:
        raise _Unencodable(
            f"a {cls.__name__} item, whose class cannot be found by its name {path!r}"
        )
    key = _enter(item, seen)
    out = {}
    for name, v in _item_fields(item).items():
        try:
            out[name] = _encode_value(v, seen)
        except _Unencodable as exc:
            exc.path.append(f"[{name!r}]")
            raise
    seen.discard(key)
    return {"!i": [path, out]}


def _item_fields(item: Any) -> dict[str, Any]:
    """Every field an item has a value for (a dataclass's or attrs class's
    fields also when ``init=False``), not converted."""
    if dataclasses.is_dataclass(item):
        return {
            f.name: getattr(item, f.name)
            for f in dataclasses.fields(item) if hasattr(item, f.name)
        }
    if _attrs is not None and _attrs.has(type(item)):
        return {
            a.name: getattr(item, a.name)
            for a in _attrs.fields(type(item)) if hasattr(item, a.name)
        }
    return dict(ItemAdapter(item).items())


def _item_class(path: str) -> type | None:
    """The item class ``module:qualname`` names in an already imported
    module (nothing is imported on the word of Redis), or None."""
    module, _, qualname = path.partition(":")
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and not issubclass(obj, dict) and ItemAdapter.is_item_class(obj):
        return obj
    return None


def _build_item(cls: type, fields: dict[str, Any]) -> Any:
    """An instance of item class ``cls`` with ``fields``: a dataclass or
    attrs class built with its ``__init__`` arguments, its other fields set
    after; other items built empty and filled through their adapter.

    :raises Exception: what the class raises for these fields.
    """
    item: Any
    if dataclasses.is_dataclass(cls):
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        item = cls(**{k: v for k, v in fields.items() if k in init})
        late = {k: v for k, v in fields.items() if k not in init}
    elif _attrs is not None and _attrs.has(cls):
        attributes = {a.name: a for a in _attrs.fields(cls)}
        item = cls(**{attributes[k].alias: v for k, v in fields.items() if attributes[k].init})
        late = {k: v for k, v in fields.items() if not attributes[k].init}
    else:
        item = cls()
        adapter = ItemAdapter(item)
        for k, v in fields.items():
            adapter[k] = v
        return item
    for k, v in late.items():
        object.__setattr__(item, k, v)  # (also on a frozen class)
    return item


#: Encoders of values by their exact type (see :func:`_encoder_of` for the others).
_ENCODERS: dict[type, Callable[[Any, set[int]], Any]] = {
    dict: _encode_dict,
    list: _encode_list,
    tuple: lambda v, seen: {"!t": _encode_all(v, seen, "[{}]")},
    set: lambda v, seen: {"!s": _encode_all(v, seen, " element")},
    frozenset: lambda v, seen: {"!fs": _encode_all(v, seen, " element")},
    bytes: lambda v, seen: {"!b": _b64encode(v)},
    bytearray: lambda v, seen: {"!ba": _b64encode(v)},
    datetime.datetime: lambda v, seen: {"!dt": _encode_datetime(v)},
    datetime.date: lambda v, seen: {"!d": v.isoformat()},
    datetime.time: _encode_time,
    datetime.timedelta: lambda v, seen: {"!td": [v.days, v.seconds, v.microseconds]},
    decimal.Decimal: lambda v, seen: {"!D": str(v)},
}


def _decode_value(value: Any) -> Any:
    """A JSON value of an entry of version 1 with its tags decoded.

    :raises DecodeError: an unknown tag, or a tag's value malformed.
    """
    kind = type(value)
    if kind is list:
        return [_decode_value(v) for v in value]
    if kind is not dict:
        return value
    if len(value) == 1:
        tag = next(iter(value))
        if tag[:1] == "!":
            try:
                return _from_tag(tag, value[tag])
            except DecodeError:
                raise
            except Exception as exc:  # what a constructor raises for malformed text
                raise DecodeError(
                    f"entry has a bad {tag!r} value: {str(value[tag])[:80]!r} "
                    f"({type(exc).__name__}: {exc})"
                ) from None
    return {k: _decode_value(v) for k, v in value.items()}


def _from_tag(tag: str, v: Any) -> Any:
    """The value of tag ``tag`` with the JSON value ``v``."""
    if tag == "!dt" and type(v) is list and len(v) in (2, 3) and type(v[1]) is str:
        fold = v[2] if len(v) == 3 else 0
        if fold not in (0, 1) or type(fold) is not int:
            raise ValueError("bad fold")
        zone = zoneinfo.ZoneInfo(v[1])
        return datetime.datetime.fromisoformat(v[0]).replace(tzinfo=zone, fold=fold)
    if tag in _SEQUENCES:
        if type(v) is not list:
            raise TypeError("not a list")
        return _SEQUENCES[tag](_decode_value(x) for x in v)
    if tag in _TEXTS:
        if type(v) is not str:
            raise TypeError("not a string")
        return _TEXTS[tag](v)
    if tag == "!td" and type(v) is list and len(v) == 3 and all(type(x) is int for x in v):
        return datetime.timedelta(days=v[0], seconds=v[1], microseconds=v[2])
    if tag == "!m" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
        return {_decode_value(k): _decode_value(x) for k, x in v}
    if (tag == "!i" and type(v) is list and len(v) == 2 and type(v[0]) is str
            and type(v[1]) is dict):
        cls = _item_class(v[0])
        if cls is None:
            raise DecodeError(f"entry holds an item of {v[0]!r}, which is not a loaded item class")
        fields = {k: _decode_value(x) for k, x in v[1].items()}
        try:
            return _build_item(cls, fields)
        except Exception as exc:  # whatever the item's own code raises
            raise DecodeError(
                f"entry holds a {cls.__name__} item that its class cannot build from its "
                f"fields {sorted(fields)} ({type(exc).__name__}: {exc})"
            ) from None
    raise DecodeError(f"entry has an unknown tag or a malformed value: {tag!r}")


def _b64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


#: Tags whose value is a list of the items.
_SEQUENCES: dict[str, Callable[[Any], Any]] = {"!t": tuple, "!s": set, "!fs": frozenset}
#: Tags whose value is text.
_TEXTS: dict[str, Callable[[str], Any]] = {
    "!b": _b64,
    "!ba": lambda text: bytearray(_b64(text)),
    "!dt": datetime.datetime.fromisoformat,
    "!d": datetime.date.fromisoformat,
    "!tm": datetime.time.fromisoformat,
    "!D": decimal.Decimal,
}
