# Generated from _async_client.py by tools/gen_sync.py: do not edit.
"""The sync client :class:`Shoal`. Made from ``_async_client.py`` by ``tools/gen_sync.py``: do not edit."""

from __future__ import annotations

import contextlib
import json as _json
import os
from typing import Any, Iterator, Iterable, List, Mapping, Sequence

import httpx

from . import _sio as _io
from ._sync_sandbox import Sandbox
from ._core import Backoff, Target, create_body, ensure_daemon, resolve_target
from ._fncall import MAX_BATCH_CALLS, FnCallArgs, FnCallResult, fncall_args
from ._errors import (
    Conflict,
    ConnectionFailed,
    ImageNotFound,
    KindNotAvailable,
    NotFound,
    Retryable,
    SandboxNotFound,
    ShoalError,
    TemplateNotFound,
    Timeout,
    error_from_response,
)
from ._types import (
    ContainerArgs,
    ImageInfo,
    ImageList,
    MicroVMArgs,
    Network,
    PoolInfo,
    SandboxInfo,
    TemplateInfo,
    VMArgs,
)

__all__ = ["Shoal"]


class Shoal:
    """A client of one Shoal daemon (``shoald``).

    The daemon is found like the ``shoal`` CLI finds it: ``daemon`` (a
    Unix socket path or ``http://HOST:PORT``), else ``$SHOAL_DAEMON``,
    else the local default socket (``~/.cache/shoal/daemon/shoald.sock``,
    under ``$SHOAL_STATE`` when set). Over TCP every request carries
    ``token`` (else ``$SHOAL_TOKEN``) as a bearer token. A local daemon
    that is not running is started on the first request (``autostart``).

    ``retries`` (default 0: off) retries requests the daemon refused
    because the host or the sandbox was full (:class:`HostFull`,
    :class:`HostMemoryLow`, :class:`SandboxBusy`), waiting what its
    ``Retry-After`` says, else an exponential backoff from ``backoff``
    seconds, at most ``max_backoff``.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        daemon: str | os.PathLike[str] | None = None,
        *,
        token: str | None = None,
        timeout: float = 300.0,
        retries: int = 0,
        backoff: float = 0.25,
        max_backoff: float = 30.0,
        autostart: bool = True,
        shoald: str | None = None,
        max_connections: int = 512,
    ) -> None:
        self.target: Target = resolve_target(daemon, token)
        self.timeout = timeout
        self.backoff = Backoff(retries=max(0, retries), base=backoff, cap=max_backoff)
        self._autostart = autostart and self.target.local
        self._shoald = shoald
        headers = {"user-agent": "shoal-python/0.1"}
        if self.target.token:
            headers["authorization"] = f"Bearer {self.target.token}"
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        transport = (
            httpx.HTTPTransport(uds=self.target.socket, limits=limits)
            if self.target.socket
            else httpx.HTTPTransport(limits=limits)
        )
        self._http = httpx.Client(
            base_url=self.target.url,
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0, pool=None),
        )

    # -- plumbing -----------------------------------------------------

    def close(self) -> None:
        """Closes the connections (sandboxes are left as they are)."""
        self._http.close()

    def __enter__(self) -> Shoal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Shoal({str(self.target)!r})"

    def _start_daemon(self) -> None:
        if self._autostart:
            self._autostart = False
            _io.blocking(ensure_daemon, self.target, self._shoald)

    def _request_obj(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None,
        json: Any,
        content: Any,
        timeout: float | None,
    ) -> httpx.Request:
        kw: dict[str, Any] = {}
        if params:
            kw["params"] = {k: _q(v) for k, v in params.items() if v is not None}
        if json is not None:
            kw["json"] = json
        if content is not None:
            kw["content"] = content
        if timeout is not None:
            kw["timeout"] = httpx.Timeout(timeout, connect=10.0, pool=None)
        return self._http.build_request(method, path, **kw)

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: Any = None,
        timeout: float | None = None,
        not_found: type[NotFound] = NotFound,
        stream: bool = False,
        retry: bool = True,
    ) -> httpx.Response:
        """Sends a request; an error answer raises its exception class.
        Retryable refusals are retried (when ``retries`` was given and the
        body can be sent again)."""
        self._start_daemon()
        attempt = 0
        while True:
            req = self._request_obj(
                method, path, params=params, json=json, content=content, timeout=timeout
            )
            try:
                r = self._http.send(req, stream=True)
            except httpx.TimeoutException as e:
                raise Timeout(f"{method} {path}: no answer in time ({e})") from e
            except httpx.TransportError as e:
                raise ConnectionFailed(f"cannot reach shoald at {self.target}: {e}") from e
            if r.status_code < 400:
                if not stream:
                    try:
                        r.read()
                    finally:
                        r.close()
                return r
            try:
                body = r.read()
            finally:
                r.close()
            err = error_from_response(
                r.status_code, body, r.headers.get("retry-after"), not_found=not_found
            )
            if retry and isinstance(err, Retryable) and attempt < self.backoff.retries:
                _io.sleep(self.backoff.delay(attempt, err.retry_after))
                attempt += 1
                continue
            raise err

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        r = self._send(method, path, **kw)
        if r.status_code == 204 or not r.content:
            return None
        return r.json()

    @contextlib.contextmanager
    def _stream(self, method: str, path: str, **kw: Any) -> Iterator[httpx.Response]:
        r = self._send(method, path, stream=True, **kw)
        try:
            yield r
        except httpx.TimeoutException as e:
            raise Timeout(f"{method} {path}: the answer stalled ({e})") from e
        except httpx.TransportError as e:
            raise ConnectionFailed(f"{method} {path}: the answer broke off ({e})") from e
        finally:
            r.close()

    # -- sandboxes ----------------------------------------------------

    def create(
        self,
        image: str | None = None,
        *,
        template: str | None = None,
        vcpus: int | None = None,
        memory_mib: int | None = None,
        ttl_s: float | None = None,
        idle_timeout_s: float | None = None,
        metadata: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        layers: Sequence[str] | None = None,
        upper_size_mib: int | None = None,
        upper_disk_mib: int | None = None,
        keep_running: bool = False,
        pause_at_ttl: bool = False,
        network: Network | Mapping[str, Any] | None = None,
        priority: str = "latency",
    ) -> Sandbox:
        """Creates a sandbox from an ``image`` (``tiny``, ``base``, or an
        OCI image pulled with ``shoal image pull REF``, by reference or id:
        a container sandbox with the image's env, cwd and user as exec
        defaults; its template is booted once and cached) or a
        ``template`` (from its warm pool when it has one) and returns it,
        running.

        ``ttl_s`` kills it that many seconds after creation,
        ``idle_timeout_s`` pauses it after that long without requests
        (0/None: never). ``metadata`` are labels (:meth:`list` filters on
        them), ``env`` the environment of every command. ``layers``,
        ``upper_size_mib`` and ``upper_disk_mib`` choose further read-only
        layers and the writable upper layer (with ``image``).
        ``keep_running`` never freezes it while idle. ``pause_at_ttl``
        pauses it (to disk) at its TTL instead of killing it, and clears
        the TTL (a resume gives it none until one is set). ``network``
        (a :class:`Network`) gives it a network device behind that egress
        policy; without it the sandbox has no network device at all (one
        cannot be added later; :meth:`Sandbox.set_network` changes
        the policy while it runs). :class:`NetworkUnavailable` when this
        host cannot give sandboxes networks (the message says what it
        lacks); ``allow_dns`` needs the daemon's DNS forwarder
        (``shoald --net-dns``), else :class:`BadRequest`.
        ``priority`` is its CPU class: ``"latency"`` (the default) or
        ``"best_effort"`` (its VMM runs only on CPU time latency sandboxes
        leave: every thread ``SCHED_IDLE``, a low cgroup CPU weight; for
        batch work nobody waits on). The returned sandbox's
        ``info.smt_isolation`` says whether its vCPUs are kept off SMT
        siblings running other sandboxes, and ``info.warnings`` why not.

        Raises :class:`HostFull` when the host has no room (retried when
        the client was made with ``retries``), :class:`BadRequest` for a
        shape the host cannot serve, :class:`TemplateNotFound`.
        """
        body = create_body(
            image=image,
            template=template,
            vcpus=vcpus,
            memory_mib=memory_mib,
            ttl_s=ttl_s,
            idle_timeout_s=idle_timeout_s,
            metadata=metadata,
            env=env,
            layers=layers,
            upper_size_mib=upper_size_mib,
            upper_disk_mib=upper_disk_mib,
            keep_running=keep_running,
            pause_at_ttl=pause_at_ttl,
            network=network,
            priority=priority,
        )
        v = self._json("POST", "/v1/sandboxes", json=body, not_found=TemplateNotFound)
        return Sandbox(self, SandboxInfo.from_json(v))

    def sandbox(self, image: str | None = None, **kw: Any) -> _SandboxScope:
        """:meth:`create` as a context manager that removes the sandbox on
        exit::

            with client.sandbox(image="tiny") as sb:
                sb.exec(["echo", "hi"])
        """
        return _SandboxScope(self, image, kw)

    def get(self, sandbox_id: str) -> Sandbox:
        """The sandbox ``sandbox_id`` (:class:`SandboxNotFound` if none)."""
        v = self._json("GET", f"/v1/sandboxes/{_seg(sandbox_id)}", not_found=SandboxNotFound)
        return Sandbox(self, SandboxInfo.from_json(v))

    def list(
        self,
        *,
        state: str | None = None,
        template: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> List[Sandbox]:
        """Sandboxes matching every filter given: a ``state``
        (``running``, ``paused``, ...), a ``template``, all of the
        ``metadata`` labels."""
        meta = ",".join(f"{k}:{v}" for k, v in (metadata or {}).items()) or None
        params = {"state": state, "template": template, "metadata": meta}
        vs = self._json("GET", "/v1/sandboxes", params=params)
        return [Sandbox(self, SandboxInfo.from_json(v)) for v in vs]

    # -- per-kind entry points ----------------------------------------

    def run_microvm(self, args: MicroVMArgs) -> Sandbox:
        """Starts a KVM microVM sandbox as ``args`` describes (see
        :class:`MicroVMArgs`) and, when ``args.command`` is set, runs it
        (``check=True``; the result is on ``sandbox.last_result``)."""
        sb = self.create(
            args.image,
            template=args.template,
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
        return _run_first(sb, args.command)

    def run_container(self, args: ContainerArgs) -> Sandbox:
        """Containers: not available on this daemon yet (raises
        :class:`KindNotAvailable`)."""
        raise KindNotAvailable(_unavailable("container", args))

    def run_fncall(self, args: FnCallArgs | None = None, /, **fields: Any) -> FnCallResult:
        """One function call (``POST /v1/fncall``): ``args`` (a
        :class:`FnCallArgs`) or its fields as keywords
        (``run_fncall(language="python", code="print(1)")``), run in a
        fresh clone of the language's warm template that is destroyed
        once it answers. The program's failures are in the result's
        ``status`` (never raised); :class:`BadRequest` for a call the
        daemon refuses (an unknown language, bad sizes or timeouts)."""
        call = fncall_args(args, fields)
        run = call.timeout_s if call.timeout_s is not None else 10.0
        comp = call.compile_timeout_s if call.compile_timeout_s is not None else run
        # The answer comes once the call has run: wait at least that long.
        wait = max(self.timeout, run + comp + 60.0)
        v = self._json("POST", "/v1/fncall", json=call.to_json(), timeout=wait)
        return FnCallResult.from_json(v)

    def map_fncall(
        self, calls: Iterable[FnCallArgs], *, concurrency: int | None = None
    ) -> List[FnCallResult]:
        """Many calls (``POST /v1/fncall/batch``), at most ``concurrency``
        at once (default: what the host admits); the results in the
        order of ``calls``. Each runs in its own fresh clone, as
        :meth:`run_fncall`; a call the daemon refuses is a
        ``sandbox_error`` result with the reason, the others still run."""
        bodies = [fncall_args(c, {}).to_json() for c in calls]
        out: List[FnCallResult | None] = [None] * len(bodies)
        for start in range(0, len(bodies), MAX_BATCH_CALLS):
            chunk = bodies[start : start + MAX_BATCH_CALLS]
            body: dict[str, Any] = {"calls": chunk}
            if concurrency is not None:
                body["concurrency"] = int(concurrency)
            with self._stream("POST", "/v1/fncall/batch", json=body) as r:
                for line in r.iter_lines():
                    if not line.strip():
                        continue
                    item = _json.loads(line)
                    i = int(item["index"])
                    if not 0 <= i < len(chunk):
                        raise ShoalError(f"batch answer: index {i} out of range")
                    out[start + i] = FnCallResult.from_json(item["result"])
        lost = [i for i, r in enumerate(out) if r is None]
        if lost:
            raise ShoalError(
                f"the batch answer ended without the results of {len(lost)} calls "
                f"(first: {lost[0]})",
                code="sandbox_error",
            )
        return [r for r in out if r is not None]

    def run_vm(self, args: VMArgs) -> Sandbox:
        """Starts a full VM sandbox (the ``vm`` kind: QEMU q35 with a
        display) as ``args`` describes (see :class:`VMArgs`): from its
        vm template, made first when ``args.image`` has none yet (waits
        for the boot), and runs ``args.command`` when set (``check=True``;
        the result is on ``sandbox.last_result``). With
        ``args.disk_image`` the template boots that disk (raw or qcow2,
        never written). :class:`BadRequest` when the daemon does not run
        vm sandboxes (no QEMU, ``--no-vm``) or refuses the disk (not under
        its layers directory, a backing file, not an image)."""
        name = args.template_name()
        try:
            t = self.get_template(name)
        except TemplateNotFound:
            if args.template is not None:
                raise
            try:
                t = self.create_template(
                    name,
                    "" if args.disk_image is not None else args.image,
                    vcpus=args.vcpus,
                    memory_mib=args.memory_mib,
                    kind="vm",
                    disk=args.disk_image,
                    disk_format=args.disk_format,
                    disk_kernel=args.disk_kernel,
                    disk_root=args.disk_root,
                    disk_init=args.disk_init,
                    wait=False,
                )
            except Conflict:  # made by another client meanwhile
                t = self.get_template(name)
        if t.kind != "vm":
            raise Conflict(f"template {name} is not a vm template (its kind: {t.kind})")
        if t.state != "ready":
            self.wait_template(name)
        sb = self.create(
            template=name,
            ttl_s=args.ttl_s,
            idle_timeout_s=args.idle_timeout_s,
            metadata=args.metadata,
            env=args.env,
            keep_running=args.keep_running,
        )
        return _run_first(sb, args.command)

    # -- templates and pools ------------------------------------------

    def create_template(
        self,
        name: str,
        image: str,
        *,
        vcpus: int | None = None,
        memory_mib: int | None = None,
        layers: Sequence[str] | None = None,
        upper_size_mib: int | None = None,
        upper_disk_mib: int | None = None,
        kind: str | None = None,
        disk: str | None = None,
        disk_format: str | None = None,
        disk_kernel: str | None = None,
        disk_root: str | None = None,
        disk_init: str | None = None,
        network: bool = False,
        wait: bool = True,
        timeout: float = 600.0,
    ) -> TemplateInfo:
        """Registers a template: ``image`` booted once and snapshotted (in
        the background). With ``wait`` (default) returns once it is ready
        and raises :class:`ShoalError` if its build failed. ``kind``
        ``"vm"`` makes a full VM template (QEMU q35 with a display; the
        ``tiny`` image, 256 MiB by default, no layers or upper layer
        choice); its sandboxes are created as any others'. With ``disk``
        (``kind="vm"``, ``image`` empty) it boots that raw or qcow2 file
        instead (see :class:`VMArgs` for the ``disk_*`` options). With
        ``network`` it has a network device: its sandboxes are created with
        a ``network`` policy, each on a network slot of its own."""
        body: dict[str, Any] = {"name": name}
        if image or disk is None:
            body["image"] = image
        if kind is not None:
            body["kind"] = kind
        if network:
            body["network"] = True
        for k, v in (
            ("disk", disk),
            ("disk_format", disk_format),
            ("disk_kernel", disk_kernel),
            ("disk_root", disk_root),
            ("disk_init", disk_init),
            ("vcpus", vcpus),
            ("memory_mib", memory_mib),
            ("upper_size_mib", upper_size_mib),
            ("upper_disk_mib", upper_disk_mib),
        ):
            if v is not None:
                body[k] = v
        if layers:
            body["layers"] = list(layers)
        t = TemplateInfo.from_json(self._json("POST", "/v1/templates", json=body))
        return self.wait_template(name, timeout=timeout) if wait else t

    def wait_template(self, name: str, *, timeout: float = 600.0) -> TemplateInfo:
        """Waits until the template ``name`` is built (ready or failed:
        a failure raises)."""
        loop_end = _now() + timeout
        while True:
            t = self.get_template(name)
            if t.state == "ready":
                return t
            if t.state == "failed":
                raise ShoalError(f"template {name} failed: {t.error}", code="sandbox_error")
            if _now() > loop_end:
                raise Timeout(f"template {name} still {t.state} after {timeout:.0f} s")
            _io.sleep(0.2)

    def get_template(self, name: str) -> TemplateInfo:
        """The template ``name`` (:class:`TemplateNotFound` if none)."""
        v = self._json("GET", f"/v1/templates/{_seg(name)}", not_found=TemplateNotFound)
        return TemplateInfo.from_json(v)

    def list_templates(self) -> List[TemplateInfo]:
        """Every template, by name."""
        return [TemplateInfo.from_json(v) for v in self._json("GET", "/v1/templates")]

    def delete_template(self, name: str) -> None:
        """Deletes the template ``name`` and its pool."""
        self._send("DELETE", f"/v1/templates/{_seg(name)}", not_found=TemplateNotFound)

    def set_pool(self, template: str, target: int) -> PoolInfo:
        """Keeps ``target`` sandboxes of ``template`` restored and warm
        (refilled in the background; 0 removes the pool)."""
        v = self._json(
            "PUT",
            f"/v1/pools/{_seg(template)}",
            json={"target": int(target)},
            not_found=TemplateNotFound,
        )
        return PoolInfo.from_json(v)

    def pools(self) -> List[PoolInfo]:
        """Every warm pool with its target and ready sizes."""
        return [PoolInfo.from_json(v) for v in self._json("GET", "/v1/pools")]

    def wait_pool(self, template: str, ready: int, *, timeout: float = 600.0) -> PoolInfo:
        """Waits until the pool of ``template`` has ``ready`` sandboxes."""
        end = _now() + timeout
        while True:
            for p in self.pools():
                if p.template == template and p.ready >= ready:
                    return p
            if _now() > end:
                raise Timeout(f"pool {template} not at {ready} ready after {timeout:.0f} s")
            _io.sleep(0.2)

    # -- OCI images ---------------------------------------------------

    def pull_image(
        self, ref: str, *, insecure: bool = False, timeout: float | None = None
    ) -> ImageInfo:
        """Pulls the OCI image ``ref`` into the host's store and returns
        it once stored (plain http only to a loopback registry, or with
        ``insecure``). ``timeout`` (default: the client's) bounds the
        whole pull."""
        body = {"ref": ref, "insecure": bool(insecure)}
        kw: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        v = self._json("POST", "/v1/images", json=body, not_found=ImageNotFound, **kw)
        return ImageInfo.from_json(v)

    def list_images(self) -> ImageList:
        """Every stored image, and the bytes of their layers."""
        return ImageList.from_json(self._json("GET", "/v1/images"))

    def get_image(self, ref: str) -> ImageInfo:
        """The image ``ref`` (a reference or ``sha256:`` id) names
        (:class:`ImageNotFound` if none)."""
        v = self._json("GET", f"/v1/images/{_ref_seg(ref)}", not_found=ImageNotFound)
        return ImageInfo.from_json(v)

    def remove_image(self, ref: str) -> ImageInfo:
        """Removes a reference (by id, the image) and layers no other
        image has; :class:`Conflict` while a template or sandbox of the
        image exists. Returns the image as it was."""
        v = self._json("DELETE", f"/v1/images/{_ref_seg(ref)}", not_found=ImageNotFound)
        return ImageInfo.from_json(v)

    # -- the daemon ---------------------------------------------------

    def health(self) -> bool:
        """Whether the daemon answers ``/healthz``."""
        try:
            return bool((self._json("GET", "/healthz")).get("ok"))
        except ConnectionFailed:
            return False

    def stats(self) -> dict[str, Any]:
        """Usage, limits, host memory and pools (``/v1/stats``), as JSON."""
        return dict(self._json("GET", "/v1/stats"))


class _SandboxScope:
    """``with client.sandbox(...) as sb``: creates on entry, kills on
    exit."""

    def __init__(self, client: Shoal, image: str | None, kw: dict[str, Any]) -> None:
        self._client, self._image, self._kw = client, image, kw
        self._sb: Sandbox | None = None

    def __enter__(self) -> Sandbox:
        self._sb = self._client.create(self._image, **self._kw)
        return self._sb

    def __exit__(self, *exc: object) -> None:
        if self._sb is not None:
            self._sb.kill(missing_ok=True)


def _q(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _seg(s: str) -> str:
    """A path segment (ids and names never hold ``/``; refuse one that
    does rather than reach another route)."""
    from ._errors import BadRequest

    if not s or "/" in s or s in (".", ".."):
        raise BadRequest(f"invalid id or name {s!r}")
    return httpx.URL(f"http://x/{s}").raw_path.decode("ascii")[1:]


def _ref_seg(ref: str) -> str:
    """An image reference as one path segment (its ``/`` as ``%2F``)."""
    from urllib.parse import quote

    from ._errors import BadRequest

    if not ref or len(ref) > 512:
        raise BadRequest(f"invalid image reference {ref[:64]!r}")
    return quote(ref, safe="")


def _now() -> float:
    import time

    return time.monotonic()


def _unavailable(kind: str, args: object) -> str:
    return (
        f"sandbox kind '{kind}' is not available on this daemon yet: it runs "
        f"microVMs, full VMs and function calls (use run_microvm(MicroVMArgs(...)), "
        f"run_vm(VMArgs(...)) or run_fncall(FnCallArgs(...))); got {type(args).__name__}"
    )


def _run_first(sb: Sandbox, command: list[str] | str | None) -> Sandbox:
    """Runs a kind entry point's ``command`` (if any) in its new sandbox,
    keeping the result in ``last_result``; a failure kills the sandbox and
    is raised."""
    if command is not None:
        try:
            sb.last_result = sb.exec(command, check=True)
        except BaseException:
            sb.kill()
            raise
    return sb
