"""The table of scrapy-redis settings in docs/scrapy-redis.md names every setting the
installed scrapy-redis reads and every name in its ``defaults.py``, so the
table cannot drift from the package."""

from __future__ import annotations

import re
from pathlib import Path

import scrapy_redis
from scrapy_redis import connection, defaults

from crawler.config import is_unknown

PAGE = Path(__file__).resolve().parent.parent / "docs" / "scrapy-redis.md"
HEADING = "## What our components change in scrapy-redis 0.9.1"
#: A string literal that names a setting: upper case words joined by "_".
SETTING_LITERAL = re.compile(r"""["']([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)["']""")


def table_names() -> set[str]:
    """The upper-case names in backticks in the first column of the first
    table under :data:`HEADING`."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index(HEADING):]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    names: set[str] = set()
    for row in rows[2:]:  # past the header and its rule
        first = row.split(" | ")[0]
        names.update(re.findall(r"`([A-Z][A-Z0-9_]*)", first))
    return names


def settings_read_by_scrapy_redis() -> set[str]:
    """Every setting name in the installed scrapy-redis's source: the
    arguments of its ``settings.get*`` calls, the names it maps to client
    options and the scheduler's optional settings (all string literals)."""
    package = Path(scrapy_redis.__file__).parent
    names: set[str] = set(connection.SETTINGS_PARAMS_MAP)
    for source in package.glob("*.py"):
        names.update(SETTING_LITERAL.findall(source.read_text(encoding="utf-8")))
    return names


def test_the_docs_table_names_every_scrapy_redis_setting_and_default() -> None:
    names = table_names()
    wanted = settings_read_by_scrapy_redis() | {k for k in vars(defaults) if k.isupper()}
    assert "REDIS_START_URLS_AS_SET" in wanted and "PIPELINE_KEY" in wanted
    assert sorted(wanted - names) == []


def test_every_redis_setting_scrapy_redis_reads_is_known_to_the_typo_check() -> None:
    """A ``REDIS_*`` setting scrapy-redis reads is never warned about as a
    typo (:func:`crawler.config.is_unknown`)."""
    wanted = settings_read_by_scrapy_redis() | {k for k in vars(defaults) if k.isupper()}
    assert sorted(n for n in wanted if is_unknown(n)) == []
