"""Shoal: KVM microVM sandboxes from Python.

Two mirrored clients with the same names and docstrings: :class:`Shoal` /
:class:`Sandbox` (blocking) and :class:`AsyncShoal` / :class:`AsyncSandbox`
(asyncio)::

    import asyncio, shoal

    async def main():
        async with shoal.AsyncShoal() as client:
            async with client.sandbox(image="base") as sb:
                r = await sb.exec(["python3", "-c", "print(6*7)"])
                print(r.text)

    asyncio.run(main())

See ``sdk/python/README.md`` for the guide.
"""

from . import display
from ._async_client import AsyncShoal
from ._async_files import AsyncFiles
from ._async_sandbox import AsyncCommand, AsyncSandbox
from ._core import default_socket, default_state_dir, start_daemon
from ._errors import (
    ERROR_CLASSES,
    BadRequest,
    CommandFailed,
    CommandNotFound,
    CommandTimedOut,
    Conflict,
    ConnectionFailed,
    DaemonStartFailed,
    FileNotFound,
    Forbidden,
    ForkFailed,
    HostFull,
    HostMemoryLow,
    NetworkUnavailable,
    InsufficientStorage,
    InternalError,
    KindNotAvailable,
    NotFound,
    PayloadTooLarge,
    Retryable,
    SandboxBusy,
    SandboxError,
    SandboxNotFound,
    ShoalError,
    ImageNotFound,
    TemplateNotFound,
    Timeout,
    Unauthorized,
)
from ._fncall import FnCallArgs, FnCallCompile, FnCallResult
from ._sync_client import Shoal
from ._sync_files import Files
from ._sync_sandbox import Command, Sandbox
from ._types import (
    CommandInfo,
    ContainerArgs,
    DirEntry,
    ExecEvent,
    ExecResult,
    FileStat,
    Forked,
    MicroVMArgs,
    Network,
    PoolInfo,
    SandboxInfo,
    ImageInfo,
    ImageList,
    TemplateInfo,
    VMArgs,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncCommand",
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncShoal",
    "BadRequest",
    "Command",
    "CommandFailed",
    "CommandInfo",
    "CommandNotFound",
    "CommandTimedOut",
    "Conflict",
    "ConnectionFailed",
    "ContainerArgs",
    "DaemonStartFailed",
    "DirEntry",
    "ERROR_CLASSES",
    "ExecEvent",
    "ExecResult",
    "FileNotFound",
    "FileStat",
    "Files",
    "FnCallArgs",
    "FnCallCompile",
    "FnCallResult",
    "Forbidden",
    "ForkFailed",
    "Forked",
    "HostFull",
    "HostMemoryLow",
    "NetworkUnavailable",
    "InsufficientStorage",
    "InternalError",
    "KindNotAvailable",
    "MicroVMArgs",
    "Network",
    "NotFound",
    "PayloadTooLarge",
    "PoolInfo",
    "Retryable",
    "Sandbox",
    "SandboxBusy",
    "SandboxError",
    "SandboxInfo",
    "SandboxNotFound",
    "Shoal",
    "ShoalError",
    "ImageInfo",
    "ImageList",
    "ImageNotFound",
    "TemplateInfo",
    "TemplateNotFound",
    "Timeout",
    "Unauthorized",
    "VMArgs",
    "default_socket",
    "display",
    "default_state_dir",
    "start_daemon",
]
