"""The per-site overrides' parsers, under the frontier's name: they live in
:mod:`crawler.overrides` (the configuration layer, which imports no
frontier), and are re-exported here for the frontier's modules."""

from crawler.overrides import (
    CONCURRENCY,
    DELAY,
    MAX_CONCURRENCY,
    MAX_DELAY_SECONDS,
    MAX_REVISIT_SECONDS,
    REVISIT,
    OverrideKind,
    parse_concurrency,
    parse_delay,
    parse_revisit,
    parse_site,
    parse_site_settings,
    stored_value_ok,
)

__all__ = [
    "CONCURRENCY",
    "DELAY",
    "MAX_CONCURRENCY",
    "MAX_DELAY_SECONDS",
    "MAX_REVISIT_SECONDS",
    "REVISIT",
    "OverrideKind",
    "parse_concurrency",
    "parse_delay",
    "parse_revisit",
    "parse_site",
    "parse_site_settings",
    "stored_value_ok",
]
