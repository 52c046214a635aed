"""The documentation's reference pages, generated from the code.

A page under ``docs/`` holds a marker ``<!-- generated: NAME -->`` on a line
of its own (after a note for readers of the bare Markdown, which goes too);
:func:`expand` replaces it with the Markdown of :data:`GENERATORS` ``[NAME]``
when MkDocs builds the site (the hook ``devtools/docs_hooks.py``), so the
reference cannot drift from the code:

- ``settings``: every row of :data:`crawler.config.SETTINGS` (name, default,
  allowed values, meaning);
- ``commands``: the ``--help`` of every command of the project
  (``crawler/commands/``), and of each subcommand a command lists in a
  module-level ``SUBCOMMANDS`` tuple, as ``scrapy`` prints it;
- ``metrics``: every metric family :class:`crawler.metrics.StatusCollector`
  yields (name, type, labels, help);
- ``redis-keys``: the key tables of :mod:`crawler.keys` and
  :mod:`crawler.frontier.store`, and the shard key list of
  :mod:`crawler.frontier.protocol`.

``python -m devtools.docs_reference NAME`` prints one of them.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.settings import default_settings

import crawler.commands
import crawler.keys
from crawler.config import SCRAPYS, SETTINGS
from crawler.frontier import protocol, store
from crawler.metrics import StatusCollector
from crawler.status import ClusterStatus

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["GENERATORS", "MARKER", "expand", "main"]

PROJECT_DIR = Path(__file__).resolve().parent.parent

#: A marker line, ``<!-- generated: NAME -->``, with the note for readers
#: of the bare Markdown (on GitHub) that may stand in the line before it
#: (``*Generated from the code ...*``): both are replaced.
MARKER = re.compile(r"^(?:\*Generated from the code[^\n]*\*\n\n)?<!-- generated: ([a-z-]+) -->$",
                    re.MULTILINE)

#: Seconds the ``--help`` runs may take together.
HELP_TIMEOUT = 120


def _cell(text: str) -> str:
    """``text`` made safe for one Markdown table cell: one line, ``|``
    escaped, ``<`` and ``>`` outside code spans written as entities."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(part if n % 2 else part.replace("<", "&lt;").replace(">", "&gt;")
                    for n, part in enumerate(parts))


def _code(value: str) -> str:
    """``value`` in backticks, safe in a table cell."""
    return f"`{value}`".replace("|", "\\|")


def settings_table() -> str:
    """Every setting of :data:`crawler.config.SETTINGS`, in its order."""
    rows = ["| setting | default | values | meaning |", "|---|---|---|---|"]
    for name, setting in SETTINGS.items():
        if setting.default is SCRAPYS:
            if hasattr(default_settings, name):
                default = f"Scrapy's: {_code(repr(getattr(default_settings, name)))}"
            else:
                default = "Scrapy's or scrapy-redis's"
        else:
            default = _code(repr(setting.default))
        rows.append(f"| `{name}` | {default} | {_cell(setting.kind.allowed)} | "
                    f"{_cell(setting.meaning)} |")
    return "\n".join(rows) + "\n"


def _command_names() -> list[tuple[str, tuple[str, ...]]]:
    """Each command module of ``crawler/commands/`` with its subcommands
    (its ``SUBCOMMANDS`` tuple; none when it has none)."""
    found = []
    for info in sorted(pkgutil.iter_modules(crawler.commands.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"crawler.commands.{info.name}")
        if hasattr(module, "Command"):
            found.append((info.name, tuple(getattr(module, "SUBCOMMANDS", ()))))
    return found


#: Run in one Python process: each argv's ``scrapy ... --help`` output.
_HELP_DRIVER = """
import contextlib, io, json, sys
from scrapy.cmdline import execute
out = {}
for argv in json.loads(sys.argv[1]):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        try:
            execute(["scrapy", *argv])
        except SystemExit:
            pass
    out[" ".join(argv)] = buffer.getvalue()
print(json.dumps(out))
"""


def command_help() -> dict[str, str]:
    """``"seed --help"``-style argv -> what ``scrapy`` prints for it, run in
    the project directory (one child process for all of them)."""
    argvs = []
    for name, subcommands in _command_names():
        argvs.append([name, "--help"])
        argvs.extend([name, sub, "--help"] for sub in subcommands)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "MONGO_URI")}
    env["COLUMNS"] = "80"
    done = subprocess.run(
        [sys.executable, "-c", _HELP_DRIVER, json.dumps(argvs)], cwd=PROJECT_DIR, env=env,
        capture_output=True, text=True, timeout=HELP_TIMEOUT, check=True,
    )
    result: dict[str, str] = json.loads(done.stdout)
    return result


def commands_page() -> str:
    """A section per command and subcommand, with its ``--help``."""
    parts = []
    for argv, text in command_help().items():
        words = argv.removesuffix(" --help")
        level = "##" if " " not in words else "###"
        if not text.strip():
            raise RuntimeError(f"scrapy {argv} printed nothing")
        parts.append(f"{level} `scrapy {words}`\n\n```text\n$ scrapy {argv}\n"
                     f"{text.rstrip()}\n```\n")
    return "\n".join(parts)


def metrics_table() -> str:
    """Every metric family the exporter yields, read from a collection of
    an empty cluster (no server needed)."""
    class _Empty:
        def read(self) -> ClusterStatus:
            return ClusterStatus(time=0.0)

    collector = StatusCollector(_Empty())  # type: ignore[arg-type]
    rows = ["| metric | type | labels | help |", "|---|---|---|---|"]
    for family in collector.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels: list[str] = list(getattr(family, "_labelnames", ()))
        if family.name == "crawler_up":
            labels = ["server"]
        rows.append(f"| `{name}` | {family.type} | {', '.join(labels) or '-'} | "
                    f"{_cell(family.documentation)} |")
    return "\n".join(rows) + "\n"


def _rst_tables(doc: str) -> list[list[list[str]]]:
    """The simple reStructuredText tables of ``doc``: each a list of rows,
    a row a list of cells (continuation lines joined)."""
    tables: list[list[list[str]]] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        if re.fullmatch(r"\s*=+( +=+)+\s*", lines[i]):
            rule = lines[i]
            spans = [(m.start(), m.end()) for m in re.finditer(r"=+", rule)]
            rows: list[list[str]] = []
            rules = 1
            i += 1
            while i < len(lines) and rules < 3:
                line = lines[i]
                if line.strip() == rule.strip():
                    rules += 1
                elif line.strip():
                    cells = []
                    for n, (start, _) in enumerate(spans):
                        stop = spans[n + 1][0] if n + 1 < len(spans) else len(line)
                        cells.append(line[start:stop].strip())
                    if cells[0] or not rows:
                        rows.append(cells)
                    else:  # a continuation line
                        rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells,
                                                                       strict=True)]
                i += 1
            tables.append(rows)
        else:
            i += 1
    return tables


def _rst_inline(text: str) -> str:
    """reStructuredText inline markup made Markdown: ``x`` -> `x`, roles
    such as :mod:`x` -> `x`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _markdown_table(rows: list[list[str]]) -> str:
    head, *body = rows
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(_rst_inline(c)) for c in row) + " |"
            for row in body]
    return "\n".join(out) + "\n"


def _raw_docstring(path: Path) -> str:
    """A module's docstring as written in its source (``\\t`` stays two
    characters), so the table's columns keep their places."""
    return path.read_text(encoding="utf-8").split('"""')[1].replace("\\\\", "\\")


def redis_keys_page() -> str:
    """The key tables of :mod:`crawler.keys` and :mod:`crawler.frontier.store`,
    and the shard keys every shard script is given, in their order."""
    parts = []
    for title, module in (("Every crawl's keys (`crawler/keys.py`)", crawler.keys),
                          ("The frontier's keys (`crawler/frontier/store.py`)", store)):
        tables = _rst_tables(_raw_docstring(Path(module.__file__ or "")))
        if not tables:
            raise RuntimeError(f"no key table in {module.__name__}'s docstring")
        parts.append(f"### {title}\n\n" + "\n".join(_markdown_table(t) for t in tables))
    keys = ", ".join(f"`{name}` (`{{s}}:{suffix}`)" for name, suffix in protocol.SHARD_KEYS)
    parts.append(
        "### The keys of a shard script's call (`crawler/frontier/protocol.py`)\n\n"
        f"In this order, under the shard's prefix `{{s}}:` (protocol version "
        f"{protocol.VERSION}): {keys}, then "
        + ", ".join(f"`{k}`" for k in protocol.EXTRA_KEYS)
        + " (the holder's commit marker, `{s}:sent:<holder>`).\n"
    )
    return "\n".join(parts)


#: Marker name -> the function that writes its Markdown.
GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "commands": commands_page,
    "metrics": metrics_table,
    "redis-keys": redis_keys_page,
}


def expand(markdown: str, cache: dict[str, str] | None = None) -> str:
    """``markdown`` with each marker replaced by its generated text
    (``cache``: name -> text, filled as they are made). ``KeyError`` names
    an unknown marker."""
    cache = {} if cache is None else cache

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in cache:
            cache[name] = GENERATORS[name]()
        return cache[name].rstrip("\n")

    return MARKER.sub(one, markdown)


def main(argv: list[str] | None = None) -> int:
    """Print the generated text of each NAME given (every one without)."""
    names = (sys.argv[1:] if argv is None else argv) or list(GENERATORS)
    for name in names:
        print(GENERATORS[name]())
    return 0


if __name__ == "__main__":
    sys.exit(main())

