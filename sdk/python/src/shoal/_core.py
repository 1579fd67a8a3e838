"""What the sync and async clients share and that does no I/O of its own
on the API: finding the daemon (like the ``shoal`` CLI), starting the local
one on demand, building request bodies and the retry schedule."""

from __future__ import annotations

import base64
import os
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ._errors import BadRequest, DaemonStartFailed
from ._types import Network

#: Inline stdin of a one-shot exec is sent in the JSON body (base64, at
#: most 1 MiB of JSON); larger or streamed stdin goes through a background
#: command's stdin.
INLINE_STDIN_MAX = 512 * 1024
#: Chunk size of streamed uploads and downloads.
CHUNK = 1 << 20
#: Default deadline of a command (the daemon's default too).
DEFAULT_EXEC_TIMEOUT = 300.0
#: What a client waits beyond a command's own timeout for the daemon's
#: answer (the daemon's own deadline is the timeout + 30 s).
EXEC_MARGIN = 60.0


def default_state_dir() -> Path:
    """The local daemon's state directory, as the CLI computes it:
    ``$SHOAL_STATE/daemon``, else ``$SHOAL_CACHE/daemon``, else
    ``~/.cache/shoal/daemon``."""
    base = os.environ.get("SHOAL_STATE") or os.environ.get("SHOAL_CACHE")
    if not base:
        base = os.path.join(os.environ.get("HOME") or "/root", ".cache/shoal")
    return Path(base) / "daemon"


def default_socket() -> Path:
    """The local daemon's socket (``<state dir>/shoald.sock``)."""
    return default_state_dir() / "shoald.sock"


@dataclass(frozen=True)
class Target:
    """Where the daemon is: a Unix socket path, or an ``http://`` URL with
    an optional bearer token."""

    socket: str | None
    url: str
    token: str | None

    @property
    def local(self) -> bool:
        return self.socket is not None

    def __str__(self) -> str:
        return self.socket or self.url


def resolve_target(daemon: str | os.PathLike[str] | None, token: str | None) -> Target:
    """The daemon to talk to, like the CLI: ``daemon`` (a socket path or
    ``http://HOST:PORT``), else ``$SHOAL_DAEMON``, else the default socket;
    the token is ``token``, else ``$SHOAL_TOKEN`` (TCP only)."""
    spec = os.fspath(daemon) if daemon is not None else os.environ.get("SHOAL_DAEMON", "")
    if spec.startswith("https://"):
        raise BadRequest(f"daemon {spec}: shoald serves plain http:// (use an http:// URL)")
    if spec.startswith("http://"):
        tok = token if token is not None else os.environ.get("SHOAL_TOKEN")
        return Target(socket=None, url=spec.rstrip("/"), token=tok or None)
    sock = spec or str(default_socket())
    return Target(socket=sock, url="http://shoald", token=None)


def socket_answers(path: str) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def find_shoald() -> str | None:
    """The ``shoald`` binary: ``$SHOALD``, else ``shoald`` on PATH, else
    the one next to the ``shoal`` CLI on PATH."""
    env = os.environ.get("SHOALD")
    if env:
        return env
    found = shutil.which("shoald")
    if found:
        return found
    cli = shutil.which("shoal")
    if cli:
        sib = Path(cli).resolve().with_name("shoald")
        if sib.is_file():
            return str(sib)
    return None


def start_daemon(sock: str, shoald: str | None = None, timeout: float = 30.0) -> None:
    """Starts ``shoald`` detached (its own session, like the CLI) for the
    state directory holding ``sock`` and waits until it answers. Its log
    is ``<state dir>/shoald.log``."""
    state = Path(sock).parent
    binary = shoald or find_shoald()
    if binary is None:
        raise DaemonStartFailed(
            f"shoald is not running at {sock} and no shoald binary was found "
            "(set SHOALD, or put shoald or the shoal CLI on PATH; "
            "cargo build --release -p shoald)"
        )
    state.mkdir(parents=True, exist_ok=True)
    log_path = state / "shoald.log"
    with open(log_path, "ab") as log:
        try:
            child = subprocess.Popen(
                [binary, "--state-dir", str(state)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        except OSError as e:
            raise DaemonStartFailed(f"cannot start {binary}: {e}") from e
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if socket_answers(sock):
            return
        rc = child.poll()
        if rc is not None:
            raise DaemonStartFailed(f"shoald exited ({rc}) while starting; see {log_path}")
        time.sleep(0.02)
    raise DaemonStartFailed(f"shoald did not answer within {timeout:.0f} s; see {log_path}")


def ensure_daemon(target: Target, shoald: str | None = None) -> None:
    """Starts the local daemon when nothing answers on its socket."""
    if target.socket is not None and not socket_answers(target.socket):
        start_daemon(target.socket, shoald)


def drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def create_body(
    *,
    image: str | None,
    template: str | None,
    vcpus: int | None,
    memory_mib: int | None,
    ttl_s: float | None,
    idle_timeout_s: float | None,
    metadata: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
    layers: Sequence[str] | None,
    upper_size_mib: int | None,
    upper_disk_mib: int | None,
    keep_running: bool,
    pause_at_ttl: bool = False,
    network: Network | Mapping[str, Any] | None = None,
    priority: str = "latency",
) -> dict[str, Any]:
    if (image is None) == (template is None):
        raise BadRequest("give exactly one of image= and template=")
    if isinstance(layers, str):
        raise BadRequest("layers= is a list of images or paths, not one string")
    body = drop_none(
        {
            "image": image,
            "template": template,
            "vcpus": vcpus,
            "memory_mib": memory_mib,
            "upper_size_mib": upper_size_mib,
            "upper_disk_mib": upper_disk_mib,
        }
    )
    if ttl_s:
        body["ttl_s"] = int(ttl_s)
    if idle_timeout_s:
        body["idle_timeout_s"] = int(idle_timeout_s)
    if metadata:
        body["metadata"] = dict(metadata)
    if env:
        body["env"] = dict(env)
    if layers:
        body["layers"] = list(layers)
    if keep_running:
        body["keep_running"] = True
    if pause_at_ttl:
        if not ttl_s:
            raise BadRequest("pause_at_ttl= needs a ttl_s=")
        body["pause_at_ttl"] = True
    if network is not None:
        body["network"] = network_body(network)
    if check_priority(priority) != "latency":
        body["priority"] = priority
    return body


PRIORITIES = ("latency", "best_effort")


def check_priority(priority: str) -> str:
    """``priority`` if it is a CPU class the daemon knows, else
    :class:`BadRequest` naming them."""
    if priority not in PRIORITIES:
        raise BadRequest(f"priority={priority!r}: use 'latency' or 'best_effort'")
    return priority


def network_body(network: Network | Mapping[str, Any]) -> dict[str, Any]:
    """The NetworkSpec JSON of ``network`` (a :class:`Network` or a mapping
    with its keys)."""
    if isinstance(network, Network):
        return network.to_json()
    if not isinstance(network, Mapping):
        raise BadRequest("network= is a shoal.Network or a mapping of allow_out/deny_out/allow_dns")
    unknown = set(network) - {"allow_out", "deny_out", "allow_dns"}
    if unknown:
        raise BadRequest(f"network= has unknown keys: {sorted(unknown)}")
    for k in ("allow_out", "deny_out"):
        if isinstance(network.get(k), str):
            raise BadRequest(f"network[{k!r}] is a list of entries, not one string")
    return Network.from_json(network).to_json()


def exec_body(
    cmd: Sequence[str] | str | None,
    shell: str | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    stdin: bytes | None,
) -> dict[str, Any]:
    """The ExecRequest JSON. ``cmd`` is an argv list, or a string run by
    ``/bin/sh -c`` (like ``shell=``)."""
    if isinstance(cmd, str):
        if shell is not None:
            raise BadRequest("give a command or shell=, not both")
        cmd, shell = None, cmd
    if (cmd is None) == (shell is None):
        raise BadRequest("give exactly one of a command (argv list or string) and shell=")
    body: dict[str, Any] = {}
    if cmd is not None:
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise BadRequest(f"command {cmd!r}: expected a non-empty list of strings")
        body["cmd"] = argv
    else:
        body["shell"] = shell
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if timeout is not None:
        body["timeout_s"] = float(timeout)
    if stdin is not None:
        body["stdin_b64"] = base64.b64encode(stdin).decode("ascii")
    return body


def exec_read_timeout(timeout: float | None) -> float:
    """How long a client waits for a command's answer."""
    return (timeout if timeout is not None else DEFAULT_EXEC_TIMEOUT) + EXEC_MARGIN


def inline_stdin(stdin: Any) -> bytes | None:
    """``stdin`` as bytes when it is small enough to go in the request
    body; None when it must be streamed (a file, an iterable, large)."""
    if isinstance(stdin, str):
        stdin = stdin.encode("utf-8")
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        b = bytes(stdin)
        return b if len(b) <= INLINE_STDIN_MAX else None
    return None


@dataclass(frozen=True)
class Backoff:
    """Retry schedule of the errors a later try may get past (429/503):
    ``retries`` more tries, waiting the daemon's ``Retry-After`` when it
    sent one, else ``base * 2**n`` (with jitter), at most ``cap`` seconds."""

    retries: int = 0
    base: float = 0.25
    cap: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        exp = min(self.cap, self.base * (2**attempt))
        jittered = exp * (0.5 + random.random() / 2)
        if retry_after is not None:
            return min(self.cap, max(retry_after, jittered if attempt else retry_after))
        return jittered


def signal_number(sig: int | str) -> int:
    """A signal given as a number or a name (``"TERM"``, ``"SIGKILL"``)."""
    import signal as _signal

    if isinstance(sig, int):
        return sig
    name = sig.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(getattr(_signal, name))
    except AttributeError:
        raise BadRequest(f"unknown signal {sig!r}") from None
