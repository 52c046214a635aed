"""The WARC archive (crawler.warc): real workers over the quotes capture,
their WARC files read back with warcio and replayed by devtools.replay."""

from __future__ import annotations

import gzip
import logging
import os
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from scrapy import Spider
from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from warcio.archiveiterator import ArchiveIterator

from crawler.warc import WarcWriterMiddleware
from devtools.replay import Page, ReplayServer, default_warc_path, load_warc, load_warcs
from tests.waiting import wait_for
from tests.workers import assert_quotes_crawled, crawl, start_worker, wait_workers

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from tests.conftest import SiteFactory


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a WARC file, digests checked (warcio raises on a
    mismatch, that is on a record cut short): type, headers, payload."""
    out = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh, check_digests="raise"):
            raw = record.raw_stream.read()
            out.append({
                "type": record.rec_type,
                "warc": dict(record.rec_headers.headers),
                "http": record.http_headers,
                "raw": raw,
            })
    return out


def warc_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if ".warc" in p.name)


def path_of(uri: str) -> str:
    parts = urlsplit(uri)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def items(db: Any) -> tuple[set[Any], set[Any]]:
    quotes = {(d["text"], d["author"], tuple(sorted(d["tags"]))) for d in db.quotes.find()}
    authors = {(d["name"], d["birth_date"], d["birth_place"]) for d in db.authors.find()}
    return quotes, authors


def test_warc_writer_is_off_without_warc_dir_and_says_so_only_in_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Off by default: NotConfigured without a reason, so that Scrapy logs no
    ``Disabled ...: WARC_DIR is not set`` WARNING on every start."""
    caplog.set_level(logging.DEBUG, logger="crawler.warc")
    crawler = get_crawler(Spider, {"WARC_DIR": ""})
    with pytest.raises(NotConfigured) as off:
        build_from_crawler(WarcWriterMiddleware, crawler)
    assert off.value.args == ()
    assert [r.levelname for r in caplog.records if "WARC_DIR" in r.getMessage()] == ["DEBUG"]


@pytest.mark.workers
def test_every_fetched_url_is_archived_in_rotated_files_that_replay_the_crawl(
    env: dict[str, str], db: Any, rds: redis.Redis, replay_server: ReplayServer, tmp_path: Path
) -> None:
    replay_server.clear_hits()
    rds.lpush("quotes:start_urls", replay_server.url_for("/"))
    warc_dir = tmp_path / "warc"

    workers = crawl("quotes", env, tmp_path, workers=2,
                    settings={"WARC_DIR": warc_dir, "WARC_MAX_SIZE": 100_000})

    assert_quotes_crawled(workers, db, replay_server)
    files = warc_files(warc_dir)
    assert all(f.name.endswith(".warc.gz") for f in files), files  # all closed
    records = {f: read_records(f) for f in files}
    # Rotation: several files, each opening with the warcinfo naming its crawl.
    assert len(files) >= 4
    for f, recs in records.items():
        assert [r["type"] for r in recs[:1]] == ["warcinfo"]
        assert recs[0]["warc"]["WARC-Filename"] == f.name
        info = recs[0]["raw"].decode()
        assert "spider: quotes\r\n" in info and "worker: " in info and "warcio/" in info
        assert f.name.startswith("quotes-") and f.stat().st_size < 100_000 + 30_000
    every = [r for recs in records.values() for r in recs]
    responses = [r for r in every if r["type"] == "response"]
    requests = {r["warc"]["WARC-Concurrent-To"]: r for r in every if r["type"] == "request"}
    # Every URL the site served (robots.txt too) has one response record,
    # and its request record points to it.
    fetched = Counter(h.path for h in replay_server.hits())
    assert Counter(path_of(r["warc"]["WARC-Target-URI"]) for r in responses) == fetched
    assert "/robots.txt" in fetched
    for response in responses:
        request = requests[response["warc"]["WARC-Record-ID"]]
        assert request["warc"]["WARC-Target-URI"] == response["warc"]["WARC-Target-URI"]
        method, target_and_version = request["http"].protocol, request["http"].statusline
        assert method == "GET" and target_and_version.endswith(" HTTP/1.1")
        assert response["warc"]["WARC-IP-Address"] == "127.0.0.1"
        assert response["warc"]["WARC-Payload-Digest"].startswith("sha1:")
    stats = Counter()
    for w in workers:
        stats.update({k: v for k, v in w.stats.items() if k.startswith("warc/")})
    assert stats == {"warc/records": len(every), "warc/files": len(files),
                     "warc/bytes": sum(f.stat().st_size for f in files)}
    crawled = items(db)

    # The files serve the crawl again: same items from a fresh frontier.
    rds.flushdb()
    db.quotes.drop()
    db.authors.drop()
    with ReplayServer(warc_dir) as again:
        rds.lpush("quotes:start_urls", again.url_for("/"))
        workers = crawl("quotes", env, tmp_path, workers=2)
        assert_quotes_crawled(workers, db, again)
    assert items(db) == crawled


@pytest.mark.workers
def test_sigterm_closes_the_files_and_sigkill_leaves_them_readable(
    env: dict[str, str], rds: redis.Redis, tmp_path: Path
) -> None:
    warc_dir = tmp_path / "warc"
    with ReplayServer(default_warc_path(), latency=0.05) as site:
        rds.lpush("quotes:start_urls", site.url_for("/"))
        logs = [tmp_path / "term.log", tmp_path / "kill.log"]
        procs = [
            start_worker("quotes", env, log, {
                "WARC_DIR": warc_dir, "FRONTIER_WORKER_ID": name,
                "MAX_IDLE_TIME_BEFORE_CLOSE": 2})
            for name, log in zip(["w-term", "w-kill"], logs, strict=True)
        ]

        def open_file(name: str) -> Path | None:
            found = [p for p in warc_dir.glob(f"quotes-{name}-*.open")
                     if p.stat().st_size > 30_000] if warc_dir.is_dir() else []
            return found[0] if found else None

        wait_for(lambda: open_file("w-term") and open_file("w-kill"), 60,
                 "both workers writing their WARC files")
        procs[1].send_signal(signal.SIGKILL)
        procs[0].send_signal(signal.SIGTERM)
        term, kill = wait_workers(procs, logs, timeout=30)

    assert term.returncode == 0, term.log[-2000:]
    assert "'finish_reason': 'shutdown'" in term.log  # stopped mid-crawl
    assert kill.returncode == -signal.SIGKILL
    # SIGTERM: the files are closed (renamed), whole, warcinfo first.
    closed = list(warc_dir.glob("quotes-w-term-*"))
    assert closed and all(p.name.endswith(".warc.gz") for p in closed)
    for path in closed:
        recs = read_records(path)
        assert recs[0]["type"] == "warcinfo" and len(recs) % 2 == 1  # + request/response pairs
    assert "WARC file" in term.log and "closed" in term.log
    # SIGKILL: the file stays .open and reads to its last record, each whole.
    [left] = warc_dir.glob("quotes-w-kill-*")
    assert left.name.endswith(".warc.gz.open")
    recs = read_records(left)
    assert len(recs) >= 3 and recs[0]["type"] == "warcinfo" and len(recs) % 2 == 1
    served = load_warcs(warc_dir)
    assert len(served) == len({path_of(r["warc"]["WARC-Target-URI"])
                               for p in [left, *closed] for r in read_records(p)
                               if r["type"] == "response"})
    # A record torn by a kill in the middle of its write: readers stop
    # before it (warcio with digests checked; the replay with a warning).
    whole = left.read_bytes()
    torn = tmp_path / "torn.warc.gz.open"
    torn.write_bytes(whole + whole[-len(whole) // 4:][:2000])
    assert len(load_warc(torn)) == len(load_warc(left))
    torn.write_bytes(whole + gzip.compress(b"WARC/1.1\r\nWARC-Type: response\r\n")[:-8])
    assert len(load_warc(torn)) == len(load_warc(left))


@pytest.mark.workers
def test_bodies_are_archived_as_they_came_over_the_wire(
    env: dict[str, str], db: Any, rds: redis.Redis, site_factory: SiteFactory, tmp_path: Path
) -> None:
    html = b"<html><head><title>Packed</title></head><body>hello</body></html>"
    packed = gzip.compress(html)
    site = site_factory({"/": Page(200, [("Content-Type", "text/html"),
                                         ("Content-Encoding", "gzip")], packed)})
    rds.lpush("pages:start_urls", site.url_for("/"))

    [worker] = crawl("pages", env, tmp_path, settings={"WARC_DIR": tmp_path / "warc"})

    assert worker.returncode == 0
    assert db.pages.find_one()["title"] == "Packed"  # the spider saw it decoded
    [path] = warc_files(tmp_path / "warc")
    [response] = [r for r in read_records(path)
                  if r["type"] == "response" and r["warc"]["WARC-Target-URI"].endswith("/")]
    assert response["http"].get_header("Content-Encoding") == "gzip"
    assert response["http"].get_header("Content-Length") == str(len(packed))
    assert response["raw"] == packed
    # warcio (and so the replay) decodes it.
    assert load_warc(path)["/"].body == html
    assert os.path.getsize(path) == worker.stats["warc/bytes"]
