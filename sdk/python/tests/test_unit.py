"""The SDK's own logic, no daemon: the generated sync client is current,
error bodies map to their classes, the daemon is found like the CLI does,
request bodies are checked before they are sent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import shoal
from shoal import _core
from shoal._errors import error_from_response

HERE = Path(__file__).resolve().parent


def test_the_sync_client_is_generated_from_the_async_one():
    r = subprocess.run(
        [sys.executable, str(HERE.parent / "tools" / "gen_sync.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_mirrored_names_and_docstrings():
    pairs = [
        (shoal.AsyncShoal, shoal.Shoal),
        (shoal.AsyncSandbox, shoal.Sandbox),
        (shoal.AsyncCommand, shoal.Command),
        (shoal.AsyncFiles, shoal.Files),
    ]
    for a, s in pairs:
        pub = {n for n in vars(a) if not n.startswith("_")}
        assert pub == {n for n in vars(s) if not n.startswith("_")}, a
        for n in pub:
            da = (getattr(a, n).__doc__ or "").replace("Async", "")
            ds = getattr(s, n).__doc__ or ""
            assert da.split("\n")[0] == ds.split("\n")[0], (a, n)
        assert (Path(shoal.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize(
    "status,code,cls",
    [
        (400, "bad_request", shoal.BadRequest),
        (401, "unauthorized", shoal.Unauthorized),
        (403, "forbidden", shoal.Forbidden),
        (409, "conflict", shoal.Conflict),
        (413, "payload_too_large", shoal.PayloadTooLarge),
        (429, "host_full", shoal.HostFull),
        (503, "host_memory_low", shoal.HostMemoryLow),
        (503, "network_unavailable", shoal.NetworkUnavailable),
        (429, "sandbox_busy", shoal.SandboxBusy),
        (502, "sandbox_error", shoal.SandboxError),
        (504, "deadline_exceeded", shoal.Timeout),
        (500, "internal", shoal.InternalError),
        (507, "insufficient_storage", shoal.InsufficientStorage),
    ],
)
def test_error_codes_map_to_classes(status, code, cls):
    body = f'{{"error":{{"code":"{code}","message":"m"}}}}'.encode()
    e = error_from_response(status, body, "2")
    assert type(e) is cls and e.code == code and e.status == status and e.message == "m"
    assert e.retry_after == 2.0
    assert isinstance(e, shoal.Retryable) == (status in (429, 503))
    assert set(shoal.ERROR_CLASSES) >= {code}


def test_not_found_classes():
    nf = b'{"error":{"code":"not_found","message":"no sandbox \'x\'"}}'
    assert type(error_from_response(404, nf, None, not_found=shoal.FileNotFound)) is (
        shoal.SandboxNotFound
    )
    f = b'{"error":{"code":"not_found","message":"/tmp/x: no such file"}}'
    e = error_from_response(404, f, None, not_found=shoal.FileNotFound)
    assert isinstance(e, shoal.FileNotFound) and isinstance(e, FileNotFoundError)
    e = error_from_response(502, b"<html>bad gateway", None)
    assert type(e) is shoal.SandboxError and "bad gateway" in e.message


def test_daemon_found_like_the_cli(monkeypatch, tmp_path):
    monkeypatch.delenv("SHOAL_DAEMON", raising=False)
    monkeypatch.delenv("SHOAL_TOKEN", raising=False)
    monkeypatch.setenv("SHOAL_STATE", str(tmp_path))
    t = _core.resolve_target(None, None)
    assert t.socket == str(tmp_path / "daemon" / "shoald.sock") and t.local
    monkeypatch.setenv("SHOAL_DAEMON", "http://127.0.0.1:7070/")
    monkeypatch.setenv("SHOAL_TOKEN", "sekrit")
    t = _core.resolve_target(None, None)
    assert (t.socket, t.url, t.token) == (None, "http://127.0.0.1:7070", "sekrit")
    assert _core.resolve_target("/x/s.sock", None).socket == "/x/s.sock"
    with pytest.raises(shoal.BadRequest):
        _core.resolve_target("https://h", None)


def test_autostart_failure_is_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("SHOALD", str(tmp_path / "no-shoald"))
    c = shoal.Shoal(str(tmp_path / "d" / "shoald.sock"))
    with pytest.raises(shoal.DaemonStartFailed, match="cannot start"):
        c.list()
    c2 = shoal.Shoal(str(tmp_path / "e" / "shoald.sock"), autostart=False)
    with pytest.raises(shoal.ConnectionFailed):
        c2.list()


def test_bodies_are_checked_before_sending():
    with pytest.raises(shoal.BadRequest):
        _core.exec_body(None, None, None, None, None, None)
    with pytest.raises(shoal.BadRequest):
        _core.exec_body(["a"], "b", None, None, None, None)
    with pytest.raises(shoal.BadRequest):
        _core.exec_body([], None, None, None, None, None)
    assert _core.exec_body("echo hi", None, None, None, 5, b"x") == {
        "shell": "echo hi",
        "timeout_s": 5.0,
        "stdin_b64": "eA==",
    }
    with pytest.raises(shoal.BadRequest):
        _core.create_body(
            image=None, template=None, vcpus=None, memory_mib=None, ttl_s=None,
            idle_timeout_s=None, metadata=None, env=None, layers=None,
            upper_size_mib=None, upper_disk_mib=None, keep_running=False,
        )
    shape = dict(
        image="base", template=None, vcpus=None, memory_mib=None, idle_timeout_s=None,
        metadata=None, env=None, layers=None, upper_size_mib=None, upper_disk_mib=None,
        keep_running=False,
    )
    assert _core.create_body(ttl_s=30, pause_at_ttl=True, **shape) == {
        "image": "base",
        "ttl_s": 30,
        "pause_at_ttl": True,
    }
    with pytest.raises(shoal.BadRequest, match="ttl_s"):
        _core.create_body(ttl_s=None, pause_at_ttl=True, **shape)
    # priority=: sent only when not the default; checked.
    assert "priority" not in _core.create_body(ttl_s=None, **shape)
    assert _core.create_body(ttl_s=None, priority="best_effort", **shape)["priority"] == (
        "best_effort"
    )
    with pytest.raises(shoal.BadRequest, match="best_effort"):
        _core.create_body(ttl_s=None, priority="high", **shape)
    # network=: a Network or a mapping of its keys; absent: no device.
    assert "network" not in _core.create_body(ttl_s=None, **shape)
    net = shoal.Network(allow_out=["pypi.org", "10.1.2.0/24:443"], allow_dns=False)
    assert _core.create_body(ttl_s=None, network=net, **shape)["network"] == {
        "allow_out": ["pypi.org", "10.1.2.0/24:443"],
        "deny_out": [],
        "allow_dns": False,
    }
    assert _core.create_body(ttl_s=None, network={"allow_out": ["a.b"]}, **shape)[
        "network"
    ] == {"allow_out": ["a.b"], "deny_out": [], "allow_dns": True}
    with pytest.raises(shoal.BadRequest, match="unknown keys"):
        _core.network_body({"allow": ["x"]})
    with pytest.raises(shoal.BadRequest, match="list of entries"):
        _core.network_body({"allow_out": "pypi.org"})
    with pytest.raises(shoal.BadRequest):
        _core.network_body(["pypi.org"])  # type: ignore[arg-type]
    info = shoal.SandboxInfo.from_json(
        {"id": "s", "network": {"allow_out": ["x.y"], "allow_dns": True}, "guest_addr": "10.213.0.2"}
    )
    assert info.network == shoal.Network(allow_out=["x.y"]) and info.guest_addr == "10.213.0.2"
    bare = shoal.SandboxInfo.from_json({"id": "s", "network": None})
    assert bare.network is None and bare.guest_addr is None
    # Its kind: as sent, and an older daemon's (none sent) are microVMs.
    assert bare.kind == "microvm"
    assert shoal.SandboxInfo.from_json({"id": "s", "kind": "vm"}).kind == "vm"
    assert _core.signal_number("term") == 15 and _core.signal_number("SIGKILL") == 9
    with pytest.raises(shoal.BadRequest):
        _core.signal_number("NOPE")


def test_backoff_honours_retry_after():
    b = _core.Backoff(retries=3, base=0.1, cap=5)
    assert b.delay(0, 2.0) == 2.0
    assert 0.05 <= b.delay(0, None) <= 0.1
    assert b.delay(10, None) <= 5 and b.delay(3, 100.0) == 5


def test_image_calls_reach_the_image_routes():
    import httpx

    img = {
        "id": "sha256:" + "ab" * 32,
        "refs": ["127.0.0.1:5000/team/app:1"],
        "manifest_digest": "sha256:" + "cd" * 32,
        "layers": [{"digest": "sha256:" + "ef" * 32, "diff_id": "sha256:" + "01" * 32,
                    "erofs_bytes": 4096}],
        "config": {"env": ["A=1"], "working_dir": "/w"},
        "disk_bytes": 4096,
        "in_use": 1,
        "created_at": "2026-12-02T00:00:00Z",
    }
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.method, req.url.raw_path.decode(), req.content))
        if req.method == "GET" and req.url.raw_path == b"/v1/images":
            return httpx.Response(200, json={"images": [img], "disk_bytes": 4096})
        if req.method == "DELETE":
            return httpx.Response(
                409, json={"error": {"code": "conflict", "message": "in use by sandbox x"}})
        if req.url.raw_path.endswith(b"none%3A1"):
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})
        return httpx.Response(201 if req.method == "POST" else 200, json=img)

    c = shoal.Shoal("http://127.0.0.1:9", token="t")
    c._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(handler))
    lst = c.list_images()
    assert lst.disk_bytes == 4096 and lst.images[0].id == img["id"]
    got = c.get_image("127.0.0.1:5000/team/app:1")
    assert got.in_use == 1 and got.config["working_dir"] == "/w"
    assert seen[-1][1] == "/v1/images/127.0.0.1%3A5000%2Fteam%2Fapp%3A1", seen[-1]
    pulled = c.pull_image("127.0.0.1:5000/team/app:1")
    assert pulled.refs == img["refs"]
    assert seen[-1][0] == "POST" and seen[-1][1] == "/v1/images"
    assert b'"insecure": false' in seen[-1][2] or b'"insecure":false' in seen[-1][2]
    with pytest.raises(shoal.Conflict, match="in use"):
        c.remove_image(img["id"])
    with pytest.raises(shoal.ImageNotFound):
        c.get_image("x/none:1")
    with pytest.raises(shoal.BadRequest):
        c.get_image("a" * 600)


def test_vm_disk_templates_are_named_by_the_disk_and_its_options():
    a = shoal.VMArgs(disk_image="/srv/layers/d.qcow2")
    b = shoal.VMArgs(disk_image="/srv/layers/d.qcow2", disk_init="/sbin/shoal-agent")
    assert a.template_name().startswith("vm-disk-") and a.template_name().endswith("-1c-256m")
    assert a.template_name() != b.template_name()
    assert shoal.VMArgs().template_name() == "vm-tiny-1c-256m"
    assert shoal.VMArgs(disk_image="/d", template="mine").template_name() == "mine"
    t = shoal.TemplateInfo.from_json(
        {"name": "t", "kind": "vm", "disk": {"path": "/d", "format": "raw", "kernel": "shoal"}}
    )
    assert t.disk == {"path": "/d", "format": "raw", "kernel": "shoal"}
    assert shoal.TemplateInfo.from_json({"name": "u"}).disk is None
