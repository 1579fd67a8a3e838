"""The few things the asyncio client does differently from the sync one
(``_sio.py`` is its twin): sleeping, calling a user callback, running a
blocking call, and turning a body source into chunks."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Callable

from ._core import CHUNK

sleep = asyncio.sleep


async def call(cb: Callable[[Any], Any], arg: Any) -> None:
    """Calls ``cb(arg)``, awaiting it when it is a coroutine function."""
    r = cb(arg)
    if inspect.isawaitable(r):
        await r


async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs a blocking function off the event loop."""
    return await asyncio.to_thread(fn, *args)


async def chunks(src: Any) -> AsyncIterator[bytes]:
    """The bytes of ``src`` in chunks: bytes/str, a binary file object
    (sync or with an async ``read``), or a (sync or async) iterable of
    bytes."""
    if isinstance(src, str):
        src = src.encode("utf-8")
    if isinstance(src, (bytes, bytearray, memoryview)):
        mv = memoryview(src)
        for i in range(0, len(mv), CHUNK):
            yield bytes(mv[i : i + CHUNK])
        return
    read = getattr(src, "read", None)
    if read is not None:
        while True:
            b = read(CHUNK)
            if inspect.isawaitable(b):
                b = await b
            if not b:
                return
            yield b.encode("utf-8") if isinstance(b, str) else bytes(b)
    elif hasattr(src, "__aiter__"):
        async for b in src:
            yield b.encode("utf-8") if isinstance(b, str) else bytes(b)
    else:
        for b in src:
            yield b.encode("utf-8") if isinstance(b, str) else bytes(b)


async def write_out(dst: Any, data: bytes) -> None:
    """Writes to a (sync or async) binary file object."""
    r = dst.write(data)
    if inspect.isawaitable(r):
        await r
