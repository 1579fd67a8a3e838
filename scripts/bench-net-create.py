#!/usr/bin/env python3
"""Create latency with and without a network, through a real shoald (issue
18), interleaved one by one: prints p50/p90 (ms) of each and their
difference, as JSON. Needs root, KVM and the release binaries:

    sudo target/pyenv/bin/python scripts/bench-net-create.py [N [SHOALD-ARGS...]]

(PYTHONPATH=sdk/python/src, or the SDK installed in the venv.) The daemon
runs with its defaults (a jailed VMM stock of 1 per template, a slot pool
of 4) on a fresh state directory; each sandbox is killed before the next
create, so the pools refill between creates as they would at a steady
rate. `--vmm-stock 0` makes plain creates start a fresh jailed VMM too,
as networked ones do (the stock's VMMs have no net device), which leaves
what the network itself adds."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import shoal

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rel = os.path.join(root, "target", "release")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
state = tempfile.mkdtemp(prefix="shoal-netbench-")
env = dict(os.environ, SHOAL_JAILER=os.path.join(
    root, "target", "x86_64-unknown-linux-musl", "release", "shoal-jailer"))
d = subprocess.Popen([os.path.join(rel, "shoald"), "--state-dir", state, "--net",
                      "--net-netns-prefix", "shbench-", "--net-link-prefix", "shvb",
                      "--net-pool", "10.219.0.0/22", *sys.argv[2:]],
                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(state, "log"), "w"),
                     env=env)
try:
    c = shoal.Shoal(os.path.join(state, "shoald.sock"), autostart=False, timeout=300)
    for _ in range(600):
        if os.path.exists(os.path.join(state, "shoald.sock")) and c.health():
            break
        time.sleep(0.1)
    net = shoal.Network(allow_out=["192.0.2.1:443"], allow_dns=False)
    # Both templates built, both pools full.
    c.create(image="tiny").kill()
    c.create(image="tiny", network=net).kill()
    time.sleep(3)
    plain, networked = [], []
    for _ in range(n):
        for xs, kw in ((plain, {}), (networked, {"network": net})):
            t0 = time.perf_counter()
            sb = c.create(image="tiny", **kw)
            xs.append((time.perf_counter() - t0) * 1000)
            sb.kill()
            time.sleep(0.5)

    def q(xs):
        xs = sorted(xs)
        return {"p50": round(statistics.median(xs), 2), "p90": round(xs[int(0.9 * (len(xs) - 1))], 2)}

    out = {"n": n, "plain_ms": q(plain), "networked_ms": q(networked)}
    out["added_p50_ms"] = round(out["networked_ms"]["p50"] - out["plain_ms"]["p50"], 2)
    print(json.dumps(out, indent=1))
finally:
    d.terminate()
    d.wait(30)
    subprocess.run(["rm", "-rf", state])
