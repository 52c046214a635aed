"""Real Redis and MongoDB servers started as subprocesses on free ports.

Used by the test-suite and the local demo: nothing here is a mock.  A
:class:`RedisServer` runs the system ``redis-server`` binary; a
:class:`MongoServer` runs SecantusDB's MongoDB wire-protocol server
(``python -m secantus``) from the current interpreter's environment.

Both classes share one life-cycle API::

    with RedisServer(appendonly=True) as redis_srv:   # start() on enter
        client = redis.Redis.from_url(redis_srv.url)
        ...
        redis_srv.restart()      # same port, same data dir: data reloaded
        redis_srv.kill()         # SIGKILL, to test crash recovery
        redis_srv.start()
    # stop() on exit, and the temporary data dir is removed

Servers that are still running when the interpreter exits are stopped by an
:mod:`atexit` hook, so a crashed test run does not leave processes behind.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Self

import pymongo
import pymongo.errors
import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

logger = logging.getLogger(__name__)

__all__ = ["MongoServer", "RedisServer", "free_port"]

#: Interval, in seconds, between two readiness probes while a server starts.
_POLL_INTERVAL = 0.05
#: How many bytes of a server's log are quoted in a start-up error.
_LOG_TAIL_BYTES = 4000

_live_servers: set[_ServerProcess] = set()
_live_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free right now.

    The port is found by binding port 0 and closing the socket, so another
    process could take it before the caller binds it; callers that start a
    server on it detect that case (the server fails to start).

    :param host: the address to bind, e.g. ``"127.0.0.1"``.
    :returns: a port number in ``1..65535``.
    :raises OSError: if ``host`` cannot be bound.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
    """Return the last ``limit`` bytes of the text file ``path`` (or a note)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    text = data.decode("utf-8", errors="replace").strip()
    return text or f"<{path} is empty>"


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every server of this module still running when Python exits."""
    with _live_lock:
        servers = list(_live_servers)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


class _ServerProcess:
    """Common subprocess life-cycle of :class:`RedisServer` and :class:`MongoServer`.

    Subclasses provide :meth:`_command`, :meth:`_probe` and :attr:`_log_path`.
    """

    #: Human-readable name used in log and error messages.
    _name = "server"
    #: Seconds :meth:`start` waits for the server to answer.
    start_timeout = 10.0
    #: Seconds :meth:`stop` waits after SIGTERM before sending SIGKILL.
    stop_timeout = 5.0

    def __init__(
        self,
        port: int | None,
        host: str,
        data_dir: str | Path | None,
        temp_prefix: str,
    ) -> None:
        self._host = host
        self._port = port if port is not None else free_port(host)
        self._owns_dir = data_dir is None
        if data_dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=temp_prefix))
        else:
            self._dir = Path(data_dir).resolve()
            self._dir.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    # -- to be provided by subclasses -------------------------------------

    @property
    def _log_path(self) -> Path:
        raise NotImplementedError

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _probe(self, pid: int) -> bool:
        """Return True once the server with process id ``pid`` answers."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """Hook run before each process start (e.g. write a config file)."""

    def _cwd(self) -> Path:
        return self._dir

    # -- public API -------------------------------------------------------

    @property
    def host(self) -> str:
        """The address the server binds, e.g. ``"127.0.0.1"``."""
        return self._host

    @property
    def port(self) -> int:
        """The TCP port the server listens on (kept across restarts)."""
        return self._port

    @property
    def data_dir(self) -> Path:
        """The directory holding the server's data and logs."""
        return self._dir

    @property
    def pid(self) -> int | None:
        """Process id of the running server, or None when it is not running."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self.pid is not None

    def start(self) -> None:
        """Start the server and wait until it answers.

        Waits at most :attr:`start_timeout` seconds.  Does nothing if the
        server is already running.

        :raises RuntimeError: if the process exits early or does not answer
            in time; the message quotes the tail of the server's log.  The
            process is killed in that case.
        """
        if self.running:
            return
        self._reap()
        self._prepare()
        cmd = self._command()
        logger.debug("starting %s: %s", self._name, cmd)
        self._out = (self._dir / f"{self._name}.stdout").open("ab")
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=self._cwd(),
        )
        with _live_lock:
            _live_servers.add(self)
        deadline = time.monotonic() + self.start_timeout
        proc = self._proc
        while True:
            ready = self._probe(proc.pid)
            code = proc.poll()  # checked after the probe: a probe can take ~1 s
            if code is not None:
                self._reap()
                raise RuntimeError(
                    f"{self._name} on {self._host}:{self._port} exited with code {code} "
                    f"during start-up; log tail:\n{self._log_tail()}"
                )
            if ready:
                logger.info(
                    "%s ready on %s:%d (pid %d)",
                    self._name,
                    self._host,
                    self._port,
                    proc.pid,
                )
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    f"{self._name} on {self._host}:{self._port} did not answer within "
                    f"{self.start_timeout:g} s; log tail:\n{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    def stop(self) -> None:
        """Stop the server gracefully and wait until the process has exited.

        Sends SIGTERM, waits up to :attr:`stop_timeout` seconds, then sends
        SIGKILL.  Does nothing if the server is not running.  On return the
        process is gone, so its port and files are free for a new start.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "%s (pid %d) ignored SIGTERM for %g s; killing it",
                    self._name,
                    proc.pid,
                    self.stop_timeout,
                )
                proc.kill()
                proc.wait()
        self._reap()

    def kill(self) -> None:
        """Kill the server with SIGKILL (simulates a crash) and reap it.

        Unsynced data is lost, as in a real crash.  Does nothing if the
        server is not running.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._reap()

    def restart(self) -> None:
        """Stop the server and start it again on the same port and data dir.

        :raises RuntimeError: as :meth:`start`.
        """
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and remove its data dir if this object created it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()  # no __exit__ follows a failed __enter__
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {self._host}:{self._port} {state}>"

    # -- helpers ----------------------------------------------------------

    def _reap(self) -> None:
        """Forget an exited process and close its output file."""
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None
            with _live_lock:
                _live_servers.discard(self)
        if self._proc is None and self._out is not None:
            self._out.close()
            self._out = None

    def _log_tail(self) -> str:
        parts = [_tail(self._log_path)]
        stdout_path = self._dir / f"{self._name}.stdout"
        if stdout_path != self._log_path and stdout_path.is_file() and stdout_path.stat().st_size:
            parts.append(f"-- stdout/stderr --\n{_tail(stdout_path)}")
        return "\n".join(parts)


class RedisServer(_ServerProcess):
    """A real ``redis-server`` subprocess on a (free) local port.

    The binary is ``$REDIS_SERVER_BIN`` or ``redis-server`` on ``PATH``.
    RDB snapshots are off (``--save ""``); with ``appendonly=True`` every
    write goes to an append-only file fsynced every second, which
    :meth:`restart` (a graceful stop, so the AOF is flushed) reloads.

    :param port: TCP port; a free one is picked when None.
    :param host: bind address, default ``"127.0.0.1"``.
    :param appendonly: enable the AOF (persistence across restarts).
    :param data_dir: working dir for the AOF and ``redis.log``; a temporary
        dir, removed by :meth:`close` / ``__exit__``, when None.
    :param args: more ``redis-server`` options, appended to the command
        line, e.g. ``("--maxmemory", "2mb", "--maxmemory-policy",
        "allkeys-lru")``.
    :raises RuntimeError: if no ``redis-server`` binary is found.
    """

    _name = "redis"
    start_timeout = 10.0
    stop_timeout = 5.0

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        appendonly: bool = False,
        data_dir: str | Path | None = None,
        args: Sequence[str] = (),
    ) -> None:
        binary = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
        if not binary:
            raise RuntimeError(
                "redis-server binary not found: install it (`apt-get install redis-server`) "
                "or point $REDIS_SERVER_BIN at it"
            )
        self._binary = binary
        self._appendonly = appendonly
        self._args = list(args)
        super().__init__(port, host, data_dir, "crawler-redis-")

    @property
    def url(self) -> str:
        """Connection URL of database 0, e.g. ``redis://127.0.0.1:6390/0``."""
        return f"redis://{self._host}:{self._port}/0"

    @property
    def appendonly(self) -> bool:
        """True when the append-only file is enabled."""
        return self._appendonly

    @property
    def _log_path(self) -> Path:
        return self._dir / "redis.log"

    def _command(self) -> list[str]:
        return [
            self._binary,
            "--port", str(self._port),
            "--bind", self._host,
            "--save", "",
            "--appendonly", "yes" if self._appendonly else "no",
            "--appendfsync", "everysec",
            "--dir", str(self._dir),
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self._log_path),
            *self._args,
        ]  # fmt: skip

    def _probe(self, pid: int) -> bool:
        client = redis.Redis(
            host=self._host,
            port=self._port,
            socket_timeout=1.0,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            if not client.ping():
                return False
            # Another server may have taken the port: make sure it is ours.
            info = client.info("server")
            return int(info.get("process_id", -1)) == pid
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False
        except redis.exceptions.BusyLoadingError:
            return False  # still loading the AOF
        finally:
            client.close()


class MongoServer(_ServerProcess):
    """SecantusDB (a MongoDB wire-protocol server) as a subprocess on a local port.

    Runs ``python -m secantus --standalone`` with the current interpreter,
    storing its WiredTiger files in ``<data_dir>/db`` (a real directory, so
    :meth:`restart` keeps the data) and its output in
    ``<data_dir>/secantus.stdout``.  An empty ``secantusd.toml`` is passed
    with ``--config`` so no user or system config file is picked up.

    :param port: TCP port; a free one is picked when None.
    :param host: bind address, default ``"127.0.0.1"``.
    :param data_dir: base dir for the storage and log; a temporary dir,
        removed by :meth:`close` / ``__exit__``, when None.
    """

    _name = "secantus"
    start_timeout = 30.0
    # WiredTiger checkpoints on a clean shutdown: give it time before SIGKILL.
    stop_timeout = 15.0

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        data_dir: str | Path | None = None,
    ) -> None:
        super().__init__(port, host, data_dir, "crawler-mongo-")

    @property
    def uri(self) -> str:
        """Connection URI, e.g. ``mongodb://127.0.0.1:27990/?directConnection=true``."""
        return f"mongodb://{self._host}:{self._port}/?directConnection=true"

    @property
    def storage_path(self) -> Path:
        """The WiredTiger home directory (``<data_dir>/db``)."""
        return self._dir / "db"

    @property
    def _log_path(self) -> Path:
        return self._dir / f"{self._name}.stdout"

    @property
    def _config_path(self) -> Path:
        return self._dir / "secantusd.toml"

    def _prepare(self) -> None:
        self.storage_path.mkdir(parents=True, exist_ok=True)
        if not self._config_path.exists():
            self._config_path.write_text("# empty: all settings come from the command line\n")

    def _command(self) -> list[str]:
        return [
            sys.executable, "-m", "secantus",
            "--config", str(self._config_path),
            "--host", self._host,
            "--port", str(self._port),
            "--storage-path", str(self.storage_path),
            "--standalone",
            "--log-level", "WARNING",
        ]  # fmt: skip

    def _probe(self, pid: int) -> bool:
        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
            self.uri,
            serverSelectionTimeoutMS=500,
            connectTimeoutMS=500,
            socketTimeoutMS=2000,
        )
        try:
            client.admin.command("ping")
            # Another server may have taken the port: make sure it is ours.
            status = client.admin.command("serverStatus")
            server_pid = status.get("pid")
            return server_pid is None or int(str(server_pid)) == pid
        except pymongo.errors.PyMongoError:
            return False
        finally:
            client.close()
