"""What an idle worker's frontier waits for, when nothing can be done now.

Job: when a worker has had nothing to do for ``MAX_IDLE_TIME_BEFORE_CLOSE``
seconds but requests are still pending, tell whether they can be served
soon (:func:`survey` returns None: the worker waits for them) or only wait
(a :class:`Stuck`: the worker may close; the requests stay in Redis for a
later worker), and say so in one line (:meth:`Stuck.describe`).

Pending work only waits when no request is leased anywhere (a leased one
may yield new work) and every site with queued work, and every retry, is
either on a site whose robots.txt did not answer this worker (its fetch
timed out or was given up at the idle limit; a wait for another worker's
fetch does not count), or not due for more than :data:`FAR_WAIT` seconds
(a site whose robots.txt answers 5xx is waited for while its next try is
sooner).

Collaborators: the crawl's :class:`~crawler.frontier.shards.FrontierShards`
(read only: one pipeline per Redis node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Collection

    from crawler.frontier.shards import FrontierShards

__all__ = ["FAR_WAIT", "ROBOTS_WAIT_META", "RobotsWait", "Stuck", "survey"]

#: Meta key of a request sent back to Redis to wait for its site's
#: robots.txt: scheduling it is no activity of the crawl (an idle worker's
#: clock goes on).
ROBOTS_WAIT_META = "frontier_robots_wait"

#: Seconds: pending work due later than this does not keep an idle worker
#: (with ``MAX_IDLE_TIME_BEFORE_CLOSE`` > 0) open; sooner work is waited for.
FAR_WAIT = 60.0
#: Entries of ``{s}:wait`` and ``{s}:retries`` read per shard (earliest
#: first); a shard with more is taken to have work due (the worker waits).
SCAN_LIMIT = 1000


@dataclass(frozen=True)
class RobotsWait:
    """A site whose robots.txt could not be fetched.

    :ivar site: the site (host, or host:port).
    :ivar attempts: failed fetches in a row (0: none recorded yet; another
        worker's fetch is under way and has not answered).
    :ivar next_in: seconds until the next attempt (0: due).
    """

    site: str
    attempts: int
    next_in: float


@dataclass
class Stuck:
    """Pending work that nothing can serve now.

    :ivar requests: requests queued or waiting to be retried, every shard.
    :ivar sites: sites with queued work or retries seen.
    :ivar robots: sites held because their robots.txt could not be fetched
        (with work waiting), by site.
    :ivar next_due: seconds until the first work not held by robots.txt is
        due, or None when there is none.
    """

    requests: int = 0
    sites: set[str] = field(default_factory=set)
    robots: list[RobotsWait] = field(default_factory=list)
    next_due: float | None = None

    def describe(self, shown: int = 3) -> str:
        """What waits and why, in one line (no trailing period), e.g.
        ``3 requests of 1 site wait in Redis: robots.txt of example.com did
        not answer (2 failed attempts; next try in 8 s)``."""
        n_sites = len(self.sites) or len(self.robots)
        head = (
            f"{self.requests} request{'s' * (self.requests != 1)} of {n_sites} "
            f"site{'s' * (n_sites != 1)} "
            f"{'waits' if self.requests == 1 else 'wait'} in Redis"
        )
        why = []
        if self.robots:
            listed = ", ".join(
                f"{r.site} ({r.attempts} failed attempt{'s' * (r.attempts != 1)}; "
                f"next try in {_span(r.next_in)})" if r.attempts
                else f"{r.site} (another worker's fetch has not answered)"
                for r in self.robots[:shown]
            )
            more = len(self.robots) - shown
            why.append(
                f"robots.txt did not answer for {listed}"
                + (f" and {more} more site{'s' * (more != 1)}" if more > 0 else "")
            )
        if self.next_due is not None:
            why.append(f"the next other request is due in {_span(self.next_due)}")
        return head + (": " + "; ".join(why) if why else "")


def _span(seconds: float) -> str:
    """``8 s``, ``2 min``, ``3 h``, ``2 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86_400:.0f} days"


def _down(raw: Any) -> tuple[int, int] | None:
    """``(next_ms, attempts)`` of a ``{s}:robots:down`` value, or None."""
    try:
        fields = (raw.decode() if isinstance(raw, bytes) else str(raw)).split()
        return int(fields[0]), int(fields[1])
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def survey(
    shards: FrontierShards, far: float = FAR_WAIT, unanswered: Collection[str] = (),
) -> Stuck | None:
    """Whether the crawl's pending work only waits (see the module's doc).

    :param far: seconds; work due sooner than this keeps the worker.
    :param unanswered: sites whose robots.txt did not answer this worker:
        their work waits however soon its next try is.
    :returns: None when some work is leased, due now or within ``far``
        seconds (or too much is queued to tell); else what waits.
    :raises redis.exceptions.RedisError: Redis failed (the caller keeps
        waiting: an outage is no reason to close).
    """
    stuck = Stuck()
    robots: dict[str, RobotsWait] = {}
    for pipe, indices in shards.groups(range(len(shards.frontiers))):
        with pipe:
            pipe.time()
            for i in indices:
                f = shards.frontiers[i]
                pipe.zcard(f.key("leases"))
                pipe.get(f.key("count"))
                pipe.zrange(f.key("ready"), 0, SCAN_LIMIT - 1)
                pipe.zrange(f.key("wait"), 0, SCAN_LIMIT - 1, withscores=True)
                pipe.zrange(f.key("retries"), 0, SCAN_LIMIT - 1, withscores=True)
                pipe.zcard(f.key("ready"))
                pipe.zcard(f.key("wait"))
                pipe.zcard(f.key("retries"))
                pipe.hgetall(f.key("robots:down"))
            replies = pipe.execute()
        seconds, micros = replies[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        for n in range(len(indices)):
            (leases, count, ready, wait, retries, n_ready, n_wait, n_retries,
             down_raw) = replies[1 + 9 * n: 10 + 9 * n]
            if int(leases) or max(n_ready, n_wait, n_retries) > SCAN_LIMIT:
                return None
            down = {}
            for site_raw, value in down_raw.items():
                parsed = _down(value)
                if parsed is not None:
                    down[_text(site_raw)] = parsed
            stuck.requests += int(count or 0) + int(n_retries)
            timed = [(_text(s), score) for s, score in wait]
            timed += [(_text(m).split("\t", 2)[1] if _text(m).count("\t") >= 2 else "", score)
                      for m, score in retries]
            timed += [(_text(s), float(now_ms)) for s in ready]
            for site, score in timed:
                stuck.sites.add(site)
                if site in unanswered:
                    next_ms, attempts = down.get(site, (now_ms, 0))
                    robots[site] = RobotsWait(site, attempts, max(0.0, (next_ms - now_ms) / 1000))
                    continue
                due = max(0.0, (score - now_ms) / 1000)
                if due <= far:
                    return None
                stuck.next_due = due if stuck.next_due is None else min(stuck.next_due, due)
    if stuck.requests == 0 or not stuck.sites:
        return None
    stuck.robots = sorted(robots.values(), key=lambda r: r.site)
    return stuck
