"""``ShoalCluster``: the single-host client's API over every node of a
Ray cluster (see ``shoal.cluster``)."""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, Sequence

import ray

from .._errors import (
    BadRequest,
    HostFull,
    ImageNotFound,
    InsufficientStorage,
    KindNotAvailable,
    Retryable,
    SandboxBusy,
    ShoalError,
    TemplateNotFound,
    Timeout,
)
from .._fncall import FnCallArgs, FnCallResult, fncall_args
from .._placement import NodeLoad, Placer, free_slots, needs_pull, split_by_capacity
from .._types import ContainerArgs, MicroVMArgs, PoolInfo, TemplateInfo, VMArgs
from ._node import NAMESPACE, REGISTRY, registry
from ._report import BadReport, NodeReport, parse_report, split_id
from ._routing import ClusterSandbox, NodeLost, NodeShoal, SandboxLost

__all__ = ["NodeStatus", "ShoalCluster"]

#: Refusals that send a create to another node.
_ELSEWHERE = (HostFull, InsufficientStorage, NodeLost)
@dataclass(frozen=True)
class NodeStatus:
    """A node as the registry last saw it."""

    name: str
    url: str
    live: bool
    #: Why it is out of placement (None when live).
    reason: str | None
    age_s: float
    free_slots: int
    sandboxes: int
    templates: tuple[str, ...]
    pools: Mapping[str, tuple[int, int]]


class _Node:
    def __init__(self, report: NodeReport, client: NodeShoal, sampled_at: float) -> None:
        self.report = report
        self.client = client
        self.sampled_at = sampled_at


class ShoalCluster:
    """The nodes of a Ray cluster behind the single-host client's API.

    Connects to Ray (``ray.init(address)`` unless it is already
    initialised: inside a Ray task or actor it is) and reads the nodes'
    reports from the registry actor of ``namespace``. ``k`` is the
    power-of-k placement's sample size; a node whose report is older
    than ``stale_s`` (or says its daemon does not answer) is out of
    placement. ``timeout``, ``retries``, ``backoff`` and ``max_backoff``
    are each node client's (:class:`shoal.Shoal`). ``nodes`` limits
    placement to those nodes (every node's sandboxes stay reachable).
    """

    _defaults: dict[str, ShoalCluster] = {}
    _default_lock = threading.Lock()

    def __init__(
        self,
        address: str | None = None,
        *,
        namespace: str = NAMESPACE,
        k: int = 2,
        stale_s: float = 3.0,
        refresh_s: float = 0.25,
        timeout: float = 300.0,
        retries: int = 0,
        backoff: float = 0.25,
        max_backoff: float = 30.0,
        seed: int | None = None,
        nodes: Sequence[str] | None = None,
    ) -> None:
        import random

        if not ray.is_initialized():
            ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)
        self.namespace = namespace
        self.stale_s = stale_s
        self.refresh_s = refresh_s
        self._client_kw = dict(timeout=timeout, retries=retries, backoff=backoff)
        self._client_kw["max_backoff"] = max_backoff
        self.placer = Placer(k, rng=random.Random(seed))
        self.only = frozenset(nodes) if nodes is not None else None
        self._lock = threading.Lock()
        self._fetch_lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._clients: dict[tuple[str, str], NodeShoal] = {}
        self._status: dict[str, NodeStatus] = {}
        self._suspects: dict[str, float] = {}
        self._specs: dict[str, Any] = {"templates": {}, "pools": {}}
        self._fetched = 0.0
        self._build_locks: dict[tuple[str, str], threading.Lock] = {}
        #: Seconds this client spent placing creates (everything in
        #: :meth:`create` but the node's own create and template builds),
        #: and how many creates it placed.
        self.placement_s = 0.0
        self.placements = 0
        try:
            self._registry = ray.get_actor(REGISTRY, namespace=namespace)
        except ValueError:
            self._registry = registry(namespace)
        self.refresh()
        self._stop = threading.Event()
        threading.Thread(
            target=_refresh_loop,
            args=(weakref.ref(self), self._stop, refresh_s),
            name="shoal-cluster-refresh",
            daemon=True,
        ).start()

    @classmethod
    def default(cls, namespace: str = NAMESPACE) -> ShoalCluster:
        """One shared client per process and registry namespace (what a
        sandbox passed to a Ray task is rebuilt on)."""
        with cls._default_lock:
            c = cls._defaults.get(namespace)
            if c is None:
                c = cls._defaults[namespace] = cls(namespace=namespace)
            return c

    def __reduce__(self) -> tuple[Any, ...]:
        # Passed to a Ray task or actor: a new client there, on the same
        # registry, with the same placement and client settings.
        kw = dict(self._client_kw, namespace=self.namespace, k=self.placer.k)
        kw.update(stale_s=self.stale_s, refresh_s=self.refresh_s)
        kw["nodes"] = sorted(self.only) if self.only is not None else None
        return (_remake, (kw,))

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for c in clients:
            c.close()

    def __enter__(self) -> ShoalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the node registry --------------------------------------------

    def refresh(self) -> None:
        """Reads the registry now (done every ``refresh_s`` on use)."""
        with self._fetch_lock:
            t0 = time.monotonic()
            snap: Any = ray.get(self._registry.snapshot.remote(), timeout=10)
            if not isinstance(snap, dict):
                raise ShoalError(f"the registry answered {type(snap).__name__}, not a snapshot")
            now = time.monotonic()
            nodes: dict[str, _Node] = {}
            status: dict[str, NodeStatus] = {}
            for name, entry in (snap.get("nodes") or {}).items():
                try:
                    if not isinstance(entry, dict):
                        raise BadReport(f"registry entry of {name!r} is not an object")
                    age = float(entry.get("age", 1e9)) + (now - t0)
                    rep = parse_report(name, entry.get("report"))
                except (BadReport, ValueError, TypeError) as e:
                    age = 1e9
                    status[name] = NodeStatus(name, "", False, str(e), age, 0, 0, (), {})
                    continue
                sampled_at = now - age
                reason = None
                if age > self.stale_s:
                    reason = f"no report for {age:.1f} s (its ShoalNode actor is gone)"
                elif not rep.ok:
                    reason = rep.error or "its daemon does not answer"
                elif self._suspects.get(name, -1.0) >= sampled_at:
                    # Out of placement; its sandboxes' requests still go
                    # (and fail with SandboxLost while it does not answer).
                    reason = "its daemon did not answer this client"
                free = free_slots(rep.capacity)
                status[name] = NodeStatus(
                    name, rep.url, reason is None, reason, age, free, rep.sandboxes,
                    tuple(sorted(rep.templates)), dict(rep.pools),
                )  # fmt: skip
                if reason is None or (rep.ok and age <= self.stale_s):
                    nodes[name] = _Node(rep, self._client(name, rep), sampled_at)
            with self._lock:
                for gone in set(self._nodes) - set(nodes):
                    self.placer.forget(gone)
                self._nodes = nodes
                self._status = status
                self._specs = {
                    "templates": dict(snap.get("templates") or {}),
                    "pools": dict(snap.get("pools") or {}),
                }
                self._fetched = now

    def _fresh(self) -> dict[str, _Node]:
        """The live nodes. A background thread reads the registry every
        ``refresh_s``, so a create does not wait on it; only a view older
        than 4 periods (that thread stalled) is refreshed here."""
        if time.monotonic() - self._fetched > 4 * self.refresh_s:
            self.refresh()
        with self._lock:
            return dict(self._nodes)

    def _client(self, name: str, rep: NodeReport) -> NodeShoal:
        key = (name, rep.url)
        with self._lock:
            c = self._clients.get(key)
            if c is None or c.target.token != rep.token:
                c = NodeShoal(self, name, rep.url, rep.token, **self._client_kw)
                self._clients[key] = c
            return c

    def _suspect(self, node: str) -> None:
        with self._lock:
            self._suspects[node] = time.monotonic()
            st = self._status.get(node)
            if st is not None and st.live:
                self._status[node] = dataclasses.replace(
                    st, live=False, reason="its daemon did not answer this client"
                )
            self.placer.forget(node)

    def _gone(self, node: str, url: str) -> str | None:
        """Why ``node`` (at ``url``) is out of the cluster, or None."""
        with self._lock:
            n = self._nodes.get(node)
            if n is not None and n.report.url == url:
                return None
        self._fresh()
        with self._lock:
            n = self._nodes.get(node)
            if n is not None and n.report.url == url:
                return None
            st = self._status.get(node)
        if n is not None:
            return "it came back with a new daemon, without the old one's sandboxes"
        if st is None:
            return "the registry does not know it"
        return st.reason or "it is not live"

    def nodes(self) -> List[NodeStatus]:
        """Every node the registry knows, live or not, by name."""
        self._fresh()
        with self._lock:
            return [self._status[n] for n in sorted(self._status)]

    def live_nodes(self) -> List[str]:
        """The names of the nodes in placement now."""
        self._fresh()
        with self._lock:
            return sorted(n for n, st in self._status.items() if st.live)

    def node(self, name: str) -> NodeShoal:
        """The single-host client of node ``name`` (:class:`NodeLost` if
        it is not live)."""
        n = self._fresh().get(name)
        if n is None:
            with self._lock:
                st = self._status.get(name)
            raise NodeLost(f"node {name} is not in the cluster ({st.reason if st else 'unknown'})")
        return n.client

    # -- sandboxes ----------------------------------------------------

    def create(
        self,
        image: str | None = None,
        *,
        template: str | None = None,
        node: str | None = None,
        spread: bool = False,
        pull_timeout: float = 300.0,
        **kw: Any,
    ) -> ClusterSandbox:
        """Creates a sandbox on a node placement picks and returns it,
        running; its id is ``<node>.<local id>``. Takes every argument of
        :meth:`shoal.Shoal.create`, and:

        ``node`` pins it to that node (:class:`NodeLost` if it is not
        live, its refusal raised as is); ``spread`` takes the node with
        the most free slots instead of the best of ``k``. A node that
        refuses (429/503/507) or does not answer sends the create to the
        next choice; :class:`HostFull` when no node could take it. A
        template the cluster knows (:meth:`create_template`) that a node
        lacks is made there first. An OCI ``image`` the chosen node does
        not have (placement prefers nodes that have it) is pulled there
        first, within ``pull_timeout`` seconds (:class:`Timeout`; a
        failed pull raises the daemon's error, e.g. :class:`ImageNotFound`,
        naming the node and image; a node out of disk (507) sends the
        create to the next node).
        """
        if template is None and image is None:
            raise BadRequest("create: give an image or a template")
        tried: list[str] = []
        errors: list[str] = []
        t_place = time.perf_counter()
        while True:
            n, ticket = self._choose(image, template, node, spread, kw, tried, errors)
            placed = False
            try:
                t_node = time.perf_counter()
                if template is not None and template not in n.report.templates:
                    self._make_template(n, template)
                if needs_pull(n.report.images, image, template):
                    self._pull(n, str(image), pull_timeout)
                sb = n.client.create(image, template=template, **kw)
                t_place += time.perf_counter() - t_node
                placed = True
                return self._placed(ClusterSandbox(n.client, sb.info), ticket, t_place)
            except _ELSEWHERE as e:
                self._refused(e, n, node, tried, errors)
            finally:
                self.placer.end(ticket, placed=placed, now=time.monotonic())

    # The steps of a create, shared with AsyncShoalCluster.

    def _choose(
        self,
        image: str | None,
        template: str | None,
        node: str | None,
        spread: bool,
        kw: Mapping[str, Any],
        tried: Sequence[str],
        errors: Sequence[str],
    ) -> tuple[_Node, Any]:
        """The node for the next try of a create, and its placement
        ticket (``placer.end`` it); raises when no node is left."""
        nodes = self._fresh()
        specs = self._specs["templates"]
        if node is not None and node not in nodes:
            raise NodeLost(f"node {node} is not in the cluster ({self._why(node)})")
        mem, vcpus = self._shape(nodes, template, kw)
        loads = [self._load(n) for n in nodes.values() if self._placeable(n, node)]
        name = self.placer.choose(
            loads,
            template=template,
            image=image,
            memory_mib=mem,
            vcpus=vcpus,
            node=node,
            spread=spread,
            exclude=tried,
            buildable=template is None or template in specs,
        )
        if name is None and node is not None and node not in tried:
            # Pinned: the node's own admission is the final word (this
            # client's view of it may be a report behind).
            name = node
        if name is None:
            if template is not None and not any(template in n.templates for n in loads):
                if template not in specs:
                    raise TemplateNotFound(f"no live node has the template {template}")
            detail = "; ".join(errors) or f"{len(loads)} live nodes, none with a free slot"
            raise HostFull(f"no node of the cluster could take the sandbox: {detail}")
        return nodes[name], self.placer.begin(name)

    def _placed(self, sb: Any, ticket: Any, t_place: float) -> Any:
        self.placer.end(ticket, placed=True, now=time.monotonic())
        with self._lock:
            self.placement_s += time.perf_counter() - t_place
            self.placements += 1
        return sb

    @staticmethod
    def _refused(
        e: Exception, n: _Node, pinned: str | None, tried: list[str], errors: list[str]
    ) -> None:
        """A node refused a create: re-raised when it must not go
        elsewhere, else that node is left out of the next try."""
        if isinstance(e, SandboxBusy) or pinned is not None:
            raise e
        tried.append(n.report.node)
        errors.append(f"{n.report.node}: {e}")

    def _placeable(self, n: _Node, pinned: str | None = None) -> bool:
        name = n.report.node
        if self._suspects.get(name, -1.0) >= n.sampled_at:
            return False
        return self.only is None or name in self.only or name == pinned

    def _why(self, node: str) -> str:
        with self._lock:
            st = self._status.get(node)
        return (st.reason or "live") if st else "unknown to the registry"

    @staticmethod
    def _load(n: _Node) -> NodeLoad:
        r = n.report
        return NodeLoad(
            name=r.node,
            capacity=r.capacity,
            sampled_at=n.sampled_at,
            templates=frozenset(r.templates),
            images=r.images,
            pool_ready={t: p[1] for t, p in r.pools.items()},
        )

    def _shape(self, nodes: Mapping[str, _Node], template: str | None, kw: Any) -> tuple[int, int]:
        mem, vcpus = kw.get("memory_mib"), kw.get("vcpus")
        if template is not None and (mem is None or vcpus is None):
            for n in nodes.values():
                shape = n.report.templates.get(template)
                if shape is not None:
                    mem = mem if mem is not None else shape.memory_mib
                    vcpus = vcpus if vcpus is not None else shape.vcpus
                    break
            spec = self._specs["templates"].get(template) or {}
            mem = mem if mem is not None else spec.get("memory_mib")
            vcpus = vcpus if vcpus is not None else spec.get("vcpus")
        return int(mem or 128), int(vcpus or 1)

    def _make_template(self, n: _Node, template: str) -> None:
        """Makes the cluster's template ``template`` on node ``n`` (its
        first use there), and its pool."""
        spec = self._specs["templates"].get(template)
        if spec is None:
            raise TemplateNotFound(f"node {n.report.node} has no template {template}")
        key = (n.report.node, template)
        with self._lock:
            lock = self._build_locks.setdefault(key, threading.Lock())
        with lock:
            try:
                n.client.get_template(template)
            except TemplateNotFound:
                try:
                    n.client.create_template(**spec, wait=False)
                except ShoalError as e:
                    if e.status != 409:
                        raise
            n.client.wait_template(template, timeout=self._client_kw["timeout"])
            target = self._specs["pools"].get(template)
            if target:
                n.client.set_pool(template, int(target))

    def _pull(self, n: _Node, image: str, timeout: float) -> None:
        """Pulls ``image`` on node ``n`` unless it has it (one pull per
        node and image at a time), within ``timeout`` seconds."""
        node = n.report.node
        with self._lock:
            lock = self._build_locks.setdefault((node, "image:" + image), threading.Lock())
        with lock:
            try:
                n.client.get_image(image)
                return
            except ImageNotFound:
                pass
            try:
                n.client.pull_image(image, timeout=timeout)
            except Timeout as e:
                raise Timeout(
                    f"node {node} did not pull the image {image} within {timeout:.0f} s "
                    f"(the create's pull_timeout): {e.message}"
                ) from e
            except ShoalError as e:
                if isinstance(e, _ELSEWHERE):
                    raise
                msg = f"node {node} could not pull the image {image}: {e.message}"
                try:
                    err = type(e)(msg, code=e.code, status=e.status)
                except TypeError:
                    err = ShoalError(msg, code=e.code, status=e.status)
                raise err from e

    def sandbox(self, image: str | None = None, **kw: Any) -> _Scope:
        """:meth:`create` as a context manager that kills on exit."""
        return _Scope(self, image, kw)

    def get(self, sandbox_id: str) -> ClusterSandbox:
        """The sandbox ``<node>.<id>``: :class:`SandboxLost` when its node
        left the cluster, :class:`SandboxNotFound` when its node has no
        such sandbox, :class:`BadRequest` for an id of another form."""
        try:
            node, _ = split_id(sandbox_id)
        except ValueError as e:
            raise BadRequest(str(e)) from e
        n = self._fresh().get(node)
        if n is None:
            raise SandboxLost(
                f"sandbox {sandbox_id} is lost: its node {node} is not in the cluster "
                f"({self._why(node)})"
            )
        sb = n.client.get(sandbox_id)
        return ClusterSandbox(n.client, sb.info)

    def _each(self, fn: Any, nodes: Iterable[_Node] | None = None) -> list[tuple[str, Any]]:
        """``fn(node)`` on every live node at once: (name, result or the
        exception)."""
        ns = list(nodes if nodes is not None else self._fresh().values())
        if not ns:
            return []

        def one(n: _Node) -> tuple[str, Any]:
            try:
                return n.report.node, fn(n)
            except Exception as e:  # noqa: BLE001 - returned to the caller
                return n.report.node, e

        with ThreadPoolExecutor(max_workers=min(32, len(ns))) as ex:
            return list(ex.map(one, ns))

    def list(
        self,
        *,
        state: str | None = None,
        template: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> List[ClusterSandbox]:
        """The sandboxes of every live node matching the filters (as
        :meth:`shoal.Shoal.list`). Sandboxes of nodes that left are not
        listed (they are lost); a node that fails to answer is left out."""
        out: list[ClusterSandbox] = []
        for _, r in self._each(
            lambda n: [
                ClusterSandbox(n.client, s.info)
                for s in n.client.list(state=state, template=template, metadata=metadata)
            ]
        ):
            if isinstance(r, list):
                out.extend(r)
        return out

    def kill(self, sandbox_id: str, *, missing_ok: bool = False) -> None:
        """Kills the sandbox ``<node>.<id>``."""
        try:
            self.get(sandbox_id).kill(missing_ok=missing_ok)
        except SandboxLost:
            if not missing_ok:
                raise
        except ShoalError as e:
            if not (missing_ok and e.status == 404):
                raise

    # -- per-kind entry points ----------------------------------------

    def run_microvm(self, args: MicroVMArgs, *, node: str | None = None) -> ClusterSandbox:
        """As :meth:`shoal.Shoal.run_microvm`, on a node placement picks."""
        sb = self.create(
            args.image,
            template=args.template,
            node=node,
            vcpus=args.vcpus,
            memory_mib=args.memory_mib,
            ttl_s=args.ttl_s,
            idle_timeout_s=args.idle_timeout_s,
            metadata=args.metadata,
            env=args.env,
            layers=args.layers,
            upper_size_mib=args.upper_size_mib,
            upper_disk_mib=args.upper_disk_mib,
            keep_running=args.keep_running,
            pause_at_ttl=args.pause_at_ttl,
            priority=args.priority,
        )
        if args.command is not None:
            try:
                sb.last_result = sb.exec(args.command, check=True)
            except BaseException:
                sb.kill(missing_ok=True)
                raise
        return sb

    def run_container(self, args: ContainerArgs) -> ClusterSandbox:
        """Not available (as on a single host)."""
        raise KindNotAvailable(f"container sandboxes are not available yet ({args!r:.200})")

    def run_vm(self, args: VMArgs) -> ClusterSandbox:
        """Not available on a cluster yet (a single host's
        :meth:`shoal.Shoal.run_vm` is)."""
        raise KindNotAvailable(
            f"full VMs are not available on a cluster yet, only through one host's "
            f"Shoal.run_vm ({args!r:.200})"
        )

    def _any_node(self, exclude: Sequence[str] = ()) -> _Node:
        nodes = self._fresh()
        loads = [self._load(n) for n in nodes.values() if self._placeable(n)]
        name = self.placer.choose(loads, exclude=exclude)
        if name is None:
            raise HostFull("no live node of the cluster has a free slot")
        return nodes[name]

    def run_fncall(self, args: FnCallArgs | None = None, /, **fields: Any) -> FnCallResult:
        """As :meth:`shoal.Shoal.run_fncall`, on a node placement picks
        (another one when it refuses or is gone)."""
        call = fncall_args(args, fields)
        tried: list[str] = []
        while True:
            n = self._any_node(tried)
            try:
                return n.client.run_fncall(call)
            except (Retryable, NodeLost) as e:
                if isinstance(e, SandboxBusy):
                    raise
                tried.append(n.report.node)

    def map_fncall(
        self, calls: Iterable[FnCallArgs], *, concurrency: int | None = None
    ) -> List[FnCallResult]:
        """As :meth:`shoal.Shoal.map_fncall`: the calls split over the live
        nodes by their free slots (one batch per node, at most
        ``concurrency`` at once on each); results in the order of
        ``calls``."""
        items = [fncall_args(c, {}) for c in calls]
        nodes, parts = self._split(len(items))
        out: list[FnCallResult | None] = [None] * len(items)
        results = self._each(
            lambda n: n.client.map_fncall(
                [items[i] for i in parts[nodes.index(n)]], concurrency=concurrency
            ),
            nodes,
        )
        for (name, r), idx in zip(results, parts):
            if isinstance(r, BaseException):
                raise ShoalError(f"node {name}: {r}") from r
            for i, res in zip(idx, r):
                out[i] = res
        return [r for r in out if r is not None]

    def _split(self, count: int) -> tuple[List[_Node], List[List[int]]]:
        """The live nodes and the indexes of ``count`` calls each takes:
        shares proportional to their reported free slots (evenly when
        none has one: each node's daemon queues its part)."""
        nodes = sorted(
            (n for n in self._fresh().values() if self._placeable(n)), key=lambda n: n.report.node
        )
        if not nodes:
            raise HostFull("no live node in the cluster")
        return nodes, split_by_capacity([free_slots(n.report.capacity) for n in nodes], count)

    # -- templates and pools ------------------------------------------

    def create_template(
        self, name: str, image: str, *, wait: bool = True, timeout: float = 600.0, **kw: Any
    ) -> TemplateInfo:
        """Registers the template with the cluster (a node gets it on its
        first create of it) and makes it on every live node now, in
        parallel. Arguments as :meth:`shoal.Shoal.create_template`."""
        spec = {"name": name, "image": image, **{k: v for k, v in kw.items() if v is not None}}
        ray.get(self._registry.put_template.remote(name, spec), timeout=10)
        self.refresh()
        res = self._each(lambda n: n.client.create_template(wait=wait, timeout=timeout, **spec))
        bad = [f"{n}: {r}" for n, r in res if isinstance(r, BaseException)]
        if bad:
            raise ShoalError(f"template {name} failed on {len(bad)} nodes: {'; '.join(bad)}")
        if not res:
            raise HostFull("no live node in the cluster")
        self.refresh()
        return res[0][1]

    def list_templates(self) -> List[TemplateInfo]:
        """The templates of the live nodes, by name (one each)."""
        seen: dict[str, TemplateInfo] = {}
        for _, r in self._each(lambda n: n.client.list_templates()):
            if isinstance(r, list):
                for t in r:
                    seen.setdefault(t.name, t)
        return [seen[k] for k in sorted(seen)]

    def get_template(self, name: str) -> TemplateInfo:
        for t in self.list_templates():
            if t.name == name:
                return t
        raise TemplateNotFound(f"no live node has the template {name}")

    def delete_template(self, name: str) -> None:
        """Forgets the template and deletes it on every live node."""
        ray.get(self._registry.put_template.remote(name, None), timeout=10)
        for n, r in self._each(lambda n: n.client.delete_template(name)):
            if isinstance(r, BaseException) and not isinstance(r, TemplateNotFound):
                raise ShoalError(f"node {n}: {r}") from r

    def set_pool(self, template: str, target: int) -> List[PoolInfo]:
        """Keeps ``target`` warm sandboxes of ``template`` on every node
        that has it (and on each that makes it later); the pool of each."""
        ray.get(self._registry.put_pool.remote(template, int(target)), timeout=10)
        res = self._each(lambda n: n.client.set_pool(template, target))
        # A node without the template yet gets the pool when it makes it.
        bad = [
            f"{n}: {r}"
            for n, r in res
            if isinstance(r, BaseException) and not isinstance(r, TemplateNotFound)
        ]
        if bad:
            raise ShoalError(f"pool {template}: {'; '.join(bad)}")
        return [r for _, r in res if isinstance(r, PoolInfo)]

    def pools(self) -> dict[str, List[PoolInfo]]:
        """The warm pools of each live node."""
        return {n: r for n, r in self._each(lambda n: n.client.pools()) if isinstance(r, list)}

    def wait_pool(self, template: str, ready: int, *, timeout: float = 600.0) -> None:
        """Waits until every live node with ``template`` has ``ready`` of
        it warm."""
        end = time.monotonic() + timeout
        while True:
            short = [
                n
                for n, ps in self.pools().items()
                if any(p.template == template and p.ready < ready for p in ps)
            ]
            if not short:
                return
            if time.monotonic() > end:
                raise Timeout(f"pool {template} not at {ready} on {short} after {timeout:.0f} s")
            time.sleep(0.2)

    # -- the nodes' daemons -------------------------------------------

    def health(self) -> bool:
        """Whether any node is live."""
        return bool(self._fresh())

    def stats(self) -> dict[str, Any]:
        """Each live node's ``/v1/stats``."""
        return {n: r for n, r in self._each(lambda n: n.client.stats()) if isinstance(r, dict)}


def _refresh_loop(ref: weakref.ref[ShoalCluster], stop: threading.Event, period: float) -> None:
    while not stop.wait(period):
        c = ref()
        if c is None:
            return
        try:
            # Never from a process that left Ray: a Ray call would connect
            # it again (Ray's auto-init).
            if ray.is_initialized():
                c.refresh()
        except Exception:  # noqa: BLE001 - Ray going away, a slow registry: next period
            pass
        del c


def _remake(kw: dict[str, Any]) -> ShoalCluster:
    return ShoalCluster(**kw)


class _Scope:
    def __init__(self, cluster: ShoalCluster, image: str | None, kw: dict[str, Any]) -> None:
        self.cluster, self.image, self.kw = cluster, image, kw
        self.sb: ClusterSandbox | None = None

    def __enter__(self) -> ClusterSandbox:
        self.sb = self.cluster.create(self.image, **self.kw)
        return self.sb

    def __exit__(self, *exc: object) -> None:
        if self.sb is not None:
            self.sb.kill(missing_ok=True)
