"""``scrapy seed``: validated seeds pushed into ``<spider>:start_urls`` (real Redis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from crawler.frontier.seeds import BadSeed, parse_seed, seed_json

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable


def seed(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "scrapy", "seed", *args],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.workers
def test_seed_file_queues_valid_lines_in_order_and_reports_invalid_ones(
    redis_url: str, tmp_path: Path
) -> None:
    lines = []
    for number in range(1, 100_001):
        if number % 100 == 0:  # 1% invalid, in three kinds
            lines.append(("ftp://example.com/{0}", "not-a-url-{0}", '{{"url": {0}}}')[number % 3])
            lines[-1] = lines[-1].format(number)
        else:
            lines.append(f"https://site{number % 50}.example.com/item/{number}")
    urls = tmp_path / "urls.txt"
    urls.write_text("\n".join(lines) + "\n")

    result = seed(redis_url, "quotes", "--file", str(urls))

    assert result.returncode == 1, result.stderr  # some seeds were invalid
    assert "queued 99000 seeds in quotes:start_urls; 1000 invalid" in result.stdout
    reported = [line for line in result.stderr.splitlines() if "invalid seed" in line]
    assert len(reported) == 1000
    assert reported[0].startswith(f"{urls}:100: invalid seed:")
    assert f"{urls}:4200: invalid seed: not an http(s) URL: 'ftp://example.com/4200'" in reported
    assert f"{urls}:100000: invalid seed:" in reported[-1]
    client: redis.Redis = redis.Redis.from_url(redis_url)
    try:
        assert client.llen("quotes:start_urls") == 99_000
        first, second = client.rpop("quotes:start_urls", 2) or []
        assert json.loads(first) == {"url": "https://site1.example.com/item/1"}
        assert json.loads(second) == {"url": "https://site2.example.com/item/2"}
    finally:
        client.close()


@pytest.mark.workers
def test_seed_arguments_take_priority_and_meta_in_redis_cli_json_form(redis_url: str) -> None:
    result = seed(
        redis_url,
        "quotes",
        "https://a.example/",
        '{"url": "https://b.example/", "priority": 7, "meta": {"own": 1}}',
        "mailto:someone@example.com",
        "--priority",
        "3",
        "--meta",
        '{"source": "test"}',
    )

    assert result.returncode == 1
    assert "argument:3: invalid seed: not an http(s) URL" in result.stderr
    client: redis.Redis = redis.Redis.from_url(redis_url)
    try:
        pushed = [json.loads(s) for s in client.lrange("quotes:start_urls", 0, -1)][::-1]
    finally:
        client.close()
    assert pushed == [
        {"url": "https://a.example/", "priority": 3, "meta": {"source": "test"}},
        {"url": "https://b.example/", "priority": 7, "meta": {"source": "test", "own": 1}},
    ]
    for entry in pushed:  # what workers read back
        assert parse_seed(json.dumps(entry)).url == entry["url"]


def test_seed_with_no_options_omits_defaults() -> None:
    assert seed_json("https://a.example/x") == ('{"url":"https://a.example/x"}', ())
    assert seed_json('{"url": "https://a.example/", "priority": 0}')[0] == (
        '{"url":"https://a.example/"}'
    )


def test_seed_rejects_a_callback_the_spider_lacks() -> None:
    from crawler.spiders.quotes import QuotesSpider

    assert seed_json(
        '{"url": "https://a.example/", "callback": "parse_author"}', None, None, QuotesSpider
    )
    with pytest.raises(BadSeed, match="no callback 'nope'"):
        seed_json('{"url": "https://a.example/", "callback": "nope"}', None, None, QuotesSpider)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nosuchspider", "https://a.example/"], "unknown spider 'nosuchspider': expected one of"),
        (["quotes"], "give seeds as arguments or with --file"),
        (["quotes", "https://a.example/", "--meta", "[1]"], "--meta must be a JSON object"),
    ],
)
@pytest.mark.workers
def test_seed_usage_errors_exit_2_and_push_nothing(
    redis_url: str, args: list[str], message: str
) -> None:
    result = seed(redis_url, *args)
    assert result.returncode == 2
    assert message in result.stderr
    client: redis.Redis = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0
    finally:
        client.close()


@pytest.mark.workers
def test_seed_names_the_redis_that_failed_with_its_password_masked(redis_url: str) -> None:
    """As every other command does: the server's address, never the password."""
    wrong = redis_url.replace("redis://", "redis://nobody:s3cret-pw@", 1)  # no such user
    done = seed(wrong, "quotes", "https://quotes.toscrape.com/")
    assert done.returncode == 3, done.stderr
    host = redis_url.split("://", 1)[1].split("/", 1)[0]
    assert f"Redis at redis://nobody:****@{host}" in done.stderr, done.stderr
    assert "s3cret-pw" not in done.stderr + done.stdout


@pytest.mark.workers
def test_a_priority_the_frontier_does_not_take_is_refused_where_it_is_written(
    redis_url: str,
) -> None:
    result = seed(redis_url, "quotes", "https://a.example/", "--priority", "1000001")
    assert result.returncode == 2, result.stderr
    assert "--priority must be from -1,000,000 to 1,000,000" in result.stderr
    result = seed(redis_url, "quotes", '{"url": "https://b.example/", "priority": -2000000}')
    assert result.returncode == 1, result.stderr
    assert "'priority' -2000000 is out of range" in result.stderr
    client: redis.Redis = redis.Redis.from_url(redis_url)
    try:
        assert client.llen("quotes:start_urls") == 0
    finally:
        client.close()
