"""robots.txt is stored compact: only the group protego picks for our agent.

:func:`crawler.politeness.compact_robots` must give the same decisions
(allowed or not, Crawl-delay, Request-rate) as the full body for the
crawl's user agent, in a few KiB where the body had hundreds.
"""

from __future__ import annotations

import random

import pytest
from protego import Protego

from crawler.politeness import ROBOTS_MAX_BYTES, compact_robots

AGENT = "crawler (+https://docs.scrapy.org/en/latest/topics/practices.html)"


def big_robots(ours: str | None, size: int = 400 * 1024) -> str:
    """A robots.txt of about ``size`` bytes: many groups of other agents,
    with our group (``User-agent: <ours>``) in the middle when given."""
    rnd = random.Random(13)
    parts: list[str] = ["# a large robots.txt\nSitemap: https://x.example/sitemap.xml\n"]
    n = 0
    while sum(map(len, parts)) < size:
        n += 1
        if ours is not None and n == 400:
            parts.append(
                f"User-agent: Other-{n}\nUser-agent: {ours}\n"
                "Disallow: /private/\nAllow: /private/open$\nAllow: /private/dir/index.html\n"
                "Disallow: /*.pdf$\nDisallow: /tmp  # comment\ndisalow: /misspelt\n"
                "Crawl-delay: 2.5\nRequest-rate: 3/10s\n\n"
            )
            continue
        rules = "".join(
            f"{rnd.choice(['Allow', 'Disallow'])}: /{rnd.randrange(10**6)}/"
            f"{'*' * rnd.randrange(2)}\n"
            for _ in range(20)
        )
        parts.append(f"User-agent: bot-{n}\n{rules}Crawl-delay: {n % 7}\n\n")
    if ours is None or ours != "*":
        parts.append("User-agent: *\nDisallow: /star-only/\nCrawl-delay: 9\n")
    return "".join(parts)


URLS = [
    f"https://x.example{path}"
    for path in (
        "/", "/private/", "/private/x", "/private/open", "/private/open2", "/private/dir/",
        "/private/dir/index.html", "/private/dir/other", "/a.pdf", "/a.pdf?x", "/tmp",
        "/tmpx", "/misspelt/1", "/star-only/", "/robots.txt", "/123/", "/%7Euser",
        "/private/%7E", "/ok",
    )
]


@pytest.mark.parametrize("ours", ["crawler", "*", None], ids=["named", "star", "none"])
def test_compact_robots_gives_the_same_answers_in_a_few_kib(ours: str | None) -> None:
    full = big_robots(ours)
    assert len(full.encode()) >= 400 * 1024
    compact = compact_robots(full.encode(), AGENT)
    assert len(compact) < 2048, compact[:300]
    before, after = Protego.parse(full), Protego.parse(compact.decode())
    for url in URLS:
        assert before.can_fetch(url, AGENT) == after.can_fetch(url, AGENT), url
    assert before.crawl_delay(AGENT) == after.crawl_delay(AGENT)
    assert before.request_rate(AGENT) == after.request_rate(AGENT)
    if ours == "crawler":
        assert not after.can_fetch("https://x.example/private/x", AGENT)
        assert after.can_fetch("https://x.example/private/open", AGENT)
        assert after.crawl_delay(AGENT) == 2.5
    if ours is None:  # only "*" applies
        assert not after.can_fetch("https://x.example/star-only/", AGENT)
        assert after.crawl_delay(AGENT) == 9


def test_robots_without_a_group_for_us_compacts_to_nothing() -> None:
    body = b"User-agent: otherbot\nDisallow: /\n"
    assert compact_robots(body, AGENT) == b""
    assert Protego.parse("").can_fetch("https://x.example/", AGENT)


def test_compact_robots_stays_under_the_cap() -> None:
    body = "User-agent: *\n" + "".join(f"Disallow: /{i:09d}/\n" for i in range(40_000))
    compact = compact_robots(body.encode(), AGENT)
    assert len(body) > ROBOTS_MAX_BYTES >= len(compact)
    assert compact.endswith(b"\n")
