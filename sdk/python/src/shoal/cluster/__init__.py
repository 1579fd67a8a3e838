"""Shoal across a Ray cluster (``pip install 'shoal[ray]'``).

One detached ``ShoalNode`` Ray actor per host (:func:`start_node`) starts
or attaches to that host's shoald and reports its capacity every half
second to the registry actor; :class:`ShoalCluster` has the single-host
client's API (``create``, ``get``, ``list``, ``kill``, the kinds,
templates and pools; the sandboxes it returns are
:class:`shoal.Sandbox` with every method: exec, files, fork, ...) and
places each create on the best of ``k`` live nodes sampled at random
(power-of-k choices on free slots, counting its own placements not yet
reported). A sandbox id is ``<node>.<local id>``: any client reaches the
node's daemon from the id alone, over its TCP listener with its token
(commands and file streams go straight there, not through an actor)::

    import ray
    from shoal.cluster import ShoalCluster

    ray.init(address="auto")
    cluster = ShoalCluster()
    with cluster.sandbox(template="py") as sb:   # sb.id == "host3.5f0c1a2b9e7d"
        print(sb.exec(["python3", "-c", "print(6*7)"]).text)

A node whose actor stops reporting (``stale_s``, default 3 s) or whose
daemon does not answer leaves placement; its sandboxes raise
:class:`SandboxLost` (a :class:`shoal.SandboxNotFound`); creates go to
the other nodes; a node that reports again rejoins.

:class:`AsyncShoalCluster` is its asyncio twin (the same methods,
awaited; sandboxes are :class:`AsyncClusterSandbox`, a
:class:`shoal.AsyncSandbox`).
"""

try:
    import ray  # noqa: F401
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(
        "shoal.cluster needs Ray: pip install 'shoal[ray]' (ray==2.60.0)"
    ) from e

from .._placement import Capacity, NodeLoad, Placer, free_slots, needs_pull, split_by_capacity
from ._async import AsyncClusterSandbox, AsyncNodeShoal, AsyncShoalCluster
from ._client import NodeStatus, ShoalCluster
from ._node import ShoalNode, node_actor_name, node_resource, start_node, stop_node
from ._report import split_id
from ._routing import ClusterSandbox, NodeLost, NodeShoal, SandboxLost

__all__ = [
    "AsyncClusterSandbox",
    "AsyncNodeShoal",
    "AsyncShoalCluster",
    "Capacity",
    "ClusterSandbox",
    "NodeLoad",
    "NodeLost",
    "NodeShoal",
    "NodeStatus",
    "Placer",
    "SandboxLost",
    "ShoalCluster",
    "ShoalNode",
    "free_slots",
    "needs_pull",
    "node_actor_name",
    "node_resource",
    "split_by_capacity",
    "split_id",
    "start_node",
    "stop_node",
]
