"""One dead-letter record shape (:mod:`crawler.frontier.deadletters`): every
writer, triggered on a real Redis, writes exactly its fields; records in the
shapes of earlier versions still list and requeue."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.utils.misc import build_from_crawler

from crawler.commands.deadletters import dead_letters, load_record, requeue
from crawler.frontier.deadletters import RECORD_FIELDS, RECORD_VERSION, upgrade
from crawler.frontier.protocol import NotDue
from crawler.frontier.store import Frontier, Push
from crawler.middlewares import BackoffRetryMiddleware
from tests.test_deadletters import HOLDER, _Part

if TYPE_CHECKING:
    import redis


def _only_record(rds: redis.Redis) -> dict[str, Any]:
    [raw] = rds.lrange("{dead}:dead", 0, -1)
    record: dict[str, Any] = json.loads(raw)
    return record


def _assert_shape(record: dict[str, Any]) -> None:
    assert set(record) == set(RECORD_FIELDS), record
    assert record["v"] == RECORD_VERSION
    for field in ("url", "site", "entry", "last_error", "worker"):
        assert record[field] is None or isinstance(record[field], str), (field, record)
    for field in ("priority", "first_priority"):
        assert record[field] is None or type(record[field]) is int, (field, record)
    assert isinstance(record["reason"], str) and record["reason"]
    assert type(record["attempts"]) is int and type(record["deliveries"]) is int
    assert isinstance(record["time"], (int, float)) and record["time"] >= 0


def test_a_request_the_retry_middleware_gives_up_is_a_record_of_the_one_shape(
    redis_url: str, rds: redis.Redis,
) -> None:
    part = _Part(redis_url, RETRY_TIMES=2)
    part.dead.worker = HOLDER
    try:
        part.dead.connect(part.crawler.signals)
        middleware = build_from_crawler(BackoffRetryMiddleware, part.crawler)
        request = Request("https://a.example/x", priority=3, meta={"retry_times": 2})
        response = HtmlResponse(request.url, status=500, request=request)
        assert middleware.process_response(request, response) is response
        part.commit()
    finally:
        part.outbox.cancel()
    record = _only_record(rds)
    _assert_shape(record)
    assert record["url"] == request.url and record["site"] == "a.example"
    assert record["attempts"] == 3 and record["deliveries"] == 0
    assert record["priority"] == 3 and record["first_priority"] == 5
    assert record["worker"] == HOLDER and record["last_error"]
    assert upgrade(record) == record


def test_a_lease_past_its_deliveries_is_a_record_of_the_one_shape(rds: redis.Redis) -> None:
    frontier = Frontier(rds, "dead", max_deliveries=1)
    data = json.dumps({"u": "/x", "p": 1}).encode()
    assert frontier.push(data, site="a.example", priority=1, fingerprint=None, dont_filter=True)
    assert isinstance(frontier.lease_many(["dies#1:0"]), list)
    rds.zadd("{dead}:leases", {"dies#1:0": 0}, xx=True)  # it has expired
    rds.zrem("{dead}:alive", "dies#1")  # its worker died
    assert not isinstance(frontier.lease_many(["v#1:0"]), list)
    record = _only_record(rds)
    _assert_shape(record)
    assert record["url"] == "https://a.example/x" and record["site"] == "a.example"
    assert record["entry"] == data.decode() and record["priority"] == 1
    assert record["deliveries"] == record["attempts"] == 1
    assert record["worker"] == "dies#1" and record["last_error"] is None
    assert upgrade(record) == record


def test_an_unreadable_queued_chunk_is_a_record_of_the_one_shape(rds: redis.Redis) -> None:
    frontier = Frontier(rds, "dead")
    entries = [f"/page/{i:04d}".encode() + b"x" * 200 for i in range(30)]
    frontier.push_many([Push(e, "a.example", 0, str(i).encode(), False)
                        for i, e in enumerate(entries)])
    assert rds.hlen("{dead}:qc") > 2
    rds.hset("{dead}:qc", "a.example\t0\t0", "garbage, not entries")
    for n in range(40):
        if isinstance(frontier.lease_many([f"w#1:{n}"]), NotDue):
            break
    record = _only_record(rds)
    _assert_shape(record)
    assert record["entry"] == "garbage, not entries" and record["site"] == "a.example"
    assert record["worker"] is None and record["deliveries"] == 0


def test_an_undecodable_entry_is_a_record_of_the_one_shape(
    redis_url: str, rds: redis.Redis,
) -> None:
    part = _Part(redis_url)
    part.dead.worker = HOLDER
    try:
        part.queue.frontier.push_many([Push(b"\x80 not a request", "c.example", 0, b"f", False)])
        leased = part.queue.frontier.lease_many(part.book.new_ids(1), held_all=0)
        assert isinstance(leased, list)
        part.book.take(leased)
        part.commit()
    finally:
        part.outbox.cancel()
    record = _only_record(rds)
    _assert_shape(record)
    assert record["url"] is None and record["site"] == "c.example"
    assert record["entry"] == "\x80 not a request" and record["worker"] == HOLDER
    assert upgrade(record) == record


def test_dead_letters_of_earlier_shapes_list_and_requeue(redis_url: str, rds: redis.Redis) -> None:
    part = _Part(redis_url)
    part.outbox.cancel()
    scheduled = Request("https://a.example/old", priority=2, meta={"retry_times": 1})
    old = [
        # the scheduler's: the self-contained request under "request"
        {"url": scheduled.url, "reason": "gave up", "attempts": 2, "last_error": "500",
         "time": 1.5, "first_priority": 4,
         "request": part.queue.encode(scheduled, compact=False).decode()},
        # the scripts': the queued entry, its site and priority, deliveries
        {"reason": "delivered 3 times", "attempts": 3, "deliveries": 3, "time": 2.5,
         "entry": "/buried", "site": "b.example", "url": "https://b.example/buried",
         "priority": 1},
        # an undecodable entry's
        {"url": None, "reason": "undecodable", "attempts": 0, "last_error": "E()", "time": 3.5,
         "request": None, "entry": "\x80 no", "site": "c.example"},
    ]
    for record in old:
        rds.rpush("{dead}:dead", json.dumps(record))
    rds.rpush("{dead}:dead", b"\xff not json")
    frontier = part.queue.frontier
    listed = [load_record(raw) for _, raw in dead_letters(frontier)]
    for record in listed:
        _assert_shape(record)
    assert [r["url"] for r in listed] == [scheduled.url, "https://b.example/buried", None, None]
    assert [r["site"] for r in listed] == ["a.example", "b.example", "c.example", None]
    assert listed[0]["last_error"] == "500" and listed[0]["first_priority"] == 4
    assert listed[1]["deliveries"] == 3 and listed[1]["priority"] == 1
    assert listed[3]["reason"] == "unreadable dead letter"

    assert requeue(frontier) == (2, 2)
    leased = frontier.lease_many(["v#1:0", "v#1:1", "v#1:2"])
    assert isinstance(leased, list)
    queued = {lease.site: part.queue.decode(lease.data, lease.site) for lease in leased}
    assert sorted(queued) == ["a.example", "b.example"]
    assert queued["a.example"].url == scheduled.url and queued["a.example"].priority == 4
    assert queued["b.example"].url == "https://b.example/buried"
    assert rds.llen("{dead}:dead") == 2
