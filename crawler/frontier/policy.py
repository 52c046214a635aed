"""A site's policy: its pace and its capacity, from what the frontier stores.

One computation in two languages: ``lua/lib.lua``'s ``site_policy`` (which
``lease.lua`` and ``delay.lua`` call) and :class:`Policy` here (which Python
calls wherever it needs a site's pace or capacity). Both read the same
values and give the same figures; ``tests/test_site_policy.py`` runs one
table of cases through both, on a real Redis.

What a site's policy reads (per site, as stored in its shard):

==================  =====================================================
``{s}:delay``       its delay override, whole ms (else the default delay)
``{s}:rdelay``      its robots.txt Crawl-delay, whole ms
``{s}:slow``        its adaptive extra delay, whole ms
``{s}:conc``        its concurrency override, an integer >= 1
``{s}:robots``      whether its robots.txt is known (the gate)
==================  =====================================================

A value that is not of its form (more than 15 characters, not digits) is
left out as the scripts leave it out: the default is used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Policy", "SiteInputs", "SitePace"]

_NAT = re.compile(r"[0-9]+")
_POS = re.compile(r"[1-9][0-9]*")


def _stored(raw: bytes | str | None, pattern: re.Pattern[str]) -> int | None:
    """A stored whole number matching ``pattern`` (at most 15 characters, as
    ``lib.lua``'s ``hnum`` reads it), or None."""
    if raw is None:
        return None
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    if len(text) <= 15 and pattern.fullmatch(text):
        return int(text)
    return None


@dataclass(frozen=True)
class SiteInputs:
    """A site's stored values, as read from its shard (None: absent).

    :ivar delay: ``{s}:delay``'s value for the site (ms).
    :ivar rdelay: ``{s}:rdelay``'s (ms).
    :ivar slow: ``{s}:slow``'s (ms).
    :ivar conc: ``{s}:conc``'s.
    :ivar robots_known: ``{s}:robots`` has a field for the site (the site,
        or ``"\\t"`` + the site).
    """

    delay: bytes | str | None = None
    rdelay: bytes | str | None = None
    slow: bytes | str | None = None
    conc: bytes | str | None = None
    robots_known: bool = False


@dataclass(frozen=True)
class SitePace:
    """A site's policy now.

    :ivar delay_ms: its pace, ms: the least gap between two of its requests
        across all workers, stretched by the margin.
    :ivar capacity: its requests at once across all workers, >= 1.
    :ivar next_due_ms: when its next request may start after one starts
        at ``now_ms``: ``now_ms`` + the pace times a factor in
        [1, 1 + jitter).
    """

    delay_ms: int
    capacity: int
    next_due_ms: int


@dataclass(frozen=True)
class Policy:
    """The site policy of one frontier: its defaults, and the computation.

    :ivar delay_ms: the default delay, whole ms >= 0 (``FRONTIER_DELAY``,
        else ``DOWNLOAD_DELAY``).
    :ivar margin: the pacing margin (``FRONTIER_DELAY_MARGIN``), >= 0.
    :ivar concurrency: the default concurrency, >= 1.
    :ivar gate: a site is served one request at a time until its
        robots.txt is known (robots.txt obeyed through the frontier).
    :ivar jitter: the default jitter of a site's delay, >= 0.
    :ivar site_jitter: site -> its own jitter.
    """

    delay_ms: int = 0
    margin: float = 0.0
    concurrency: int = 8
    gate: bool = False
    jitter: float = 0.0
    site_jitter: Mapping[str, float] = field(default_factory=dict)

    @staticmethod
    def stored_ms(raw: bytes | str | None) -> int | None:
        """A stored whole number of ms (``{s}:delay``, ``{s}:slow``,
        ``{s}:due``...) as the scripts read it, or None when absent or not
        one."""
        return _stored(raw, _NAT)

    def delay(self, stored: SiteInputs) -> int:
        """The site's pace, ms: its delay (override, else :attr:`delay_ms`),
        at least its Crawl-delay, plus its slow delay, times 1 + margin,
        floored."""
        own = _stored(stored.delay, _NAT)
        delay = self.delay_ms if own is None else own
        delay = max(delay, _stored(stored.rdelay, _NAT) or 0)
        delay += _stored(stored.slow, _NAT) or 0
        return math.floor(delay * (1 + self.margin))

    def capacity(self, stored: SiteInputs) -> int:
        """The site's concurrency: 1 while its robots.txt is not known
        (:attr:`gate`), else its override, else :attr:`concurrency`."""
        if self.gate and not stored.robots_known:
            return 1
        own = _stored(stored.conc, _POS)
        return self.concurrency if own is None else own

    def of(self, site: str, stored: SiteInputs, now_ms: int, draw: float = 0.0) -> SitePace:
        """The policy of ``site`` with ``stored`` values at ``now_ms``.

        :param draw: the random number in [0, 1) that picks the jitter
            factor (the scripts draw it with ``math.random``).
        """
        delay = self.delay(stored)
        gap = delay
        j = self.site_jitter.get(site, self.jitter)
        if delay > 0 and j > 0:
            gap = math.floor(delay * (1 + j * draw))
        return SitePace(delay, self.capacity(stored), now_ms + gap)
