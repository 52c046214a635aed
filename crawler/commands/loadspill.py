"""``scrapy loadspill FILE...``: store items a worker spilled during an outage."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.exceptions import UsageError

from crawler.addon import EnvironmentCommand
from crawler.pipelines import load_spill

if TYPE_CHECKING:
    import argparse

__all__ = ["Command"]


class Command(EnvironmentCommand):
    """Load spill files of :class:`~crawler.pipelines.MongoPipeline` into MongoDB.

    Items are stored by their key (items without one by the ``_id`` the
    pipeline gave them), so loading twice stores nothing twice, and time
    never goes backwards: a spilled item older than its stored document
    (a later crawl stored it meanwhile) leaves that document's fields and
    ``last_seen`` as they are and only lowers its ``first_seen`` (see
    :func:`~crawler.pipelines.load_spill`). A file loaded in full is renamed
    to ``FILE.loaded``; a file that fails stays, and loading it again is
    harmless.
    """

    requires_project = True
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "FILE [FILE ...]"

    def short_desc(self) -> str:
        return "Store items spilled to JSON-lines files while MongoDB was down"

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args:
            raise UsageError("name at least one spill file")
        assert self.settings is not None
        for name in args:
            path = Path(name)
            loaded = load_spill(path, self.settings["MONGO_URI"], self.settings["MONGO_DATABASE"])
            path.rename(path.with_name(path.name + ".loaded"))
            print(
                f"{path}: stored {loaded.stored} items"
                + (
                    f"; {loaded.stale} older than what MongoDB holds (kept as stored,"
                    " first_seen lowered where earlier)"
                    if loaded.stale
                    else ""
                )
            )
