"""Revisits with conditional GETs (``FRONTIER_REVISIT_AFTER``): real workers,
Redis, MongoDB and HTTP servers that send ETags and answer 304."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tests.workers import crawl

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from devtools.replay import ReplayServer

#: Seconds after its fetch a page is due again in these tests: longer than
#: the first run lasts (so it revisits nothing itself), short enough to wait.
REVISIT_AFTER = 8


def redis_ms(rds: redis.Redis) -> int:
    """The Redis server's clock, ms (the scripts' clock)."""
    seconds, micros = rds.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_until_due(rds: redis.Redis, key: str) -> None:
    """Return once the last revisit in zset ``key`` is due on Redis's clock."""
    [(_, last)] = rds.zrange(key, -1, -1, withscores=True)
    time.sleep(max(0.0, (last - redis_ms(rds)) / 1000 + 0.05))


def test_second_run_revisits_every_page_conditionally_and_advances_last_seen(
    env: dict[str, str], db: Any, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    replay_server.clear_hits()
    rds.lpush("pages:start_urls", replay_server.url_for("/"))
    settings = {"FRONTIER_REVISIT_AFTER": REVISIT_AFTER, "MAX_IDLE_TIME_BEFORE_CLOSE": 2}

    [first] = crawl("pages", env, tmp_path, settings=settings)
    first_done = redis_ms(rds)

    assert first.returncode == 0
    assert "Idle for 2s with nothing to do: closing" in first.log
    before = {d["url"]: d for d in db.pages.find()}
    assert len(before) == 213
    # One revisit per page fetched, none due yet: the worker closed on
    # MAX_IDLE_TIME_BEFORE_CLOSE although they wait.
    assert first.stats["frontier/revisits/scheduled"] == 213
    assert rds.zcard("{pages}:revisits") == 213
    [(_, earliest)] = rds.zrange("{pages}:revisits", 0, 0, withscores=True)
    assert earliest > first_done
    assert not any(h.conditional for h in replay_server.hits())

    wait_until_due(rds, "{pages}:revisits")
    replay_server.clear_hits()
    [second] = crawl("pages", env, tmp_path, settings=settings)  # no new seed

    assert second.returncode == 0
    hits = [h for h in replay_server.hits() if h.path != "/robots.txt"]
    assert len(hits) == 213
    assert len({h.path for h in hits}) == 213
    assert all(h.conditional and h.status == 304 for h in hits)
    assert second.stats["frontier/revisits/leased"] == 213
    assert second.stats["revisit/not_modified"] == 213
    assert second.stats["revisit/touched"] == 213
    assert "item_scraped_count" not in second.stats  # no callback ran
    after = {d["url"]: d for d in db.pages.find()}
    assert db.pages.count_documents({}) == 213
    assert after.keys() == before.keys()
    for url, doc in after.items():
        assert doc["last_seen"] > before[url]["last_seen"]
        assert doc["fetched_at"] > before[url]["fetched_at"]
        assert doc["first_seen"] == before[url]["first_seen"]
    # Each 304 scheduled the next revisit, with the same validators.
    assert second.stats["frontier/revisits/scheduled"] == 213
    assert rds.zcard("{pages}:revisits") == 213
