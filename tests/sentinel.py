"""A Redis Sentinel group on loopback: a master, its replica and three
sentinels, all real ``redis-server`` processes (a sentinel is the same
binary run with ``--sentinel`` and a configuration file it rewrites).

The sentinels judge a silent master down after :data:`DOWN_AFTER_MS` and
may fail over again after :data:`FAILOVER_TIMEOUT_MS`, so that a failover
takes about four seconds in tests. Every process and temporary directory
is removed on exit (:meth:`SentinelGroup.close`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Self

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from devtools.embedded import RedisServer
from tests.waiting import wait_for

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["DOWN_AFTER_MS", "SERVICE", "SentinelGroup"]

#: The service name the sentinels monitor the master under.
SERVICE = "frontier"
#: ms without a reply after which a sentinel takes a server for down. A
#: sentinel PINGs each server once a second: three pings, so that one late
#: reply on a loaded machine does not fail a just-promoted master over again
#: (to the old master restarted empty as its replica).
DOWN_AFTER_MS = 3000
#: ms before the sentinels try a failover again (and within which a
#: replica is reconfigured).
FAILOVER_TIMEOUT_MS = 3000


class _AuthRedis(RedisServer):
    """A ``redis-server`` that may need a password (its readiness probe
    sends it); ``sentinel=True``: a sentinel, configured by ``conf``."""

    def __init__(
        self, *, password: str | None = None, conf: list[str] | None = None,
        args: list[str] | None = None,
    ) -> None:
        self.password = password
        self._conf = conf
        extra = list(args or [])
        if password:
            extra += ["--requirepass", password]
            if conf is None:
                extra += ["--masterauth", password]
        super().__init__(args=extra)

    def _prepare(self) -> None:
        if self._conf is not None:
            # (a sentinel rewrites its file: written afresh at each start)
            lines = [f"port {self.port}", f"bind {self.host}", "daemonize no",
                     "protected-mode no", f"dir {self.data_dir}",
                     f"logfile {self._log_path}", *self._conf]
            if self.password:
                lines.append(f"requirepass {self.password}")
            (self.data_dir / "sentinel.conf").write_text("\n".join(lines) + "\n")

    def _command(self) -> list[str]:
        if self._conf is None:
            return super()._command()
        return [self._binary, str(self.data_dir / "sentinel.conf"), "--sentinel"]

    def client(self) -> redis.Redis:
        """A client of this server (no retries)."""
        return redis.Redis(host=self.host, port=self.port, password=self.password,
                           socket_timeout=2.0, socket_connect_timeout=1.0,
                           retry=Retry(NoBackoff(), 0))

    def _probe(self, pid: int) -> bool:
        client = self.client()
        try:
            return int(client.info("server").get("process_id", -1)) == pid
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.BusyLoadingError):
            return False
        finally:
            client.close()


class SentinelGroup:
    """``master`` and ``replica`` (:class:`~devtools.embedded.RedisServer`
    processes) and three sentinels watching them under :data:`SERVICE`
    (quorum 2).

    :param password: ``requirepass`` of every process (and the sentinels'
        ``auth-pass``), None for none.
    """

    def __init__(self, password: str | None = None) -> None:
        self.password = password
        self.master = _AuthRedis(password=password)
        self.replica = _AuthRedis(password=password)
        self.sentinels: list[_AuthRedis] = []

    # -- life cycle ---------------------------------------------------------

    def start(self) -> None:
        """Start the master, its replica (in sync), then the sentinels, and
        wait until each sentinel knows the replica and the other two."""
        self.master.start()
        self.restart_as_replica(self.replica, self.master)
        conf = [
            f"sentinel monitor {SERVICE} {self.master.host} {self.master.port} 2",
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {SERVICE} 1",
        ]
        if self.password:
            conf.append(f"sentinel auth-pass {SERVICE} {self.password}")
        for _ in range(3):
            sentinel = _AuthRedis(password=self.password, conf=conf)
            self.sentinels.append(sentinel)
            sentinel.start()
        wait_for(self._sentinels_see_all, 15, "the sentinels to find each other")

    def close(self) -> None:
        """Stop every process and remove their directories."""
        for server in [*self.sentinels, self.replica, self.master]:
            with contextlib.suppress(Exception):
                server.close()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- addresses ----------------------------------------------------------

    def url(self, db: int = 0, *, password: str | None = None) -> str:
        """``redis+sentinel://[:password@]h:p,h:p,h:p/<SERVICE>/<db>`` (the
        group's password unless ``password`` is given)."""
        secret = self.password if password is None else password
        auth = f":{secret}@" if secret else ""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}/{db}"

    def master_address(self) -> tuple[str, int] | None:
        """The master's address as the first sentinel that answers says it."""
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            client = sentinel.client()
            try:
                found = client.sentinel_get_master_addr_by_name(SERVICE)
                if found:
                    host = found[0]
                    return host.decode() if isinstance(host, bytes) else str(host), int(found[1])
            except redis.exceptions.RedisError:
                continue
            finally:
                client.close()
        return None

    def server_at(self, address: tuple[str, int] | None) -> _AuthRedis | None:
        """``master`` or ``replica``, whichever listens at ``address``."""
        for server in (self.master, self.replica):
            if address == (server.host, server.port):
                return server
        return None

    # -- faults -------------------------------------------------------------

    def kill_master_and_wait_for_promotion(self, timeout: float = 30) -> _AuthRedis:
        """SIGKILL the master; wait until every sentinel names the replica
        as master with no failover in progress, and the replica says it is
        master. Returns the new master."""
        old = self.server_at(self.master_address())
        assert old is not None, "the sentinels name no server of the group"
        new = self.replica if old is self.master else self.master
        old.kill()

        def promoted() -> bool:
            if not self._sentinels_agree_on(new):
                return False
            client = new.client()
            try:
                return client.info("replication").get("role") == "master"
            finally:
                client.close()

        wait_for(promoted, timeout, "the sentinels to promote the replica")
        return new

    def restart_as_replica(self, server: _AuthRedis, of: _AuthRedis) -> None:
        """Start the stopped ``server`` (empty: no persistence) as a replica
        of ``of`` and wait until it is in sync."""
        args = server._args
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at : at + 3]
        args += ["--replicaof", of.host, str(of.port)]
        server.start()
        try:
            wait_for(lambda: self._in_sync(server), 15, "the restarted server to sync")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tails()}") from None

    def log_tails(self) -> str:
        """The tail of each process's log, each under a line naming it."""
        named = [("master", self.master), ("replica", self.replica)]
        named += [(f"sentinel {i}", sentinel) for i, sentinel in enumerate(self.sentinels)]
        return "\n".join(
            f"--- {name} ({server.host}:{server.port}):\n{server._log_tail()}"
            for name, server in named
        )

    def _in_sync(self, replica: _AuthRedis | None = None) -> bool:
        client = (replica or self.replica).client()
        try:
            return client.info("replication").get("master_link_status") == "up"
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()

    def _master_states(self) -> list[dict[str, Any]] | None:
        """Each running sentinel's ``SENTINEL MASTER`` reply for
        :data:`SERVICE`, or None while one of them does not answer."""
        states = []
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            client = sentinel.client()
            try:
                state = client.sentinel_master(SERVICE)
            except redis.exceptions.RedisError:
                return None
            finally:
                client.close()
            if not isinstance(state, dict):
                return None
            states.append(state)
        return states

    def _sentinels_agree_on(self, master: _AuthRedis) -> bool:
        """True when every running sentinel names ``master`` and runs no
        failover of it."""
        states = self._master_states()
        return states is not None and all(
            (state["ip"], int(state["port"])) == (master.host, master.port)
            and "failover_in_progress" not in state["flags"]
            for state in states
        )

    def _sentinels_see_all(self) -> bool:
        states = self._master_states()
        return states is not None and all(
            int(state["num-slaves"]) >= 1
            and int(state["num-other-sentinels"]) >= len(self.sentinels) - 1
            for state in states
        )

