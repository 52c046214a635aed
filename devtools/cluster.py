"""A real Redis Cluster on this machine: three masters on free loopback ports
(the tests' fixture and the benchmark's figure h).

Each master is a :class:`~devtools.embedded.RedisServer` started with
``--cluster-enabled yes`` in its own temporary directory; ``redis-cli
--cluster create`` then spreads the 16,384 slots over them (no replicas)::

    with RedisClusterServers() as cluster:
        client = redis.cluster.RedisCluster.from_url(cluster.url)

Processes and directories are removed on exit, also when start-up fails.
With ``appendonly=True`` every master keeps an append-only file fsynced on
every write, so a master stopped (even with SIGKILL) and started again on
its port (``cluster.nodes[i].stop()``, ``.start()``, then
:meth:`RedisClusterServers.wait_ready`) comes back with its data, its node
id and its slots.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Self

import redis

from devtools.embedded import RedisServer

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["CLUSTER_READY_TIMEOUT", "ClusterNodeServer", "RedisClusterServers",
           "free_cluster_port"]

#: Seconds to wait for ``cluster_state:ok`` on every master.
CLUSTER_READY_TIMEOUT = 20.0


def free_cluster_port(host: str = "127.0.0.1") -> int:
    """A port ``p`` with ``p`` and ``p + 10000`` (the cluster bus) free now.

    Redis refuses cluster ports above 55535, so the kernel's ephemeral
    ports (``free_port``) do not do.
    """
    for _ in range(200):
        port = random.randint(20000, 55000)  # noqa: S311 - a port, not a secret
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind((host, port))
                b.bind((host, port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class ClusterNodeServer(RedisServer):
    """A ``redis-server`` with cluster mode on (``nodes-<port>.conf`` in its dir).

    With ``appendonly=True`` its append-only file is fsynced on every write
    (``appendfsync always``): a SIGKILL loses nothing acknowledged.
    """

    _name = "redis-cluster-node"

    def _command(self) -> list[str]:
        return [
            *super()._command(),
            *(["--appendfsync", "always"] if self.appendonly else []),
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{self.port}.conf",
            "--cluster-node-timeout", "5000",
        ]  # fmt: skip


class RedisClusterServers:
    """``masters`` cluster-enabled redis-servers joined into one cluster.

    :param masters: number of masters (at least 3, Redis's minimum).
    :param host: loopback address to bind.
    :param appendonly: give every master an append-only file fsynced on
        every write (see :class:`ClusterNodeServer`), so that it can be
        stopped and started again with its data.
    :raises RuntimeError: (from :meth:`start`) ``redis-cli`` is missing, the
        cluster could not be created, or it is not ``ok`` in time.
    """

    def __init__(
        self, masters: int = 3, host: str = "127.0.0.1", appendonly: bool = False
    ) -> None:
        self.host = host
        self.nodes = [
            ClusterNodeServer(port=free_cluster_port(host), host=host, appendonly=appendonly)
            for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        """URL of the first master, e.g. ``redis://127.0.0.1:7000/0``."""
        return self.nodes[0].url

    @property
    def pids(self) -> list[int]:
        """The process ids of the running nodes (to read their CPU time)."""
        return [pid for node in self.nodes if (pid := node.pid) is not None]

    def start(self) -> None:
        """Start every node, create the cluster, wait until it serves all slots."""
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli not found: it creates the test cluster")
        for node in self.nodes:
            node.start()
        addresses = [f"{self.host}:{node.port}" for node in self.nodes]
        created = subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0",
             "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({created.returncode}):\n"
                f"{created.stdout}\n{created.stderr}"
            )
        self.wait_ready()

    def wait_ready(self) -> None:
        """Wait until every node sees the whole cluster, all slots served.

        :raises RuntimeError: a node is not ``ok`` within
            :data:`CLUSTER_READY_TIMEOUT` seconds.
        """
        for node in self.nodes:

            def ready(port: int = node.port) -> bool:
                client = redis.Redis(host=self.host, port=port, socket_timeout=2)
                try:
                    info = client.cluster("info")
                finally:
                    client.close()
                return (
                    info.get("cluster_state") == "ok"
                    and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
                    and int(info.get("cluster_slots_ok", 0)) == 16384
                )

            deadline = time.monotonic() + CLUSTER_READY_TIMEOUT
            while not ready():
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Redis Cluster node {self.host}:{node.port} not ok after "
                        f"{CLUSTER_READY_TIMEOUT:g}s"
                    )
                time.sleep(0.05)

    def flushall(self) -> None:
        """Empty every master."""
        for node in self.nodes:
            if node.running:
                client = redis.Redis(host=self.host, port=node.port)
                try:
                    client.flushall()
                finally:
                    client.close()

    def close(self) -> None:
        """Stop every node and remove its directory."""
        for node in self.nodes:
            node.close()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
