"""Per-site politeness overrides: parse what an operator types, check what Redis holds.

Part of the configuration layer (it imports nothing of the project): the
settings check (:mod:`crawler.config`), the commands and the frontier all
parse site values here.

Operators slow a site down (or speed it up) while a crawl runs through two
Redis hashes of the crawl (see :mod:`crawler.frontier.store`):

=====================  =================================================
key                    field -> value
=====================  =================================================
``{<spider>}:delay``   site -> delay between two requests to the site, in
                       **milliseconds**, a decimal integer ``>= 0``
                       (``"2000"``)
``{<spider>}:conc``    site -> requests to the site at once, a decimal
                       integer ``>= 1`` (``"4"``)
``{<spider>}:revisit`` site -> revisit interval (``FRONTIER_REVISIT_AFTER``
                       for that site), in **milliseconds**, a decimal
                       integer ``>= 0``; ``"0"``: the site is not revisited
=====================  =================================================

The lease script treats any other stored value as bad: it uses the default
for that site and reports the value. :func:`stored_value_ok` is the same
rule in Python (``scrapy frontier overrides`` flags bad values with it).

People think of delays in seconds (``DOWNLOAD_DELAY``, robots.txt's
``Crawl-delay``), so :func:`parse_delay` takes seconds and returns the
milliseconds to store; :func:`parse_concurrency` takes a whole number;
:func:`parse_site` turns a host or a URL into the site name the frontier
uses. Each raises :class:`ValueError` with a message that says what is
allowed. They serve ``scrapy frontier delay|concurrency`` and, through
:func:`parse_site_settings`, the ``FRONTIER_SITE_DELAYS`` /
``FRONTIER_SITE_CONCURRENCY`` settings alike.

Everything here is pure: no I/O.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "CONCURRENCY",
    "DELAY",
    "MAX_CONCURRENCY",
    "MAX_DELAY_SECONDS",
    "MAX_REVISIT_SECONDS",
    "REVISIT",
    "SLOT_MAX_CHARS",
    "SLOT_META",
    "OverrideKind",
    "check_slot",
    "parse_concurrency",
    "parse_delay",
    "parse_download_slots",
    "parse_revisit",
    "parse_site",
    "parse_site_settings",
    "stored_value_ok",
]

#: The kinds of override, named as their hash: ``{<spider>}:delay``, ``{<spider>}:conc``.
OverrideKind = Literal["delay", "conc", "revisit"]

#: The meta key Scrapy's downloader reads a request's download slot from
#: (``scrapy.core.downloader.Downloader.DOWNLOAD_SLOT``).
SLOT_META: Final = "download_slot"
#: Longest slot name :func:`check_slot` accepts, characters.
SLOT_MAX_CHARS: Final = 1000
DELAY: Final = "delay"
CONCURRENCY: Final = "conc"
REVISIT: Final = "revisit"

#: Longest delay :func:`parse_delay` accepts, in seconds (one day). A longer
#: one is more likely a slip (milliseconds typed as seconds) than a wish.
MAX_DELAY_SECONDS: Final = 86_400
#: Longest revisit interval :func:`parse_revisit` accepts, in seconds (a year).
MAX_REVISIT_SECONDS: Final = 366 * 86_400
#: Highest concurrency :func:`parse_concurrency` accepts.
MAX_CONCURRENCY: Final = 100_000

#: The stored formats, as the lease script matches them (Lua ``^%d+$`` and
#: ``^[1-9]%d*$``, at most 15 characters: lib.lua's ``hnum``, since a longer
#: number is no longer exact as a Lua number): ASCII digits only, no sign, no
#: blanks, no leading zero for a concurrency.
_STORED: Final = {
    DELAY: re.compile(rb"[0-9]{1,15}"),
    CONCURRENCY: re.compile(rb"[1-9][0-9]{0,14}"),
    REVISIT: re.compile(rb"[0-9]{1,15}"),
}
#: Seconds as an operator types them: ``2``, ``2.5``, ``0.25``, ``.5``, ``2.``.
_SECONDS: Final = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
_WHOLE: Final = re.compile(r"[0-9]+", re.ASCII)
#: A bare site: a host name or IPv4 address, or an IPv6 literal in brackets,
#: with an optional port.
_SITE: Final = re.compile(
    r"(?:[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?"
)
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}

_DELAY_RULE = (
    f"a delay is a number of seconds from 0 to {MAX_DELAY_SECONDS}, written with digits"
    " and at most one decimal point, no unit (e.g. 2, 2.5 or 0.25)"
)
_REVISIT_RULE = (
    f"a revisit interval is a number of seconds from 0 (never) to {MAX_REVISIT_SECONDS},"
    " written with digits and at most one decimal point, no unit (e.g. 3600 or 20)"
)
_CONC_RULE = f"a concurrency is a whole number from 1 to {MAX_CONCURRENCY} (e.g. 1 or 4)"


def parse_delay(value: str | float) -> int:
    """The delay to store, in milliseconds, for ``value`` seconds.

    ``value`` is what an operator typed (``"2"``, ``"2.5"``, ``"0.25"``;
    blanks around it are ignored) or a number from the settings (``2``,
    ``0.25``). The result is rounded to the nearest millisecond (half up):
    ``parse_delay("2.5") == 2500``, ``parse_delay("0.0004") == 0``.

    :param value: seconds, ``0 <= value <= MAX_DELAY_SECONDS``.
    :returns: whole milliseconds ``>= 0``, the format of ``{<spider>}:delay``.
    :raises ValueError: a unit (``"2s"``), a sign (``"-1"``), an empty
        string, ``nan`` or ``inf``, an exponent, a letter for a digit
        (``"1O"``), a bool, or a value over :data:`MAX_DELAY_SECONDS`; the
        message says what is allowed.
    """
    seconds = _decimal(value, _SECONDS, "delay", _DELAY_RULE)
    if seconds > MAX_DELAY_SECONDS:
        raise ValueError(f"delay {value!r} is not allowed: {_DELAY_RULE}")
    return int((seconds * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def parse_revisit(value: str | float) -> int:
    """The revisit interval to store, in milliseconds, for ``value`` seconds.

    As :func:`parse_delay` (rounded to the ms, half up), up to
    :data:`MAX_REVISIT_SECONDS`; ``0`` means the site is not revisited.

    :returns: whole milliseconds ``>= 0``, the format of ``{<spider>}:revisit``.
    :raises ValueError: as :func:`parse_delay`; the message says what is allowed.
    """
    seconds = _decimal(value, _SECONDS, "revisit interval", _REVISIT_RULE)
    if seconds > MAX_REVISIT_SECONDS:
        raise ValueError(f"revisit interval {value!r} is not allowed: {_REVISIT_RULE}")
    return int((seconds * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def parse_concurrency(value: str | int) -> int:
    """The concurrency to store for ``value``: requests to a site at once.

    :param value: a whole number, typed (``"4"``, blanks around it
        ignored) or from the settings (``4``).
    :returns: an int, ``1 <= n <= MAX_CONCURRENCY``, the format of
        ``{<spider>}:conc``.
    :raises ValueError: ``0``, a sign, a decimal point (``"1.5"``, ``"1.0"``),
        a unit, an empty string, a letter for a digit (``"1O"``), a bool, or a
        value over :data:`MAX_CONCURRENCY`; the message says what is allowed.
    """
    number = _decimal(value, _WHOLE, "concurrency", _CONC_RULE)
    if number != number.to_integral_value() or not 1 <= number <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency {value!r} is not allowed: {_CONC_RULE}")
    return int(number)


def _decimal(value: object, pattern: re.Pattern[str], noun: str, rule: str) -> Decimal:
    """``value`` as a Decimal, if it is a number >= 0 or a string ``pattern`` matches.

    :raises ValueError: ``"<noun> <value> is not allowed: <rule>"``.
    """
    refused = ValueError(f"{noun} {value!r} is not allowed: {rule}")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise refused
    if isinstance(value, str):
        text = value.strip()
        if not pattern.fullmatch(text):
            raise refused
        return Decimal(text)
    number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite() or number < 0:
        raise refused
    return number


def stored_value_ok(kind: OverrideKind, raw: bytes) -> bool:
    """Whether ``raw``, a value of the hash ``{<spider>}:<kind>``, is well formed.

    Exactly the lease script's rule: for ``"delay"`` and ``"revisit"`` whole
    milliseconds (``^[0-9]+$``: ``b"0"``, ``b"2000"``), for ``"conc"`` a
    whole number ``>= 1`` without a leading zero (``^[1-9][0-9]*$``), both of
    at most 15 characters. Anything else (``b"2s"``, ``b"-1"``, ``b""``,
    ``b" 5"``, ``b"2.5"``, 16 digits) is bad, and the lease script uses the
    default for the site instead.

    :raises ValueError: ``kind`` is neither ``"delay"`` nor ``"conc"``.
    """
    pattern = _STORED.get(kind)
    if pattern is None:
        raise ValueError(
            f"unknown override kind {kind!r}: expected 'delay', 'conc' or 'revisit'"
        )
    return pattern.fullmatch(raw) is not None


def parse_site(text: str) -> str:
    """The site name the frontier uses for ``text``, a host or a URL.

    A site is the host, lowercase, with ``:port`` when the port is not the
    scheme's default (the rule of :func:`crawler.frontier.sites.site_of`).

    * a URL: ``"https://Example.com:443/a?b"`` gives ``"example.com"``,
      ``"http://127.0.0.1:8080/"`` gives ``"127.0.0.1:8080"``;
    * a bare host, with a port if needed, lowercased and otherwise kept
      as given (without a scheme, no port is known to be the default):
      ``"Example.COM"`` gives ``"example.com"``, ``"example.com:8080"``
      stays.

    :raises ValueError: empty, not an http(s) URL, no host, a bad port, or a
        bare name with characters a host cannot have (``/``, blanks, ...).
    """
    stripped = text.strip()
    if "://" in stripped:
        try:
            parts = urlsplit(stripped)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a valid URL: {exc}") from None
        if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"{text!r} is not an http(s) URL with a host")
        host = parts.hostname.lower()
        if ":" in host:
            host = f"[{host}]"
        if port is None or port == _DEFAULT_PORTS[parts.scheme.lower()]:
            return host
        return f"{host}:{port}"
    site = stripped.lower()
    if not _SITE.fullmatch(site) or (":" in site.rsplit("]", 1)[-1] and not _port_ok(site)):
        raise ValueError(
            f"{text!r} is not a site: give a host (example.com), a host and port "
            "(example.com:8080) or a URL (https://example.com/)"
        )
    return site


def _port_ok(site: str) -> bool:
    """Whether the ``:port`` ending ``site`` is 1..65535."""
    return 1 <= int(site.rsplit(":", 1)[1]) <= 65_535


def parse_site_settings(
    kind: OverrideKind, values: Mapping[str, object], setting: str = ""
) -> dict[str, int]:
    """The hash fields to store for a per-site setting.

    ``parse_site_settings("delay", {"Example.com": 2, "https://a.example/": "0.5"})``
    gives ``{"example.com": 2000, "a.example": 500}``: sites through
    :func:`parse_site`, values through :func:`parse_delay` (seconds in, ms
    out) or, for ``"conc"``, :func:`parse_concurrency`.

    :param kind: ``"delay"`` for ``FRONTIER_SITE_DELAYS``, ``"conc"`` for
        ``FRONTIER_SITE_CONCURRENCY``.
    :param values: site (host or URL) -> seconds or concurrency.
    :param setting: the setting's name, for messages.
    :raises ValueError: a bad site or value; the message names the setting
        and the site, and says what is allowed. Two spellings of one site
        (``"Example.com"`` and ``"example.com"``) with different values are
        refused too.
    """
    parse = {DELAY: parse_delay, REVISIT: parse_revisit}.get(kind, parse_concurrency)
    if kind not in _STORED:
        raise ValueError(
            f"unknown override kind {kind!r}: expected 'delay', 'conc' or 'revisit'"
        )
    parsed: dict[str, int] = {}
    for name, value in values.items():
        where = f"{setting}[{name!r}]" if setting else repr(name)
        try:
            site = parse_site(str(name))
            number = parse(value)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if parsed.get(site, number) != number:
            raise ValueError(f"{where}: {site} is given two values, {parsed[site]} and {number}")
        parsed[site] = number
    return parsed


def check_slot(slot: object) -> str:
    """``slot``, a ``meta["download_slot"]`` or a ``DOWNLOAD_SLOTS`` key, if
    the frontier can keep it.

    :raises ValueError: not a str, longer than :data:`SLOT_MAX_CHARS`, or
        holding a tab, a line break or a NUL (the frontier's entries
        separate fields with them); the message says so.
    """
    if not isinstance(slot, str):
        raise ValueError(
            f"meta[{SLOT_META!r}] must be text (a slot name), not {type(slot).__name__}"
        )
    if len(slot) > SLOT_MAX_CHARS or any(c in slot for c in "\t\r\n\0"):
        raise ValueError(
            f"meta[{SLOT_META!r}] {slot[:80]!r} is not a slot name the frontier can keep: "
            f"at most {SLOT_MAX_CHARS} characters, without tabs, line breaks or NUL"
        )
    return slot


def parse_download_slots(
    slots: Mapping[str, Any],
) -> tuple[dict[str, int], dict[str, int]]:
    """``DOWNLOAD_SLOTS`` as the frontier's overrides: (slot -> delay in
    ms, slot -> concurrency), for the entries that set them
    (``jitter`` and ``randomize_delay`` are read by
    :meth:`crawler.frontier.slots.SitePolicy.from_settings`).

    :raises ValueError: an entry is not a dict, names a slot the frontier
        cannot keep (:func:`check_slot`), or has a delay or concurrency out
        of range; the message names the slot and what is allowed.
    """
    delays: dict[str, int] = {}
    caps: dict[str, int] = {}
    for name, entry in slots.items():
        where = f"DOWNLOAD_SLOTS[{name!r}]"
        try:
            slot = check_slot(name)
            if not isinstance(entry, dict):
                raise ValueError(
                    f"must be a dict such as {{'delay': 1.5, 'concurrency': 1}}, "
                    f"not {type(entry).__name__}"
                )
            if entry.get("delay") is not None:
                delays[slot] = parse_delay(entry["delay"])
            if entry.get("concurrency") is not None:
                caps[slot] = parse_concurrency(entry["concurrency"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return delays, caps
