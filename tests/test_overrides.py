"""Per-site politeness overrides: the parsers, and ``scrapy frontier delay|concurrency|overrides``
against a real Redis."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scrapy import Request

from crawler.frontier.sites import site_of
from crawler.overrides import (
    MAX_CONCURRENCY,
    MAX_DELAY_SECONDS,
    parse_concurrency,
    parse_delay,
    parse_site,
    parse_site_settings,
    stored_value_ok,
)

if TYPE_CHECKING:
    import redis

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable


def frontier(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``scrapy frontier ARGS`` against ``redis_url``."""
    return subprocess.run(
        [PYTHON, "-m", "scrapy", "frontier", *args],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- parsers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2", 2000), ("2.5", 2500), ("0.25", 250), ("0", 0), (" 3 ", 3000), (".5", 500),
        ("2.", 2000), ("0.001", 1), ("0.0005", 1), ("0.0004", 0),
        (str(MAX_DELAY_SECONDS), MAX_DELAY_SECONDS * 1000),
        # Numbers, as FRONTIER_SITE_DELAYS holds them.
        (2, 2000), (0.25, 250), (0.1 + 0.2, 300), (0, 0),
    ],
)
def test_parse_delay_takes_seconds_and_gives_whole_milliseconds(
    text: str | float, ms: int
) -> None:
    assert parse_delay(text) == ms
    assert stored_value_ok("delay", str(ms).encode())


@pytest.mark.parametrize(
    "text",
    [
        "2s", "-1", "", " ", "nan", "inf", "-inf", "1O", "1e3", "+1", "0x10", "1_000", "1,5",
        "2 s", "٢", "..5", str(MAX_DELAY_SECONDS + 1),
        -1, -0.5, float("nan"), float("inf"), True, None,
    ],
)
def test_parse_delay_refuses_what_is_not_plain_seconds_and_says_what_is_allowed(
    text: object,
) -> None:
    with pytest.raises(ValueError, match=r"a delay is a number of seconds from 0 to 86400"):
        parse_delay(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "n"), [("1", 1), ("4", 4), (" 8 ", 8), ("007", 7), (3, 3)])
def test_parse_concurrency_takes_whole_numbers_from_one(text: str | int, n: int) -> None:
    assert parse_concurrency(text) == n
    assert stored_value_ok("conc", str(n).encode())


@pytest.mark.parametrize(
    "text",
    ["0", "-1", "", "1.5", "1.0", "1O", "2s", "nan", "inf", "1e2", str(MAX_CONCURRENCY + 1),
     0, -3, 1.5, True, None],
)
def test_parse_concurrency_refuses_the_rest_and_says_what_is_allowed(text: object) -> None:
    with pytest.raises(ValueError, match=r"a concurrency is a whole number from 1 to"):
        parse_concurrency(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "raw", "ok"),
    [
        ("delay", b"0", True), ("delay", b"2000", True), ("delay", b"007", True),
        ("delay", b"", False), ("delay", b"2s", False), ("delay", b"-1", False),
        ("delay", b"2.5", False), ("delay", b" 5", False), ("delay", b"5\n", False),
        ("delay", b"1O", False), ("delay", "٢".encode(), False),
        ("conc", b"1", True), ("conc", b"16", True), ("conc", b"0", False),
        ("conc", b"01", False), ("conc", b"-1", False), ("conc", b"", False),
        ("conc", b"1.0", False), ("conc", b"4\n", False),
        # at most 15 characters, as lib.lua's hnum reads them
        ("delay", b"9" * 15, True), ("delay", b"1" + b"0" * 15, False),
        ("revisit", b"0" * 15, True), ("revisit", b"0" * 16, False),
        ("conc", b"1" + b"0" * 14, True), ("conc", b"1" + b"0" * 15, False),
    ],
)
def test_stored_value_ok_is_the_lease_scripts_rule(kind: str, raw: bytes, ok: bool) -> None:
    assert stored_value_ok(kind, raw) is ok  # type: ignore[arg-type]


def test_stored_value_ok_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="expected 'delay', 'conc' or 'revisit'"):
        stored_value_ok("slow", b"1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        "https://Example.com/a?b", "https://example.com:443/", "http://example.com:80/",
        "http://127.0.0.1:8080/x", "https://example.com:8443/", "http://[::1]:8080/",
        "http://[::1]/", "HTTP://WWW.Example.COM",
    ],
)
def test_parse_site_of_a_url_is_the_schedulers_site(url: str) -> None:
    assert parse_site(url) == site_of(Request(url))


@pytest.mark.parametrize(
    ("text", "site"),
    [
        ("example.com", "example.com"), ("Example.COM", "example.com"),
        (" example.com ", "example.com"), ("example.com:8080", "example.com:8080"),
        ("127.0.0.1:8080", "127.0.0.1:8080"), ("[::1]:8080", "[::1]:8080"),
        ("my_host.local", "my_host.local"),
    ],
)
def test_parse_site_of_a_host_lowercases_it(text: str, site: str) -> None:
    assert parse_site(text) == site


@pytest.mark.parametrize(
    "text",
    ["", "a b", "example.com/a", "ftp://example.com/", "http://", "example.com:0",
     "example.com:99999", "https://x.com:abc/", ".example.com", "example.com:"],
)
def test_parse_site_refuses_what_is_not_a_host_or_an_http_url(text: str) -> None:
    with pytest.raises(ValueError, match=r"site|URL"):
        parse_site(text)


def test_parse_site_settings_gives_the_hash_fields_of_the_per_site_settings() -> None:
    delays = {"Example.com": 2, "https://a.example:443/x": "0.5", "127.0.0.1:8080": 0.25}
    assert parse_site_settings("delay", delays, "FRONTIER_SITE_DELAYS") == {
        "example.com": 2000, "a.example": 500, "127.0.0.1:8080": 250,
    }
    assert parse_site_settings("conc", {"example.com": 1, "b.example": "4"}) == {
        "example.com": 1, "b.example": 4,
    }
    assert parse_site_settings("delay", {}) == {}


@pytest.mark.parametrize(
    ("kind", "values", "message"),
    [
        ("delay", {"example.com": "2s"}, "FRONTIER_SITE_X['example.com']: delay '2s' is not"),
        ("delay", {"example.com": -1}, "FRONTIER_SITE_X['example.com']: delay -1 is not"),
        ("conc", {"example.com": 0}, "FRONTIER_SITE_X['example.com']: concurrency 0 is not"),
        ("conc", {"a b": 1}, "FRONTIER_SITE_X['a b']: 'a b' is not a site"),
        ("conc", {"Example.com": 1, "example.com": 2}, "example.com is given two values, 1 and 2"),
        ("slow", {"example.com": 1}, "unknown override kind 'slow'"),
    ],
)
def test_parse_site_settings_names_the_setting_and_site_it_refuses(
    kind: str, values: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_site_settings(kind, values, "FRONTIER_SITE_X")  # type: ignore[arg-type]


# --- the command, on a real Redis -------------------------------------------------


@pytest.mark.workers
def test_delay_and_concurrency_are_stored_in_the_lease_scripts_formats(
    redis_url: str, rds: redis.Redis
) -> None:
    set_delay = frontier(redis_url, "delay", "pages", "https://Example.com:443/x", "2.5")
    set_conc = frontier(redis_url, "concurrency", "pages", "127.0.0.1:8080", "3")
    set_zero = frontier(redis_url, "delay", "quotes", "example.org", "0")

    assert set_delay.returncode == 0, set_delay.stderr
    assert "{pages}:delay example.com = 2500 ms (2.5 s)" in set_delay.stdout
    assert set_conc.returncode == 0, set_conc.stderr
    assert set_zero.returncode == 0, set_zero.stderr
    assert rds.hgetall("{pages}:delay") == {b"example.com": b"2500"}
    assert rds.hgetall("{pages}:conc") == {b"127.0.0.1:8080": b"3"}
    assert rds.hgetall("{quotes}:delay") == {b"example.org": b"0"}


@pytest.mark.workers
@pytest.mark.parametrize("value", ["2s", "1O", "-1", "", "nan", "inf", "1e3"])
def test_a_bad_delay_is_refused_with_exit_status_2_and_nothing_written(
    redis_url: str, rds: redis.Redis, value: str
) -> None:
    rds.hset("{pages}:delay", "example.com", "1000")

    result = frontier(redis_url, "delay", "pages", "example.com", value)

    assert result.returncode == 2
    assert f"refused: delay {value!r} is not allowed: a delay is a number of seconds" in (
        result.stderr
    )
    assert "(e.g. 2, 2.5 or 0.25)" in result.stderr
    assert rds.hgetall("{pages}:delay") == {b"example.com": b"1000"}


@pytest.mark.workers
@pytest.mark.parametrize("value", ["2s", "1O", "-1", "", "0", "1.5"])
def test_a_bad_concurrency_is_refused_with_exit_status_2_and_nothing_written(
    redis_url: str, rds: redis.Redis, value: str
) -> None:
    result = frontier(redis_url, "concurrency", "pages", "example.com", value)

    assert result.returncode == 2
    assert "a concurrency is a whole number from 1 to" in result.stderr
    assert not rds.exists("{pages}:conc")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["delay", "nosuchspider", "example.com", "2"], "unknown spider 'nosuchspider'"),
        (["delay", "pages", "example.com/a", "2"], "'example.com/a' is not a site"),
        (["delay", "pages", "ftp://example.com/", "2"], "not an http(s) URL"),
        (["delay", "pages", "example.com"], "expected: delay SPIDER SITE SECONDS"),
        (["concurrency", "pages", "example.com", "2", "3"], "expected: concurrency SPIDER SITE N"),
        (["delay", "pages", "example.com", "2", "--unset"], "SPIDER SITE --unset"),
        (["overrides", "--unset"], "--unset is not an option of scrapy frontier overrides"),
        (["delay", "pages", "example.com", "2", "--watch"],
         "--watch is not an option of scrapy frontier delay"),
    ],
)
@pytest.mark.workers
def test_usage_errors_exit_2_and_write_nothing(
    redis_url: str, rds: redis.Redis, args: list[str], message: str
) -> None:
    result = frontier(redis_url, *args)

    assert result.returncode == 2
    assert message in result.stderr
    assert rds.dbsize() == 0


@pytest.mark.workers
def test_unset_removes_an_override_and_says_when_there_was_none(
    redis_url: str, rds: redis.Redis
) -> None:
    rds.hset("{pages}:delay", mapping={"example.com": "2000", "example.org": "1"})
    rds.hset("{pages}:conc", "example.com", "2")

    removed = frontier(redis_url, "delay", "pages", "https://example.com/", "--unset")
    again = frontier(redis_url, "delay", "pages", "example.com", "--unset")
    conc = frontier(redis_url, "concurrency", "pages", "example.com", "--unset")

    assert removed.returncode == again.returncode == conc.returncode == 0
    assert "removed the delay override of example.com from {pages}:delay" in removed.stdout
    assert "example.com had no delay override in {pages}:delay" in again.stdout
    assert rds.hgetall("{pages}:delay") == {b"example.org": b"1"}
    assert not rds.exists("{pages}:conc")


@pytest.mark.workers
def test_overrides_lists_every_spiders_values_and_flags_the_bad_ones(
    redis_url: str, rds: redis.Redis
) -> None:
    # Set with redis-cli, as the README used to say: one typo per hash.
    rds.hset("{pages}:delay", mapping={"example.com": "2000", "typo.example": "2s"})
    rds.hset("{pages}:conc", mapping={"example.com": "1", "zero.example": "0"})
    rds.hset("{quotes}:conc", "quotes.toscrape.com", "4")

    listed = frontier(redis_url, "overrides", "--json")
    table = frontier(redis_url, "overrides", "pages")

    assert listed.returncode == 1, listed.stderr  # bad values found
    rows = json.loads(listed.stdout)
    assert rows == [
        {"spider": "pages", "kind": "delay", "site": "example.com", "value": "2000", "ok": True},
        {"spider": "pages", "kind": "delay", "site": "typo.example", "value": "2s", "ok": False},
        {"spider": "pages", "kind": "conc", "site": "example.com", "value": "1", "ok": True},
        {"spider": "pages", "kind": "conc", "site": "zero.example", "value": "0", "ok": False},
        {"spider": "quotes", "kind": "conc", "site": "quotes.toscrape.com", "value": "4",
         "ok": True},
    ]
    assert table.returncode == 1
    assert "2000 ms (2 s)" in table.stdout
    assert ("BAD '2s': not whole milliseconds >= 0 (at most 15 digits), the default is used"
            in table.stdout)
    assert ("BAD '0': not a whole number >= 1 (at most 15 digits), the default is used"
            in table.stdout)
    assert "2 bad value(s)" in table.stdout
    assert "quotes.toscrape.com" not in table.stdout

    fixed = frontier(redis_url, "delay", "pages", "typo.example", "2")
    rds.hdel("{pages}:conc", "zero.example")
    assert fixed.returncode == 0
    assert frontier(redis_url, "overrides", "--json").returncode == 0


@pytest.mark.workers
def test_an_unreachable_redis_exits_3(redis_url: str) -> None:
    result = frontier("redis://127.0.0.1:1/0", "delay", "pages", "example.com", "2")

    assert result.returncode == 3
    assert "Redis at redis://127.0.0.1:1/0 failed" in result.stderr


@pytest.mark.workers
def test_overrides_lists_huge_and_undecodable_values_without_failing(
    redis_url: str, rds: redis.Redis
) -> None:
    rds.hset("{pages}:delay", mapping={
        "huge.example": "9" * 5000, "bin.example": b"\xff", "year.example": "9" * 15,
    })

    result = frontier(redis_url, "overrides", "pages")

    assert result.returncode == 1, result.stderr
    # 16 digits or more: the lease script uses the default, so it is bad
    assert f"BAD '{'9' * 5000}': not whole milliseconds >= 0 (at most 15 digits)" in result.stdout
    # 15 digits: used, and flagged as more than the subcommand sets
    assert (f"{'9' * 15} ms (1e+12 s) - over the most scrapy frontier delay sets, 86400000"
            in result.stdout)
    assert "2 bad value(s)" in result.stdout
    assert "BAD '\\\\xff': not whole milliseconds >= 0" in result.stdout
