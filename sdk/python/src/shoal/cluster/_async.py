"""``AsyncShoalCluster``: the asyncio twin of :class:`ShoalCluster`.

The registry, placement, node status and templates are those of a
:class:`ShoalCluster` it holds (its background thread reads the
registry; a Ray call is made off the event loop); requests to the nodes'
daemons go through :class:`AsyncNodeShoal` (an :class:`shoal.AsyncShoal`
per node with the same id routing and lost-node errors), and sandboxes
are :class:`AsyncClusterSandbox` (a :class:`shoal.AsyncSandbox`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any, AsyncIterator, Iterable, List, Mapping

import httpx

from .._async_client import AsyncShoal
from .._async_sandbox import AsyncSandbox
from .._errors import BadRequest, ConnectionFailed, ForkFailed, Retryable, SandboxBusy
from .._errors import KindNotAvailable, ShoalError
from .._fncall import FnCallArgs, FnCallResult, fncall_args
from .._types import ContainerArgs, Forked, MicroVMArgs, PoolInfo, SandboxInfo, TemplateInfo
from .._types import VMArgs
from .._placement import needs_pull
from ._client import _ELSEWHERE, NodeStatus, ShoalCluster, _Node
from ._report import split_id
from ._routing import NodeLost, NodeRoutes, SandboxLost

__all__ = ["AsyncClusterSandbox", "AsyncNodeShoal", "AsyncShoalCluster"]


class AsyncNodeShoal(NodeRoutes, AsyncShoal):
    """The asyncio client of one node (as :class:`NodeShoal`)."""

    async def _dead(self) -> bool:
        try:
            return (await self._http.get("/healthz", timeout=2.0)).status_code >= 500
        except httpx.HTTPError:
            return True

    async def _failed(self, path: str, e: ConnectionFailed, what: str) -> ShoalError:
        if not await self._dead():
            return e
        self.cluster._suspect(self.node)
        return self._lost(path, f"its daemon {what}: {e.message}")

    async def _gone(self) -> str | None:
        c = self.cluster
        with c._lock:
            n = c._nodes.get(self.node)
            if n is not None and n.report.url == self.target.url:
                return None
        # Not in this client's view: it may read the registry (a Ray call).
        return await asyncio.to_thread(c._gone, self.node, self.target.url)

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        why = await self._gone()
        if why is not None:
            raise self._lost(path, why)
        try:
            return await super()._send(method, self._local(path), **kw)
        except NodeLost:
            raise
        except ConnectionFailed as e:
            raise await self._failed(path, e, "does not answer") from e

    @contextlib.asynccontextmanager
    async def _stream(self, method: str, path: str, **kw: Any) -> AsyncIterator[httpx.Response]:
        try:
            async with super()._stream(method, path, **kw) as r:
                yield r
        except NodeLost:
            raise
        except ConnectionFailed as e:
            raise await self._failed(path, e, "broke off") from e


class AsyncClusterSandbox(AsyncSandbox):
    """A sandbox of a cluster (as :class:`ClusterSandbox`): ``id`` is
    ``<node>.<local id>``."""

    client: AsyncNodeShoal

    def __init__(self, client: AsyncNodeShoal, info: SandboxInfo) -> None:
        self.node = client.node
        local = info.id.split(".", 1)[1] if info.id.startswith(client.node + ".") else info.id
        self.local_id = local
        super().__init__(client, self._named(info))

    def _named(self, info: SandboxInfo) -> SandboxInfo:
        return dataclasses.replace(info, id=f"{self.node}.{self.local_id}")

    def __repr__(self) -> str:
        return f"AsyncClusterSandbox(id={self.id!r}, state={self.info.state!r})"

    def _update(self, v: Any) -> SandboxInfo:
        if not isinstance(v, Mapping):
            raise ShoalError(f"node {self.node}: a sandbox view is not an object: {v!r:.200}")
        self.info = self._named(SandboxInfo.from_json(v))
        return self.info

    async def fork(
        self, n: int = 1, *, metadata: Mapping[str, str] | None = None, partial: bool = False
    ) -> Forked[AsyncSandbox]:
        """As :meth:`AsyncSandbox.fork`: the clones are on this node."""
        made = await super().fork(n, metadata=metadata, partial=True)
        out: Forked[AsyncSandbox] = Forked(AsyncClusterSandbox(self.client, s.info) for s in made)
        out.failures = made.failures
        if out.failures and not partial:
            raise ForkFailed(list(out), out.failures, n)
        return out


class AsyncShoalCluster:
    """:class:`ShoalCluster` for asyncio: the same arguments and methods,
    awaited; sandboxes are :class:`AsyncClusterSandbox`. Use ``async
    with`` or :meth:`close`."""

    def __init__(self, address: str | None = None, **kw: Any) -> None:
        #: The synchronous client whose registry view and placement this
        #: one uses (its templates and pools calls run on a thread).
        self.sync = ShoalCluster(address, **kw)
        self._clients: dict[tuple[str, str, str | None], AsyncNodeShoal] = {}

    @property
    def placer(self) -> Any:
        return self.sync.placer

    async def close(self) -> None:
        self.sync.close()
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()

    async def __aenter__(self) -> AsyncShoalCluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _client(self, n: _Node) -> AsyncNodeShoal:
        r = n.report
        key = (r.node, r.url, r.token)
        c = self._clients.get(key)
        if c is None:
            c = AsyncNodeShoal(self.sync, r.node, r.url, r.token, **self.sync._client_kw)
            self._clients[key] = c
        return c

    async def _fresh(self) -> dict[str, _Node]:
        return await asyncio.to_thread(self.sync._fresh)

    # -- the node registry --------------------------------------------

    async def refresh(self) -> None:
        await asyncio.to_thread(self.sync.refresh)

    async def nodes(self) -> List[NodeStatus]:
        return await asyncio.to_thread(self.sync.nodes)

    async def live_nodes(self) -> List[str]:
        return await asyncio.to_thread(self.sync.live_nodes)

    async def node(self, name: str) -> AsyncNodeShoal:
        n = (await self._fresh()).get(name)
        if n is None:
            raise NodeLost(f"node {name} is not in the cluster ({self.sync._why(name)})")
        return self._client(n)

    # -- sandboxes ----------------------------------------------------

    async def create(
        self,
        image: str | None = None,
        *,
        template: str | None = None,
        node: str | None = None,
        spread: bool = False,
        pull_timeout: float = 300.0,
        **kw: Any,
    ) -> AsyncClusterSandbox:
        """As :meth:`ShoalCluster.create`."""
        if template is None and image is None:
            raise BadRequest("create: give an image or a template")
        c = self.sync
        tried: list[str] = []
        errors: list[str] = []
        t_place = time.perf_counter()
        while True:
            n, ticket = await asyncio.to_thread(
                c._choose, image, template, node, spread, kw, tried, errors
            )
            placed = False
            try:
                t_node = time.perf_counter()
                if template is not None and template not in n.report.templates:
                    await asyncio.to_thread(c._make_template, n, template)
                if needs_pull(n.report.images, image, template):
                    await asyncio.to_thread(c._pull, n, str(image), pull_timeout)
                client = self._client(n)
                sb = await client.create(image, template=template, **kw)
                t_place += time.perf_counter() - t_node
                placed = True
                return c._placed(AsyncClusterSandbox(client, sb.info), ticket, t_place)
            except _ELSEWHERE as e:
                c._refused(e, n, node, tried, errors)
            finally:
                c.placer.end(ticket, placed=placed, now=time.monotonic())

    def sandbox(self, image: str | None = None, **kw: Any) -> _Scope:
        """:meth:`create` as an async context manager that kills on exit."""
        return _Scope(self, image, kw)

    async def get(self, sandbox_id: str) -> AsyncClusterSandbox:
        """As :meth:`ShoalCluster.get`."""
        try:
            node, _ = split_id(sandbox_id)
        except ValueError as e:
            raise BadRequest(str(e)) from e
        n = (await self._fresh()).get(node)
        if n is None:
            raise SandboxLost(
                f"sandbox {sandbox_id} is lost: its node {node} is not in the cluster "
                f"({self.sync._why(node)})"
            )
        client = self._client(n)
        sb = await client.get(sandbox_id)
        return AsyncClusterSandbox(client, sb.info)

    async def _each(self, fn: Any, nodes: Iterable[_Node] | None = None) -> list[tuple[str, Any]]:
        ns = list(nodes if nodes is not None else (await self._fresh()).values())

        async def one(n: _Node) -> tuple[str, Any]:
            try:
                return n.report.node, await fn(self._client(n))
            except Exception as e:  # noqa: BLE001 - returned to the caller
                return n.report.node, e

        return list(await asyncio.gather(*(one(n) for n in ns)))

    async def list(
        self,
        *,
        state: str | None = None,
        template: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> List[AsyncClusterSandbox]:
        """As :meth:`ShoalCluster.list`."""

        async def one(c: AsyncNodeShoal) -> list[AsyncClusterSandbox]:
            got = await c.list(state=state, template=template, metadata=metadata)
            return [AsyncClusterSandbox(c, s.info) for s in got]

        out: list[AsyncClusterSandbox] = []
        for _, r in await self._each(one):
            if isinstance(r, list):
                out.extend(r)
        return out

    async def kill(self, sandbox_id: str, *, missing_ok: bool = False) -> None:
        """Kills the sandbox ``<node>.<id>``."""
        try:
            await (await self.get(sandbox_id)).kill(missing_ok=missing_ok)
        except SandboxLost:
            if not missing_ok:
                raise
        except ShoalError as e:
            if not (missing_ok and e.status == 404):
                raise

    async def run_microvm(
        self, args: MicroVMArgs, *, node: str | None = None
    ) -> AsyncClusterSandbox:
        """As :meth:`ShoalCluster.run_microvm`."""
        fields = dataclasses.asdict(args)
        command = fields.pop("command", None)
        image, template = fields.pop("image", None), fields.pop("template", None)
        sb = await self.create(image, template=template, node=node, **fields)
        if command is not None:
            try:
                sb.last_result = await sb.exec(command, check=True)
            except BaseException:
                await sb.kill(missing_ok=True)
                raise
        return sb

    async def run_container(self, args: ContainerArgs) -> AsyncClusterSandbox:
        raise KindNotAvailable(f"container sandboxes are not available yet ({args!r:.200})")

    async def run_vm(self, args: VMArgs) -> AsyncClusterSandbox:
        raise KindNotAvailable(
            f"full VMs are not available on a cluster yet, only through one host's "
            f"AsyncShoal.run_vm ({args!r:.200})"
        )

    async def run_fncall(self, args: FnCallArgs | None = None, /, **fields: Any) -> FnCallResult:
        """As :meth:`ShoalCluster.run_fncall`."""
        call = fncall_args(args, fields)
        tried: list[str] = []
        while True:
            n = await asyncio.to_thread(self.sync._any_node, tried)
            try:
                return await self._client(n).run_fncall(call)
            except (Retryable, NodeLost) as e:
                if isinstance(e, SandboxBusy):
                    raise
                tried.append(n.report.node)

    async def map_fncall(
        self, calls: Iterable[FnCallArgs], *, concurrency: int | None = None
    ) -> List[FnCallResult]:
        """As :meth:`ShoalCluster.map_fncall` (split by free slots)."""
        items = [fncall_args(c, {}) for c in calls]
        nodes, parts = await asyncio.to_thread(self.sync._split, len(items))
        batches = {n.report.node: [items[i] for i in p] for n, p in zip(nodes, parts)}
        results = await self._each(
            lambda c: c.map_fncall(batches[c.node], concurrency=concurrency), nodes
        )
        out: list[FnCallResult | None] = [None] * len(items)
        for (name, r), idx in zip(results, parts):
            if isinstance(r, BaseException):
                raise ShoalError(f"node {name}: {r}") from r
            if not isinstance(r, list) or len(r) != len(idx):
                raise ShoalError(f"node {name}: {len(idx)} calls, answers {r!r:.200}")
            for i, res in zip(idx, r):
                out[i] = res
        return [r for r in out if r is not None]

    # -- templates, pools, daemons (the sync client's, off the loop) --

    async def create_template(self, name: str, image: str, **kw: Any) -> TemplateInfo:
        return await asyncio.to_thread(self.sync.create_template, name, image, **kw)

    async def list_templates(self) -> List[TemplateInfo]:
        return await asyncio.to_thread(self.sync.list_templates)

    async def get_template(self, name: str) -> TemplateInfo:
        return await asyncio.to_thread(self.sync.get_template, name)

    async def delete_template(self, name: str) -> None:
        await asyncio.to_thread(self.sync.delete_template, name)

    async def set_pool(self, template: str, target: int) -> List[PoolInfo]:
        return await asyncio.to_thread(self.sync.set_pool, template, target)

    async def pools(self) -> dict[str, List[PoolInfo]]:
        return await asyncio.to_thread(self.sync.pools)

    async def wait_pool(self, template: str, ready: int, *, timeout: float = 600.0) -> None:
        await asyncio.to_thread(self.sync.wait_pool, template, ready, timeout=timeout)

    async def health(self) -> bool:
        return bool(await self._fresh())

    async def stats(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.stats)


class _Scope:
    def __init__(self, cluster: AsyncShoalCluster, image: str | None, kw: dict[str, Any]):
        self.cluster, self.image, self.kw = cluster, image, kw
        self.sb: AsyncClusterSandbox | None = None

    async def __aenter__(self) -> AsyncClusterSandbox:
        self.sb = await self.cluster.create(self.image, **self.kw)
        return self.sb

    async def __aexit__(self, *exc: object) -> None:
        if self.sb is not None:
            await self.sb.kill(missing_ok=True)

