"""Seeds queued from any Python process (crawler.producer.queue_seeds), as
``scrapy seed`` queues them: the same checks, one round trip, bad seeds
logged and skipped, and read back by the frontier's own seed parser."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from crawler.frontier.seeds import parse_seed
from crawler.producer import queue_seeds

if TYPE_CHECKING:
    import pytest
    import redis


def test_urls_and_request_data_are_queued_in_order_with_priority_and_meta(
    redis_url: str, rds: redis.Redis
) -> None:
    result = queue_seeds(redis_url, "quotes", [
        "https://a.example/1",
        {"url": "https://a.example/login", "method": "POST", "user": "u"},
        '{"url": "https://a.example/2", "priority": 3, "meta": {"k": 1}}',
    ], priority=9, meta={"source": "nightly", "k": 0})
    assert (result.queued, result.key, result.invalid) == (3, "quotes:start_urls", [])
    taken = [json.loads(x) for x in reversed(rds.lrange("quotes:start_urls", 0, -1))]
    assert taken == [
        {"url": "https://a.example/1", "priority": 9, "meta": {"source": "nightly", "k": 0}},
        {"url": "https://a.example/login", "method": "POST", "user": "u", "priority": 9,
         "meta": {"source": "nightly", "k": 0}},
        {"url": "https://a.example/2", "priority": 3, "meta": {"source": "nightly", "k": 1}},
    ]
    login = parse_seed(json.dumps(taken[1]))
    assert (login.method, login.formdata) == ("POST", {"user": "u"})


def test_bad_seeds_are_logged_and_skipped_and_the_others_queued(
    redis_url: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    result = queue_seeds(rds, "quotes", ["ftp://a.example/", "https://a.example/ok", "{bad"])
    assert result.queued == 1
    assert [seed for seed, _why in result.invalid] == ["ftp://a.example/", "{bad"]
    assert rds.lrange("quotes:start_urls", 0, -1) == [b'{"url":"https://a.example/ok"}']
    assert len([r for r in caplog.records if r.getMessage().startswith("Seed skipped")]) == 2


def test_many_seeds_go_in_one_round_trip(rds: redis.Redis) -> None:
    before = rds.info("stats")["total_commands_processed"]
    result = queue_seeds(rds, "quotes", (f"https://a.example/{i}" for i in range(5000)))
    after = rds.info("stats")["total_commands_processed"]
    assert result.queued == rds.llen("quotes:start_urls") == 5000
    assert after - before <= 1 + 5 + 1  # INFO, five LPUSH of 1,000 in one pipeline, INFO


def test_a_crawl_reading_a_seed_set_gets_them_in_its_set(rds: redis.Redis) -> None:
    settings = {"REDIS_START_URLS_AS_SET": True, "REDIS_START_URLS_KEY": "%(name)s:seeds"}
    result = queue_seeds(rds, "quotes", ["https://a.example/1", "https://a.example/1"],
                         settings=settings)
    assert result.key == "quotes:seeds"
    assert rds.smembers("quotes:seeds") == {b'{"url":"https://a.example/1"}'}
