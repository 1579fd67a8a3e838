"""The few things the sync client does differently from the asyncio one
(``_aio.py`` is its twin): sleeping, calling a user callback, running a
blocking call, and turning a body source into chunks."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from ._core import CHUNK

sleep = time.sleep


def call(cb: Callable[[Any], Any], arg: Any) -> None:
    """Calls ``cb(arg)``."""
    cb(arg)


def blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs a blocking function (here: just calls it)."""
    return fn(*args)


def chunks(src: Any) -> Iterator[bytes]:
    """The bytes of ``src`` in chunks: bytes/str, a binary file object,
    or an iterable of bytes."""
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
            if not b:
                return
            yield b.encode("utf-8") if isinstance(b, str) else bytes(b)
    else:
        for b in src:
            yield b.encode("utf-8") if isinstance(b, str) else bytes(b)


def write_out(dst: Any, data: bytes) -> None:
    """Writes to a binary file object."""
    dst.write(data)
