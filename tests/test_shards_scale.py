"""The sharded frontier at scale, against real Redis servers: a cluster
crawl of 200 sites in 9 shards, status and the metrics exporter of a
sharded crawl beside a million foreign keys, the dead-letter cap with
shards, and repairs of bad values met while leasing."""

from __future__ import annotations

import json
import statistics
import subprocess
import urllib.request
from typing import TYPE_CHECKING, Any, Literal

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from redis.cluster import RedisCluster
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from scrapy.utils.request import request_from_dict

from crawler import metrics
from crawler.frontier import serializer
from crawler.frontier.audit import repair_damage
from crawler.frontier.connection import get_redis
from crawler.frontier.housekeeping import Housekeeper
from crawler.frontier.protocol import Damage
from crawler.frontier.shards import FrontierShards
from crawler.frontier.store import Frontier, Lease, chunk_entries
from crawler.keys import shard_of, shard_prefixes
from crawler.status import StatusReader
from devtools.embedded import RedisServer
from tests.faultproxy import FaultProxy
from tests.test_shards import _assert_stored_once, _Sites, bytes_per_master, served_sites
from tests.test_status_noscan import (
    PYTHON,
    TOLERANCE,
    commands,
    crowd,
    timed,
)
from tests.workers import PROJECT_DIR, crawl, worker_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("stop_heartbeats")


@pytest.fixture
def many_sites() -> Iterator[_Sites]:
    with served_sites() as server:
        yield server


@pytest.mark.workers
def test_a_crawl_of_200_sites_in_9_shards_spreads_over_the_masters_of_a_cluster(
    redis_cluster_url: str, mongo_uri: str, mongo_db: str, db: Any,
    many_sites: _Sites, tmp_path: Path,
) -> None:
    n, shards = 200, 9
    rc = RedisCluster.from_url(redis_cluster_url)
    try:
        rc.lpush("pages:start_urls", *many_sites.urls(n))
        env = {**worker_env(redis_cluster_url, mongo_uri, mongo_db), "FRONTIER_REDIS_CLUSTER": "1"}
        workers = crawl("pages", env, tmp_path, workers=2, settings={"FRONTIER_SHARDS": shards})
        _assert_stored_once(db, many_sites, n, workers)
        assert all("MOVED" not in w.log and "CROSSSLOT" not in w.log for w in workers)
        assert FrontierShards.build(rc, "pages", shards).audit() == {}
        prefixes = shard_prefixes("pages", shards)
        assert sum(int(rc.get(p + "count") or 0) for p in prefixes) == 0
        assert [rc.llen(p + "dead") for p in prefixes] == [0] * shards
        assert all(rc.scard(p + "dupefilter") > 0 for p in prefixes)
        per_master = bytes_per_master(rc, "pages")
        assert max(per_master) <= 0.6 * sum(per_master), per_master
    finally:
        rc.close()


# -- status and the metrics exporter of a sharded crawl beside 1,000,000 foreign keys --------

SHARDS = 4


def fill_sharded_crawl(client: redis.Redis, beat: float) -> None:
    """A crawl of spider ``quotes`` in :data:`SHARDS` shards, with keys of
    every kind the status reads in several shards: 200 requests on 40 sites
    (one leased), two dead letters in two shards, trimmed counts in two."""
    client.lpush("quotes:start_urls", "https://s.example/")
    client.set("{quotes}:shards", SHARDS)
    shards = FrontierShards.build(client, "quotes", SHARDS)
    for i in range(200):
        site = f"s{i % 40}.example"
        assert shards.for_site(site).push(
            f'{{"u":"https://{site}/{i}"}}'.encode(), site=site, priority=i % 5,
            fingerprint=f"f{i}".encode(), dont_filter=False,
        )
    assert isinstance(shards.lease("w1#n:1"), Lease)
    used = sorted({shard_of(f"s{i}.example", SHARDS) for i in range(40)})
    assert len(used) == SHARDS
    for index in used[:2]:
        shards[index].dead_letter({"url": "https://x.example/", "reason": "r", "attempts": 3})
    prefixes = shard_prefixes("quotes", SHARDS)
    client.set(prefixes[1] + "dead:trimmed", 5)
    client.set(prefixes[3] + "dead:trimmed", 7)
    client.hset("{quotes}:stats", mapping={"response_received_count": 5})
    client.hset(
        "{quotes}:workers", "w1",
        json.dumps({"pid": 1, "host": "h", "last_heartbeat": beat, "pages": 5}),
    )


@pytest.fixture(scope="module")
def crowded() -> Iterator[tuple[str, str]]:
    """A redis-server of this module's own: db 0 the sharded crawl alone,
    db 1 the crawl and a million foreign keys. Yields the two URLs."""
    with RedisServer(appendonly=False) as srv:
        yield crowd(srv, fill_sharded_crawl)


def _scans(client: redis.Redis) -> int:
    return commands(client, "scan") + commands(client, "keys")


def _figures(result: dict[str, Any]) -> dict[str, Any]:
    result.pop("time")
    for spider in result["spiders"].values():
        for worker in spider["workers"]:
            worker.pop("age")
    return result


@pytest.mark.parametrize("configured", [SHARDS, 1])
def test_sharded_status_is_the_same_and_as_fast_beside_a_million_foreign_keys(
    crowded: tuple[str, str], configured: int
) -> None:
    """Read with the crawl's FRONTIER_SHARDS, and with the default (the
    recorded count then takes a second pipeline)."""
    clients = [redis.Redis.from_url(u) for u in crowded]
    settings = Settings({"FRONTIER_SHARDS": configured})
    readers = [
        StatusReader(c, None, "unused", ["quotes", "pages"], settings=settings) for c in clients
    ]
    try:
        before = _scans(clients[0])
        results = [_figures(r.read().as_dict()) for r in readers]
        assert results[0] == results[1]
        quotes = results[1]["spiders"]["quotes"]
        assert quotes["shards"] == SHARDS
        assert (quotes["queued"], quotes["leases"], quotes["dead_letters"]) == (199, 1, 2)
        assert quotes["dead_trimmed"] == 12
        assert quotes["seen"] == 200
        assert sum(quotes["queued_by_priority"].values()) == 199
        assert quotes["leases_by_worker"] == {"w1": 1}
        times: list[list[float]] = [[], []]
        for _ in range(7):
            for i, reader in enumerate(readers):
                times[i].append(timed(reader.read))
        alone, crowded_time = (statistics.median(t) for t in times)
        assert crowded_time - alone < TOLERANCE, (alone, crowded_time)
        assert _scans(clients[0]) == before
    finally:
        for reader in readers:
            reader.close()


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "crawler_status_read_seconds":
                continue
            if sample.name == "crawler_worker_last_heartbeat_timestamp_seconds":
                continue
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_the_metrics_exporter_of_a_sharded_crawl_is_the_same_and_as_fast_beside_a_million_keys(
    crowded: tuple[str, str],
) -> None:
    """The exporter's own scrape over HTTP: the same samples either way,
    sums over the shards, no SCAN or KEYS, the read time within 150 ms."""
    clients = [redis.Redis.from_url(u) for u in crowded]
    settings = Settings({"FRONTIER_SHARDS": SHARDS})
    readers = [
        StatusReader(c, None, "unused", ["quotes"], settings=settings) for c in clients
    ]
    servers = [metrics.serve(r, "127.0.0.1", 0) for r in readers]
    try:
        before = _scans(clients[0])
        ports = [server.server_address[1] for server, _ in servers]
        scraped = [_scrape(p) for p in ports]
        assert scraped[0] == scraped[1]
        got = scraped[1]
        quotes = (("spider", "quotes"),)
        assert got[("crawler_requests_queued", quotes)] == 199
        assert got[("crawler_requests_leased", quotes)] == 1
        assert got[("crawler_frontier_shards", quotes)] == SHARDS
        assert got[("crawler_urls_seen", quotes)] == 200
        dead = [v for (name, _), v in got.items() if name == "crawler_dead_letters"]
        assert dead == [2]
        trimmed = "crawler_dead_letters_trimmed_total"
        assert [v for (name, _), v in got.items() if name == trimmed] == [12]
        times: list[list[float]] = [[], []]
        for _ in range(7):
            for i, port in enumerate(ports):
                times[i].append(timed(lambda port=port: _scrape(port)))
        alone, crowded_time = (statistics.median(t) for t in times)
        assert crowded_time - alone < TOLERANCE, (alone, crowded_time)
        assert _scans(clients[0]) == before
    finally:
        for server, _ in servers:
            server.shutdown()
            server.server_close()
        for reader in readers:
            reader.close()


# -- the dead-letter cap with shards ---------------------------------------------------


def _frontier_status(env: dict[str, str], *extra: str) -> str:
    result = subprocess.run(
        [PYTHON, "-m", "scrapy", "frontier", "status", *extra],
        cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.workers
@pytest.mark.parametrize("mode", ["drop", "hold"])
def test_dead_letters_trimmed_in_three_shards_are_counted_once_and_shown_summed(
    redis_url: str, rds: redis.Redis, env: dict[str, str], mode: Literal["drop", "hold"]
) -> None:
    """FRONTIER_DEAD_LETTERS_MAX=7 over 3 shards (3 kept each): the reply
    of one shard's trim is lost (the run fails), more dead letters come,
    the next runs trim what is past the cap; every trimmed letter is
    counted once, and ``frontier status`` (text and JSON) shows the sum of
    the shards' counts."""
    shards = FrontierShards.build(rds, "pages", 3)
    shards.check_count()
    for index, shard in enumerate(shards):
        for i in range(10 + index):  # 10, 11, 12
            shard.dead_letter({"url": f"https://d{index}.example/{i}", "reason": "r"})
    params = {"socket_timeout": 0.5} if mode == "hold" else {}
    with FaultProxy(redis_url) as proxy:
        client = get_redis(Settings({"REDIS_URL": proxy.url, "REDIS_PARAMS": params}))
        keeper = Housekeeper(client, "pages", shards=3, dead_max=7, site_forget_after=0)
        assert keeper.dead_max_per_shard == 3
        for lua in (keeper._forget_workers, keeper._trim_dead, keeper._forget_sites):
            client.script_load(lua.source)
        trim = (PROJECT_DIR / "crawler" / "frontier" / "lua" / "trim_dead.lua").read_bytes()
        rule = proxy.lose_replies(script=trim, skip=1, mode=mode)  # the second shard's
        with pytest.raises(redis.ConnectionError if mode == "drop" else redis.TimeoutError):
            keeper.run()
        assert rule.acted == 1
        assert len(proxy.commands(script=trim)) == 3  # none sent twice
        for index, shard in enumerate(shards):  # new dead letters meanwhile
            shard.dead_letter({"url": f"https://late{index}.example/", "reason": "r"})
        assert keeper.run().dead_trimmed == 3  # one new past the cap per shard
        assert keeper.run().dead_trimmed == 0
        client.close()
    prefixes = shard_prefixes("pages", 3)
    assert [rds.llen(p + "dead") for p in prefixes] == [3, 3, 3]
    assert [rds.get(p + "dead:trimmed") for p in prefixes] == [b"8", b"9", b"10"]
    # The newest kept: the late one last.
    assert json.loads(rds.lrange(prefixes[1] + "dead", -1, -1)[0])["url"] == (
        "https://late1.example/"
    )
    status_env = {**env, "REDIS_URL": redis_url, "COLUMNS": "200"}
    answer = json.loads(_frontier_status(status_env, "--json"))["spiders"]["pages"]
    assert (answer["shards"], answer["dead_letters"], answer["dead_trimmed"]) == (3, 9, 27)
    text = _frontier_status(status_env)
    assert "(27 older ones trimmed)" in text, text


# -- a level found empty in a lease call --------------------------------------------------


@pytest.mark.parametrize("damage", ["malformed bounds, no chunk", "unreadable chunk"])
@pytest.mark.parametrize("least", [None, 5])
def test_a_level_found_empty_while_leasing_does_not_let_a_lower_priority_jump_the_line(
    rds: redis.Redis, damage: str, least: int | None
) -> None:
    """Site y is ranked in ready by its priority-9 queue, whose bounds value
    is malformed with no chunk left or whose only chunk cannot be read
    (dead-lettered). Its priority-0 request must not be leased in that
    batch before a's second priority-9 request, nor after the first lease
    of a batch told another shard has priority 5 due. (Malformed bounds are
    left as they are and reported: y is passed over until the worker's
    repair drops the queue, then y0 is leased.)"""
    frontier = Frontier(rds, "t")

    def push(site: str, priority: int, tag: str) -> None:
        assert frontier.push(
            f'{{"u":"https://{site}/{tag}"}}'.encode(), site=site, priority=priority,
            fingerprint=None, dont_filter=True,
        )

    push("a.example", 9, "a9")
    push("a.example", 9, "a9b")
    push("y.example", 9, "y9")
    push("y.example", 0, "y0")
    if damage == "unreadable chunk":
        rds.hset("{t}:qc", "y.example\t9\t0", "zz:garbage")
    else:
        rds.hset("{t}:qm", "y.example\t9", "garbage")
        rds.hdel("{t}:qc", "y.example\t9\t0")
    got = frontier.lease_many([f"w#n:{i}" for i in range(3)], least=least)
    assert isinstance(got, list)
    urls = [json.loads(lease.data)["u"] for lease in got]
    expected = ["https://a.example/a9", "https://a.example/a9b"]
    if damage != "unreadable chunk":
        assert got[0].damaged == (Damage("qm", "y.example\t9"),), got[0]
        repaired = repair_damage(frontier, got[0].damaged[0])
        assert repaired and all(x.repaired for x in repaired), repaired
        got += frontier.lease_many(["w#n:3"])  # type: ignore[operator]
        urls.append(json.loads(got[-1].data)["u"])
        expected.append("https://y.example/y0")
    elif least is None:
        expected.append("https://y.example/y0")
    assert urls == expected


# -- decoding: a request whose encoding is not ASCII-compatible -------------------------


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "cp037"])
def test_a_followed_link_of_a_page_in_an_encoding_not_ascii_compatible_keeps_its_url(
    encoding: str,
) -> None:
    """``Response.follow`` gives the page's encoding to the request, whose
    query Scrapy escapes in it: the stored URL (all ASCII, escaped) comes
    back as it was, however many times it is stored and decoded. (Scrapy's
    ``request_from_dict`` escapes it again on every decode: the URL grows
    and changes, so this is where :func:`serializer.rebuild` differs from it.)"""
    page = HtmlResponse("http://a.example/", body="<p>x</p>".encode(encoding), encoding=encoding)
    request = page.follow("/p?q=1&x='y'")
    url = request.url
    for _ in range(3):
        request = serializer.rebuild(serializer.loads(serializer.dumps(
            request.to_dict(), "a.example"), "a.example"))
        assert (request.url, request.encoding) == (url, encoding)
    slow = request_from_dict(serializer.loads(serializer.dumps(request.to_dict(), "a.example"),
                                              "a.example"))
    assert slow.url != url  # (what the fast path spares)


# -- q_repair: a malformed {s}:qm value rebuilt from the chunks ----------------------------


def _entry(i: int) -> str:
    return f"{i:03d}" + "q" * 600  # three a chunk


@pytest.mark.parametrize("site", ["a\\b", "a?b", "h[::1]:80", "a\\*"])
def test_a_queue_of_negative_and_partly_deleted_chunks_is_rebuilt_and_a_front_push_comes_first(
    queue_lib: Any, queue_repair: Any, rds: redis.Redis, site: str
) -> None:
    """Front pushes make chunks at and below 0, back pushes above; chunk 1
    is lost and the bounds value is garbage (glob characters in the site's
    name). Another queue whose name the site's is a
    prefix of is not matched."""
    for i in range(6):
        queue_lib("front", site, "0", _entry(5 - i))  # 000 first out
    for i in range(6, 12):
        queue_lib("push", site, "0", _entry(i))
    queue_lib("push", site + "x", "0", "OTHER")
    chunks = sorted(int(k.decode().rsplit("\t", 1)[1]) for k in rds.hkeys("{t}:qc")
                    if k.decode().startswith(site + "\t"))
    assert chunks[0] < 0 < chunks[-1]
    lost = chunk_entries(rds.hget("{t}:qc", f"{site}\t0\t1") or b"")
    assert lost
    rds.hdel("{t}:qc", f"{site}\t0\t1")
    rds.hset("{t}:qm", f"{site}\t0", "9 1")
    # (left as it is by the scripts, reported; the repair rebuilds it)
    assert queue_lib("pop", site, "0")[:2] == ["<nil>", "damaged"]
    assert "rebuilt from its chunks" in queue_repair("qm", f"{site}\t0")[0]
    out = queue_lib("front", site, "0", "FRONT")
    assert out[0] == "ok"
    got = queue_lib(*[a for _ in range(13) for a in ("pop", site, "0")])[:-1][0::2]
    left = [e for e in map(_entry, range(12)) if e.encode() not in lost]
    assert got == ["FRONT", *left] + ["<nil>"] * (12 - len(left))
    assert not any(k.decode().startswith(site + "\t") for k in rds.hkeys("{t}:qc"))
    assert not rds.hexists("{t}:qm", f"{site}\t0")
    assert rds.hget("{t}:qc", f"{site}x\t0\t0") == b"5:OTHER"
