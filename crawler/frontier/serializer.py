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
=====  =====================  =====================================
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
_LONG = {short: name for name, (short, _) in _PLAIN.items()}


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
    :raises EncodeError: when meta, cb_kwargs or cookies hold a value JSON
        cannot carry; the message names the URL and the key.
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


def loads(data: bytes | str, site: str | None = None) -> dict[str, Any]:
    """Decode bytes written by :func:`dumps` into a ``Request.to_dict`` dict.

    :param data: one frontier entry.
    :param site: the site it was stored under (needed for a relative URL).
    :returns: a dict that :func:`scrapy.utils.request.request_from_dict`
        accepts.
    :raises DecodeError: the entry is not our JSON (a pickled payload is
        named as such and never unpickled).
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
    for short, name in _LONG.items():
        if short in enc:
            out[name] = enc[short]
    out["dont_filter"] = bool(enc.get("f"))
    if "h" in enc:
        out["headers"] = {
            k.encode("latin-1"): [v.encode("latin-1") for v in vs]
            for k, vs in enc["h"].items()
        }
    if "b" in enc:
        out["body"] = enc["b"].encode("utf-8")
    elif "B" in enc:
        out["body"] = base64.b64decode(enc["B"])
    return out


#: Types of the encoded fields; anything else is refused.
_TYPES: dict[str, tuple[type, ...]] = {
    "u": (str,), "w": (int,), "c": (str,), "e": (str,), "M": (str,), "h": (dict,),
    "b": (str,), "B": (str,), "k": (dict, list), "m": (dict,), "a": (dict,),
    "x": (str,), "p": (int,), "f": (int,), "g": (list,), "t": (str,),
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
    cls = enc.get("t")
    if cls is not None and not _is_request_class(cls):
        raise DecodeError(f"entry names {cls!r}, which is not a loaded Request class")


def _is_request_class(path: str) -> bool:
    """Whether ``path`` names a Request subclass in an already imported module.

    Nothing is imported on the word of Redis: importing a module runs code.
    """
    module, _, name = path.rpartition(".")
    obj = getattr(sys.modules.get(module), name, None)
    return isinstance(obj, type) and issubclass(obj, Request)


def _latin1(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value
