"""A real Redis Cluster for tests: :mod:`devtools.cluster` (three masters on
free loopback ports), where the benchmark can use it too."""

from __future__ import annotations

from devtools.cluster import (
    CLUSTER_READY_TIMEOUT,
    ClusterNodeServer,
    RedisClusterServers,
    free_cluster_port,
)

__all__ = ["CLUSTER_READY_TIMEOUT", "ClusterNodeServer", "RedisClusterServers",
           "free_cluster_port"]
