"""Run :class:`~crawler.politeness.AdaptiveSlowdownMiddleware` on a running
asyncio reactor against a real Redis, and record the thread of every Redis
command sent in this process (a hook on redis-py's
``AbstractConnection.send_command``), for tests.

``python -m tests.slowdown_threads REDIS_URL`` prints one JSON object:
``reactor`` (the reactor thread's id), ``on_reactor`` (whether the
middleware was called on the running reactor's thread), ``commands`` (one
``[thread id, command name]`` per command), ``a`` (the ``{t}:slow`` value of
``a.example`` after a 429, a 503 and a 200, in ms, each read once the
response went on) and ``b`` (that of ``b.example`` after two 429s answered
at the same time).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

from scrapy.utils.reactor import install_reactor

install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")

import redis  # noqa: E402
from redis.connection import AbstractConnection  # noqa: E402
from scrapy import Request, Spider  # noqa: E402
from scrapy.http import Response  # noqa: E402
from scrapy.utils.defer import deferred_from_coro  # noqa: E402
from scrapy.utils.test import get_crawler  # noqa: E402
from twisted.internet import reactor  # noqa: E402

from crawler.frontier.health import on_running_reactor  # noqa: E402
from crawler.politeness import AdaptiveSlowdownMiddleware  # noqa: E402

commands: list[tuple[int, str]] = []
_send = AbstractConnection.send_command


def _recorded(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
    commands.append((threading.get_ident(), str(args[0])))
    _send(self, *args, **kwargs)


class _Unrecorded(redis.Connection):
    """A connection whose commands are not recorded (the check's own)."""

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        _send(self, *args, **kwargs)


class _Spider(Spider):
    name = "t"


def main(redis_url: str) -> None:
    crawler = get_crawler(_Spider, {"REDIS_URL": redis_url})
    crawler.spider = crawler._create_spider()
    assert crawler.stats is not None
    crawler.stats.open_spider()
    mw = AdaptiveSlowdownMiddleware.from_crawler(crawler)
    # (the check reads with a client of its own, its commands not recorded)
    check = redis.Redis.from_url(redis_url, connection_class=_Unrecorded)
    out: dict[str, Any] = {"reactor": threading.get_ident(), "a": []}

    def slow_of(site: str) -> float:
        return float(check.hget("{t}:slow", site) or 0)

    async def answer(url: str, status: int) -> None:
        await mw.process_response(Request(url), Response(url, status=status))

    async def run() -> None:
        out["on_reactor"] = on_running_reactor()
        for status in (429, 503, 200):
            await answer("http://a.example/", status)
            out["a"].append(await asyncio.to_thread(slow_of, "a.example"))
        await asyncio.gather(answer("http://b.example/1", 429), answer("http://b.example/2", 429))
        out["b"] = await asyncio.to_thread(slow_of, "b.example")

    AbstractConnection.send_command = _recorded  # type: ignore[method-assign]

    def start() -> None:
        done = deferred_from_coro(run())
        done.addErrback(lambda failure: out.setdefault("error", repr(failure.value)))
        done.addBoth(lambda _: reactor.stop())  # type: ignore[attr-defined]

    reactor.callWhenRunning(start)  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]
    out["commands"] = [list(c) for c in commands]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
