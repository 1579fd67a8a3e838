# Generated from _async_sandbox.py by tools/gen_sync.py: do not edit.
""":class:`Sandbox` and its background commands. Made from ``_async_sandbox.py`` by ``tools/gen_sync.py``: do not edit."""

from __future__ import annotations

import json as _json
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Iterator,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)

from . import _sio as _io
from . import display
from ._sync_files import Files
from ._core import (
    check_priority,
    exec_body,
    exec_read_timeout,
    inline_stdin,
    network_body,
    signal_number,
)
from ._errors import (
    CommandFailed,
    CommandNotFound,
    CommandTimedOut,
    ForkFailed,
    ShoalError,
    SandboxNotFound,
    error_from_response,
)
from ._types import (
    CommandInfo,
    ExecEvent,
    ExecResult,
    Forked,
    Network,
    SandboxInfo,
    TemplateInfo,
)

if TYPE_CHECKING:  # pragma: no cover
    from ._sync_client import Shoal

__all__ = ["Sandbox", "Command"]

#: A callback of streamed output: gets each chunk's bytes.
OutputCallback = Callable[[bytes], Any]


class Sandbox:
    """A sandbox of a Shoal daemon: run commands in it, move files in and
    out, pause, snapshot, fork, kill.

    Made by :meth:`Shoal.create` / :meth:`Shoal.get` (never
    directly). ``with sandbox:`` kills it on exit. :attr:`info` is
    the view as of the last call that returned one (:meth:`refresh`
    updates it).
    """

    def __init__(self, client: Shoal, info: SandboxInfo) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        #: The files of the sandbox.
        self.files = Files(self)
        #: The result of ``MicroVMArgs.command`` (run_microvm), else None.
        self.last_result: ExecResult | None = None

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, state={self.info.state!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill(missing_ok=True)

    @property
    def kind(self) -> str:
        """How its VM runs: ``microvm`` or ``vm`` (``info.kind``; a
        sandbox keeps its template's kind for life)."""
        return self.info.kind

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{self.id}"

    def _do(self, method: str, sub: str, **kw: Any) -> Any:
        kw.setdefault("not_found", SandboxNotFound)
        return self.client._json(method, self._path + sub, **kw)

    def _update(self, v: Any) -> SandboxInfo:
        self.info = SandboxInfo.from_json(v)
        return self.info

    # -- lifecycle ----------------------------------------------------

    def refresh(self) -> SandboxInfo:
        """Fetches the sandbox's current view (state, pid, TTL, ...)."""
        return self._update(self._do("GET", ""))

    def get_info(self) -> SandboxInfo:
        """The sandbox's current view (same as :meth:`refresh`)."""
        return self.refresh()

    def pause(self) -> SandboxInfo:
        """Pauses it: state to disk, its VMM process ends (the next
        command or :meth:`resume` continues it)."""
        return self._update(self._do("POST", "/pause"))

    def resume(self) -> SandboxInfo:
        """Resumes a paused sandbox (any command or file call also does)."""
        return self._update(self._do("POST", "/resume"))

    def set_network(self, network: Network | Mapping[str, Any]) -> SandboxInfo:
        """Replaces the egress policy of a sandbox created with
        ``network=``, in force at once: its next packet to a destination
        no longer allowed is dropped, established connection or not.
        Raises :class:`Conflict` for a sandbox without a network device
        (one cannot be added to a running guest), :class:`BadRequest` for
        a policy that does not parse."""
        body = network_body(network)
        return self._update(self._do("PUT", "/network", json=body))

    # -- display (vm sandboxes) ---------------------------------------

    def screen(self) -> bytes:
        """A screenshot of a ``vm`` sandbox's display: PNG bytes
        (``shoal.display.png_size`` reads its size). :class:`Conflict`
        for kinds without a display (microVMs, containers)."""
        r = self.client._send(
            "GET", self._path + "/screen", not_found=SandboxNotFound, stream=False
        )
        png = r.content
        if not png.startswith(b"\x89PNG\r\n\x1a\n"):
            raise ShoalError(f"screen of {self.id}: the answer is not a PNG ({len(png)} bytes)")
        return png

    def input(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Sends keyboard and pointer ``events`` to a ``vm`` sandbox's
        display, in order (made with ``shoal.display``: ``key``,
        ``type_text``, ``move``, ``click``...; more than 256 go in several
        requests). :class:`BadRequest` for an invalid event,
        :class:`Conflict` for kinds without a display."""
        evs = display.check_events(events)
        for i in range(0, len(evs), display.MAX_EVENTS):
            self._do("POST", "/input", json={"events": evs[i : i + display.MAX_EVENTS]})

    def snapshot(self, template: str | None = None) -> TemplateInfo:
        """Snapshots the running sandbox into a new template (named
        ``template``, else ``snap-ID-TIME``); the sandbox goes on."""
        body = {"template": template} if template else {}
        return TemplateInfo.from_json(self._do("POST", "/snapshot", json=body))

    def fork(
        self, n: int = 1, *, metadata: Mapping[str, str] | None = None, partial: bool = False
    ) -> Forked[Sandbox]:
        """Forks the running sandbox into ``n`` (1-100) live clones that
        continue from this instant with their own memory, upper layer,
        fresh entropy and clock; this sandbox keeps running.

        Returns the clones (a list; ``.failures`` holds why any could not
        be made). ``metadata`` labels the clones (default: this sandbox's
        labels). When some failed and ``partial`` is false, raises
        :class:`ForkFailed` instead, whose ``sandboxes`` are the clones that
        were made (still running: the caller owns them).
        """
        body: dict[str, Any] = {"count": int(n)}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        v = self._do("POST", "/fork", json=body)
        made: Forked[Sandbox] = Forked(
            Sandbox(self.client, SandboxInfo.from_json(s)) for s in v.get("sandboxes", [])
        )
        for f in v.get("failed") or []:
            err = _json.dumps({"error": f}).encode()
            made.failures.append(error_from_response(0, err, None))
        if made.failures and not partial:
            raise ForkFailed(list(made), made.failures, n)
        return made

    def set_ttl(
        self, ttl_s: float | None = None, *, idle_timeout_s: float | None = None
    ) -> SandboxInfo:
        """Sets the TTL (killed ``ttl_s`` seconds from now; 0: never) and/or
        the idle timeout (paused after that long without requests)."""
        body: dict[str, Any] = {}
        if ttl_s is not None:
            body["ttl_s"] = int(ttl_s)
        if idle_timeout_s is not None:
            body["idle_timeout_s"] = int(idle_timeout_s)
        return self._update(self._do("PATCH", "", json=body))

    def set_priority(self, priority: str) -> SandboxInfo:
        """Changes its CPU class (``"latency"`` or ``"best_effort"``); a
        running sandbox's VMM gets it at once, a paused one when it
        resumes. The answer's ``smt_isolation`` and ``warnings`` say what
        the host gives it."""
        body = {"priority": check_priority(priority)}
        return self._update(self._do("PATCH", "", json=body))

    def kill(self, *, missing_ok: bool = False) -> None:
        """Kills the sandbox and removes everything it had. A sandbox
        already gone raises :class:`SandboxNotFound` unless ``missing_ok``."""
        try:
            self._do("DELETE", "")
        except SandboxNotFound:
            if not missing_ok:
                raise

    # -- commands -----------------------------------------------------

    def exec(
        self,
        cmd: Sequence[str] | str | None = None,
        *,
        shell: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: Any = None,
        check: bool = False,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """Runs a command and returns its result once it exits.

        ``cmd`` is an argv list (``["python3", "-c", "..."]``) or a string
        run by ``/bin/sh -c`` (as is ``shell=``). ``env`` adds to the
        sandbox's environment; ``timeout`` (seconds, default 300) kills the
        command's process tree. ``stdin`` is bytes/str, a binary file
        object or an iterable of bytes (large or streamed input goes
        through a background command's stdin). With ``on_stdout`` /
        ``on_stderr`` the output is streamed to them as it comes (and is
        also in the result). A paused sandbox is resumed first.

        A non-zero exit is a result, not an error, unless ``check=True``:
        then :class:`CommandFailed` (:class:`CommandTimedOut` when the
        timeout fired).
        """
        t0 = time.monotonic()
        small = inline_stdin(stdin)
        if stdin is not None and small is None:
            c = self.start(cmd, shell=shell, env=env, cwd=cwd, timeout=timeout, stdin=True)
            c.write_stdin(stdin, close=True)
            res = c.wait(on_stdout=on_stdout, on_stderr=on_stderr)
        elif on_stdout is None and on_stderr is None:
            body = exec_body(cmd, shell, env, cwd, timeout, small)
            v = self._do("POST", "/exec", json=body, timeout=exec_read_timeout(timeout))
            res = ExecResult.from_json(v)
        else:
            body = exec_body(cmd, shell, env, cwd, timeout, small)
            res = _collect(
                self._events("/exec/stream", body, timeout), on_stdout, on_stderr, t0
            )
        if not res.duration:
            res.duration = time.monotonic() - t0
        if check and not res.ok:
            raise (CommandTimedOut if res.timed_out else CommandFailed)(res, cmd or shell)
        return res

    def exec_stream(
        self,
        cmd: Sequence[str] | str | None = None,
        *,
        shell: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
    ) -> Iterator[ExecEvent]:
        """Runs a command and yields its events as they come: ``start``,
        ``stdout``/``stderr`` chunks (``event.data``), then ``exit`` or
        ``error`` (``event.message``: the sandbox or daemon failed), the
        last one::

            for ev in sb.exec_stream(["make"]):
                if ev.type == "stdout":
                    print(ev.text, end="")

        The daemon kills a streamed command whose reader takes nothing
        for 15 s.
        """
        small = inline_stdin(stdin)
        if stdin is not None and small is None:
            raise ShoalError("exec_stream takes at most 512 KiB of stdin; use start(stdin=True)")
        body = exec_body(cmd, shell, env, cwd, timeout, small)
        for ev in self._events("/exec/stream", body, timeout):
            yield ev

    def _events(
        self, sub: str, body: Any, timeout: float | None, method: str = "POST"
    ) -> Iterator[ExecEvent]:
        with self.client._stream(
            method,
            self._path + sub,
            json=body,
            timeout=exec_read_timeout(timeout),
            not_found=SandboxNotFound,
        ) as r:
            for line in r.iter_lines():
                if line.strip():
                    yield ExecEvent.from_json(_json.loads(line))

    def start(
        self,
        cmd: Sequence[str] | str | None = None,
        *,
        shell: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bool = False,
    ) -> Command:
        """Starts a command in the background and returns at once with a
        handle to wait on, signal, stream or feed (``stdin=True`` keeps its
        standard input open for :meth:`Command.write_stdin`). It
        outlives this client: :meth:`command` re-attaches by id."""
        body = exec_body(cmd, shell, env, cwd, timeout, None)
        if stdin:
            body["stdin_open"] = True
        v = self._do("POST", "/commands", json=body)
        return Command(self, CommandInfo.from_json(v), timeout)

    def command(self, command_id: str) -> Command:
        """Re-attaches to the background command ``command_id``."""
        v = self._do("GET", f"/commands/{command_id}", not_found=CommandNotFound)
        return Command(self, CommandInfo.from_json(v), None)

    def commands(self) -> list[Command]:
        """The sandbox's background commands (running and exited)."""
        vs = self._do("GET", "/commands")
        return [Command(self, CommandInfo.from_json(v), None) for v in vs]


class Command:
    """A background command in a sandbox (:meth:`Sandbox.start`)."""

    def __init__(self, sandbox: Sandbox, info: CommandInfo, timeout: float | None) -> None:
        self.sandbox = sandbox
        self.info = info
        self.id = info.id
        self.pid = info.pid
        self._timeout = timeout

    def __repr__(self) -> str:
        return f"Command(id={self.id!r}, pid={self.pid}, state={self.info.state!r})"

    @property
    def _sub(self) -> str:
        return f"/commands/{self.id}"

    def _do(self, method: str, sub: str = "", **kw: Any) -> Any:
        return self.sandbox._do(method, self._sub + sub, not_found=CommandNotFound, **kw)

    def refresh(self) -> CommandInfo:
        """Its current state (``running``/``exited``, exit code...)."""
        self.info = CommandInfo.from_json(self._do("GET"))
        return self.info

    def wait(
        self,
        *,
        timeout: float | None = None,
        check: bool = False,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """Waits for it to exit and returns its result (output included).
        ``timeout`` bounds this wait (:class:`Timeout`), not the command.
        With callbacks, the output is streamed to them (re-attached)."""
        t0 = time.monotonic()
        if on_stdout is not None or on_stderr is not None:
            res = _collect(self.stream(), on_stdout, on_stderr, t0)
        else:
            params = {"timeout_s": timeout} if timeout is not None else None
            read = exec_read_timeout(timeout if timeout is not None else self._timeout)
            v = self._do("POST", "/wait", params=params, timeout=read)
            res = ExecResult.from_json(v)
        if check and not res.ok:
            raise (CommandTimedOut if res.timed_out else CommandFailed)(res, self.id)
        return res

    def stream(self) -> Iterator[ExecEvent]:
        """Its events (like :meth:`Sandbox.exec_stream`), re-attached:
        may be read from another client or process."""
        for ev in self.sandbox._events(self._sub + "/stream", None, None, method="GET"):
            yield ev

    def signal(self, sig: int | str = "TERM", *, group: bool = True) -> None:
        """Sends a signal (a number or a name: ``"INT"``, ``"KILL"``) to the
        command, or to its whole process group (``group``, default)."""
        self._do("POST", "/signal", json={"signal": signal_number(sig), "group": group})

    def kill(self) -> None:
        """SIGKILL to its process group."""
        self.signal("KILL", group=True)

    def write_stdin(self, data: Any, *, close: bool = False) -> None:
        """Sends ``data`` (bytes/str, a binary file object or an iterable of
        bytes, streamed) to its standard input; ``close`` closes it after."""
        self._do(
            "POST", "/stdin", params={"close": close}, content=_io.chunks(data), retry=False
        )

    def close_stdin(self) -> None:
        """Closes its standard input (EOF)."""
        self._do("POST", "/stdin", params={"close": True}, content=b"")


def _collect(
    events: Iterator[ExecEvent],
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
    t0: float,
) -> ExecResult:
    out: list[bytes] = []
    err: list[bytes] = []
    for ev in events:
        if ev.type == "stdout":
            out.append(ev.data)
            if on_stdout is not None:
                _io.call(on_stdout, ev.data)
        elif ev.type == "stderr":
            err.append(ev.data)
            if on_stderr is not None:
                _io.call(on_stderr, ev.data)
        elif ev.type == "exit":
            return ExecResult(
                stdout=b"".join(out),
                stderr=b"".join(err),
                exit_code=ev.exit_code,
                signal=ev.signal,
                timed_out=ev.timed_out,
                duration=time.monotonic() - t0,
            )
        elif ev.type == "error":
            raise error_from_response(
                502, _json.dumps({"error": {"code": "sandbox_error", "message": ev.message}}).encode(), None
            )
    raise error_from_response(
        502,
        b'{"error":{"code":"sandbox_error","message":"the stream ended without an exit event"}}',
        None,
    )
