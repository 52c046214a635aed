"""MkDocs hook (``hooks:`` in ``mkdocs.yml``): fills each page's
``<!-- generated: NAME -->`` markers with the reference generated from the
code (:mod:`devtools.docs_reference`), at every build."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: The checkout, whose ``crawler`` and ``devtools`` the generators import
#: (MkDocs restores ``sys.path`` after loading a hook: set at each call).
PROJECT_DIR = str(Path(__file__).resolve().parent.parent)

#: Marker name -> generated text, made once per ``mkdocs`` process.
_CACHE: dict[str, str] = {}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """The page's Markdown with its markers expanded."""
    if PROJECT_DIR not in sys.path:
        sys.path.insert(0, PROJECT_DIR)
    from devtools.docs_reference import expand  # noqa: PLC0415 (needs PROJECT_DIR on sys.path)

    return expand(markdown, _CACHE)
