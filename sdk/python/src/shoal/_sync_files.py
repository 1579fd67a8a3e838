# Generated from _async_files.py by tools/gen_sync.py: do not edit.
"""The files of a sandbox (:class:`Files`). Made from ``_async_files.py`` by ``tools/gen_sync.py``: do not edit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, List

from . import _sio as _io
from ._errors import FileNotFound
from ._types import DirEntry, FileStat

if TYPE_CHECKING:  # pragma: no cover
    from ._sync_sandbox import Sandbox

__all__ = ["Files"]


class Files:
    """The file system of a sandbox (``sandbox.files``). Paths are
    absolute guest paths. Reads and writes are streamed: any size, with
    little memory on either side."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{self.sandbox.id}/files"

    def _call(self, method: str, sub: str, **kw: Any) -> Any:
        kw.setdefault("not_found", FileNotFound)
        return self.sandbox.client._json(method, self._path + sub, **kw)

    def write(
        self,
        path: str,
        data: Any,
        *,
        mode: int = 0o644,
        append: bool = False,
        parents: bool = False,
    ) -> int:
        """Writes ``data`` (bytes/str, a binary file object, or an
        iterable of bytes; streamed) to ``path`` with permission bits
        ``mode``, truncating it (or appending with ``append``);
        ``parents`` creates missing directories. Returns the bytes
        written."""
        params = {
            "path": path,
            "mode": format(mode, "o"),
            "append": append or None,
            "parents": parents or None,
        }
        v = self.sandbox.client._json(
            "PUT",
            self._path,
            params=params,
            content=_io.chunks(data),
            not_found=FileNotFound,
            retry=False,
        )
        return int(v["bytes"])

    def read(self, path: str) -> bytes:
        """The whole content of the file ``path``, as bytes."""
        parts = [c for c in self.iter_read(path)]
        return b"".join(parts)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The content of the file ``path``, as text."""
        return (self.read(path)).decode(encoding)

    def read_to(self, path: str, dst: Any) -> int:
        """Streams the file ``path`` into ``dst`` (a writable binary file
        object). Returns the bytes copied."""
        n = 0
        for c in self.iter_read(path):
            _io.write_out(dst, c)
            n += len(c)
        return n

    def iter_read(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The file ``path`` in chunks as they arrive."""
        with self.sandbox.client._stream(
            "GET", self._path, params={"path": path}, not_found=FileNotFound
        ) as r:
            for c in r.iter_bytes(chunk_size):
                yield c

    def list(self, path: str = "/") -> List[DirEntry]:
        """The entries of the directory ``path``, by name."""
        return [DirEntry.from_json(v) for v in self._call("GET", "/list", params={"path": path})]

    def stat(self, path: str) -> FileStat:
        """Type, permission bits, size and mtime of ``path``
        (:class:`FileNotFound` if it does not exist)."""
        return FileStat.from_json(self._call("GET", "/stat", params={"path": path}))

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            self.stat(path)
            return True
        except FileNotFound:
            return False

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a directory (its whole tree with
        ``recursive``)."""
        self._call("DELETE", "", params={"path": path, "recursive": recursive or None})

    def mkdir(self, path: str, *, parents: bool = False, mode: int = 0o755) -> None:
        """Creates the directory ``path`` (and missing parents with
        ``parents``, which also makes an existing one no error)."""
        params = {"path": path, "parents": parents, "mode": format(mode, "o")}
        self._call("POST", "/mkdir", params=params)

    def rename(self, src: str, dst: str) -> None:
        """Renames (moves) ``src`` to ``dst`` within the sandbox."""
        self._call("POST", "/rename", json={"from": src, "to": dst})
