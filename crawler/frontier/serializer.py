"""JSON encoding of requests for the Redis frontier.

This module is a scrapy-redis *serializer* (it has ``dumps`` and ``loads``):
scrapy-redis's queues pass it the dict of
:meth:`scrapy.Request.to_dict` and store what ``dumps`` returns. It replaces
scrapy-redis's default, pickle, so that nothing read from Redis can run code
on a worker.

Encoded form: one compact JSON object (UTF-8) whose fields equal to Scrapy's
defaults are left out. Field names are short because every queued request
pays for them in Redis memory:

=====  =====================  =====================================
key    Request attribute      encoding
=====  =====================  =====================================
``u``  ``url``                string (always present); relative to
                              its site (``/path?query``) when the
                              entry is stored under the site's key
``w``  (scheme)               ``1`` for a relative ``http`` URL
                              (relative ones are ``https`` by default)
``c``  ``callback``           spider method name
``e``  ``errback``            spider method name
``M``  ``method``             string, left out when ``GET``
``h``  ``headers``            ``{name: [value, ...]}``, latin-1 strings
``b``  ``body``               UTF-8 string; ``B``: base64 when not UTF-8
``k``  ``cookies``            JSON as given
``m``  ``meta``               JSON object
``a``  ``cb_kwargs``          JSON object
``x``  ``encoding``           left out when ``utf-8``
``p``  ``priority``           integer, left out when 0
``f``  ``dont_filter``        ``1`` when true
``g``  ``flags``              list of strings
``t``  ``_class``             import path of a Request subclass
``X``  the other names in     ``{name: value}``, JSON values, only
       the subclass's         with ``t``: what a subclass adds to
       ``attributes``         ``Request.attributes`` (e.g.
                              ``JsonRequest.dumps_kwargs``)
=====  =====================  =====================================

So a :class:`scrapy.Request` subclass comes back as itself with every
attribute it declares in ``attributes`` (as Scrapy documents for
subclasses), as with Scrapy's own :meth:`~scrapy.Request.to_dict` and
:func:`~scrapy.utils.request.request_from_dict`; a subclass whose attribute
holds a value JSON cannot carry (a set, bytes, an object) is refused when it
is encoded, naming the class and the attribute. As in ``meta``, a tuple
comes back as a list.

:func:`loads` gives every attribute of ``Request`` (defaults filled in),
as ``Request.to_dict`` does, so a subclass whose ``__init__`` fills in
arguments it is not given (``XmlRpcRequest``'s method POST) gets the
values stored.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

from scrapy import Request

__all__ = ["DecodeError", "EncodeError", "dumps", "loads"]


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
    """Encode the dict of :meth:`scrapy.Request.to_dict` as compact JSON.

    :param obj: the request's dict (``url``, ``callback``, ``headers``, ...).
    :param site: the site (``host`` or ``host:port``) the entry is stored
        under; an http(s) URL on that site is then stored without its
        ``scheme://site`` part, which :func:`loads` needs the site to restore.
    :returns: UTF-8 JSON bytes, defaults left out (see the module table).
    :raises EncodeError: when meta, cb_kwargs, cookies or an attribute a
        Request subclass adds hold a value JSON cannot carry; the message
        names the URL and the key (``cannot store request https://a/ in
        Redis: TaggedRequest attribute 'tag' is a set, which JSON cannot
        carry``); or when ``obj`` has keys of no Request attribute without
        a ``_class``.
    """
    url = obj["url"]
    out: dict[str, Any] = {"u": url}
    if site is not None:
        for scheme in ("https", "http"):
            prefix = f"{scheme}://{site}"
            rest = url[len(prefix):]
            if url.startswith(prefix) and rest[:1] in ("/", "?"):
                out["u"] = rest if rest[0] == "/" else "/" + rest
                if scheme == "http":
                    out["w"] = 1
                break
    for name, (short, default) in _PLAIN.items():
        value = obj.get(name, default)
        if value is None or value == default:
            continue
        _check_json(value, name, url)
        out[short] = value
    if obj.get("dont_filter"):
        out["f"] = 1
    if extra := _extra_attributes(obj, url):
        out["X"] = extra
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
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:  # e.g. NaN is fine, circular is not
        raise EncodeError(f"cannot store request {url} in Redis: {exc}") from exc


def _extra_attributes(obj: dict[str, Any], url: str) -> dict[str, Any]:
    """The attributes a Request subclass adds (the keys of ``obj`` without a
    field of their own), checked.

    :raises EncodeError: a value JSON cannot carry (naming the class and
        the attribute), or such keys without a ``_class``.
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
    cls_name = str(cls).rpartition(".")[2]
    for name, value in extra.items():
        _check_json(value, f"{cls_name} attribute {name!r}", url)
    return extra


def loads(data: bytes | str, site: str | None = None) -> dict[str, Any]:
    """Decode bytes written by :func:`dumps` into a ``Request.to_dict`` dict.

    :param data: one frontier entry.
    :param site: the site it was stored under (needed for a relative URL).
    :returns: a dict that :func:`scrapy.utils.request.request_from_dict`
        accepts, with every ``Request`` attribute (defaults filled in), the
        ``_class`` of a subclass and the attributes it adds.
    :raises DecodeError: the entry is not our JSON (a pickled payload is
        named as such and never unpickled), or a field is malformed: of the
        wrong type, unknown, or (``X``) naming no attribute the entry's
        class adds to ``Request.attributes``.
    """
    raw = data.encode() if isinstance(data, str) else data
    if raw[:1] == b"\x80":
        raise DecodeError(
            "entry is a pickled payload; pickled requests are not loaded "
            "(set SCHEDULER_SERIALIZER to a pickle serializer to allow them)"
        )
    try:
        enc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DecodeError(f"entry is not JSON: {exc}") from None
    if not isinstance(enc, dict) or not isinstance(enc.get("u"), str):
        raise DecodeError("entry is not a JSON request object with a 'u' url")
    _check_fields(enc)
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


#: Types of the encoded fields; anything else is refused.
_TYPES: dict[str, tuple[type, ...]] = {
    "u": (str,), "w": (int,), "c": (str,), "e": (str,), "M": (str,), "h": (dict,),
    "b": (str,), "B": (str,), "k": (dict, list), "m": (dict,), "a": (dict,),
    "x": (str,), "p": (int,), "f": (int,), "g": (list,), "t": (str,), "X": (dict,),
}


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


def _request_class(path: str) -> type[Request] | None:
    """The Request subclass ``path`` names in an already imported module, or None.

    Nothing is imported on the word of Redis: importing a module runs code.
    """
    module, _, name = path.rpartition(".")
    obj = getattr(sys.modules.get(module), name, None)
    return obj if isinstance(obj, type) and issubclass(obj, Request) else None


def _latin1(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value
