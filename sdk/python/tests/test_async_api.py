"""Every call of the client against the real daemon, through the asyncio
client. ``test_sync_api.py`` is made from this file by
``tools/gen_sync.py`` (the same tests through the sync client)."""

from __future__ import annotations

import hashlib
import io
import time

import pytest

import shoal
from conftest import TEMPLATE


async def test_create_get_list_info_kill(aclient):
    sb = await aclient.create(
        template=TEMPLATE, metadata={"suite": "py", "case": "list"}, env={"GREETING": "hi"}
    )
    try:
        assert len(sb.id) == 12 and sb.info.state == "running"
        assert sb.info.template == TEMPLATE and sb.info.memory_mib == 128
        assert sb.info.metadata == {"suite": "py", "case": "list"}
        again = await aclient.get(sb.id)
        assert again.id == sb.id and again.info.env == {"GREETING": "hi"}
        ids = [s.id for s in await aclient.list(metadata={"case": "list"})]
        assert ids == [sb.id]
        assert sb.id in [s.id for s in await aclient.list(state="running")]
        assert await aclient.list(metadata={"case": "none-such"}) == []
        info = await sb.refresh()
        assert info.last_active >= info.created_at > 0
        r = await sb.exec("echo $GREETING")
        assert r.text == "hi\n"
    finally:
        await sb.kill()
    with pytest.raises(shoal.SandboxNotFound):
        await aclient.get(sb.id)
    await sb.kill(missing_ok=True)
    with pytest.raises(shoal.SandboxNotFound):
        await sb.kill()


async def test_context_managers_remove_the_sandbox(aclient):
    async with aclient.sandbox(template=TEMPLATE) as sb:
        assert (await sb.exec(["true"])).ok
    with pytest.raises(shoal.SandboxNotFound):
        await aclient.get(sb.id)
    async with await aclient.create(template=TEMPLATE) as sb2:
        pass
    with pytest.raises(shoal.SandboxNotFound):
        await sb2.refresh()


async def test_exec_results_env_cwd_stdin_timeouts(asandbox):
    r = await asandbox.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.stdout, r.stderr, r.exit_code, r.ok, r.code) == (b"out\n", b"err\n", 3, False, 3)
    assert r.duration > 0
    r = await asandbox.exec(shell="echo $A-$B; pwd", env={"A": "1", "B": "2"}, cwd="/tmp")
    assert r.text == "1-2\n/tmp\n"
    r = await asandbox.exec(["cat"], stdin=b"\x00\xffbinary")
    assert r.stdout == b"\x00\xffbinary"
    r = await asandbox.exec(["cat"], stdin="text in")
    assert r.text == "text in"
    # Larger than the inline limit, from a file object: streamed through a
    # background command's stdin.
    blob = bytes(range(256)) * 4096  # 1 MiB
    r = await asandbox.exec(["sh", "-c", "wc -c"], stdin=io.BytesIO(blob))
    assert r.text.strip() == str(len(blob))
    r = await asandbox.exec(["sh", "-c", "kill -9 $$"])
    assert (r.exit_code, r.signal, r.code) == (None, 9, 137)
    with pytest.raises(shoal.CommandFailed) as e:
        await asandbox.exec("echo nope >&2; exit 7", check=True)
    assert e.value.result.exit_code == 7 and "nope" in str(e.value)
    t0 = time.monotonic()
    r = await asandbox.exec(["sleep", "30"], timeout=1)
    assert r.timed_out and not r.ok and time.monotonic() - t0 < 20
    with pytest.raises(shoal.CommandTimedOut):
        await asandbox.exec(["sleep", "30"], timeout=1, check=True)
    assert (await asandbox.exec(["true"], check=True)).ok


async def test_streaming_callbacks_events_and_a_slow_consumer(asandbox):
    out: list[bytes] = []
    err: list[bytes] = []
    r = await asandbox.exec(
        "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert b"".join(out) == b"o1\no2\no3\n" == r.stdout and b"".join(err) == r.stderr
    assert len(out) >= 2, "the output came in one piece: not streamed"
    events = [ev async for ev in asandbox.exec_stream(["sh", "-c", "echo a; exit 4"])]
    assert [e.type for e in events][0] == "start" and events[0].pid
    assert events[-1].type == "exit" and events[-1].exit_code == 4
    assert b"".join(e.data for e in events if e.type == "stdout") == b"a\n"
    # A slow consumer: 512 KiB of output read with pauses;
    # nothing lost, in order.
    got = bytearray()
    n = 0
    script = "head -c 524288 /dev/zero | tr '\\0' x"
    async for ev in asandbox.exec_stream(script):
        if ev.type == "stdout":
            got += ev.data
            n += 1
            time.sleep(0.05)
        elif ev.type == "exit":
            assert ev.exit_code == 0
    assert got == b"x" * 524288 and n > 1


async def test_files(asandbox):
    f = asandbox.files
    assert await f.write("/tmp/a.txt", b"hello") == 5
    assert await f.read("/tmp/a.txt") == b"hello"
    assert await f.write("/tmp/a.txt", " world", append=True) == 6
    assert await f.read_text("/tmp/a.txt") == "hello world"
    await f.write("/tmp/deep/er/x.bin", io.BytesIO(b"\x01\x02"), parents=True, mode=0o600)
    st = await f.stat("/tmp/deep/er/x.bin")
    assert (st.type, st.size, st.mode & 0o777, st.is_file) == ("file", 2, 0o600, True)
    await f.write("/tmp/it.txt", [b"a", b"b", "c"])
    assert await f.read("/tmp/it.txt") == b"abc"
    sink = io.BytesIO()
    assert await f.read_to("/tmp/it.txt", sink) == 3 and sink.getvalue() == b"abc"
    names = {e.name: e.type for e in await f.list("/tmp")}
    assert names["a.txt"] == "file" and names["deep"] == "dir"
    assert await f.exists("/tmp/a.txt") and not await f.exists("/tmp/none")
    await f.mkdir("/tmp/m/n/o", parents=True)
    assert (await f.stat("/tmp/m/n/o")).is_dir
    await f.mkdir("/tmp/m/n/o", parents=True)  # exists: fine with parents
    await f.mkdir("/tmp/single")
    with pytest.raises(shoal.ShoalError):
        await f.mkdir("/tmp/single")
    await f.rename("/tmp/a.txt", "/tmp/m/b.txt")
    assert not await f.exists("/tmp/a.txt")
    assert await f.read("/tmp/m/b.txt") == b"hello world"
    await f.remove("/tmp/m/b.txt")
    await f.remove("/tmp/m", recursive=True)
    assert not await f.exists("/tmp/m")
    with pytest.raises(shoal.FileNotFound):
        await f.read("/tmp/none")
    with pytest.raises(shoal.FileNotFound):
        await f.stat("/tmp/none")
    with pytest.raises(shoal.BadRequest):
        await f.read("relative/path")


async def test_background_commands(asandbox):
    c = await asandbox.start(
        ["sh", "-c", "read line; echo got:$line; read more; echo then:$more; sleep 60"],
        stdin=True,
    )
    assert c.id and c.pid and c.info.state == "running"
    await c.write_stdin(b"one\n")
    # Re-attached by id, as another process would.
    again = await asandbox.command(c.id)
    assert again.id == c.id and again.pid == c.pid
    assert c.id in [x.id for x in await asandbox.commands()]
    await again.write_stdin("two\n", close=True)
    seen = b""
    async for ev in again.stream():
        if ev.type == "stdout":
            seen += ev.data
            if b"then:two" in seen:
                break
    assert b"got:one\n" in seen and b"then:two\n" in seen
    with pytest.raises(shoal.Timeout):
        await c.wait(timeout=0.5)
    await c.signal("TERM")
    r = await c.wait()
    assert r.signal == 15 and r.exit_code is None
    assert b"got:one" in r.stdout
    assert (await c.refresh()).state == "exited"
    # Output to callbacks, and a clean exit.
    c2 = await asandbox.start("echo done; exit 5")
    chunks: list[bytes] = []
    r2 = await c2.wait(on_stdout=chunks.append)
    assert r2.exit_code == 5 and b"".join(chunks) == b"done\n"
    with pytest.raises(shoal.CommandFailed):
        await (await asandbox.start("exit 2")).wait(check=True)
    with pytest.raises(shoal.CommandNotFound):
        await asandbox.command("999999")


async def test_pause_resume_snapshot_ttl(aclient, asandbox):
    await asandbox.files.write("/tmp/keep", b"kept")
    assert (await asandbox.pause()).state == "paused"
    assert (await asandbox.refresh()).state == "paused"
    assert (await asandbox.resume()).state == "running"
    assert await asandbox.files.read("/tmp/keep") == b"kept"
    await asandbox.pause()
    r = await asandbox.exec(["cat", "/tmp/keep"])  # resumes first
    assert r.stdout == b"kept" and (await asandbox.refresh()).state == "running"
    name = f"py-snap-{asandbox.id}"
    t = await asandbox.snapshot(template=name)
    assert t.name == name and t.state == "ready"
    assert name in [x.name for x in await aclient.list_templates()]
    async with aclient.sandbox(template=name) as copy:
        assert await copy.files.read("/tmp/keep") == b"kept"
    await aclient.delete_template(name)
    with pytest.raises(shoal.TemplateNotFound):
        await aclient.get_template(name)
    # The TTL counts from now: the daemon keeps it from creation.
    info = await asandbox.set_ttl(3600, idle_timeout_s=600)
    age = time.time() - info.created_at
    assert 3600 <= info.ttl_s <= 3600 + age + 2 and info.idle_timeout_s == 600
    assert (await asandbox.refresh()).ttl_s == info.ttl_s
    info = await asandbox.set_ttl(0)
    assert info.ttl_s == 0 and info.idle_timeout_s == 600


async def test_network_is_opt_in_and_its_policy_changes_live(aclient, asandbox):
    # No device unless asked; one cannot be added later.
    assert asandbox.info.network is None and asandbox.info.guest_addr is None
    with pytest.raises(shoal.Conflict):
        await asandbox.set_network(shoal.Network(allow_out=["192.0.2.1"], allow_dns=False))
    first = shoal.Network(allow_out=["192.0.2.1:443"], allow_dns=False)
    async with aclient.sandbox(image="tiny", network=first) as sb:
        assert sb.info.network == first and sb.info.guest_addr
        # The agent gave the guest its slot's address and resolver.
        r = await sb.exec(["sh", "-c", "cat /etc/resolv.conf; ip -4 addr show eth0"])
        assert b"nameserver" in r.stdout and sb.info.guest_addr.encode() in r.stdout
        later = shoal.Network(allow_out=[], deny_out=["192.0.2.0/24"], allow_dns=False)
        assert (await sb.set_network(later)).network == later
        assert (await sb.refresh()).network == later
        with pytest.raises(shoal.BadRequest):
            await sb.set_network({"allow_out": ["10.0.0.0/33"], "allow_dns": False})


async def test_cpu_classes_on_create_and_changed_live(aclient):
    async with aclient.sandbox(image="tiny", priority="best_effort") as sb:
        assert sb.info.priority == "best_effort"
        # Not asked for: a best-effort sandbox gets no SMT isolation.
        assert sb.info.smt_isolation is False
        assert (await sb.exec(["echo", "idle"])).stdout == b"idle\n"
        assert (await sb.refresh()).priority == "best_effort"
        info = await sb.set_priority("latency")
        assert info.priority == "latency" and info.smt_isolation is not None
        # Where the kernel lacks core scheduling, the reply says so.
        assert info.smt_isolation or any("SMT" in w for w in info.warnings)
        with pytest.raises(shoal.BadRequest, match="best_effort"):
            await sb.set_priority("urgent")
    with pytest.raises(shoal.BadRequest, match="best_effort"):
        await aclient.create(image="tiny", priority="high")


async def test_errors_bad_ids_and_arguments(aclient):
    with pytest.raises(shoal.SandboxNotFound) as e:
        await aclient.get("000000000000")
    assert e.value.status == 404 and e.value.code == "not_found"
    with pytest.raises(shoal.BadRequest):
        await aclient.get("../v1/stats")
    with pytest.raises(shoal.TemplateNotFound):
        await aclient.create(template="no-such-template")
    with pytest.raises(shoal.BadRequest) as e:
        await aclient.create(image="tiny", vcpus=100000)
    assert e.value.status == 400
    with pytest.raises(shoal.BadRequest):
        await aclient.create(image="tiny", template=TEMPLATE)
    with pytest.raises(shoal.BadRequest):
        await aclient.create(template=TEMPLATE, metadata={"k" * 200: "v"})
    with pytest.raises(shoal.BadRequest):
        await aclient.list(state="sleepy")
    gone = await aclient.create(template=TEMPLATE)
    await gone.kill()
    with pytest.raises(shoal.SandboxNotFound):
        await gone.exec(["true"])
    with pytest.raises(shoal.SandboxNotFound):
        await gone.files.read("/etc/passwd")
    with pytest.raises(shoal.BadRequest):
        await gone.exec()


async def test_per_kind_entry_points(aclient):
    sb = await aclient.run_microvm(shoal.MicroVMArgs(template=TEMPLATE, command=["echo", "up"]))
    try:
        assert sb.last_result is not None and sb.last_result.text == "up\n"
    finally:
        await sb.kill()
    with pytest.raises(shoal.KindNotAvailable, match="not available on this daemon yet"):
        await aclient.run_container(shoal.ContainerArgs(image="debian:12"))
    # A vm from a disk of one's own: the daemon takes disks from under its
    # layers directory only (checked before anything boots).
    with pytest.raises(shoal.BadRequest, match="layers directory"):
        await aclient.run_vm(shoal.VMArgs(disk_image="/x.img"))
    # A template of another kind is not taken for a vm one.
    with pytest.raises(shoal.Conflict, match="not a vm template"):
        await aclient.run_vm(shoal.VMArgs(template=TEMPLATE))


async def test_daemon_calls(aclient):
    assert await aclient.health()
    st = await aclient.stats()
    assert "usage" in st and "limits" in st
    pools = {p.template: p for p in await aclient.pools()}
    assert pools[TEMPLATE].target >= 1
    t = await aclient.get_template(TEMPLATE)
    assert t.state == "ready" and t.source == "image:tiny"


async def test_upload_and_download_checksums(asandbox):
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

    assert await asandbox.files.write("/tmp/big.bin", source()) == 4 << 20
    r = await asandbox.exec(["sha256sum", "/tmp/big.bin"], check=True)
    assert r.text.split()[0] == want.hexdigest()
    got = hashlib.sha256()
    async for c in asandbox.files.iter_read("/tmp/big.bin", chunk_size=65536):
        got.update(c)
    assert got.hexdigest() == want.hexdigest()
