"""What only an asyncio client does: many calls at once from one event
loop, and the RL rollout shape (fork, fan out, gather); and the one
full-VM test (its boot is too long to run through both clients)."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

import shoal
from conftest import POOL, TEMPLATE


async def test_100_concurrent_calls_from_one_loop(aclient):
    """100 calls at once over sandboxes taken from the warm pool, 20 of
    them execs and 80 file reads: every one answers with its own result.
    (Not 100 execs: each starts a guest process, ~0.5-2 s of emulated
    guest kernel on a PVM host, and 10 per guest overran the daemon's
    300 s call deadline on a loaded one. A file read is the agent's own
    work, no process.)"""
    sbs = await asyncio.gather(*(aclient.create(template=TEMPLATE) for _ in range(POOL)))
    try:
        assert sum(1 for s in sbs if s.info.from_pool) >= 1, "no sandbox came from the pool"
        await asyncio.gather(
            *(s.files.write("/tmp/who", f"sb{k}".encode()) for k, s in enumerate(sbs))
        )
        t0 = time.monotonic()
        execs = [sbs[i % len(sbs)].exec(["echo", f"n{i}"], check=True) for i in range(20)]
        reads = [sbs[i % len(sbs)].files.read("/tmp/who") for i in range(80)]
        results = await asyncio.gather(*execs, *reads)
        wall = time.monotonic() - t0
        ran, read = results[:20], results[20:]
        assert [r.text for r in ran] == [f"n{i}\n" for i in range(20)]
        assert read == [f"sb{i % len(sbs)}".encode() for i in range(80)]
        # Concurrency, not a timing claim: the sum of the execs' own
        # durations exceeds the wall time all the calls took together.
        assert sum(r.duration for r in ran) > wall, (wall, [r.duration for r in ran])
    finally:
        await asyncio.gather(*(s.kill() for s in sbs))


async def test_async_callbacks_are_awaited(asandbox):
    seen: list[bytes] = []

    async def slow(chunk: bytes) -> None:
        await asyncio.sleep(0.05)
        seen.append(chunk)

    r = await asandbox.exec("echo a; sleep 0.2; echo b", on_stdout=slow)
    assert b"".join(seen) == r.stdout == b"a\nb\n"


SERVER = (
    # A process whose state lives only in its memory: a token drawn at
    # start and a counter of the questions it answered.
    "tok=$$-$RANDOM$RANDOM; n=0; "
    "while :; do read c < /tmp/q; n=$((n+1)); echo \"$tok $n $c\" > /tmp/r.new; "
    "mv /tmp/r.new /tmp/r; done"
)
ASK = (
    "rm -f /tmp/r; echo {q} > /tmp/q; i=0; "
    "while [ ! -e /tmp/r ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; cat /tmp/r"
)


async def ask(sb: shoal.AsyncSandbox, q: str) -> tuple[str, int, str]:
    r = await sb.exec(ASK.format(q=q), check=True, timeout=60)
    tok, n, c = r.text.split()
    return tok, int(n), c


async def test_fork_clones_share_memory_and_files_then_diverge(aclient):
    src = await aclient.create(template=TEMPLATE, keep_running=True)
    clones: list[shoal.AsyncSandbox] = []
    try:
        # Detached (its own session), so it outlives the exec that starts it.
        await src.exec(
            ["sh", "-c", f"mkfifo /tmp/q && (setsid sh -c '{SERVER}' </dev/null >/dev/null 2>&1 &)"],
            check=True,
        )
        await src.files.write("/tmp/state.txt", b"before-fork")
        tok, n, _ = await ask(src, "src")
        assert n == 1
        clones = await src.fork(3)
        assert len(clones) == 3 and clones.failures == []
        assert len({c.id for c in clones} | {src.id}) == 4
        # Every clone has the process with its memory (same token, counter
        # at 1) and the file.
        for c in clones:
            assert c.info.state == "running"
            assert await c.files.read("/tmp/state.txt") == b"before-fork"
            assert await ask(c, c.id) == (tok, 2, c.id)
        # Then they diverge: each its own file and counter.
        for i, c in enumerate(clones):
            await c.files.write("/tmp/state.txt", f"clone-{i}")
            for _ in range(i):
                await ask(c, "again")
        for i, c in enumerate(clones):
            assert await c.files.read("/tmp/state.txt") == f"clone-{i}".encode()
            assert await ask(c, "last") == (tok, 3 + i, "last")
        assert await src.files.read("/tmp/state.txt") == b"before-fork"
        assert await ask(src, "src") == (tok, 2, "src")
        # Entropy is fresh per clone.
        rnd = [
            (await c.exec(["head", "-c16", "/dev/urandom"], check=True)).stdout for c in clones
        ]
        assert len(set(rnd)) == 3
    finally:
        await asyncio.gather(*(c.kill(missing_ok=True) for c in [src, *clones]))


async def test_rollout_example_shape(aclient):
    """The README's rollout: N sandboxes in parallel, exec, read a file,
    fork the best, clean up."""

    async def rollout(i: int) -> tuple[shoal.AsyncSandbox, int]:
        sb = await aclient.create(template=TEMPLATE, metadata={"rollout": "t"})
        await sb.exec(f"echo $(({i} * 7)) > /tmp/score", check=True)
        return sb, int(await sb.files.read_text("/tmp/score"))

    pairs = await asyncio.gather(*(rollout(i) for i in range(4)))
    try:
        best, score = max(pairs, key=lambda p: p[1])
        assert score == 21
        kids = await best.fork(2)
        try:
            for k in kids:
                assert (await k.files.read_text("/tmp/score")).strip() == "21"
        finally:
            await asyncio.gather(*(k.kill() for k in kids))
    finally:
        await asyncio.gather(*(sb.kill() for sb, _ in pairs))
    assert await aclient.list(metadata={"rollout": "t"}) == []


async def test_100_mib_upload_and_download_with_checksums(aclient, big_template, big_size):
    """``big_size`` (100 MiB) streamed in from a generator and back out in
    chunks, never whole in memory, SHA-256 on both sides; the guest sees
    the full size."""
    sb = await aclient.create(template=big_template)
    try:
        block = hashlib.sha256(b"seed").digest() * 32768  # 1 MiB
        sent = hashlib.sha256()

        def source():
            for i in range(big_size >> 20):
                piece = i.to_bytes(4, "little") + block[4:]
                sent.update(piece)
                yield piece

        assert await sb.files.write("/big.bin", source()) == big_size
        assert (await sb.files.stat("/big.bin")).size == big_size
        got = hashlib.sha256()
        total = 0
        async for c in sb.files.iter_read("/big.bin"):
            got.update(c)
            total += len(c)
        assert total == big_size and got.hexdigest() == sent.hexdigest()
    finally:
        await sb.kill()


async def test_a_vm_sandbox_with_its_screen_and_input(aclient):
    """The one full-VM test (a QEMU q35 boot: ~20-45 s on a PVM host,
    then a restore): run_vm makes the vm template on first use, the
    sandbox runs commands like any other, its screen is a PNG, input
    events are taken (a bad one is refused), and a microVM has no
    display."""
    args = shoal.VMArgs(command=["echo", "from q35"], metadata={"suite": "vm"})
    sb = await aclient.run_vm(args)
    try:
        assert sb.last_result is not None and sb.last_result.text == "from q35\n"
        t = await aclient.get_template(args.template_name())
        assert (t.kind, t.memory_mib, t.state) == ("vm", 256, "ready")
        # The sandbox says its kind itself, in every view of it.
        assert sb.kind == sb.info.kind == "vm"
        assert (await aclient.get(sb.id)).kind == "vm"
        png = await sb.screen()
        w, h = shoal.display.png_size(png)
        assert w >= 320 and h >= 200, (w, h)
        d = shoal.display
        await sb.input(d.move(100, 200) + d.key("shift") + d.type_text("ls -l\n"))
        with pytest.raises(shoal.BadRequest):
            await sb.input([{"type": "key", "key": "NO;quit", "down": True}])
        # The daemon's own check of the pointer range (the helpers refuse it first).
        with pytest.raises(shoal.BadRequest):
            await sb.input([{"type": "move", "x": 0, "y": 40000}])
        # Listed by its labels like any sandbox.
        listed = await aclient.list(metadata={"suite": "vm"})
        assert (listed[0].id, listed[0].kind) == (sb.id, "vm")
    finally:
        await sb.kill()
    async with aclient.sandbox(template=TEMPLATE) as micro:
        assert micro.kind == "microvm"
        with pytest.raises(shoal.Conflict):
            await micro.screen()
