"""FnCall through the SDK (``run_fncall``, ``map_fncall``, both clients)
against a real shoald and real guests."""

from __future__ import annotations

import pytest

import shoal


@pytest.fixture
def fclient(fncall_daemon):
    with shoal.Shoal(fncall_daemon.sock, autostart=False, timeout=600) as c:
        yield c


@pytest.fixture
async def afclient(fncall_daemon):
    async with shoal.AsyncShoal(fncall_daemon.sock, autostart=False, timeout=600) as c:
        yield c


def test_run_fncall_python_stdin_files_and_exit_codes(fclient):
    r = fclient.run_fncall(language="python", code="print(6 * 7)")
    assert isinstance(r, shoal.FnCallResult)
    assert (r.status, r.ok, r.stdout, r.exit_code) == ("success", True, "42\n", 0)
    assert r.duration_ms > 0 and r.total_ms >= r.duration_ms
    code = (
        "import sys\n"
        "data = open('in/data.bin', 'rb').read()\n"
        "open('out.txt', 'w').write(sys.stdin.read().upper() + str(len(data)))\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    r = fclient.run_fncall(
        shoal.FnCallArgs(
            language="python",
            code=code,
            stdin="abc",
            files={"in/data.bin": b"\x00\x01\x02"},
            fetch_files=["out.txt", "missing.txt"],
        )
    )
    assert (r.status, r.exit_code, r.stderr) == ("failed", 3, "to stderr\n")
    assert r.files == {"out.txt": b"ABC3"}


def test_run_fncall_refusals_and_timeouts(fclient):
    with pytest.raises(shoal.BadRequest, match="unknown language"):
        fclient.run_fncall(language="cobol", code="x")
    with pytest.raises(shoal.BadRequest, match="timeout_s"):
        fclient.run_fncall(language="python", code="x", timeout_s=-1)
    r = fclient.run_fncall(language="python", code="while True: pass", timeout_s=1)
    assert r.status == "timeout" and r.exit_code is None


async def test_map_fncall_keeps_the_order_and_reports_refused_calls(afclient):
    # Generous timeouts: a busy host must not turn this into a timing test.
    calls = [shoal.FnCallArgs("python", f"print({i} * {i})", timeout_s=60) for i in range(12)]
    calls.insert(5, shoal.FnCallArgs("cobol", "x"))
    rs = await afclient.map_fncall(calls, concurrency=4)
    assert len(rs) == 13
    bad = rs.pop(5)
    assert bad.status == "sandbox_error" and "unknown language" in (bad.error or "")
    assert [r.stdout for r in rs] == [f"{i * i}\n" for i in range(12)]
    assert all(r.ok for r in rs), [(r.status, r.exit_code, r.stderr, r.error) for r in rs]


def test_map_fncall_sync_and_bash(fclient):
    rs = fclient.map_fncall(
        [
            shoal.FnCallArgs("bash", "echo $((1 + 2)); exit 4", timeout_s=60),
            shoal.FnCallArgs("python", "1/0", timeout_s=60),
        ]
    )
    assert (rs[0].status, rs[0].stdout, rs[0].exit_code) == ("failed", "3\n", 4)
    assert rs[1].status == "failed" and "ZeroDivisionError" in rs[1].stderr
