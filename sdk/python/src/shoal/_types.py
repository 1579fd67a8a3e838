"""The values the SDK hands back: plain dataclasses parsed from the API's
JSON (unknown fields are ignored, so a newer daemon does not break an
older SDK)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Literal, Mapping, TypeVar

from ._errors import ShoalError

#: States of a sandbox (``pooled`` ones are never listed).
SandboxState = Literal["pooled", "starting", "running", "pausing", "paused", "failed"]
#: States of a background command (``lost``: the daemon no longer knows
#: how it ended, e.g. the sandbox was paused to disk).
CommandState = Literal["running", "exited", "lost"]
#: Types of a guest file.
FileType = Literal["file", "dir", "symlink", "other"]


def _decode(data: str | None, encoding: str | None) -> bytes:
    if data is None:
        return b""
    if encoding == "base64":
        return base64.b64decode(data)
    return data.encode("utf-8")


@dataclass
class Network:
    """A sandbox's egress policy (``network=`` of :meth:`AsyncShoal.create`). Everything out is dropped except
    what ``allow_out`` allows and ``deny_out`` does not deny; entries are
    ``CIDR[:port[-port]]`` (``"10.1.2.0/24:443"``), ``"domain"`` or
    ``"*.domain"`` (the addresses the sandbox's own DNS lookups of it
    answer, for their TTL). ``allow_dns`` answers lookups of allowed
    names. The host, the daemon, other sandboxes and link-local
    (metadata) addresses stay unreachable unless named explicitly."""

    allow_out: list[str] = field(default_factory=list)
    deny_out: list[str] = field(default_factory=list)
    allow_dns: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "allow_out": list(self.allow_out),
            "deny_out": list(self.deny_out),
            "allow_dns": bool(self.allow_dns),
        }

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> Network:
        return cls(
            allow_out=[str(x) for x in v.get("allow_out") or []],
            deny_out=[str(x) for x in v.get("deny_out") or []],
            allow_dns=bool(v.get("allow_dns", True)),
        )


@dataclass
class SandboxInfo:
    """A sandbox as the daemon shows it (``GET /v1/sandboxes/{id}``)."""

    id: str
    template: str
    state: str
    vcpus: int
    memory_mib: int
    pid: int | None = None
    created_at: float = 0.0
    last_active: float = 0.0
    ttl_s: int = 0
    idle_timeout_s: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    keep_running: bool = False
    pause_at_ttl: bool = False
    from_pool: bool | None = None
    #: Its egress policy (None: it has no network device).
    network: Network | None = None
    #: The guest's IPv4 address (None: no network device).
    guest_addr: str | None = None
    #: CPU class: ``latency`` or ``best_effort``.
    priority: str = "latency"
    #: Whether its vCPUs are kept off SMT siblings running other sandboxes
    #: (only in the answer to a create or a priority change; else None).
    smt_isolation: bool | None = None
    #: What the host could not give it as asked (create and priority
    #: change only): e.g. no SMT isolation on a kernel without core
    #: scheduling.
    warnings: list[str] = field(default_factory=list)
    #: How its VM runs (its template's kind): ``microvm`` (plain, FnCall and
    #: container sandboxes) or ``vm`` (a QEMU q35 guest with a display).
    kind: str = "microvm"

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> SandboxInfo:
        net = v.get("network")
        return cls(
            id=str(v["id"]),
            template=str(v.get("template", "")),
            state=str(v.get("state", "")),
            vcpus=int(v.get("vcpus", 0)),
            memory_mib=int(v.get("memory_mib", 0)),
            pid=v.get("pid"),
            created_at=float(v.get("created_at") or 0.0),
            last_active=float(v.get("last_active") or 0.0),
            ttl_s=int(v.get("ttl_s") or 0),
            idle_timeout_s=int(v.get("idle_timeout_s") or 0),
            metadata=dict(v.get("metadata") or {}),
            env=dict(v.get("env") or {}),
            error=v.get("error"),
            keep_running=bool(v.get("keep_running", False)),
            pause_at_ttl=bool(v.get("pause_at_ttl", False)),
            from_pool=v.get("from_pool"),
            network=Network.from_json(net) if isinstance(net, Mapping) else None,
            guest_addr=v.get("guest_addr"),
            priority=str(v.get("priority") or "latency"),
            smt_isolation=v.get("smt_isolation"),
            warnings=[str(w) for w in v.get("warnings") or []],
            # Older daemons send none: theirs are microVMs.
            kind=str(v.get("kind") or "microvm"),
        )


@dataclass
class ExecResult:
    """A finished command: its output (bytes), status and duration.

    ``stdout``/``stderr`` are bytes; :attr:`text` and :attr:`stderr_text`
    decode them (UTF-8, invalid bytes replaced).
    """

    stdout: bytes
    stderr: bytes
    exit_code: int | None
    signal: int | None = None
    timed_out: bool = False
    #: Seconds from request to exit (the daemon's figure when it gives one).
    duration: float = 0.0
    #: Output beyond the daemon's per-stream limit was dropped.
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Exited 0 (not killed, not timed out)."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def code(self) -> int:
        """The shell-style status: the exit code, 128 + the signal, or 1."""
        if self.exit_code is not None:
            return self.exit_code
        if self.signal is not None:
            return 128 + self.signal
        return 1

    @property
    def text(self) -> str:
        """Standard output as text."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        """Standard error as text."""
        return self.stderr.decode("utf-8", "replace")

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> ExecResult:
        enc = v.get("encoding")
        return cls(
            stdout=_decode(v.get("stdout"), enc),
            stderr=_decode(v.get("stderr"), enc),
            exit_code=v.get("exit_code"),
            signal=v.get("signal"),
            timed_out=bool(v.get("timed_out", False)),
            duration=float(v.get("duration_ms") or 0.0) / 1000.0,
            truncated=bool(v.get("truncated", False)),
        )


@dataclass
class ExecEvent:
    """One event of a streamed command: ``start`` (``pid``), ``stdout`` /
    ``stderr`` (``data``: bytes), then ``exit`` (``exit_code``, ``signal``,
    ``timed_out``) or ``error`` (``message``), the last one."""

    type: str
    data: bytes = b""
    pid: int | None = None
    exec_id: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    message: str | None = None

    @property
    def text(self) -> str:
        """``data`` as text."""
        return self.data.decode("utf-8", "replace")

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> ExecEvent:
        t = str(v.get("type", ""))
        return cls(
            type=t,
            data=_decode(v.get("data"), v.get("encoding")) if t in ("stdout", "stderr") else b"",
            pid=v.get("pid"),
            exec_id=v.get("exec_id"),
            exit_code=v.get("exit_code"),
            signal=v.get("signal"),
            timed_out=bool(v.get("timed_out", False)),
            message=v.get("message"),
        )


@dataclass
class CommandInfo:
    """A background command (``GET .../commands/{id}``)."""

    id: str
    pid: int | None
    sandbox_id: str
    state: str
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    started_at: float = 0.0

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> CommandInfo:
        return cls(
            id=str(v["id"]),
            pid=v.get("pid"),
            sandbox_id=str(v.get("sandbox_id", "")),
            state=str(v.get("state", "")),
            exit_code=v.get("exit_code"),
            signal=v.get("signal"),
            timed_out=bool(v.get("timed_out", False)),
            started_at=float(v.get("started_at") or 0.0),
        )


@dataclass
class FileStat:
    """A guest file's type, permission bits, size and mtime."""

    type: str
    mode: int
    size: int
    mtime_ns: int

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> FileStat:
        return cls(
            type=str(v["type"]),
            mode=int(v["mode"]),
            size=int(v["size"]),
            mtime_ns=int(v["mtime_ns"]),
        )


@dataclass
class DirEntry:
    """One entry of a guest directory."""

    name: str
    type: str

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> DirEntry:
        return cls(name=str(v["name"]), type=str(v["type"]))


@dataclass
class TemplateInfo:
    """A template: an image booted once and snapshotted, or a sandbox's
    snapshot."""

    name: str
    source: str
    state: str
    vcpus: int
    memory_mib: int
    error: str | None = None
    created_at: float = 0.0
    owner: str | None = None
    layers: list[str] = field(default_factory=list)
    upper_size_mib: int | None = None
    upper_disk_mib: int | None = None
    image: str | None = None
    """The OCI image (``sha256:...``) of a container template or of a
    snapshot of one."""
    kind: str = "microvm"
    """The kind of its sandboxes: ``microvm`` or ``vm``."""
    disk: dict[str, Any] | None = None
    """A vm template's own disk: ``path``, ``format``, ``kernel``
    (``shoal`` or ``none``), ``root`` and ``init``; None otherwise."""

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> TemplateInfo:
        return cls(
            name=str(v["name"]),
            source=str(v.get("source", "")),
            state=str(v.get("state", "")),
            vcpus=int(v.get("vcpus", 0)),
            memory_mib=int(v.get("memory_mib", 0)),
            error=v.get("error"),
            created_at=float(v.get("created_at") or 0.0),
            owner=v.get("owner"),
            layers=list(v.get("layers") or []),
            upper_size_mib=v.get("upper_size_mib"),
            upper_disk_mib=v.get("upper_disk_mib"),
            image=v.get("image"),
            kind=str(v.get("kind") or "microvm"),
            disk=dict(v["disk"]) if isinstance(v.get("disk"), Mapping) else None,
        )


@dataclass
class ImageInfo:
    """An OCI image in the host's image store (``shoal image pull``)."""

    id: str
    refs: list[str]
    manifest_digest: str
    layers: list[dict[str, Any]]
    config: dict[str, Any]
    disk_bytes: int
    in_use: int
    created_at: str

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> ImageInfo:
        return cls(
            id=str(v["id"]),
            refs=[str(r) for r in v.get("refs") or []],
            manifest_digest=str(v.get("manifest_digest", "")),
            layers=[dict(x) for x in v.get("layers") or []],
            config=dict(v.get("config") or {}),
            disk_bytes=int(v.get("disk_bytes") or 0),
            in_use=int(v.get("in_use") or 0),
            created_at=str(v.get("created_at", "")),
        )


@dataclass
class ImageList:
    """The host's OCI images and the bytes of their layers (each shared
    layer once)."""

    images: list[ImageInfo]
    disk_bytes: int

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> ImageList:
        return cls(
            images=[ImageInfo.from_json(i) for i in v.get("images") or []],
            disk_bytes=int(v.get("disk_bytes") or 0),
        )


@dataclass
class PoolInfo:
    """A warm pool: its target size and how many sandboxes are ready."""

    template: str
    target: int
    ready: int

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> PoolInfo:
        return cls(template=str(v["template"]), target=int(v["target"]), ready=int(v["ready"]))


@dataclass
class MicroVMArgs:
    """What :meth:`AsyncShoal.run_microvm` starts: a KVM microVM sandbox
    from a ``template`` or an ``image`` (``tiny``, ``base``).

    The fields are those of :meth:`AsyncShoal.create`; ``command``, when
    given, is run once the sandbox is up (its result is on
    ``sandbox.last_result``).
    """

    image: str | None = None
    template: str | None = None
    vcpus: int | None = None
    memory_mib: int | None = None
    ttl_s: int = 0
    idle_timeout_s: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)
    upper_size_mib: int | None = None
    upper_disk_mib: int | None = None
    keep_running: bool = False
    pause_at_ttl: bool = False
    priority: str = "latency"
    command: list[str] | str | None = None


@dataclass
class ContainerArgs:
    """A container sandbox (an OCI image). Not served by this daemon yet:
    :meth:`AsyncShoal.run_container` raises :class:`KindNotAvailable`."""

    image: str
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_mib: int | None = None


@dataclass
class VMArgs:
    """What :meth:`AsyncShoal.run_vm` starts: a full VM (the ``vm`` kind:
    a QEMU q35 guest with a display, ``sandbox.screen()`` and
    ``sandbox.input()``) from a ``vm`` ``template``, or from ``image``,
    whose vm template (``vm-IMAGE-Nc-Mm``, ``vcpus`` and ``memory_mib``)
    is made on first use (a boot and a snapshot: ~20-45 s on a PVM host).
    vm templates boot the ``tiny`` image with Shoal's kernel, or
    ``disk_image``.

    ``disk_image``: a raw or qcow2 disk of your own (an absolute path on
    the daemon's host, under its layers directory; no backing file), never
    written: each sandbox gets an overlay over it. Its template
    (``vm-disk-HASH-Nc-Mm``, the hash of the path and the ``disk_*``
    options) is made on first use. ``disk_kernel`` ``"shoal"`` (default)
    boots it with Shoal's kernel, its file system on ``disk_root``
    (default ``/dev/vda``) as the root and ``disk_init`` (default
    ``/usr/local/sbin/shoal-agent``, where ``shoal image build base --kind
    vm`` puts the agent) as init; ``"none"`` boots the disk's own
    bootloader (hardware KVM only). ``disk_format``: ``raw`` or ``qcow2``
    (default: detected). A disk changed in place keeps its old template:
    give a new path or delete the template.

    ``command``, when given, is run once the sandbox is up (its result is
    on ``sandbox.last_result``).
    """

    template: str | None = None
    image: str = "tiny"
    vcpus: int = 1
    memory_mib: int = 256
    ttl_s: int = 0
    idle_timeout_s: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    keep_running: bool = False
    command: list[str] | str | None = None
    disk_image: str | None = None
    disk_format: str | None = None
    disk_kernel: str | None = None
    disk_root: str | None = None
    disk_init: str | None = None

    def template_name(self) -> str:
        """The template a create from ``image`` (or ``disk_image``) uses."""
        if self.template:
            return self.template
        shape = f"{self.vcpus}c-{self.memory_mib}m"
        if self.disk_image is not None:
            key = "\n".join(
                str(v or "")
                for v in (
                    self.disk_image,
                    self.disk_format,
                    self.disk_kernel,
                    self.disk_root,
                    self.disk_init,
                )
            )
            h = hashlib.sha256(key.encode()).hexdigest()[:12]
            return f"vm-disk-{h}-{shape}"
        return f"vm-{self.image}-{shape}"


T = TypeVar("T")


class Forked(List[T]):
    """The clones ``sandbox.fork(n)`` made (a list of sandboxes), and in
    ``failures`` why any of those asked for could not be made."""

    def __init__(self, items: Iterable[T] = ()) -> None:
        super().__init__(items)
        self.failures: list[ShoalError] = []
