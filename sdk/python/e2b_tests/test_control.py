"""The control plane with the stock SDK: create with metadata and envs,
get_info, set_timeout, list with filters and pages, pause and connect,
fork, snapshots, metrics, logs, kill, a wrong API key; sync and async."""

from __future__ import annotations

import datetime as dt
import uuid

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException

from conftest import TEMPLATE, e2b_version


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _list(query: SandboxQuery, **kw) -> list:
    """Every page of ``Sandbox.list``."""
    p = Sandbox.list(query=query, **kw)
    out = []
    while p.has_next:
        out.extend(p.next_items())
    return out


def test_create_get_info_timeout_list_kill(daemon) -> None:
    run = uuid.uuid4().hex
    sbx = Sandbox.create(metadata={"run": run, "who": "a b&c"}, envs={"FOO": "bar"}, timeout=60)
    try:
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.template_id == TEMPLATE
        assert info.metadata == {"run": run, "who": "a b&c"}
        assert info.state == SandboxState.RUNNING
        assert info.cpu_count >= 1 and info.memory_mb == 256
        left = (info.end_at - _now()).total_seconds()
        assert 30 < left <= 61, left
        assert abs((info.started_at - _now()).total_seconds()) < 60

        sbx.set_timeout(600)
        left = (sbx.get_info().end_at - _now()).total_seconds()
        assert 500 < left <= 601, left

        other = Sandbox.create(metadata={"run": run, "who": "other"}, timeout=60)
        try:
            mine = _list(SandboxQuery(metadata={"run": run, "who": "a b&c"}))
            assert [s.sandbox_id for s in mine] == [sbx.sandbox_id]
            both = _list(SandboxQuery(metadata={"run": run}), limit=1)
            assert sorted(s.sandbox_id for s in both) == sorted([sbx.sandbox_id, other.sandbox_id])
            paused = _list(SandboxQuery(metadata={"run": run}, state=[SandboxState.PAUSED]))
            assert paused == []
            assert all(s.metadata["run"] == run for s in both)
        finally:
            assert other.kill() is True
    finally:
        assert sbx.kill() is True
    # Gone: the data plane says so (502 "was not found"), the control plane 404s.
    assert sbx.is_running() is False
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    assert _list(SandboxQuery(metadata={"run": run})) == []


def test_a_wrong_api_key_is_refused(daemon) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 32)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_wrong").next_items()


def test_an_unknown_template_and_unsupported_options_are_clear(daemon) -> None:
    with pytest.raises(SandboxException, match="nope"):
        Sandbox.create("nope")
    if e2b_version() >= (2, 51, 0):
        # What shoald's networks cannot do: 400, naming the field (rules
        # themselves are test_network.py's).
        with pytest.raises(SandboxException, match="allowPublicTraffic is not supported"):
            Sandbox.create(network={"allow_public_traffic": True})


def test_pause_and_connect(daemon) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        sbx.pause()
        info = Sandbox.get_info(sbx.sandbox_id)
        assert info.state == SandboxState.PAUSED
        assert sbx.sandbox_id in [
            s.sandbox_id for s in _list(SandboxQuery(state=[SandboxState.PAUSED]))
        ]
        back = Sandbox.connect(sbx.sandbox_id, timeout=120)
        assert back.sandbox_id == sbx.sandbox_id
        info = back.get_info()
        assert info.state == SandboxState.RUNNING
        left = (info.end_at - _now()).total_seconds()
        assert 60 < left <= 121, left
        # Connecting to a running sandbox keeps it running.
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.get_info().state == SandboxState.RUNNING
    finally:
        sbx.kill()


def _wait_paused(sandbox_id: str, within_s: float = 90.0) -> None:
    import time

    end = time.monotonic() + within_s
    while Sandbox.get_info(sandbox_id).state != SandboxState.PAUSED:
        assert time.monotonic() < end, "not paused at its timeout"
        time.sleep(0.5)


def test_auto_pause_at_timeout_then_connect(daemon) -> None:
    # autoPause with autoResume off: paused (not killed) at the timeout;
    # traffic does not wake it, a connect does.
    # The write comes first, the short timeout after it: on a loaded host
    # a create and a write can take longer than 4 s.
    sbx = Sandbox.create(
        timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": False}
    )
    try:
        sbx.files.write("/tmp/kept", "state")
        sbx.set_timeout(4)
        _wait_paused(sbx.sandbox_id)
        # e2b 2.20 passes a transport error on unwrapped (a pooled
        # keep-alive connection the pause ended): either way, no answer
        # from the guest, and the state check below is what counts.
        with pytest.raises((SandboxException, httpx.TransportError)):
            sbx.commands.run("true", request_timeout=20)
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        # The instance's connect: e2b 2.20's class-level one sends no
        # E2b-Sandbox-Id header, which a custom E2B_SANDBOX_URL needs.
        back = sbx.connect(timeout=120)
        info = back.get_info()
        assert info.state == SandboxState.RUNNING
        assert 60 < (info.end_at - _now()).total_seconds() <= 121
        assert back.files.read("/tmp/kept") == "state"
    finally:
        sbx.kill()


def test_fork(daemon) -> None:
    if e2b_version() < (2, 50, 0):
        # Sandbox.fork arrived in e2b 2.50: nothing to drive here.
        assert not hasattr(Sandbox, "fork")
        return
    sbx = Sandbox.create(metadata={"kind": "source"}, timeout=60)
    try:
        clones = sbx.fork()
        assert len(clones) == 1
        c = clones[0]
        assert isinstance(c, Sandbox), c
        try:
            assert c.sandbox_id != sbx.sandbox_id
            info = c.get_info()
            assert info.state == SandboxState.RUNNING
            assert info.metadata == {"kind": "source"}
        finally:
            c.kill()
    finally:
        sbx.kill()


def test_snapshots(daemon) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        snap = sbx.create_snapshot()
        assert snap.snapshot_id
        listed = []
        p = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id)
        while p.has_next:
            listed.extend(p.next_items())
        assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
        # A snapshot is a template: a sandbox starts from it.
        child = Sandbox.create(snap.snapshot_id, timeout=60)
        try:
            assert child.get_info().template_id == snap.snapshot_id
        finally:
            child.kill()
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    finally:
        sbx.kill()


def test_metrics_and_logs(daemon) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        m = sbx.get_metrics()
        assert len(m) == 1, m
        assert m[0].cpu_count >= 1
        assert 0 < m[0].mem_used <= m[0].mem_total == 256 << 20
    finally:
        sbx.kill()


async def test_async_flow(daemon) -> None:
    run = uuid.uuid4().hex
    sbx = await AsyncSandbox.create(metadata={"run": run}, timeout=60)
    try:
        info = await sbx.get_info()
        assert info.metadata == {"run": run} and info.state == SandboxState.RUNNING
        await sbx.set_timeout(300)
        left = ((await sbx.get_info()).end_at - _now()).total_seconds()
        assert 200 < left <= 301, left
        p = AsyncSandbox.list(query=SandboxQuery(metadata={"run": run}))
        found = await p.next_items()
        assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
        await sbx.pause()
        assert (await AsyncSandbox.get_info(sbx.sandbox_id)).state == SandboxState.PAUSED
        back = await AsyncSandbox.connect(sbx.sandbox_id)
        assert (await back.get_info()).state == SandboxState.RUNNING
        with pytest.raises(AuthenticationException):
            await AsyncSandbox.create(api_key="e2b_" + "1" * 32)
    finally:
        assert await sbx.kill() is True
    assert await sbx.is_running() is False
