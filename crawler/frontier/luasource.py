"""The source a shard script is loaded as: ``lib.lua``'s part it uses, then the script.

Redis runs a script's whole body on every ``EVALSHA``, so every helper of
``lib.lua`` prepended to it is made again on each call (a closure, its
upvalues, and the garbage the collector sweeps after the call), used or
not, and the binding's table ``K`` of 33 keys is filled again. Both cost
Redis time on every call, whatever the call does. :func:`shard_source`
builds the loaded text so that the scripts keep their named source and
Redis runs only what a script needs:

* **Only the helpers it uses.** ``lib.lua`` is read as a sequence of top
  level statements. A ``local`` statement (``local function f``,
  ``local a, b = ...``) is kept when a name it declares occurs in the
  script or in a statement kept already, until nothing more is added;
  any other top level statement (``K.P = ...``) is always kept. Names are
  read from the code with its comments and strings removed, so a helper
  named only in a comment is left out, and one named anywhere in code is
  kept (a false match keeps too much, never too little). The kept
  statements stay in their order, so each still sees the locals declared
  before it.
* **Keys by number.** ``K.<key>`` of a shard key becomes ``KEYS[<n>]``
  (its place in :func:`crawler.frontier.protocol.shard_keys`) in the
  loaded code, and the binding's ``K`` is made empty (it keeps the call's
  own fields: ``K.P``, ``K.cap``, ``K.now``...). The files keep the names,
  and the test of :func:`crawler.frontier.protocol.lua_binding` still
  checks the binding block of ``lib.lua``.

The result is one script as before (one atomic call, one SHA).
``python -m bench.compare i`` counts what a call costs in Redis
instructions (``bench/call_cost.py``).
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from itertools import pairwise

from crawler.frontier import protocol

__all__ = ["code_names", "script_source", "shard_source", "statements"]

#: A top-level statement of lib.lua starts at column 0 with a name
#: (``local``, ``K.P``); ``end`` and ``}`` close the one before.
_STATEMENT = re.compile(r"^(?!end\b)[A-Za-z_]", re.M)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOCAL = re.compile(r"local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w\s,]*?)\s*(?:=|$))")
_BINDING = re.compile(r"^local K = \{\n(?:  \w+ = KEYS\[\d+\],\n)*\}$", re.M)


def code_names(code: str) -> set[str]:
    """The names in Lua ``code`` outside its comments and string literals
    (``--`` and ``--[[ ]]`` comments, quoted and ``[[ ]]`` strings), after a
    ``.`` or ``:`` included (``K.qm`` gives ``K`` and ``qm``)."""
    out: list[str] = []
    i, n = 0, len(code)
    start = 0
    while i < n:
        c = code[i]
        if c == "-" and code.startswith("--", i):
            out.append(code[start:i])
            long = re.match(r"--\[(=*)\[", code[i:])
            if long:
                end = code.find("]" + long.group(1) + "]", i)
                i = n if end < 0 else end + len(long.group(1)) + 2
            else:
                end = code.find("\n", i)
                i = n if end < 0 else end
            start = i
        elif c in "'\"":
            out.append(code[start:i])
            i += 1
            while i < n and code[i] != c:
                i += 2 if code[i] == "\\" else 1
            i += 1
            start = i
        elif c == "[" and re.match(r"\[=*\[", code[i:]):
            out.append(code[start:i])
            level = re.match(r"\[(=*)\[", code[i:]).group(1)  # type: ignore[union-attr]
            end = code.find("]" + level + "]", i)
            i = n if end < 0 else end + len(level) + 2
            start = i
        else:
            i += 1
    out.append(code[start:])
    return set(_NAME.findall(" ".join(out)))


def statements(lib: str) -> list[tuple[str, frozenset[str]]]:
    """``lib``'s top-level statements in order, each as (its text, the names
    it declares: empty for a statement that is no ``local``). The comment
    lines before a statement belong to it."""
    starts = [m.start() for m in _STATEMENT.finditer(lib)]
    if not starts:
        return [(lib, frozenset())]
    # Comments and blank lines just above a statement go with it.
    bounds = [0]
    for pos in starts[1:]:
        begin = pos
        while begin > 0:
            prev = lib.rfind("\n", 0, begin - 1) + 1
            line = lib[prev : begin - 1]
            if line.strip() and not line.startswith("--"):
                break
            begin = prev
        bounds.append(begin)
    bounds.append(len(lib))
    out = []
    for (a, b), pos in zip(pairwise(bounds), starts, strict=True):
        text = lib[a:b]
        eol = lib.find("\n", pos)
        first = lib[pos : eol if eol >= 0 else len(lib)]
        declared: set[str] = set()
        m = _LOCAL.match(first)
        if m:
            declared = {m.group(1)} if m.group(1) else {
                name.strip() for name in (m.group(2) or "").split(",") if name.strip()
            }
        out.append((text, frozenset(declared)))
    return out


def shard_source(lib: str, script: str, keys: dict[str, int]) -> str:
    """The text Redis loads for a shard script: the statements of ``lib``
    that ``script`` uses (see the module's docstring), then ``script``,
    with ``K.<name>`` of each of ``keys`` (key name -> its ``KEYS`` index,
    1-based) written as ``KEYS[<index>]`` and the binding's ``K`` table made
    empty.

    :raises ValueError: if ``lib`` has no binding table ``local K = {...}``
        of ``name = KEYS[n],`` lines (the text :func:`protocol.lua_binding`
        writes).
    """
    if not _BINDING.search(lib):
        raise ValueError("lib.lua has no binding table `local K = {...}` (protocol.lua_binding)")
    parts = statements(lib)
    needed = code_names(script) | {"KEYS"}
    keep = [not declared for _, declared in parts]
    for i, (text, _) in enumerate(parts):
        if keep[i]:
            needed |= code_names(text)
    changed = True
    while changed:
        changed = False
        for i, (text, declared) in enumerate(parts):
            if not keep[i] and declared & needed:
                keep[i] = True
                needed |= code_names(text)
                changed = True
    kept = "".join(text for (text, _), k in zip(parts, keep, strict=True) if k)
    kept = _BINDING.sub("local K = {}", kept)
    source = kept + "\n" + script
    pattern = re.compile(r"\bK\.(" + "|".join(map(re.escape, keys)) + r")\b")
    return pattern.sub(lambda m: f"KEYS[{keys[m.group(1)]}]", source)


@functools.cache
def script_source(name: str, *, lib: bool = True) -> str:
    """The text Redis loads for ``lua/<name>``: with ``lib``, the shard
    script's :func:`shard_source` (``lib.lua``'s part it uses, keys by
    number); else the file as it is. Built once per process (about 4 ms a
    script).

    :raises FileNotFoundError: if there is no such script.
    """
    folder = resources.files("crawler.frontier").joinpath("lua")
    script = folder.joinpath(name).read_text()
    if not lib:
        return script
    return shard_source(folder.joinpath("lib.lua").read_text(), script, protocol.key_numbers())
