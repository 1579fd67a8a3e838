"""One real shoald per test session, listening on TCP with a token, running
real guests (KVM), driven by the stock E2B SDK of this venv, unmodified:
only ``E2B_API_URL``, ``E2B_SANDBOX_URL`` (both shoald's TCP listener) and
``E2B_API_KEY`` (the daemon's token) are set, as a user would.

The session registers the template ``base`` (the base image; E2B's
default templateID) with a warm pool, and ``code-interpreter-v1`` when the
image exists (for the code-interpreter tests), through shoald's own API.

Nothing is mocked: a host without /dev/kvm, the binaries or the guest
artifacts fails every test with the reason (never skips). Binaries:
``$SHOAL_BIN_DIR`` (default: the checkout's ``target/release``), with
``$SHOAL_VMM``/``$SHOAL_JAILER`` winning when set; artifacts:
``$SHOAL_ARTIFACTS`` (default ``~/.cache/shoal/artifacts``)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = "base"
POOL = 3


def _require_kvm() -> None:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError as e:
        raise RuntimeError(f"these tests run real guests and need /dev/kvm (read-write): {e}")
    os.close(fd)


def _bin_dir() -> Path:
    d = Path(os.environ.get("SHOAL_BIN_DIR") or ROOT / "target" / "release")
    if not (d / "shoald").is_file():
        raise RuntimeError(f"{d / 'shoald'} is missing: cargo build --release -p shoald")
    return d


def _artifacts() -> Path:
    d = os.environ.get("SHOAL_ARTIFACTS")
    if not d:
        cache = os.environ.get("SHOAL_CACHE") or os.path.expanduser("~/.cache/shoal")
        d = os.path.join(cache, "artifacts")
    p = Path(d)
    for f in ("vmlinux", "cmdline", "images/base.erofs"):
        if not (p / f).is_file():
            raise RuntimeError(
                f"guest artifact {p / f} is missing: target/release/shoal artifacts build"
            )
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A shoald process on its own state directory, on TCP."""

    def __init__(self) -> None:
        _require_kvm()
        bins = _bin_dir()
        self.tmp = tempfile.mkdtemp(prefix="shoal-e2b-")
        self.dir = Path(self.tmp)
        self.token = "e2b_" + secrets.token_hex(16)
        self.interp_warmup: InterpWarmup | None = None
        tok = self.dir / "token"
        tok.write_text(self.token + "\n")
        tok.chmod(0o600)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        for b in ("shoal-vmm", "shoal-jailer"):
            var = "SHOAL_VMM" if b == "shoal-vmm" else "SHOAL_JAILER"
            if var not in env and (bins / b).is_file():
                env[var] = str(bins / b)
        self.log_path = self.dir / "shoald.log"
        state = self.dir / "state"
        # Sandbox networks (test_network.py) on a pool, prefixes and links
        # of this session's own; set up at the first networked create, and
        # with no DNS forwarder (nothing is resolved: the tests reach only
        # a peer netns of theirs).
        self.net_tag = os.getpid() % 200
        net = [
            "--net-pool", f"10.219.{self.net_tag}.0/24",
            "--net-slots", "2",
            "--net-netns-prefix", f"se2b{self.net_tag}-",
            "--net-link-prefix", f"shv{self.net_tag}e",
            "--net-dns", "off",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(bins / "shoald"),
                    "--state-dir", str(state),
                    "--artifacts", str(_artifacts()),
                    "--listen", f"127.0.0.1:{self.port}",
                    "--token-file", str(tok),
                    "--agent-timeout", "300",
                    *net,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        end = time.monotonic() + 30
        while True:
            try:
                if self.api("GET", "/healthz")["ok"]:
                    break
            except (OSError, urllib.error.URLError, KeyError, ValueError):
                pass
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"shoald did not come up:\n{self.log()}")
            time.sleep(0.05)

    def api(self, method: str, path: str, body: Any = None, timeout: float = 600) -> Any:
        """A call to shoald's own API (bearer token)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def template(self, name: str, image: str, memory_mib: int, pool: int) -> None:
        """Registers ``name`` from ``image`` with a warm pool of ``pool``,
        and waits for the first warm sandbox (the rest fill meanwhile:
        the tests need the pool for speed only)."""
        try:
            self.api("POST", "/v1/templates", {"name": name, "image": image, "memory_mib": memory_mib})
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"template {name}: {e.read()!r}\n{self.log()}")
        end = time.monotonic() + 600
        while True:
            t = self.api("GET", f"/v1/templates/{name}")
            if t["state"] == "ready":
                break
            if t["state"] == "failed" or time.monotonic() > end:
                raise RuntimeError(f"template {name}: {t}\n{self.log()}")
            time.sleep(0.2)
        if pool:
            self.api("PUT", f"/v1/pools/{name}", {"target": pool})
            while True:
                ready = [p for p in self.api("GET", "/v1/pools") if p["template"] == name]
                if ready and ready[0]["ready"] >= 1:
                    return
                if time.monotonic() > end:
                    raise RuntimeError(f"pool {name} not filled: {ready}\n{self.log()}")
                time.sleep(0.2)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def vmm_pids(self) -> list[int]:
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


_SESSION: dict[str, Any] = {"interp": False}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Notes whether the selected tests include code-interpreter ones."""
    _SESSION["interp"] = any(i.get_closest_marker("code_interpreter") for i in session.items)


class InterpWarmup:
    """The first ``code-interpreter-v1`` create builds its template: the
    scientific stack's imports take minutes in a PVM guest. It starts with
    the session, in a thread, so the build overlaps the other files' tests
    instead of coming after them; ``wait`` gives its error, if any (the
    tests' own create then builds again and fails clearly)."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="interp-warmup", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            from e2b_code_interpreter import Sandbox

            Sandbox.create(timeout=600, request_timeout=2400).kill()
        except Exception as e:  # noqa: BLE001 - reported by wait()
            self.error = repr(e)

    def wait(self) -> str | None:
        self.thread.join(2400)
        return self.error


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """The session's daemon with the template ``base`` and a warm pool;
    the E2B SDK's environment points at it."""
    d = Daemon()
    try:
        d.template(TEMPLATE, "base", 256, POOL)
        os.environ["E2B_API_URL"] = d.url
        os.environ["E2B_SANDBOX_URL"] = d.url
        os.environ["E2B_API_KEY"] = d.token
        os.environ.pop("E2B_DEBUG", None)
        os.environ.pop("E2B_DOMAIN", None)
        d.interp_warmup = InterpWarmup() if _SESSION["interp"] else None
        yield d
    finally:
        d.stop()


@pytest.fixture
def sandbox(daemon: Daemon):
    """A sandbox of the default template, killed after the test."""
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()


def e2b_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(x) for x in version("e2b").split(".")[:3])
