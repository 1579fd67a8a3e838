"""``create(image=REF)`` of an OCI image no node has: the chosen node
pulls it first, from a real registry on loopback (Debian's
``docker-registry``, pushed with ``skopeo copy``; no internet), and a
pull that fails says which node and image (real Ray, daemons, guests)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import socket
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Iterator

import pytest

import shoal
from shoal.cluster import ShoalCluster

for _tool in ("/usr/bin/docker-registry", "skopeo"):
    if shutil.which(_tool) is None:  # a clear failure, never a skip
        raise RuntimeError(f"{_tool} is missing: apt-get install -y docker-registry skopeo")

HELLO = b"from-the-registry\n"


def _blob(layout: Path, data: bytes) -> str:
    h = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / h).write_bytes(data)
    return "sha256:" + h


def _layout(layout: Path, tag: str) -> None:
    """An OCI layout with one image: one layer holding /hello.txt."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mode = len(HELLO), 0o644
        t.addfile(info, io.BytesIO(HELLO))
    layer = buf.getvalue()
    cfg = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin"]},
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()],
            },
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _blob(layout, cfg),
                "size": len(cfg),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _blob(layout, layer),
                    "size": len(layer),
                }
            ],
        }
    ).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": _blob(layout, manifest),
                "size": len(manifest),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``127.0.0.1:PORT``: a registry holding ``shoal/hello:1``."""
    d = tmp_path_factory.mktemp("registry")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = d / "registry.yml"
    cfg.write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {d / 'storage'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        ["/usr/bin/docker-registry", "serve", str(cfg)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        end = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < end, "docker-registry did not listen in 15 s"
                time.sleep(0.05)
        _layout(d / "layout", "1")
        policy = d / "policy.json"
        policy.write_text('{"default":[{"type":"insecureAcceptAnything"}]}')
        subprocess.run(
            ["skopeo", "--policy", str(policy), "copy", "--quiet", "--dest-tls-verify=false",
             f"oci:{d / 'layout'}:1", f"docker://127.0.0.1:{port}/shoal/hello:1"],
            check=True, timeout=60,
        )  # fmt: skip
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_an_image_no_node_has_is_pulled_by_the_chosen_node(
    registry: str, cluster: ShoalCluster
) -> None:
    ref = f"{registry}/shoal/hello:1"
    n0 = cluster.node("n0")
    with pytest.raises(shoal.ImageNotFound):
        n0.get_image(ref)
    t0 = time.monotonic()
    sb = cluster.create(image=ref, node="n0", pull_timeout=60)
    try:
        took = time.monotonic() - t0
        print(f"create of an image n0 lacked (pull + container boot): {took:.1f} s")
        assert sb.node == "n0" and sb.info.state == "running"
        assert sb.files.read("/hello.txt") == HELLO
        assert ref in {r for i in n0.list_images().images for r in i.refs}
    finally:
        sb.kill(missing_ok=True)
    # A pull that fails: the node and the image named, nothing created.
    missing = f"{registry}/shoal/missing:1"
    before = {s.id for s in cluster.node("n1").list()}
    with pytest.raises(shoal.ImageNotFound, match=r"node n1 could not pull the image .*missing"):
        cluster.create(image=missing, node="n1", pull_timeout=30)
    assert {s.id for s in cluster.node("n1").list()} == before
