"""Seeds: what users push into ``<spider>:start_urls`` with ``redis-cli``.

Two forms are accepted, as scrapy-redis accepts them:

* a bare URL: ``redis-cli lpush quotes:start_urls https://quotes.toscrape.com/``
* a JSON object: ``{"url": "...", "meta": {...}, "priority": 9}``, with the
  optional keys ``callback`` (a spider method name), ``cb_kwargs`` (object),
  ``method``, ``headers`` (object of strings) and ``body`` (string). Every
  other key is form data, as scrapy-redis 0.9.1 reads it: the request is a
  ``FormRequest`` with those keys as its ``formdata`` (the body of a POST,
  the query of a GET); a value is a string, a number (sent as its JSON
  text) or a list of them.

A seed that is empty, is not valid JSON (when it starts with ``{``), is not a
JSON object, lacks a string ``url``, has an optional key of the wrong type,
has form data of another type or both form data and a ``body``, or whose URL
is not an absolute http(s) URL raises :class:`BadSeed` with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from crawler.frontier.store import PRIORITY_LIMIT

if TYPE_CHECKING:
    from redis import Redis

__all__ = ["BadSeed", "Seed", "SeedPusher", "parse_seed", "seed_json"]


class BadSeed(ValueError):
    """A seed that cannot become a request; the message says why."""


@dataclass(frozen=True)
class Seed:
    """A parsed seed, ready to become a :class:`scrapy.Request`.

    :ivar url: absolute http(s) URL.
    :ivar formdata: form data (scrapy-redis's extra JSON keys), key ->
        value or values; empty: a plain request.
    """

    url: str
    meta: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    callback: str | None = None
    cb_kwargs: dict[str, Any] = field(default_factory=dict)
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    formdata: dict[str, str | list[str]] = field(default_factory=dict)


_TYPES: dict[str, tuple[type, ...]] = {
    "meta": (dict,),
    "priority": (int,),
    "callback": (str,),
    "cb_kwargs": (dict,),
    "method": (str,),
    "headers": (dict,),
    "body": (str,),
}


def check_url(url: str) -> str:
    """Return ``url`` stripped if it is an absolute http(s) URL with a host.

    :raises BadSeed: otherwise, saying what is wrong.
    """
    url = url.strip()
    if not url:
        raise BadSeed("empty URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise BadSeed(f"malformed URL {url!r}: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise BadSeed(f"not an http(s) URL: {url!r}")
    if not parts.hostname:
        raise BadSeed(f"URL has no host: {url!r}")
    return url


def _form_value(key: str, value: Any) -> str | list[str]:
    """A form field's value as text (numbers as their JSON text).

    :raises BadSeed: not a string, a number or a list of them.
    """
    if isinstance(value, list):
        return [_form_scalar(key, v) for v in value]
    return _form_scalar(key, value)


def _form_scalar(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)
    raise BadSeed(
        f"JSON seed form field {key!r} must be a string, a number or a list of them, "
        f"got {type(value).__name__}"
    )


def parse_seed(data: bytes | str, encoding: str = "utf-8") -> Seed:
    """Parse one entry of the seed list.

    :param data: the raw list entry.
    :param encoding: how to decode bytes (``REDIS_ENCODING``).
    :raises BadSeed: the entry cannot become a request; the message says why.
    """
    try:
        text = data.decode(encoding) if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise BadSeed(f"not {encoding} text: {exc}") from None
    text = text.strip()
    if not text:
        raise BadSeed("empty seed")
    if text[0] not in "{[\"":
        return Seed(url=check_url(text))
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise BadSeed(f"not valid JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(obj, dict):
        raise BadSeed(f"JSON seed must be an object, got {type(obj).__name__}")
    url = obj.get("url")
    if not isinstance(url, str):
        raise BadSeed(
            "JSON seed has no string 'url'"
            + ("" if url is None else f" (got {type(url).__name__})")
        )
    for key, types in _TYPES.items():
        if key in obj and (
            not isinstance(obj[key], types) or isinstance(obj[key], bool)
        ):
            raise BadSeed(
                f"JSON seed key {key!r} must be {types[0].__name__}, "
                f"got {type(obj[key]).__name__}"
            )
    formdata = {key: _form_value(key, obj[key]) for key in obj
                if key not in _TYPES and key != "url"}
    if formdata and "body" in obj:
        raise BadSeed(
            f"JSON seed has both a 'body' and form data ({', '.join(sorted(formdata))})"
        )
    headers = obj.get("headers", {})
    if not all(isinstance(v, str) for v in headers.values()):
        raise BadSeed("JSON seed 'headers' values must be strings")
    if not -PRIORITY_LIMIT <= obj.get("priority", 0) <= PRIORITY_LIMIT:
        raise BadSeed(
            f"JSON seed 'priority' {obj['priority']} is out of range: the frontier takes "
            f"-{PRIORITY_LIMIT:,} to {PRIORITY_LIMIT:,}"
        )
    return Seed(
        url=check_url(url),
        meta=obj.get("meta", {}),
        priority=obj.get("priority", 0),
        callback=obj.get("callback"),
        cb_kwargs=obj.get("cb_kwargs", {}),
        method=obj.get("method", "GET").upper(),
        headers=headers,
        body=obj.get("body", ""),
        formdata=formdata,
    )


def seed_json(
    line: bytes | str,
    priority: int | None = None,
    meta: dict[str, Any] | None = None,
    spider_cls: type | None = None,
) -> tuple[str, tuple[str, ...]]:
    """Validate one seed and return it in the JSON form pushed to Redis.

    :param line: a bare URL or a JSON seed object, as ``redis-cli`` takes.
    :param priority: ``--priority``, used when the seed sets none.
    :param meta: ``--meta``, merged under the seed's own meta keys.
    :param spider_cls: when given, a seed's ``callback`` must be one of its
        methods.
    :returns: ``(json_text, form_keys)``: compact JSON with ``url`` first
        and defaults (priority 0, empty meta) left out; the JSON keys the
        workers send as form data (scrapy-redis's reading), sorted.
    :raises BadSeed: the seed cannot become a request; the message says why.
    """
    seed = parse_seed(line)
    text = line.decode() if isinstance(line, bytes) else line
    text = text.strip()
    obj: dict[str, Any] = {"url": seed.url}
    if text.startswith("{"):
        obj.update(json.loads(text))
        obj["url"] = seed.url
    if priority is not None and "priority" not in obj:
        obj["priority"] = priority
    if meta:
        obj["meta"] = {**meta, **obj.get("meta", {})}
    if not obj.get("priority"):
        obj.pop("priority", None)
    if not obj.get("meta"):
        obj.pop("meta", None)
    if seed.callback is not None and spider_cls is not None:
        if not callable(getattr(spider_cls, seed.callback, None)):
            raise BadSeed(f"spider has no callback {seed.callback!r}")
    form_keys = tuple(sorted(seed.formdata))
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False), form_keys


class SeedPusher:
    """Push validated seeds into a seed list in pipelined ``LPUSH`` batches.

    ``LPUSH key s1 s2 s3`` and workers taking from the right (``RPOP``)
    mean seeds are crawled in the order given.

    :param server: a redis-py client.
    :param key: the seed list, e.g. ``quotes:start_urls``.
    :param batch_size: seeds per ``LPUSH``; a pipeline carries
        ``pipeline_batches`` of them per round trip.
    :param as_set: the seeds go into a set (``SADD``), as
        ``REDIS_START_URLS_AS_SET`` has them read.
    """

    def __init__(
        self, server: Redis, key: str, batch_size: int = 1000, pipeline_batches: int = 10,
        *, as_set: bool = False,
    ) -> None:
        self.server = server
        self.key = key
        self.as_set = as_set
        self.batch_size = batch_size
        self.pipeline_batches = pipeline_batches
        self.pushed = 0
        self._batch: list[str] = []
        self._batches: list[list[str]] = []

    def add(self, seed: str) -> None:
        """Queue one seed (JSON text); sends when enough are waiting.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        self._batch.append(seed)
        if len(self._batch) >= self.batch_size:
            self._batches.append(self._batch)
            self._batch = []
            if len(self._batches) >= self.pipeline_batches:
                self.flush()

    def flush(self) -> None:
        """Send everything queued.

        :raises redis.exceptions.RedisError: Redis failed.
        """
        if self._batch:
            self._batches.append(self._batch)
            self._batch = []
        if not self._batches:
            return
        pipe = self.server.pipeline(transaction=False)
        for batch in self._batches:
            if self.as_set:
                pipe.sadd(self.key, *batch)
            else:
                pipe.lpush(self.key, *batch)
        pipe.execute()
        self.pushed += sum(map(len, self._batches))
        self._batches = []
