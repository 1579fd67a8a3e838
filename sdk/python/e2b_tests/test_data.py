"""The data plane (envd's protocol, served by shoald over the guest agent)
with the stock SDK: commands (foreground, background with on_stdout,
non-zero exit, timeout, stdin, kill, list, connect, users) and files
(write str/bytes/file object, read text/bytes/stream, list, exists,
get_info, make_dir, rename, remove, watch_dir, users); sync and async.

One sandbox per test function (from the warm pool), many checks in each:
a guest exec costs ~0.5 s under PVM."""

from __future__ import annotations

import asyncio
import io
import time
import uuid

import pytest
from e2b import AsyncSandbox, CommandExitException, FileType, PtySize, Sandbox, TimeoutException
from e2b.exceptions import NotFoundException, SandboxException

from conftest import e2b_version

# Every command's stream deadline (the SDK's default is 60 s): on a PVM host
# loaded by the other suites, a guest can wait that long for its vCPU.
T = 300


def _long(sandbox: Sandbox) -> Sandbox:
    """The fixture's sandbox, given time for many guest execs on a busy
    host (PVM)."""
    sandbox.set_timeout(900)
    return sandbox


def test_commands(sandbox: Sandbox) -> None:
    sandbox = _long(sandbox)
    r = sandbox.commands.run("echo hi; echo oops >&2; whoami; pwd; echo $HOME", timeout=T)
    assert r.exit_code == 0
    assert r.stdout == "hi\nuser\n/home/user\n/home/user\n"
    assert r.stderr == "oops\n"

    # bash -l -c: a login shell, with cwd and envs as asked.
    r = sandbox.commands.run("echo $FOO; pwd; shopt -q login_shell && echo login",
                             envs={"FOO": "b a r"}, cwd="/tmp", timeout=T)
    assert r.stdout == "b a r\n/tmp\nlogin\n"
    r = sandbox.commands.run("whoami; echo $HOME; id -u", user="root", timeout=T)
    assert r.stdout == "root\n/root\n0\n"

    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("echo before; exit 3", timeout=T)
    assert ei.value.exit_code == 3 and ei.value.stdout == "before\n"

    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=2)
    assert time.monotonic() - t0 < 25
    # The process is killed at its deadline (the guest's, just after the
    # client's).
    end = time.monotonic() + 10
    while any("sleep 30" in " ".join(p.args) for p in sandbox.commands.list()):
        assert time.monotonic() < end, "the timed-out command still runs"
        time.sleep(0.2)

    # Background, its output through on_stdout as it comes.
    seen: list[str] = []
    h = sandbox.commands.run(
        "for i in 1 2 3; do echo l$i; sleep 0.2; done", background=True, timeout=T
    )
    res = h.wait(on_stdout=seen.append)
    assert res.exit_code == 0 and "".join(seen) == "l1\nl2\nl3\n"

    # stdin, list by tag-less pid, connect, kill.
    cat = sandbox.commands.run("cat", background=True, stdin=True, timeout=T)
    sandbox.commands.send_stdin(cat.pid, "to stdin\n")
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert cat.pid in listed and listed[cat.pid].cmd == "/bin/bash"
    assert listed[cat.pid].args == ["-l", "-c", "cat"]
    if e2b_version() >= (2, 50, 0):
        sandbox.commands.close_stdin(cat.pid)
        assert cat.wait().stdout == "to stdin\n"
    else:
        assert sandbox.commands.kill(cat.pid) is True

    if e2b_version() >= (2, 63, 0):  # stream_input is new in 2.63 of the pins
        cat2 = sandbox.commands.run("cat", background=True, stdin=True, timeout=T)
        sandbox.commands.stream_input(cat2.pid, iter(["a", b"b", "c\n"]))
        sandbox.commands.close_stdin(cat2.pid)
        assert cat2.wait().stdout == "abc\n"

    slow = sandbox.commands.run("sleep 1.5; echo late", background=True, timeout=T)
    # (The SDK's connect defaults to 60 s, which a loaded CI host passed.)
    again = sandbox.commands.connect(slow.pid, timeout=T)
    assert again.wait().stdout == "late\n"

    sleeper = sandbox.commands.run("sleep 100", background=True, timeout=T)
    assert sandbox.commands.kill(sleeper.pid) is True
    assert sandbox.commands.kill(sleeper.pid) is False
    assert sleeper.pid not in {p.pid for p in sandbox.commands.list()}
    with pytest.raises(CommandExitException):
        sleeper.wait()
    with pytest.raises(SandboxException):
        sandbox.commands.connect(sleeper.pid)


def test_pty(sandbox: Sandbox) -> None:
    sandbox = _long(sandbox)
    term = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=T)
    sandbox.pty.resize(term.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(term.pid, b"stty size; tty; echo $TERM; exit 7\n")
    out: list[bytes] = []
    with pytest.raises(CommandExitException) as ei:
        term.wait(on_pty=out.append)
    assert ei.value.exit_code == 7
    text = b"".join(out).decode(errors="replace")
    assert "30 100" in text and "/dev/pts/" in text and "xterm-256color" in text, text


def test_files(sandbox: Sandbox) -> None:
    sandbox = _long(sandbox)
    d = f"/tmp/{uuid.uuid4().hex}"
    info = sandbox.files.write(f"{d}/a.txt", "héllo")
    assert info.path == f"{d}/a.txt" and info.name == "a.txt"
    sandbox.files.write(f"{d}/b.bin", b"\x00\x01\xff")
    sandbox.files.write(f"{d}/c.txt", io.BytesIO(b"from a file object"))
    assert sandbox.files.read(f"{d}/a.txt") == "héllo"
    assert bytes(sandbox.files.read(f"{d}/b.bin", format="bytes")) == b"\x00\x01\xff"
    assert b"".join(sandbox.files.read(f"{d}/c.txt", format="stream")) == b"from a file object"

    entries = {e.name: e for e in sandbox.files.list(d)}
    assert sorted(entries) == ["a.txt", "b.bin", "c.txt"]
    assert entries["b.bin"].type == FileType.FILE and entries["b.bin"].size == 3

    assert sandbox.files.exists(f"{d}/a.txt") is True
    assert sandbox.files.exists(f"{d}/nope") is False
    st = sandbox.files.get_info(f"{d}/a.txt")
    assert st.size == len("héllo".encode()) and st.permissions == "-rw-r--r--"
    assert st.owner == "user" and st.group == "user"
    assert abs(st.modified_time.timestamp() - time.time()) < 600

    assert sandbox.files.make_dir(f"{d}/sub/deeper") is True
    assert sandbox.files.make_dir(f"{d}/sub/deeper") is False
    assert sandbox.files.get_info(f"{d}/sub").type == FileType.DIR
    deep = {e.path for e in sandbox.files.list(d, depth=2)}
    assert f"{d}/sub/deeper" in deep and f"{d}/a.txt" in deep

    moved = sandbox.files.rename(f"{d}/a.txt", f"{d}/sub/a2.txt")
    assert moved.path == f"{d}/sub/a2.txt"
    assert sandbox.files.exists(f"{d}/a.txt") is False
    sandbox.files.remove(f"{d}/sub")
    assert sandbox.files.exists(f"{d}/sub") is False

    with pytest.raises(NotFoundException):
        sandbox.files.read(f"{d}/missing")

    # Relative paths are in the user's home; files are the user's.
    sandbox.files.write("rel.txt", "home")
    assert sandbox.files.read("/home/user/rel.txt") == "home"
    assert sandbox.files.get_info("/home/user/rel.txt").owner == "user"
    sandbox.files.write("/root/r.txt", "r", user="root")
    assert sandbox.files.get_info("/root/r.txt", user="root").owner == "root"

    w = f"{d}/watched"
    sandbox.files.make_dir(w)
    h = sandbox.files.watch_dir(w)
    try:
        sandbox.files.write(f"{w}/new.txt", "x")
        events = []
        end = time.monotonic() + 30
        while not events and time.monotonic() < end:
            events = h.get_new_events()
            time.sleep(0.2)
        assert [(e.name, e.type.value) for e in events] == [("new.txt", "create")]
    finally:
        h.stop()


def test_async_commands_and_files(daemon) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create(timeout=900)
        try:
            r = await sbx.commands.run("echo hi; whoami", timeout=T)
            assert r.stdout == "hi\nuser\n"
            with pytest.raises(CommandExitException):
                await sbx.commands.run("exit 4", timeout=T)
            with pytest.raises(TimeoutException):
                await sbx.commands.run("sleep 30", timeout=2)

            seen: list[str] = []
            h = await sbx.commands.run(
                "echo a; sleep 0.3; echo b", background=True, on_stdout=seen.append, timeout=T
            )
            assert (await h.wait()).exit_code == 0
            assert "".join(seen) == "a\nb\n"

            cat = await sbx.commands.run("cat", background=True, stdin=True, timeout=T)
            await sbx.commands.send_stdin(cat.pid, "x\n")
            assert cat.pid in {p.pid for p in await sbx.commands.list()}
            assert await sbx.commands.kill(cat.pid) is True

            slow = await sbx.commands.run("sleep 1; echo late", background=True, timeout=T)
            again = await sbx.commands.connect(slow.pid)
            assert (await again.wait()).stdout == "late\n"

            d = f"/tmp/{uuid.uuid4().hex}"
            await sbx.files.write(f"{d}/a.txt", "async")
            await sbx.files.write(f"{d}/b.bin", b"\x01")
            assert await sbx.files.read(f"{d}/a.txt") == "async"
            assert bytes(await sbx.files.read(f"{d}/b.bin", format="bytes")) == b"\x01"
            assert [e.name for e in await sbx.files.list(d)] == ["a.txt", "b.bin"]
            assert await sbx.files.exists(f"{d}/a.txt") is True
            assert (await sbx.files.get_info(f"{d}/a.txt")).size == 5
            assert await sbx.files.make_dir(f"{d}/e") is True
            await sbx.files.rename(f"{d}/b.bin", f"{d}/e/b.bin")
            await sbx.files.remove(f"{d}/e")
            assert await sbx.files.exists(f"{d}/e") is False

            events = []
            got = asyncio.Event()

            def on_event(e) -> None:
                events.append(e)
                got.set()

            wh = await sbx.files.watch_dir(d, on_event=on_event)
            try:
                await sbx.files.write(f"{d}/w.txt", "w")
                await asyncio.wait_for(got.wait(), 30)
                assert ("w.txt", "create") in [(e.name, e.type.value) for e in events]
            finally:
                await wh.stop()
        finally:
            await sbx.kill()

    asyncio.run(main())


def test_a_paused_sandbox_resumes_on_use_and_a_killed_one_is_gone(daemon) -> None:
    sbx = Sandbox.create(timeout=300)
    assert sbx.is_running() is True
    sbx.files.write("/tmp/kept.txt", "kept")
    # Paused through shoald's own API (whatever the SDK version calls it).
    daemon.api("POST", f"/v1/sandboxes/{sbx.sandbox_id}/pause", {})
    assert sbx.is_running() is False
    # Any other data-plane call resumes it.
    assert sbx.commands.run("cat /tmp/kept.txt", timeout=T).stdout == "kept"
    assert sbx.is_running() is True
    h = sbx.commands.run("sleep 60", background=True)
    assert sbx.kill() is True
    assert sbx.is_running() is False
    # The stream of a command of a sandbox that went ends (no hang).
    with pytest.raises(SandboxException):
        h.wait()
    with pytest.raises(SandboxException):
        sbx.commands.run("echo hi")
