"""The Ray side of a Shoal cluster: one detached ``ShoalNode`` actor per
host, and the registry its reports go to.

A ``ShoalNode`` (named ``shoal-node-<name>``, ``num_cpus=0``, pinned to
its host by the custom node resource ``shoal_node_<name>``) attaches to
that host's shoald over TCP (``url`` and ``token``), or starts one there
(``shoald --listen HOST:PORT --token-file ...`` on a state directory of
its own; it ends with the actor). Every ``period_s`` it reads the
daemon's ``/v1/stats``, ``/v1/templates`` and ``/v1/images`` and reports
capacity to the registry (``shoal-registry``, a detached actor holding
only the latest report per node). A report that stops coming, or says
the daemon does not answer, takes the node out of placement.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

import ray

from .._errors import ShoalError
from .._sync_client import Shoal
from ._report import REPORT_VERSION, capacity_from_stats, check_node_name

NAMESPACE = "shoal"
REGISTRY = "shoal-registry"


def node_actor_name(name: str) -> str:
    return f"shoal-node-{name}"


def node_resource(name: str) -> str:
    """The custom resource a host running node ``name`` declares
    (``ray start --resources '{"shoal_node_NAME": 1}'``)."""
    return f"shoal_node_{name}"


class Registry:
    """The latest report of each node, and the cluster's template and
    pool specs (made on a node on its first use there)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[float, dict[str, Any]]] = {}
        self.templates: dict[str, dict[str, Any]] = {}
        self.pools: dict[str, int] = {}

    def report(self, name: str, report: dict[str, Any]) -> None:
        self.nodes[name] = (time.time(), report)

    def leave(self, name: str, url: str) -> None:
        cur = self.nodes.get(name)
        if cur is not None and cur[1].get("url") == url:
            del self.nodes[name]

    def put_template(self, name: str, spec: dict[str, Any] | None) -> None:
        if spec is None:
            self.templates.pop(name, None)
            self.pools.pop(name, None)
        else:
            self.templates[name] = spec

    def put_pool(self, template: str, target: int) -> None:
        self.pools[template] = target

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        return {
            "nodes": {n: {"age": now - t, "report": r} for n, (t, r) in self.nodes.items()},
            "templates": dict(self.templates),
            "pools": dict(self.pools),
        }


def registry(namespace: str = NAMESPACE) -> Any:
    """The registry actor (made, detached, on first use)."""
    return (
        ray.remote(Registry)
        .options(
            name=REGISTRY,
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=64,
        )
        .remote()
    )


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ShoalNode:
    """The actor of one host (see the module's doc)."""

    def __init__(
        self,
        name: str,
        *,
        url: str | None = None,
        token: str | None = None,
        shoald: str | None = None,
        shoald_args: list[str] | None = None,
        listen_host: str | None = None,
        period_s: float = 0.5,
        namespace: str = NAMESPACE,
    ) -> None:
        self.name = check_node_name(name)
        self.period_s = max(0.05, float(period_s))
        self.namespace = namespace
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        if url is None:
            url, token = self._start(shoald, shoald_args or [], listen_host)
        self.url = url.rstrip("/")
        self.token = token
        self._client = Shoal(self.url, token=token, timeout=max(2.0, 4 * self.period_s))
        self._stop = threading.Event()
        self._seq = 0
        self._last: dict[str, Any] = {}
        self._registry = registry(namespace)
        self._poll()
        self._thread = threading.Thread(target=self._loop, name="shoal-node-report", daemon=True)
        self._thread.start()

    def _start(
        self, shoald: str | None, args: list[str], listen_host: str | None
    ) -> tuple[str, str]:
        """Starts this host's shoald, listening on TCP with a fresh token;
        it gets SIGTERM when this actor's process ends."""
        binary = shoald or shutil.which("shoald") or os.environ.get("SHOALD")
        if not binary:
            raise ShoalError("no shoald to start: give shoald= or put it on PATH")
        host = listen_host or ray.util.get_node_ip_address()
        port = _free_port(host)
        self._dir = tempfile.mkdtemp(prefix=f"shoal-node-{self.name}-")
        token = secrets.token_hex(16)
        tok = os.path.join(self._dir, "token")
        fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        log = open(os.path.join(self._dir, "shoald.log"), "ab")
        state = os.path.join(self._dir, "state")

        def die_with_parent() -> None:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

        self._proc = subprocess.Popen(
            [binary, "--state-dir", state, "--listen", f"{host}:{port}", "--token-file", tok, *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent,
        )
        log.close()
        url = f"http://{host}:{port}"
        end = time.monotonic() + 60
        with Shoal(url, token=token, timeout=2.0) as c:
            while not c.health():
                if self._proc.poll() is not None or time.monotonic() > end:
                    raise ShoalError(f"shoald of node {self.name} did not come up at {url}")
                time.sleep(0.1)
        return url, token

    def _poll(self) -> dict[str, Any]:
        """Reads the daemon and sends one report."""
        self._seq += 1
        r: dict[str, Any] = {
            "v": REPORT_VERSION,
            "node": self.name,
            "url": self.url,
            "token": self.token,
            "seq": self._seq,
            "at": time.time(),
        }
        try:
            stats = self._client.stats()
            r["capacity"] = capacity_from_stats(stats)
            r["pools"] = {
                str(p["template"]): [int(p["target"]), int(p["ready"])]
                for p in stats.get("pools") or []
            }
            r["templates"] = {
                t.name: {"memory_mib": t.memory_mib, "vcpus": t.vcpus}
                for t in self._client.list_templates()
                if t.state == "ready"
            }
            r["images"] = sorted(
                {ref for i in self._client.list_images().images for ref in [i.id, *i.refs]}
            )
            r["ok"] = True
        except Exception as e:  # noqa: BLE001 - any failure: the daemon is not usable
            r["ok"] = False
            r["error"] = f"shoald at {self.url} does not answer: {e}"
        self._last = r
        try:
            ray.get(self._registry.report.remote(self.name, r), timeout=max(2.0, self.period_s))
        except Exception:  # noqa: BLE001 - the registry went: find or make it again
            try:
                self._registry = registry(self.namespace)
            except Exception:  # noqa: BLE001
                pass
        return r

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._poll()

    def info(self) -> dict[str, Any]:
        """The latest report."""
        return dict(self._last)

    def state_dir(self) -> str | None:
        """The directory of the daemon this actor started (None: attached)."""
        return self._dir

    def stop(self) -> None:
        """Leaves the cluster (the registry forgets it) and stops the
        daemon this actor started, if any."""
        self._stop.set()
        try:
            ray.get(self._registry.leave.remote(self.name, self.url), timeout=5)
        except Exception:  # noqa: BLE001
            pass
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def start_node(
    name: str,
    *,
    url: str | None = None,
    token: str | None = None,
    shoald: str | None = None,
    shoald_args: list[str] | None = None,
    listen_host: str | None = None,
    period_s: float = 0.5,
    namespace: str = NAMESPACE,
    resource: str | None = None,
    timeout: float = 90.0,
) -> Any:
    """Starts (or finds) the detached ``ShoalNode`` actor of node ``name``
    on the Ray node that declares the resource ``shoal_node_<name>``
    (``resource`` to name another) and waits until its first report is
    in. With ``url`` (and ``token``) it attaches to that shoald; without,
    it starts one on its host (``shoald``: the binary, default ``shoald``
    on PATH; ``shoald_args``: more flags). Returns the actor handle."""
    check_node_name(name)
    if not ray.is_initialized():
        raise ShoalError("start_node: call ray.init(...) first")
    actor: Any = (
        ray.remote(ShoalNode)
        .options(
            name=node_actor_name(name),
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            resources={resource or node_resource(name): 0.001},
            max_concurrency=8,
        )
        .remote(
            name,
            url=url,
            token=token,
            shoald=shoald,
            shoald_args=shoald_args,
            listen_host=listen_host,
            period_s=period_s,
            namespace=namespace,
        )
    )
    ray.get(actor.info.remote(), timeout=timeout)
    return actor


def stop_node(name: str, *, namespace: str = NAMESPACE, timeout: float = 60.0) -> None:
    """Stops node ``name``'s actor (and the daemon it started)."""
    try:
        actor = ray.get_actor(node_actor_name(name), namespace=namespace)
    except ValueError:
        return
    try:
        ray.get(actor.stop.remote(), timeout=timeout)
    finally:
        ray.kill(actor)
