# Generated from test_async_api.py by tools/gen_sync.py: do not edit.
"""Every call of the client against the real daemon, through the sync
client (made from ``test_async_api.py`` by ``tools/gen_sync.py``: do not
edit)."""

from __future__ import annotations

import hashlib
import io
import time

import pytest

import shoal
from conftest import TEMPLATE


def test_create_get_list_info_kill(client):
    sb = client.create(
        template=TEMPLATE, metadata={"suite": "py", "case": "list"}, env={"GREETING": "hi"}
    )
    try:
        assert len(sb.id) == 12 and sb.info.state == "running"
        assert sb.info.template == TEMPLATE and sb.info.memory_mib == 128
        assert sb.info.metadata == {"suite": "py", "case": "list"}
        again = client.get(sb.id)
        assert again.id == sb.id and again.info.env == {"GREETING": "hi"}
        ids = [s.id for s in client.list(metadata={"case": "list"})]
        assert ids == [sb.id]
        assert sb.id in [s.id for s in client.list(state="running")]
        assert client.list(metadata={"case": "none-such"}) == []
        info = sb.refresh()
        assert info.last_active >= info.created_at > 0
        r = sb.exec("echo $GREETING")
        assert r.text == "hi\n"
    finally:
        sb.kill()
    with pytest.raises(shoal.SandboxNotFound):
        client.get(sb.id)
    sb.kill(missing_ok=True)
    with pytest.raises(shoal.SandboxNotFound):
        sb.kill()


def test_context_managers_remove_the_sandbox(client):
    with client.sandbox(template=TEMPLATE) as sb:
        assert (sb.exec(["true"])).ok
    with pytest.raises(shoal.SandboxNotFound):
        client.get(sb.id)
    with client.create(template=TEMPLATE) as sb2:
        pass
    with pytest.raises(shoal.SandboxNotFound):
        sb2.refresh()


def test_exec_results_env_cwd_stdin_timeouts(sandbox):
    r = sandbox.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.stdout, r.stderr, r.exit_code, r.ok, r.code) == (b"out\n", b"err\n", 3, False, 3)
    assert r.duration > 0
    r = sandbox.exec(shell="echo $A-$B; pwd", env={"A": "1", "B": "2"}, cwd="/tmp")
    assert r.text == "1-2\n/tmp\n"
    r = sandbox.exec(["cat"], stdin=b"\x00\xffbinary")
    assert r.stdout == b"\x00\xffbinary"
    r = sandbox.exec(["cat"], stdin="text in")
    assert r.text == "text in"
    # Larger than the inline limit, from a file object: streamed through a
    # background command's stdin.
    blob = bytes(range(256)) * 4096  # 1 MiB
    r = sandbox.exec(["sh", "-c", "wc -c"], stdin=io.BytesIO(blob))
    assert r.text.strip() == str(len(blob))
    r = sandbox.exec(["sh", "-c", "kill -9 $$"])
    assert (r.exit_code, r.signal, r.code) == (None, 9, 137)
    with pytest.raises(shoal.CommandFailed) as e:
        sandbox.exec("echo nope >&2; exit 7", check=True)
    assert e.value.result.exit_code == 7 and "nope" in str(e.value)
    t0 = time.monotonic()
    r = sandbox.exec(["sleep", "30"], timeout=1)
    assert r.timed_out and not r.ok and time.monotonic() - t0 < 20
    with pytest.raises(shoal.CommandTimedOut):
        sandbox.exec(["sleep", "30"], timeout=1, check=True)
    assert (sandbox.exec(["true"], check=True)).ok


def test_streaming_callbacks_events_and_a_slow_consumer(sandbox):
    out: list[bytes] = []
    err: list[bytes] = []
    r = sandbox.exec(
        "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert b"".join(out) == b"o1\no2\no3\n" == r.stdout and b"".join(err) == r.stderr
    assert len(out) >= 2, "the output came in one piece: not streamed"
    events = [ev for ev in sandbox.exec_stream(["sh", "-c", "echo a; exit 4"])]
    assert [e.type for e in events][0] == "start" and events[0].pid
    assert events[-1].type == "exit" and events[-1].exit_code == 4
    assert b"".join(e.data for e in events if e.type == "stdout") == b"a\n"
    # A slow consumer: 512 KiB of output read with pauses;
    # nothing lost, in order.
    got = bytearray()
    n = 0
    script = "head -c 524288 /dev/zero | tr '\\0' x"
    for ev in sandbox.exec_stream(script):
        if ev.type == "stdout":
            got += ev.data
            n += 1
            time.sleep(0.05)
        elif ev.type == "exit":
            assert ev.exit_code == 0
    assert got == b"x" * 524288 and n > 1


def test_files(sandbox):
    f = sandbox.files
    assert f.write("/tmp/a.txt", b"hello") == 5
    assert f.read("/tmp/a.txt") == b"hello"
    assert f.write("/tmp/a.txt", " world", append=True) == 6
    assert f.read_text("/tmp/a.txt") == "hello world"
    f.write("/tmp/deep/er/x.bin", io.BytesIO(b"\x01\x02"), parents=True, mode=0o600)
    st = f.stat("/tmp/deep/er/x.bin")
    assert (st.type, st.size, st.mode & 0o777, st.is_file) == ("file", 2, 0o600, True)
    f.write("/tmp/it.txt", [b"a", b"b", "c"])
    assert f.read("/tmp/it.txt") == b"abc"
    sink = io.BytesIO()
    assert f.read_to("/tmp/it.txt", sink) == 3 and sink.getvalue() == b"abc"
    names = {e.name: e.type for e in f.list("/tmp")}
    assert names["a.txt"] == "file" and names["deep"] == "dir"
    assert f.exists("/tmp/a.txt") and not f.exists("/tmp/none")
    f.mkdir("/tmp/m/n/o", parents=True)
    assert (f.stat("/tmp/m/n/o")).is_dir
    f.mkdir("/tmp/m/n/o", parents=True)  # exists: fine with parents
    f.mkdir("/tmp/single")
    with pytest.raises(shoal.ShoalError):
        f.mkdir("/tmp/single")
    f.rename("/tmp/a.txt", "/tmp/m/b.txt")
    assert not f.exists("/tmp/a.txt")
    assert f.read("/tmp/m/b.txt") == b"hello world"
    f.remove("/tmp/m/b.txt")
    f.remove("/tmp/m", recursive=True)
    assert not f.exists("/tmp/m")
    with pytest.raises(shoal.FileNotFound):
        f.read("/tmp/none")
    with pytest.raises(shoal.FileNotFound):
        f.stat("/tmp/none")
    with pytest.raises(shoal.BadRequest):
        f.read("relative/path")


def test_background_commands(sandbox):
    c = sandbox.start(
        ["sh", "-c", "read line; echo got:$line; read more; echo then:$more; sleep 60"],
        stdin=True,
    )
    assert c.id and c.pid and c.info.state == "running"
    c.write_stdin(b"one\n")
    # Re-attached by id, as another process would.
    again = sandbox.command(c.id)
    assert again.id == c.id and again.pid == c.pid
    assert c.id in [x.id for x in sandbox.commands()]
    again.write_stdin("two\n", close=True)
    seen = b""
    for ev in again.stream():
        if ev.type == "stdout":
            seen += ev.data
            if b"then:two" in seen:
                break
    assert b"got:one\n" in seen and b"then:two\n" in seen
    with pytest.raises(shoal.Timeout):
        c.wait(timeout=0.5)
    c.signal("TERM")
    r = c.wait()
    assert r.signal == 15 and r.exit_code is None
    assert b"got:one" in r.stdout
    assert (c.refresh()).state == "exited"
    # Output to callbacks, and a clean exit.
    c2 = sandbox.start("echo done; exit 5")
    chunks: list[bytes] = []
    r2 = c2.wait(on_stdout=chunks.append)
    assert r2.exit_code == 5 and b"".join(chunks) == b"done\n"
    with pytest.raises(shoal.CommandFailed):
        (sandbox.start("exit 2")).wait(check=True)
    with pytest.raises(shoal.CommandNotFound):
        sandbox.command("999999")


def test_pause_resume_snapshot_ttl(client, sandbox):
    sandbox.files.write("/tmp/keep", b"kept")
    assert (sandbox.pause()).state == "paused"
    assert (sandbox.refresh()).state == "paused"
    assert (sandbox.resume()).state == "running"
    assert sandbox.files.read("/tmp/keep") == b"kept"
    sandbox.pause()
    r = sandbox.exec(["cat", "/tmp/keep"])  # resumes first
    assert r.stdout == b"kept" and (sandbox.refresh()).state == "running"
    name = f"py-snap-{sandbox.id}"
    t = sandbox.snapshot(template=name)
    assert t.name == name and t.state == "ready"
    assert name in [x.name for x in client.list_templates()]
    with client.sandbox(template=name) as copy:
        assert copy.files.read("/tmp/keep") == b"kept"
    client.delete_template(name)
    with pytest.raises(shoal.TemplateNotFound):
        client.get_template(name)
    # The TTL counts from now: the daemon keeps it from creation.
    info = sandbox.set_ttl(3600, idle_timeout_s=600)
    age = time.time() - info.created_at
    assert 3600 <= info.ttl_s <= 3600 + age + 2 and info.idle_timeout_s == 600
    assert (sandbox.refresh()).ttl_s == info.ttl_s
    info = sandbox.set_ttl(0)
    assert info.ttl_s == 0 and info.idle_timeout_s == 600


def test_network_is_opt_in_and_its_policy_changes_live(client, sandbox):
    # No device unless asked; one cannot be added later.
    assert sandbox.info.network is None and sandbox.info.guest_addr is None
    with pytest.raises(shoal.Conflict):
        sandbox.set_network(shoal.Network(allow_out=["192.0.2.1"], allow_dns=False))
    first = shoal.Network(allow_out=["192.0.2.1:443"], allow_dns=False)
    with client.sandbox(image="tiny", network=first) as sb:
        assert sb.info.network == first and sb.info.guest_addr
        # The agent gave the guest its slot's address and resolver.
        r = sb.exec(["sh", "-c", "cat /etc/resolv.conf; ip -4 addr show eth0"])
        assert b"nameserver" in r.stdout and sb.info.guest_addr.encode() in r.stdout
        later = shoal.Network(allow_out=[], deny_out=["192.0.2.0/24"], allow_dns=False)
        assert (sb.set_network(later)).network == later
        assert (sb.refresh()).network == later
        with pytest.raises(shoal.BadRequest):
            sb.set_network({"allow_out": ["10.0.0.0/33"], "allow_dns": False})


def test_cpu_classes_on_create_and_changed_live(client):
    with client.sandbox(image="tiny", priority="best_effort") as sb:
        assert sb.info.priority == "best_effort"
        # Not asked for: a best-effort sandbox gets no SMT isolation.
        assert sb.info.smt_isolation is False
        assert (sb.exec(["echo", "idle"])).stdout == b"idle\n"
        assert (sb.refresh()).priority == "best_effort"
        info = sb.set_priority("latency")
        assert info.priority == "latency" and info.smt_isolation is not None
        # Where the kernel lacks core scheduling, the reply says so.
        assert info.smt_isolation or any("SMT" in w for w in info.warnings)
        with pytest.raises(shoal.BadRequest, match="best_effort"):
            sb.set_priority("urgent")
    with pytest.raises(shoal.BadRequest, match="best_effort"):
        client.create(image="tiny", priority="high")


def test_errors_bad_ids_and_arguments(client):
    with pytest.raises(shoal.SandboxNotFound) as e:
        client.get("000000000000")
    assert e.value.status == 404 and e.value.code == "not_found"
    with pytest.raises(shoal.BadRequest):
        client.get("../v1/stats")
    with pytest.raises(shoal.TemplateNotFound):
        client.create(template="no-such-template")
    with pytest.raises(shoal.BadRequest) as e:
        client.create(image="tiny", vcpus=100000)
    assert e.value.status == 400
    with pytest.raises(shoal.BadRequest):
        client.create(image="tiny", template=TEMPLATE)
    with pytest.raises(shoal.BadRequest):
        client.create(template=TEMPLATE, metadata={"k" * 200: "v"})
    with pytest.raises(shoal.BadRequest):
        client.list(state="sleepy")
    gone = client.create(template=TEMPLATE)
    gone.kill()
    with pytest.raises(shoal.SandboxNotFound):
        gone.exec(["true"])
    with pytest.raises(shoal.SandboxNotFound):
        gone.files.read("/etc/passwd")
    with pytest.raises(shoal.BadRequest):
        gone.exec()


def test_per_kind_entry_points(client):
    sb = client.run_microvm(shoal.MicroVMArgs(template=TEMPLATE, command=["echo", "up"]))
    try:
        assert sb.last_result is not None and sb.last_result.text == "up\n"
    finally:
        sb.kill()
    with pytest.raises(shoal.KindNotAvailable, match="not available on this daemon yet"):
        client.run_container(shoal.ContainerArgs(image="debian:12"))
    # A vm from a disk of one's own: the daemon takes disks from under its
    # layers directory only (checked before anything boots).
    with pytest.raises(shoal.BadRequest, match="layers directory"):
        client.run_vm(shoal.VMArgs(disk_image="/x.img"))
    # A template of another kind is not taken for a vm one.
    with pytest.raises(shoal.Conflict, match="not a vm template"):
        client.run_vm(shoal.VMArgs(template=TEMPLATE))


def test_daemon_calls(client):
    assert client.health()
    st = client.stats()
    assert "usage" in st and "limits" in st
    pools = {p.template: p for p in client.pools()}
    assert pools[TEMPLATE].target >= 1
    t = client.get_template(TEMPLATE)
    assert t.state == "ready" and t.source == "image:tiny"


def test_upload_and_download_checksums(sandbox):
    """4 MiB streamed in from a generator and back out, SHA-256 on both
    sides and the guest's own (the 100 MiB transfer is in
    test_async_only.py)."""
    chunk = hashlib.sha256(b"seed").digest() * 32768  # 1 MiB
    want = hashlib.sha256()

    def source():
        for i in range(4):
            piece = bytes([i]) + chunk[1:]
            want.update(piece)
            yield piece

    assert sandbox.files.write("/tmp/big.bin", source()) == 4 << 20
    r = sandbox.exec(["sha256sum", "/tmp/big.bin"], check=True)
    assert r.text.split()[0] == want.hexdigest()
    got = hashlib.sha256()
    for c in sandbox.files.iter_read("/tmp/big.bin", chunk_size=65536):
        got.update(c)
    assert got.hexdigest() == want.hexdigest()
