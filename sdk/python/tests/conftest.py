"""One real shoald per test session, on a temporary state directory,
running real guests (KVM). Nothing of the daemon is mocked: a host
without /dev/kvm, the binaries or the guest artifacts fails every test
with the reason (never skips).

The binaries are ``$SHOAL_BIN_DIR`` (default: the checkout's
``target/release``: shoald, shoal-vmm, shoal-jailer; ``$SHOAL_VMM`` and
``$SHOAL_JAILER`` win for those two when set); the guest kernel and
images ``$SHOAL_ARTIFACTS`` (default ``~/.cache/shoal/artifacts``, what
``target/release/shoal artifacts build tiny`` installs)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

import shoal

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = "py-tiny"
POOL = 10


def _require_kvm() -> None:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError as e:
        raise RuntimeError(f"these tests run real guests and need /dev/kvm (read-write): {e}")
    os.close(fd)


def _bin_dir() -> Path:
    d = Path(os.environ.get("SHOAL_BIN_DIR") or ROOT / "target" / "release")
    for b in ("shoald", "shoal-vmm", "shoal-jailer"):
        if not (d / b).is_file():
            raise RuntimeError(
                f"{d / b} is missing: cargo build --release -p shoald -p vmm -p shoal-jailer"
            )
    return d


def _artifacts() -> Path:
    d = os.environ.get("SHOAL_ARTIFACTS")
    if not d:
        cache = os.environ.get("SHOAL_CACHE") or os.path.expanduser("~/.cache/shoal")
        d = os.path.join(cache, "artifacts")
    p = Path(d)
    for f in ("vmlinux", "cmdline", "images/tiny.erofs"):
        if not (p / f).is_file():
            raise RuntimeError(
                f"guest artifact {p / f} is missing: target/release/shoal artifacts build tiny"
            )
    return p


class Daemon:
    """A shoald process on its own state directory."""

    def __init__(self, *args: str) -> None:
        _require_kvm()
        bins = _bin_dir()
        self.tmp = tempfile.mkdtemp(prefix="shoal-py-")
        self.dir = Path(self.tmp)
        self.sock = str(self.dir / "shoald.sock")
        env = dict(os.environ)
        env.setdefault("SHOAL_VMM", str(bins / "shoal-vmm"))
        env.setdefault("SHOAL_JAILER", str(bins / "shoal-jailer"))
        self.log_path = self.dir / "shoald.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(bins / "shoald"), "--state-dir", self.tmp, "--artifacts", str(_artifacts()), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        end = time.monotonic() + 30
        from shoal._core import socket_answers

        while not socket_answers(self.sock):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"shoald did not come up:\n{self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def vmm_pids(self) -> list[int]:
        """VMM processes started for this state directory."""
        pids = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == self.proc.pid:
                continue
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if self.tmp.encode() in cmd and b"shoal-vmm" in cmd:
                pids.append(int(p.name))
        return pids

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in self.vmm_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """The session's daemon, with the template ``py-tiny`` (the tiny
    image, 1 vCPU, 128 MiB) built and a warm pool of 10."""
    # A generous agent deadline: the host may be busy (PVM, shared CPUs),
    # and these tests assert behaviour, not speed.
    d = Daemon("--agent-timeout", "300", "--agent-call-timeout", "300")
    try:
        with shoal.Shoal(d.sock, autostart=False) as c:
            c.create_template(TEMPLATE, "tiny", timeout=300)
            c.set_pool(TEMPLATE, POOL)
            c.wait_pool(TEMPLATE, POOL, timeout=300)
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="session")
def big_template(daemon: Daemon) -> str:
    """A template of the tiny image with 512 MiB of memory and a 384 MiB
    upper layer (for the 100 MiB transfer)."""
    with shoal.Shoal(daemon.sock, autostart=False) as c:
        c.create_template("py-tiny-big", "tiny", memory_mib=512, upper_size_mib=384, timeout=300)
    return "py-tiny-big"


@pytest.fixture(scope="session")
def big_size() -> int:
    """The large transfer: 100 MiB (``SHOAL_PY_BIG_MIB`` to change)."""
    return int(os.environ.get("SHOAL_PY_BIG_MIB", "100")) << 20


@pytest.fixture
def client(daemon: Daemon) -> Iterator[shoal.Shoal]:
    with shoal.Shoal(daemon.sock, autostart=False) as c:
        yield c


@pytest.fixture
async def aclient(daemon: Daemon):
    async with shoal.AsyncShoal(daemon.sock, autostart=False) as c:
        yield c


@pytest.fixture
def sandbox(client: shoal.Shoal) -> Iterator[shoal.Sandbox]:
    with client.create(template=TEMPLATE) as sb:
        yield sb


@pytest.fixture
async def asandbox(aclient: shoal.AsyncShoal):
    async with await aclient.create(template=TEMPLATE) as sb:
        yield sb


class TcpDaemon(Daemon):
    """A daemon that also listens on TCP (127.0.0.1, a free port) with a
    token file: ``url`` and ``token``."""

    def __init__(self, *args: str) -> None:
        import secrets
        import socket

        self.token = secrets.token_hex(16)
        tokdir = tempfile.mkdtemp(prefix="shoal-py-tok-")
        self.token_file = os.path.join(tokdir, "token")
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token + "\n")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            "--listen", f"127.0.0.1:{self.port}", "--token-file", self.token_file, *args
        )
        end = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"shoald did not listen on TCP:\n{self.log()}")
                time.sleep(0.05)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(os.path.dirname(self.token_file), ignore_errors=True)


@pytest.fixture(scope="session")
def fncall_daemon() -> Iterator[TcpDaemon]:
    """A daemon on the Unix socket and TCP for FnCall and SandboxFusion's
    ``/run_code`` (its language templates are built on their first call,
    from the ``base`` image: ``target/release/shoal artifacts build``)."""
    base = _artifacts() / "images" / "base.erofs"
    if not base.is_file():
        raise RuntimeError(f"{base} is missing: target/release/shoal artifacts build base")
    d = TcpDaemon("--agent-timeout", "300", "--agent-call-timeout", "300")
    try:
        yield d
    finally:
        d.stop()
