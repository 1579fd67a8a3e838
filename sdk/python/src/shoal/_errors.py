"""Exceptions: one class per error code of the daemon's API.

Every failed request raises a subclass of :class:`ShoalError`. The daemon
answers errors as ``{"error": {"code", "message"}}``; the code picks the
class (:data:`ERROR_CLASSES`), so callers can catch what they can act on::

    try:
        sb = client.create(image="tiny")
    except shoal.HostFull as e:
        time.sleep(e.retry_after or 1)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ._types import ExecResult


class ShoalError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        code: the API's error code (``"not_found"``, ...), or None for
            errors that did not come from the daemon's error body.
        status: the HTTP status, or None.
        message: the daemon's message (for people).
        retry_after: seconds the daemon asked to wait before retrying
            (``Retry-After``), or None.
    """

    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" ({self.code}, HTTP {self.status})" if self.status else ""
        return f"{self.message}{where}"


class ConnectionFailed(ShoalError):
    """The daemon could not be reached (no socket, refused, reset)."""


class DaemonStartFailed(ConnectionFailed):
    """The local daemon was not running and could not be started."""


class BadRequest(ShoalError, ValueError):
    """400: the request is malformed or invalid (a bad argument)."""

    code = "bad_request"


class Unauthorized(ShoalError):
    """401: missing or wrong bearer token (TCP only)."""

    code = "unauthorized"


class Forbidden(ShoalError):
    """403: the caller may not do this (a template it does not own)."""

    code = "forbidden"


class NotFound(ShoalError, LookupError):
    """404: no such sandbox, template, command, file or route."""

    code = "not_found"


class SandboxNotFound(NotFound):
    """404 for a sandbox id that does not exist (or no longer does)."""


class TemplateNotFound(NotFound):
    """404 for a template name that does not exist."""


class ImageNotFound(NotFound):
    """404 for an OCI image not in the host's store (or, on a pull, not in
    the registry)."""


class FileNotFound(NotFound, FileNotFoundError):
    """404 for a guest path that does not exist."""


class CommandNotFound(NotFound):
    """404 for a background command id the sandbox does not have."""


class Conflict(ShoalError):
    """409: not possible in the sandbox's current state."""

    code = "conflict"


class PayloadTooLarge(ShoalError):
    """413: the request body is larger than the route takes."""

    code = "payload_too_large"


class Retryable(ShoalError):
    """Base of the errors the same request may get past later (429/503,
    with ``retry_after``). Retried by the client when it was made with
    ``retries=N``."""


class HostFull(Retryable):
    """429 ``host_full``: the host's admission quota is full. Retry after
    :attr:`retry_after` seconds or after removing sandboxes."""

    code = "host_full"


class HostMemoryLow(HostFull):
    """503 ``host_memory_low``: the host is short of memory or disk (a
    kind of :class:`HostFull`)."""

    code = "host_memory_low"


class NetworkUnavailable(Retryable):
    """503 ``network_unavailable``: a sandbox asked for a network this
    daemon cannot give now (the message says why); a create without
    ``network=`` works."""

    code = "network_unavailable"


class SandboxBusy(Retryable):
    """429 ``sandbox_busy``: the sandbox has as many calls in flight as it
    may; more are refused, never queued."""

    code = "sandbox_busy"


class SandboxError(ShoalError):
    """502: the sandbox (its VMM or guest agent) failed."""

    code = "sandbox_error"


class Timeout(ShoalError, TimeoutError):
    """A deadline passed: the daemon's 504 ``deadline_exceeded``, or the
    client's own timeout waiting for an answer."""

    code = "deadline_exceeded"


class InternalError(ShoalError):
    """500: the daemon failed."""

    code = "internal"


class InsufficientStorage(ShoalError, OSError):
    """507: the sandbox's file system is full (its upper layer's cap)."""

    code = "insufficient_storage"


class KindNotAvailable(ShoalError, NotImplementedError):
    """The daemon does not run this kind of sandbox (yet): only microVMs
    are served today; containers, function calls and full VMs are not."""


class CommandFailed(ShoalError):
    """A command exited non-zero (or was killed) and ``check=True`` was
    given. :attr:`result` holds its output."""

    def __init__(self, result: ExecResult, cmd: Any = None) -> None:
        what = f"{cmd!r} " if cmd is not None else ""
        if result.timed_out:
            why = "timed out"
        elif result.signal is not None:
            why = f"was killed by signal {result.signal}"
        else:
            why = f"exited with {result.exit_code}"
        tail = result.stderr[-500:].decode("utf-8", "replace").strip()
        msg = f"command {what}{why}" + (f": {tail}" if tail else "")
        super().__init__(msg)
        self.result = result


class CommandTimedOut(CommandFailed, Timeout):
    """``check=True`` and the command's own timeout fired (its processes
    were killed); both a :class:`CommandFailed` and a :class:`Timeout`."""


class ForkFailed(ShoalError):
    """Some clones of a fork could not be made: ``sandboxes`` are those
    that were (running: the caller owns them), ``failures`` why the rest
    were not."""

    def __init__(self, made: list[Any], failures: list[ShoalError], asked: int) -> None:
        why = "; ".join(str(f) for f in failures[:3])
        super().__init__(f"fork made {len(made)} of {asked} clones: {why}")
        self.sandboxes = list(made)
        self.failures = failures


#: The class raised for each API error code.
ERROR_CLASSES: dict[str, type[ShoalError]] = {
    "bad_request": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "payload_too_large": PayloadTooLarge,
    "host_full": HostFull,
    "host_memory_low": HostMemoryLow,
    "network_unavailable": NetworkUnavailable,
    "sandbox_busy": SandboxBusy,
    "sandbox_error": SandboxError,
    "deadline_exceeded": Timeout,
    "internal": InternalError,
    "insufficient_storage": InsufficientStorage,
}

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    413: "payload_too_large",
    429: "host_full",
    500: "internal",
    502: "sandbox_error",
    503: "host_memory_low",
    504: "deadline_exceeded",
    507: "insufficient_storage",
}


def error_from_response(
    status: int,
    body: bytes,
    retry_after: str | None,
    *,
    not_found: type[NotFound] = NotFound,
) -> ShoalError:
    """The exception for an error response (``not_found`` is the class a
    404 of this route means: a sandbox, a template, a file...)."""
    import json

    code: str | None = None
    message = ""
    try:
        err = json.loads(body)["error"]
        code = str(err["code"])
        message = str(err["message"])
    except (ValueError, KeyError, TypeError):
        message = body[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
    if code is None:
        code = _STATUS_CODES.get(status)
    cls = ERROR_CLASSES.get(code or "", ShoalError)
    if cls is NotFound:
        # A route under a sandbox answers 404 for the sandbox too.
        if message.startswith("no such route"):
            cls = NotFound
            message += " (this daemon is older than the SDK: it lacks this call)"
        else:
            cls = SandboxNotFound if message.startswith("no sandbox ") else not_found
    wait: float | None = None
    if retry_after is not None:
        try:
            wait = max(0.0, float(retry_after))
        except ValueError:
            wait = None
    return cls(message, code=code, status=status, retry_after=wait)
