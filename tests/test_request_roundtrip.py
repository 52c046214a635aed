"""Requests keep their meta and cb_kwargs as in Scrapy's own queues: through
the scheduler in process, a real Redis, and dead letters requeued; a value no
encoding can carry is refused when scheduled, in one line naming its key."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import io
import logging
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Field, Item, Request, Spider

from crawler.commands.deadletters import requeue
from crawler.frontier.store import Frontier
from tests import scheduler_harness as harness

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


class _Spider(Spider):
    name = "types"

    def parse_page(self, response: object, **kwargs: Any) -> None:
        pass


class ProductItem(Item):
    name = Field()
    price = Field()


@dataclasses.dataclass
class Visit:
    at: datetime.datetime
    pages: tuple[int, ...]


class StrictItem(Item):
    """An item its class cannot build from its fields alone."""

    name = Field()

    def __init__(self, required: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)


META: dict[str, Any] = {
    "when": datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC),
    "day": datetime.date(2024, 5, 1),
    "at": datetime.time(9, 30),
    "wait": datetime.timedelta(minutes=5),
    "price": decimal.Decimal("19.90"),
    "raw": b"\x00\xff",
    "tags": {"a", "b"},
    "frozen": frozenset({1}),
    "pair": (1, "two"),
    "pages": {1: "first", 2: "second"},
    "item": ProductItem(name="p", price=decimal.Decimal("1.5")),
    "visit": Visit(datetime.datetime(2024, 1, 1, 8), (1, 2)),
}


def _assert_same(back: Any, sent: Any) -> None:
    """Equal, and of the same types all the way down."""
    assert back == sent
    assert type(back) is type(sent)
    if isinstance(sent, dict):
        for k, v in sent.items():
            [k2] = [x for x in back if x == k]
            assert type(k2) is type(k)
            _assert_same(back[k], v)
    elif isinstance(sent, (list, tuple)):
        for b, s in zip(back, sent, strict=True):
            _assert_same(b, s)
    elif isinstance(sent, Item):
        _assert_same(dict(back), dict(sent))


def test_meta_and_cb_kwargs_keep_their_types_through_the_scheduler(redis_url: str) -> None:
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider)
    spider = crawler.spider
    request = Request(
        "https://a.example/p", callback=spider.parse_page,
        meta={**META, "depth": 2}, cb_kwargs={"since": META["day"], "ids": {3: (4,)}},
    )
    assert scheduler.enqueue_request(request)
    assert scheduler.flush_outbox()
    [back] = harness.lease_all(scheduler)
    # (its site as its download slot, which Scrapy's downloader would set)
    _assert_same(back.meta, {**META, "depth": 2, "download_slot": "a.example"})
    _assert_same(back.cb_kwargs, {"since": META["day"], "ids": {3: (4,)}})
    assert back.callback == spider.parse_page
    assert crawler.stats.get_value("scheduler/unencodable") is None


def test_a_dead_letter_requeued_keeps_the_types_of_its_meta(
    redis_url: str, rds: redis.Redis
) -> None:
    scheduler, _ = harness.open_scheduler(redis_url, _Spider)
    request = Request("https://a.example/dead", meta={**META, "retry_times": 2}, priority=1)
    scheduler.dead_letter(request, "gave up after 3 attempts: 500")
    assert scheduler.flush_outbox()
    frontier = Frontier(rds, "types")
    assert requeue(frontier) == (1, 0)
    scheduler, _ = harness.open_scheduler(redis_url, _Spider)
    [back] = harness.lease_all(scheduler)
    _assert_same(back.meta, {**META, "download_slot": "a.example"})  # without retry_times
    assert back.priority == 3


@pytest.mark.parametrize(
    ("meta", "cb_kwargs", "where"),
    [
        ({"x": lambda: None}, {}, "meta['x']"),
        ({"ok": 1}, {"f": io.BufferedReader(io.BytesIO(b"x"))},  # as an open file
         "cb_kwargs['f'] is a BufferedReader"),
        ({"deep": [1, {"k": (object(),)}]}, {}, "meta['deep'][1]['k'][0]"),
        ({"strict": StrictItem("r", name="n")}, {},
         "a StrictItem item that its class cannot build from its fields ['name']"),
    ],
)
def test_a_request_no_encoding_can_carry_is_refused_when_scheduled_in_one_line(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture,
    meta: dict[str, Any], cb_kwargs: dict[str, Any], where: str,
) -> None:
    scheduler, crawler = harness.open_scheduler(redis_url, _Spider)
    caplog.set_level(logging.INFO)
    request = Request("https://a.example/refused", meta=meta, cb_kwargs=cb_kwargs)

    assert scheduler.enqueue_request(request) is False  # as Scrapy's scheduler refuses

    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert message.startswith("cannot store request https://a.example/refused in Redis: ")
    assert where in message and "\n" not in message
    assert crawler.stats.get_value("scheduler/unencodable") == 1
    # Not queued, not marked as seen: the same request, fixed, is taken.
    assert scheduler.flush_outbox()
    assert int(rds.get("{types}:count") or 0) == 0
    assert scheduler.enqueue_request(request.replace(meta={}, cb_kwargs={}))
    assert scheduler.flush_outbox()
    assert int(rds.get("{types}:count") or 0) == 1
