"""``shoal bench cluster``: Shoal on a Ray cluster (issue 20).

1. **Scaling**: a local Ray cluster of 3 nodes (``ray.cluster_utils``)
   with 3 real shoald daemons, each daemon process capped to the same
   share of this host's CPU (a cgroup v1 ``cpu`` quota, ``--cpu-share``;
   the VMMs, which the jailer puts in cgroups of their own, are not
   capped; a 10 ms CFS period, so the quota binds within a burst), each
   with a warm pool. For 1, 2 and 3 nodes: a burst of ``burst x N``
   creates through :class:`ShoalCluster` (placement limited to those N
   nodes) from N load generators (Ray tasks, as RL workers: each its own
   process and client, ``--threads`` threads), started together;
   throughput = creates / wall time from the first start to the last
   answer. Goal: >= 0.9 N x the 1-node throughput at 3 nodes.
2. **Placement overhead**: what :meth:`ShoalCluster.create` spends outside
   the node's own create (registry refresh, choice, in-flight
   bookkeeping, wrapping), measured over every create of the bursts; and
   creates through the cluster vs straight to the node's daemon
   (``shoal.Shoal``), interleaved, from its warm pool. Goal: <= 2 ms.
3. **Simulation** at DSec's scale (``cluster_sim.py``): 160 nodes, 5,000
   creates/s, Poisson arrivals, per-node capacities from this host's
   measured free slots; power-of-2 vs random vs least-loaded.

Writes ``bench-cluster.json`` (the ``shoal bench plot`` document),
``bench-cluster-summary.json`` and the PNGs under ``--out``. Needs root
(the cgroup), /dev/kvm, the release binaries and ``ray==2.60.0``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import shoal  # noqa: E402
from cluster_sim import fleet, simulate  # noqa: E402
from shoal.cluster import ClusterSandbox, ShoalCluster, node_resource, start_node  # noqa: E402

NAMES = ("n0", "n1", "n2")
TEMPLATE = "bench-tiny"
NAMESPACE = "shoal-bench"


def _sdk_conftest() -> Any:
    spec = importlib.util.spec_from_file_location(
        "shoal_sdk_conftest", HERE.parent / "tests" / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


class CpuCap:
    """A cgroup v1 ``cpu`` group with a CFS quota, holding one process."""

    def __init__(self, name: str, pid: int, share: float) -> None:
        base = Path("/sys/fs/cgroup/cpu")
        if not (base / "cpu.cfs_quota_us").exists():
            raise RuntimeError(f"{base}: no cgroup v1 cpu controller to cap the daemons with")
        self.dir = base / f"shoal-bench-{name}-{os.getpid()}"
        self.dir.mkdir(exist_ok=True)
        # A short period: the quota binds within a burst of milliseconds
        # (a 100 ms period would let a short burst run uncapped).
        (self.dir / "cpu.cfs_period_us").write_text("10000")
        (self.dir / "cpu.cfs_quota_us").write_text(str(max(1000, int(share * 10000))))
        (self.dir / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _wait_pools(cl: ShoalCluster, names: list[str], ready: int, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while True:
        pools = cl.pools()
        if all(
            any(p.template == TEMPLATE and p.ready >= ready for p in pools.get(n, [])) for n in names
        ):
            return
        if time.monotonic() > end:
            raise RuntimeError(f"pools not at {ready} after {timeout:.0f} s: {pools}")
        time.sleep(0.25)


@ray.remote(num_cpus=0)
def _generate(kw: dict[str, Any], count: int, threads: int, start_at: float) -> dict[str, Any]:
    """One load generator (a Ray task: its own process and client, as an
    RL worker would be): ``count`` creates from ``threads`` threads,
    starting at ``start_at`` (wall clock)."""
    cl = ShoalCluster(**kw)
    lat: list[float] = []

    def one(_: int) -> ClusterSandbox:
        t = time.perf_counter()
        sb = cl.create(template=TEMPLATE)
        lat.append(time.perf_counter() - t)
        return sb

    cl.refresh()
    time.sleep(max(0.0, start_at - time.time()))
    t0 = time.time()
    with ThreadPoolExecutor(threads) as ex:
        sbs = list(ex.map(one, range(count)))
    t1 = time.time()
    cl.close()
    return {
        "t0": t0,
        "t1": t1,
        "ids": [sb.id for sb in sbs],
        "from_pool": sum(1 for sb in sbs if sb.info.from_pool),
        "lat": lat,
        "placement_s": cl.placement_s,
        "placements": cl.placements,
    }


def burst(cl: ShoalCluster, names: list[str], per_node: int, threads: int) -> dict[str, Any]:
    """``per_node x N`` creates from N load generators (Ray tasks) of
    ``threads`` threads each, all starting at once; then kills them."""
    kw = {"namespace": NAMESPACE, "nodes": names}
    start_at = time.time() + 5.0
    refs = [
        _generate.remote(dict(kw, seed=i), per_node, threads, start_at) for i in range(len(names))
    ]
    outs = ray.get(refs, timeout=600)
    wall = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    ids = [i for o in outs for i in o["ids"]]
    by_node: dict[str, int] = {}
    for i in ids:
        node = i.split(".", 1)[0]
        by_node[node] = by_node.get(node, 0) + 1
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: cl.kill(i, missing_ok=True), ids))
    lat = [x for o in outs for x in o["lat"]]
    placed = sum(o["placements"] for o in outs)
    return {
        "nodes": len(names),
        "creates": len(ids),
        "from_pool": sum(o["from_pool"] for o in outs),
        "wall_s": wall,
        "creates_per_s": len(ids) / wall,
        "by_node": by_node,
        "create_p50_ms": 1000 * statistics.median(lat),
        "create_p99_ms": 1000 * sorted(lat)[int(0.99 * (len(lat) - 1))],
        "placement_ms_per_create": 1000 * sum(o["placement_s"] for o in outs) / max(1, placed),
    }


def interleaved(cl: ShoalCluster, url: str, token: str, n: int) -> dict[str, Any]:
    """Creates through the cluster (placement on n0 alone) vs straight to
    n0's daemon, alternating, each from the warm pool and killed."""
    via: list[float] = []
    direct: list[float] = []
    with shoal.Shoal(url, token=token) as d:
        for i in range(2 * n):
            _wait_pools(cl, ["n0"], 2)
            t = time.perf_counter()
            sb = cl.create(template=TEMPLATE) if i % 2 == 0 else d.create(template=TEMPLATE)
            (via if i % 2 == 0 else direct).append(time.perf_counter() - t)
            sb.kill()
    return {
        "n": n,
        "cluster_p50_ms": 1000 * statistics.median(via),
        "direct_p50_ms": 1000 * statistics.median(direct),
        "overhead_p50_ms": 1000 * (statistics.median(via) - statistics.median(direct)),
    }


def real(a: argparse.Namespace) -> dict[str, Any]:
    conf = _sdk_conftest()
    ray_cluster = None
    daemons: dict[str, Any] = {}
    caps: list[CpuCap] = []
    clients: list[ShoalCluster] = []
    try:
        args: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 << 20}
        ray_cluster = Cluster(
            initialize_head=True, head_node_args={**args, "resources": {node_resource("n0"): 1}}
        )
        for name in NAMES[1:]:
            ray_cluster.add_node(**args, resources={node_resource(name): 1})
        ray.init(address=ray_cluster.address, namespace=NAMESPACE, log_to_driver=False)
        for name in NAMES:
            d = conf.TcpDaemon("--agent-timeout", "300", "--agent-call-timeout", "300")
            daemons[name] = d
            caps.append(CpuCap(name, d.proc.pid, a.cpu_share))
            start_node(name, url=d.url, token=d.token, namespace=NAMESPACE)
        cl = ShoalCluster(namespace=NAMESPACE, seed=1)
        clients.append(cl)
        measured = next(n.free_slots for n in cl.nodes() if n.name == "n0")
        cl.create_template(TEMPLATE, "tiny", timeout=900)
        cl.set_pool(TEMPLATE, a.pool)
        runs: list[dict[str, Any]] = []
        for n in (1, 2, 3):
            names = list(NAMES[:n])
            sub = ShoalCluster(namespace=NAMESPACE, seed=n, nodes=names)
            clients.append(sub)
            for r in range(a.rounds):
                _wait_pools(cl, names, a.pool)
                res = burst(sub, names, a.burst or (a.pool * 3) // 4, a.threads)
                res["round"] = r
                print(json.dumps(res), flush=True)
                runs.append(res)
        one = ShoalCluster(namespace=NAMESPACE, seed=9, nodes=["n0"])
        clients.append(one)
        inter = interleaved(one, daemons["n0"].url, daemons["n0"].token, a.interleaved)
        print(json.dumps(inter), flush=True)
        return {"measured_free_slots": measured, "runs": runs, "interleaved": inter}
    finally:
        for cl in clients:
            cl.close()
        for d in daemons.values():
            d.stop()
        for c in caps:
            c.remove()
        if ray.is_initialized():
            ray.shutdown()
        if ray_cluster is not None:
            ray_cluster.shutdown()


def summarize(r: dict[str, Any], sims: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    s: dict[str, Any] = {"cpu_share_per_daemon": a.cpu_share, "pool_per_node": a.pool}
    if r:
        tput = {
            n: statistics.median(x["creates_per_s"] for x in r["runs"] if x["nodes"] == n)
            for n in (1, 2, 3)
        }
        s["creates_per_s"] = tput
        s["scaling_at_3"] = tput[3] / tput[1]
        s["scaling_goal_0.9N_met"] = tput[3] >= 0.9 * 3 * tput[1]
        place = [x["placement_ms_per_create"] for x in r["runs"]]
        s["placement_ms_per_create_max"] = max(place)
        s["placement_ms_per_create_median"] = statistics.median(place)
        s["placement_goal_2ms_met"] = max(place) <= 2.0
        s["interleaved"] = r["interleaved"]
        s["measured_free_slots_per_host"] = r["measured_free_slots"]
    s["simulation"] = {x["strategy"]: x for x in sims}
    return s


def document(r: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    bars = [
        {"label": f"{k} imbalance (max/mean)", "value": v["imbalance_mean"]}
        for k, v in s["simulation"].items()
    ]
    xy: list[dict[str, Any]] = []
    sub = []
    if r:
        t = s["creates_per_s"]
        xy = [
            {"label": "measured creates/s", "points": [[n, t[n]] for n in (1, 2, 3)]},
            {"label": "ideal N x 1 node", "points": [[n, n * t[1]] for n in (1, 2, 3)]},
        ]
        bars += [
            {"label": f"placement ms/create, {n} nodes", "value": statistics.median(
                x["placement_ms_per_create"] for x in r["runs"] if x["nodes"] == n)}
            for n in (1, 2, 3)
        ]
        sub.append(
            f"3 nodes {s['scaling_at_3']:.2f}x of 1 (goal 2.7x); placement <= "
            f"{s['placement_ms_per_create_max']:.2f} ms/create (goal 2)"
        )
    short = {"power_of_2": "po2", "random": "random", "least_loaded": "LL"}
    sub.append(
        "imbalance at 160 nodes "
        + " / ".join(f"{short[k]} {v['imbalance_mean']:.2f}" for k, v in s["simulation"].items())
    )
    doc: dict[str, Any] = {
        "title": "Shoal on Ray: creates over 1-3 local nodes, and placement at 160 nodes (simulated)",
        "subtitle": "; ".join(sub),
        "unit": "ms",
        "series": [],
        "bars": {"title": "Load imbalance at 160 nodes, 5,000 creates/s; placement cost",
                 "y_label": "max/mean utilisation, or ms", "bars": bars},
    }
    if xy:
        doc["xy"] = {"title": "Creates/s from warm pools by node count", "x_label": "nodes",
                     "y_label": "creates/s", "series": xy}
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=int, default=40, help="warm pool per node")
    ap.add_argument("--burst", type=int, default=0,
                    help="creates per node in a burst (default: 3/4 of the pool: headroom for "
                    "the reports' lag, so every create is from a warm pool)")
    ap.add_argument("--rounds", type=int, default=3, help="bursts per node count")
    ap.add_argument("--threads", type=int, default=4, help="threads per load generator")
    ap.add_argument("--cpu-share", type=float, default=0.1, help="CPU share of each daemon")
    ap.add_argument("--interleaved", type=int, default=20, help="creates each way, interleaved")
    ap.add_argument("--sim-seconds", type=float, default=60.0, help="simulated seconds")
    ap.add_argument("--sim-only", action="store_true", help="only the simulation")
    ap.add_argument("--sim-capacity", type=int, default=0,
                    help="per-host capacity for the simulation (default: measured here)")
    ap.add_argument("--out", default=str(ROOT / "target" / "bench"))
    ap.add_argument("--bins", default=str(ROOT / "target" / "release"))
    a = ap.parse_args()
    os.environ.setdefault("SHOAL_BIN_DIR", a.bins)
    r = {} if a.sim_only else real(a)
    measured = a.sim_capacity or r.get("measured_free_slots") or 0
    if measured <= 0:
        raise SystemExit("--sim-only needs --sim-capacity (this host's free slots)")
    caps = fleet(measured)
    sims = []
    for strategy in ("power_of_2", "random", "least_loaded"):
        res = simulate(strategy, capacities=caps, duration_s=a.sim_seconds,
                       warmup_s=a.sim_seconds * 2 / 3)
        res["capacity_measured"] = measured
        print(json.dumps(res), flush=True)
        sims.append(res)
    s = summarize(r, sims, a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-cluster.json").write_text(json.dumps(document(r, s), allow_nan=False, indent=1))
    (out / "bench-cluster-summary.json").write_text(json.dumps({"summary": s, "raw": r}, indent=1))
    print(json.dumps(s, indent=1))
    cli = Path(a.bins) / "shoal"
    if cli.is_file():
        subprocess.run([str(cli), "bench", "plot", str(out / "bench-cluster.json"), "--plot", str(out)],
                       check=True)
    else:
        print(f"{cli} missing: no PNG (cargo build --release -p shoal-cli)", file=sys.stderr)


if __name__ == "__main__":
    main()
