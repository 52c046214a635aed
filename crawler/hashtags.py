"""Redis Cluster hash tags of key names (configuration layer: no I/O, no
project imports).

A key's hash tag is the text between its first ``{`` and the next ``}``
(when not empty): Redis Cluster hashes only that, so keys with one tag
share one slot. The seed list's intake keys (:mod:`crawler.frontier.intake`)
are named here so that the settings check (``REDIS_START_URLS_KEY``) and
the frontier name them alike.
"""

from __future__ import annotations

from redis.crc import key_slot

__all__ = ["hash_tag", "intake_base"]


def hash_tag(key: str) -> str | None:
    """The hash tag Redis Cluster hashes for ``key``, or None (whole key)."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]


def intake_base(seeds: str) -> str:
    """The intake key of the seed list ``seeds``, in the seed list's slot:
    ``<seeds>:intake`` when ``seeds`` has a hash tag, else
    ``{<seeds>}:intake``.

    :raises ValueError: ``seeds`` has no usable hash tag and a ``}``, so no
        other key can share its Redis Cluster slot; the message names
        ``REDIS_START_URLS_KEY``.
    """
    if hash_tag(seeds) is not None:
        base = f"{seeds}:intake"
    elif "}" not in seeds:
        base = f"{{{seeds}}}:intake"
    else:
        raise ValueError(
            f"seed list key {seeds!r}: with a '}}' and no hash tag, no intake key "
            "can share its Redis Cluster slot; rename it (REDIS_START_URLS_KEY)"
        )
    if key_slot(base.encode()) != key_slot(seeds.encode()):  # pragma: no cover
        raise ValueError(f"intake key {base!r} is not in the slot of {seeds!r}")
    return base
