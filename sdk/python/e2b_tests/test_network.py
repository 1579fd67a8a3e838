"""E2B's network options with the stock SDK against shoald's sandbox
networks: ``Sandbox.create(network=...)`` makes a networked sandbox whose
policy has E2B's meaning (allowOut wins over denyOut), ``get_info`` shows
it, ``update_network`` changes it live, and a sandbox created without
rules has no network at all.

The internet is a network namespace this test makes (a veth to the host,
TCP listeners on two ports): every connection a guest makes here goes to
it, never to a real address. Needs root (netns, veth, nftables), as the
daemon's networks do; fails saying so otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest
from e2b import ALL_TRAFFIC, Sandbox
from e2b.exceptions import SandboxException

# One TCP listener: answers each connection with a line, then closes it.
_SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[3].encode() + b"\\n")
    c.close()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Peer:
    """A netns joined to the host by a veth (host side .1/30, its side
    .2/30), standing in for the internet."""

    def __init__(self, tag: int) -> None:
        self.ns = f"se2bp{tag}"
        self.link = f"se2bp{tag}h"
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        host, self.addr = f"10.218.{tag}.1", f"10.218.{tag}.2"
        self.procs: list[subprocess.Popen] = []
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        _ip("addr", "add", f"{host}/30", "dev", self.link)
        _ip("link", "set", self.link, "up")
        _ip("-n", self.ns, "addr", "add", f"{self.addr}/30", "dev", "eth0")
        _ip("-n", self.ns, "link", "set", "eth0", "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")
        _ip("-n", self.ns, "route", "add", "default", "via", host)

    def serve(self, port: int, reply: str) -> str:
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-c", _SERVER, self.addr, str(port), reply],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return f"{self.addr}:{port}"

    def remove(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)


@pytest.fixture(scope="module")
def peer(daemon) -> Iterator[Peer]:
    if os.geteuid() != 0:
        raise RuntimeError("sandbox networks need root (netns, veth, nftables): run as root")
    p = Peer(daemon.net_tag)
    try:
        yield p
    finally:
        p.remove()


def _reach(sbx: Sandbox, to: str, secs: int) -> str:
    """The line the guest read connecting to ``to`` within ``secs`` (empty:
    no connection), with bash's /dev/tcp (the base image's bash)."""
    host, port = to.split(":")
    cmd = f"timeout {secs} bash -c 'exec 3<>/dev/tcp/{host}/{port} && cat <&3' 2>/dev/null; true"
    return sbx.commands.run(cmd, timeout=secs + 60).stdout.strip()


def _blocked(sbx: Sandbox, to: str, why: str) -> None:
    assert _reach(sbx, to, 4) == "", why


def test_network_rules_info_and_live_update(daemon, peer) -> None:
    allowed = peer.serve(8080, "allowed-port")
    other = peer.serve(9090, "other-port")
    # The first networked create boots the daemon's networked template of
    # base (the session's template has no network device).
    sbx = Sandbox.create(
        network={"allow_out": [allowed], "deny_out": [ALL_TRAFFIC]},
        timeout=300,
        request_timeout=900,
    )
    try:
        info = sbx.get_info()
        assert info.network is not None, daemon.log()
        assert info.network["allow_out"] == [allowed]
        assert info.network["deny_out"] == [ALL_TRAFFIC]
        assert info.allow_internet_access is False
        # A fresh guest's first connection waits on ARP: up to 20 s.
        assert _reach(sbx, allowed, 20) == "allowed-port", daemon.log()
        _blocked(sbx, other, "only the allowed address:port passes")

        # E2B's update: in force at once.
        sbx.update_network({"allow_out": [other], "deny_out": [ALL_TRAFFIC]})
        assert sbx.get_info().network["allow_out"] == [other]
        assert _reach(sbx, other, 20) == "other-port"
        _blocked(sbx, allowed, "the old rule is gone")

        # allowOut wins over denyOut (E2B's precedence): the peer denied
        # but its port 8080 allowed.
        sbx.update_network({"allow_out": [allowed], "deny_out": [f"{peer.addr}/32"]})
        assert _reach(sbx, allowed, 20) == "allowed-port"
        _blocked(sbx, other, "denied, and not allowed")
        info = sbx.get_info()
        assert info.allow_internet_access is True
        assert info.network["allow_out"] == []
        assert info.network["deny_out"] == [f"{peer.addr}:1-8079", f"{peer.addr}:8081-65535"]
        # What shoald cannot do is refused, naming the field.
        with pytest.raises(SandboxException, match="network.rules"):
            sbx.update_network({"allow_out": [allowed], "rules": {"a.test": [{}]}})
    finally:
        sbx.kill()

    # Without rules: no network device, and none can be added.
    plain = Sandbox.create(timeout=60)
    try:
        info = plain.get_info()
        assert info.network is None and info.allow_internet_access is False
        _blocked(plain, allowed, "a sandbox without network rules has no network")
        with pytest.raises(SandboxException, match="has no network"):
            plain.update_network({"allow_out": [allowed], "deny_out": [ALL_TRAFFIC]})
    finally:
        plain.kill()
