"""One site policy in two languages: every case of one table goes through
``lib.lua``'s ``site_policy`` on a real Redis and through
:class:`crawler.frontier.policy.Policy`, and both give the case's delay,
capacity and next due time."""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from crawler.frontier import protocol
from crawler.frontier.policy import Policy, SiteInputs, SitePace
from crawler.frontier.store import Frontier

if TYPE_CHECKING:
    import redis

PREFIX = "{policy_test}:"
SITE = "example.com"
NOW = 1_700_000_000_000

#: Calls lib.lua's site_policy for one site. ARGV: the options P as JSON
#: (without draw), the default concurrency, the gate ("1"/"0"), the random
#: draw, the site.
_DRIVER = """
K.cap = tonumber(ARGV[2])
K.gate = ARGV[3] == '1'
local P = cjson.decode(ARGV[1])
local r = tonumber(ARGV[4])
P.draw = function() return r end
local delay, cap, next_due = site_policy(ARGV[5], P)
return {delay, cap, next_due, problems}
"""


class Case(NamedTuple):
    """Inputs -> the expected policy."""

    name: str
    policy: Policy
    stored: SiteInputs
    draw: float
    expected: SitePace


CASES = [
    Case("defaults", Policy(), SiteInputs(), 0.0, SitePace(0, 8, NOW)),
    Case("default delay and margin", Policy(delay_ms=1000, margin=0.1),
         SiteInputs(), 0.0, SitePace(1100, 8, NOW + 1100)),
    Case("an override replaces the default", Policy(delay_ms=1000),
         SiteInputs(delay="250"), 0.0, SitePace(250, 8, NOW + 250)),
    Case("an override of 0", Policy(delay_ms=1000), SiteInputs(delay="0"), 0.5,
         SitePace(0, 8, NOW)),
    Case("a larger Crawl-delay wins", Policy(delay_ms=1000),
         SiteInputs(rdelay="3000"), 0.0, SitePace(3000, 8, NOW + 3000)),
    Case("a smaller Crawl-delay does not", Policy(delay_ms=1000),
         SiteInputs(delay="2000", rdelay="1500"), 0.0, SitePace(2000, 8, NOW + 2000)),
    Case("the slow delay adds", Policy(delay_ms=1000, margin=0.1),
         SiteInputs(rdelay="2000", slow="500"), 0.0, SitePace(2750, 8, NOW + 2750)),
    Case("the margin floors", Policy(delay_ms=333, margin=0.15), SiteInputs(), 0.0,
         SitePace(382, 8, NOW + 382)),
    Case("jitter draws in [1, 1 + j)", Policy(delay_ms=1000, jitter=0.5),
         SiteInputs(), 0.75, SitePace(1000, 8, NOW + 1375)),
    Case("a site's own jitter", Policy(delay_ms=1000, jitter=0.5,
                                       site_jitter={SITE: 0.2}),
         SiteInputs(), 0.5, SitePace(1000, 8, NOW + 1100)),
    Case("a site's own jitter of 0", Policy(delay_ms=1000, jitter=0.5,
                                            site_jitter={SITE: 0.0}),
         SiteInputs(), 0.9, SitePace(1000, 8, NOW + 1000)),
    Case("jitter of another site", Policy(delay_ms=1000, jitter=0.5,
                                          site_jitter={"other.org": 0.2}),
         SiteInputs(), 0.5, SitePace(1000, 8, NOW + 1250)),
    Case("no jitter without a delay", Policy(jitter=0.5), SiteInputs(), 0.9,
         SitePace(0, 8, NOW)),
    Case("a concurrency override", Policy(concurrency=4), SiteInputs(conc="2"), 0.0,
         SitePace(0, 2, NOW)),
    Case("gated: robots.txt not known", Policy(concurrency=4, gate=True),
         SiteInputs(conc="3"), 0.0, SitePace(0, 1, NOW)),
    Case("gated: robots.txt known", Policy(concurrency=4, gate=True),
         SiteInputs(conc="3", robots_known=True), 0.0, SitePace(0, 3, NOW)),
    Case("a bad override: the default", Policy(delay_ms=1000),
         SiteInputs(delay="1.5"), 0.0, SitePace(1000, 8, NOW + 1000)),
    Case("a negative Crawl-delay: left out", Policy(delay_ms=100),
         SiteInputs(rdelay="-5000"), 0.0, SitePace(100, 8, NOW + 100)),
    Case("a slow mark of 16 digits: left out", Policy(delay_ms=100),
         SiteInputs(slow="1" * 16), 0.0, SitePace(100, 8, NOW + 100)),
    Case("a concurrency of 0: the default", Policy(concurrency=4),
         SiteInputs(conc="0"), 0.0, SitePace(0, 4, NOW)),
    Case("a concurrency that is no number", Policy(concurrency=4),
         SiteInputs(conc="x"), 0.0, SitePace(0, 4, NOW)),
    Case("all at once", Policy(delay_ms=500, margin=0.1, concurrency=6, gate=True,
                               jitter=0.3),
         SiteInputs(delay="800", rdelay="1200", slow="300", conc="5", robots_known=True),
         0.25, SitePace(1650, 5, NOW + 1773)),
]


def _lua_policy(rds: redis.Redis, case: Case) -> tuple[SitePace, list[Any]]:
    lib = resources.files("crawler.frontier").joinpath("lua/lib.lua").read_text()
    script = rds.register_script(lib + "\n" + _DRIVER)
    stored = case.stored
    for name, value in (("delay", stored.delay), ("rdelay", stored.rdelay),
                        ("slow", stored.slow), ("conc", stored.conc)):
        if value is not None:
            rds.hset(PREFIX + name, SITE, value)
    if stored.robots_known:
        rds.hset(PREFIX + "robots", SITE, b"0\n")
    p = case.policy
    options: dict[str, Any] = {"delay_ms": p.delay_ms, "margin": p.margin,
                               "jitter": p.jitter, "now": NOW}
    if p.site_jitter:
        options["jitters"] = dict(p.site_jitter)
    reply = script(keys=protocol.shard_keys(PREFIX), args=[
        json.dumps(options), p.concurrency, "1" if p.gate else "0", repr(case.draw), SITE,
    ])
    return SitePace(*(int(x) for x in reply[:3])), reply[3]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lua_and_python_give_the_same_site_policy(rds: redis.Redis, case: Case) -> None:
    lua, _ = _lua_policy(rds, case)
    python = case.policy.of(SITE, case.stored, NOW, case.draw)
    assert lua == python == case.expected


def test_bad_values_are_reported_by_the_script(rds: redis.Redis) -> None:
    case = next(c for c in CASES if c.name == "a bad override: the default")
    _, problems = _lua_policy(rds, case)
    assert [p.decode() for p in problems] == [
        f'{PREFIX}delay {SITE} = "1.5" ignored (delay must be whole ms >= 0: default used)'
    ]


def test_robots_fetched_pushes_the_next_due_time_to_one_pace_never_forward(
    rds: redis.Redis,
) -> None:
    frontier = Frontier(rds, "policy_test", default_delay=1.0, delay_margin=0.1)
    rds.hset(PREFIX + "slow", SITE, "500")
    rds.zadd(PREFIX + "wait", {SITE: 5})
    frontier.robots_fetched(SITE, b"1\nUser-agent: *\n", 2000, NOW)
    # max(1000, Crawl-delay 2000) + 500, times 1.1
    expected = frontier.policy.of(SITE, SiteInputs(rdelay="2000", slow="500"), NOW)
    assert expected.delay_ms == 2750
    assert rds.hget(PREFIX + "due", SITE) == str(NOW + 2750).encode()
    assert rds.zscore(PREFIX + "wait", SITE) == NOW + 2750
    assert rds.hget(PREFIX + "rdelay", SITE) == b"2000"
    frontier.robots_fetched(SITE, b"2\n", None, NOW - 10_000)  # an earlier due: kept
    assert rds.hget(PREFIX + "due", SITE) == str(NOW + 2750).encode()
    assert rds.hget(PREFIX + "rdelay", SITE) is None
    assert rds.hget(PREFIX + "robots", SITE) == b"2\n"
    rds.delete(*(PREFIX + k for k in ("slow", "wait", "due", "rdelay", "robots")))


def test_the_frontiers_policy_is_its_lease_scripts(rds: redis.Redis) -> None:
    frontier = Frontier(rds, "policy_test", default_delay=0.5, default_concurrency=3,
                        delay_margin=0.2, robots_gate=True, jitter=0.1,
                        site_jitter={"a.example": 0.3})
    assert frontier.policy == Policy(delay_ms=500, margin=0.2, concurrency=3, gate=True,
                                     jitter=0.1, site_jitter={"a.example": 0.3})
