"""Redis-side cost of the frontier's scripts, µs per push, lease and ack.

What a worker waits for in each round trip is mostly the time Redis spends
in ``commit.lua`` and ``lease.lua``. :func:`script_cost` measures it from
Redis's own ``INFO commandstats`` (``usec`` of ``EVALSHA``), so the
client's speed and the machine's noise weigh little: ``cycles`` commits of
``batch`` new requests, then ``cycles`` lease calls of ``batch`` requests,
each followed by the commit of its acks, on ``sites`` sites.

``python -m bench.compare s CHECKOUT...`` runs it on each checkout (each
with its own scripts), which is how a change to the scripts is weighed.
This module uses only what every version of the frontier has
(``Frontier``, ``Commit``, ``Push``, ``lease_many``), since
:mod:`bench.compare` runs this file's source in older checkouts too.
"""

from __future__ import annotations

import redis

from crawler.frontier.store import Commit, Frontier, NotDue, Push

__all__ = ["script_cost"]


def script_cost(
    redis_url: str, *, batch: int = 16, cycles: int = 200, sites: int = 1
) -> dict[str, float]:
    """µs of Redis time per push, per lease and per ack (``EVALSHA`` usec),
    on a Redis database of its own (it is flushed before and after).

    :param batch: requests per commit and per lease call.
    :param sites: sites the requests are spread over (round robin).
    :returns: ``{"push": µs, "lease": µs, "ack": µs}`` (per request).
    """
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    frontier = Frontier(client, "costbench", default_concurrency=100_000)
    frontier.load_scripts()

    def usec() -> int:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))

    n = batch * cycles
    pushes = [
        Push(f"/catalog/item-{i:07d}.html?ref=list\tparse_item\t2".encode(),
             f"www.example-shop{i % sites}.com", 0, f"fp{i:012d}".encode(), False)
        for i in range(n)
    ]
    client.config_resetstat()
    for c in range(cycles):
        frontier.commit(Commit(pushes=pushes[c * batch : (c + 1) * batch], marker=("bench", c)))
    push_us = usec()
    lease_us = ack_us = leased = 0
    for c in range(cycles):
        ids = [f"bench#0:{c * batch + j}" for j in range(batch)]
        client.config_resetstat()
        result = frontier.lease_many(ids)
        lease_us += usec()
        if isinstance(result, NotDue):
            break
        leased += len(result)
        client.config_resetstat()
        frontier.commit(Commit(acks=[lease.lease_id for lease in result]))
        ack_us += usec()
    client.flushdb()
    client.close()
    return {"push": push_us / n, "lease": lease_us / max(1, leased),
            "ack": ack_us / max(1, leased)}
