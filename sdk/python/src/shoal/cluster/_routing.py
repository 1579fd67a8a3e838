"""Per-node clients and sandboxes of a cluster: the single-host
:class:`~shoal.Shoal` and :class:`~shoal.Sandbox`, with the sandbox id
``<node>.<local id>`` and a node that left turned into a clear error."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import httpx

from .._errors import ConnectionFailed, SandboxNotFound, ShoalError
from .._sync_client import Shoal
from .._sync_sandbox import Sandbox
from .._types import Forked, SandboxInfo

if TYPE_CHECKING:  # pragma: no cover
    from ._client import ShoalCluster


class NodeLost(ConnectionFailed):
    """The node is not in the cluster any more: its ``ShoalNode`` actor
    stopped reporting, or its daemon stopped answering."""

    code = "node_lost"


class SandboxLost(NodeLost, SandboxNotFound):
    """The sandbox's node left the cluster: the sandbox is gone with it
    (a node that comes back has a fresh daemon: its old sandboxes are
    not there). Also a :class:`SandboxNotFound`."""

    code = "sandbox_lost"


class NodeRoutes:
    """What a node's client (sync or async) adds to the single-host one:
    the ``<node>.`` prefix of its sandboxes' ids taken off its request
    paths, and a lost node's error naming the sandbox or the node."""

    node: str
    _prefix: str

    def __init__(self, cluster: ShoalCluster, node: str, url: str, token: str | None, **kw: Any):
        super().__init__(url, token=token, autostart=False, **kw)  # type: ignore[call-arg]
        self.cluster = cluster
        self.node = node
        self._prefix = f"/v1/sandboxes/{node}."

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.node!r}, {str(getattr(self, 'target', ''))!r})"

    def _lost(self, path: str, why: str) -> NodeLost:
        if path.startswith(self._prefix):
            sid = self.node + "." + path[len(self._prefix) :].split("/", 1)[0]
            return SandboxLost(
                f"sandbox {sid} is lost: its node {self.node} left the cluster ({why})"
            )
        return NodeLost(f"node {self.node} left the cluster ({why})")

    def _local(self, path: str) -> str:
        if path.startswith(self._prefix):
            return "/v1/sandboxes/" + path[len(self._prefix) :]
        return path


class NodeShoal(NodeRoutes, Shoal):
    """The single-host client of one node of a cluster. Requests for the
    sandbox ``<node>.<id>`` go to ``/v1/sandboxes/<id>`` of this node's
    daemon; a node that left raises :class:`SandboxLost` /
    :class:`NodeLost` at once; a failed connection to a daemon that no
    longer answers ``/healthz`` raises them too and takes the node out of
    this client's placement until a later report says it answers."""

    def _dead(self) -> bool:
        """Whether the daemon is gone (after a failed connection): a
        transient failure (a reset, a full accept queue) leaves a daemon
        that still answers ``/healthz``."""
        try:
            return self._http.get("/healthz", timeout=2.0).status_code >= 500
        except httpx.HTTPError:
            return True

    def _failed(self, path: str, e: ConnectionFailed, what: str) -> ShoalError:
        if not self._dead():
            return e
        self.cluster._suspect(self.node)
        return self._lost(path, f"its daemon {what}: {e.message}")

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        why = self.cluster._gone(self.node, self.target.url)
        if why is not None:
            raise self._lost(path, why)
        try:
            return super()._send(method, self._local(path), **kw)
        except NodeLost:
            raise
        except ConnectionFailed as e:
            raise self._failed(path, e, "does not answer") from e

    @contextlib.contextmanager
    def _stream(self, method: str, path: str, **kw: Any) -> Iterator[httpx.Response]:
        try:
            with super()._stream(method, path, **kw) as r:
                yield r
        except NodeLost:
            raise
        except ConnectionFailed as e:
            raise self._failed(path, e, "broke off") from e


class ClusterSandbox(Sandbox):
    """A sandbox of a cluster: the single-host :class:`~shoal.Sandbox`
    (every method), whose ``id`` (and ``info.id``) is ``<node>.<local
    id>``; ``node`` is its node, ``local_id`` its id on that node's
    daemon. Commands and file streams go straight to that daemon."""

    client: NodeShoal

    def __init__(self, client: NodeShoal, info: SandboxInfo) -> None:
        self.node = client.node
        local = info.id.split(".", 1)[1] if info.id.startswith(client.node + ".") else info.id
        self.local_id = local
        super().__init__(client, self._named(info))

    def _named(self, info: SandboxInfo) -> SandboxInfo:
        return dataclasses.replace(info, id=f"{self.node}.{self.local_id}")

    def __repr__(self) -> str:
        return f"ClusterSandbox(id={self.id!r}, state={self.info.state!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Passed to a Ray task or actor: rebuilt there on that process's
        # cluster client (the node's address comes from the registry).
        return (_rebuild, (self.id, self.client.cluster.namespace))

    def _update(self, v: Any) -> SandboxInfo:
        if not isinstance(v, Mapping):
            raise ShoalError(f"node {self.node}: a sandbox view is not an object: {v!r:.200}")
        self.info = self._named(SandboxInfo.from_json(v))
        return self.info

    def fork(
        self, n: int = 1, *, metadata: Mapping[str, str] | None = None, partial: bool = False
    ) -> Forked[Sandbox]:
        """As :meth:`Sandbox.fork`: the clones are on this sandbox's node."""
        from .._errors import ForkFailed

        made = super().fork(n, metadata=metadata, partial=True)
        out: Forked[Sandbox] = Forked(ClusterSandbox(self.client, s.info) for s in made)
        out.failures = made.failures
        if out.failures and not partial:
            raise ForkFailed(list(out), out.failures, n)
        return out


def _rebuild(sandbox_id: str, namespace: str) -> ClusterSandbox:
    from ._client import ShoalCluster

    return ShoalCluster.default(namespace).get(sandbox_id)
