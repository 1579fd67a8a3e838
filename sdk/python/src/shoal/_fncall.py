"""FnCall: one short, stateless run of untrusted code, each in a fresh
copy-on-write clone of a per-language warm template (``POST /v1/fncall``,
``POST /v1/fncall/batch``). :class:`FnCallArgs` is the request and
:class:`FnCallResult` the answer, field for field as the daemon's
``FnCallRequest`` and ``FnCallResult`` (``api-types/src/fncall.rs``), with
file contents as bytes instead of base64."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from ._errors import BadRequest

#: How a call ended.
FnCallStatus = Literal[
    "success", "failed", "compile_error", "timeout", "out_of_memory", "sandbox_error"
]

#: Most calls in one ``POST /v1/fncall/batch`` (``map_fncall`` sends more
#: as several batches).
MAX_BATCH_CALLS = 10_000


def _b64(path: str, content: bytes | str) -> str:
    if isinstance(content, str):
        content = content.encode("utf-8")
    if not isinstance(content, (bytes, bytearray, memoryview)):
        raise BadRequest(f"files[{path!r}]: expected bytes or str, got {type(content).__name__}")
    return base64.b64encode(bytes(content)).decode("ascii")


@dataclass
class FnCallArgs:
    """One call: ``code`` in ``language`` (``python``, ``bash``, ``cpp``,
    ``nodejs``; ``GET /v1/fncall/languages`` lists them).

    ``stdin`` is what the program reads (text; bytes must be UTF-8).
    ``files`` are written before the run (path, absolute or relative to
    the call's working directory → bytes or text), ``fetch_files`` read
    back after it (into :attr:`FnCallResult.files`; a missing one is left
    out). ``timeout_s`` (default 10, at most 300) kills the clone when it
    passes; ``compile_timeout_s`` bounds a compiled language's compile
    (default: ``timeout_s``). ``memory_mib`` limits the program inside the
    guest (default: what the language's template allows); ``env`` and
    ``args`` are its environment (over the language's) and arguments.
    ``output_limit`` is the bytes kept of each of stdout and stderr
    (default 64 KiB, at most 8 MiB; more is cut and flagged).
    """

    language: str
    code: str
    stdin: str | bytes | None = None
    files: dict[str, bytes | str] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)
    timeout_s: float | None = None
    compile_timeout_s: float | None = None
    memory_mib: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    output_limit: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The request body (``FnCallRequest``)."""
        body: dict[str, Any] = {"language": self.language, "code": self.code}
        if self.stdin is not None:
            if isinstance(self.stdin, (bytes, bytearray, memoryview)):
                try:
                    body["stdin"] = bytes(self.stdin).decode("utf-8")
                except UnicodeDecodeError as e:
                    raise BadRequest(f"stdin must be UTF-8 text: {e}") from e
            else:
                body["stdin"] = str(self.stdin)
        if self.files:
            body["files"] = {str(p): _b64(str(p), c) for p, c in self.files.items()}
        if self.fetch_files:
            body["fetch_files"] = [str(p) for p in self.fetch_files]
        for k in ("timeout_s", "compile_timeout_s"):
            v = getattr(self, k)
            if v is not None:
                body[k] = float(v)
        for k in ("memory_mib", "output_limit"):
            v = getattr(self, k)
            if v is not None:
                body[k] = int(v)
        if self.env:
            body["env"] = {str(k): str(v) for k, v in self.env.items()}
        if self.args:
            body["args"] = [str(a) for a in self.args]
        return body


@dataclass
class FnCallCompile:
    """The compile step of a compiled language."""

    exit_code: int | None
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> FnCallCompile:
        return cls(
            exit_code=v.get("exit_code"),
            stdout=str(v.get("stdout") or ""),
            stderr=str(v.get("stderr") or ""),
            duration_ms=float(v.get("duration_ms") or 0.0),
            timed_out=bool(v.get("timed_out", False)),
        )


@dataclass
class FnCallResult:
    """How a call ended (``FnCallResult``).

    ``status`` is ``success`` (exited 0), ``failed`` (non-zero exit or a
    signal), ``compile_error``, ``timeout``, ``out_of_memory`` or
    ``sandbox_error`` (not the program's fault: ``error`` says why).
    ``stdout``/``stderr`` are text (invalid UTF-8 replaced), cut at the
    output limit when ``*_truncated``. ``duration_ms`` is the run's wall
    time, ``total_ms`` the whole call's as the daemon saw it. ``files``
    are the fetched files' contents.
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit_code: int | None = None
    signal: int | None = None
    duration_ms: float = 0.0
    total_ms: float = 0.0
    files: dict[str, bytes] = field(default_factory=dict)
    compile: FnCallCompile | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The program ran and exited 0."""
        return self.status == "success"

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> FnCallResult:
        c = v.get("compile")
        return cls(
            status=str(v["status"]),
            stdout=str(v.get("stdout") or ""),
            stderr=str(v.get("stderr") or ""),
            stdout_truncated=bool(v.get("stdout_truncated", False)),
            stderr_truncated=bool(v.get("stderr_truncated", False)),
            exit_code=v.get("exit_code"),
            signal=v.get("signal"),
            duration_ms=float(v.get("duration_ms") or 0.0),
            total_ms=float(v.get("total_ms") or 0.0),
            files={str(p): base64.b64decode(b) for p, b in (v.get("files") or {}).items()},
            compile=FnCallCompile.from_json(c) if c else None,
            error=v.get("error"),
        )


def fncall_args(args: FnCallArgs | None, fields: Mapping[str, Any]) -> FnCallArgs:
    """``run_fncall(args)`` or ``run_fncall(language=..., code=...)``."""
    if args is None:
        try:
            return FnCallArgs(**fields)
        except TypeError as e:
            raise BadRequest(f"run_fncall: {e}") from e
    if fields:
        raise BadRequest("run_fncall: pass FnCallArgs or keyword fields, not both")
    if not isinstance(args, FnCallArgs):
        raise BadRequest(f"run_fncall: expected FnCallArgs, got {type(args).__name__}")
    return args
