"""FnCall through the cluster (``run_fncall``, ``map_fncall`` split by
free slots) and a node whose ``ShoalNode`` actor dies while its daemon
keeps running, on the suite's cluster (real Ray, daemons, guests)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray

import shoal
from shoal import FnCallArgs
from shoal.cluster import SandboxLost, ShoalCluster, node_actor_name

from conftest import CAPS, NAMESPACE, TEMPLATE, Env


def _bash_ready(cluster: ShoalCluster, name: str) -> bool:
    """Whether node ``name``'s daemon built its bash FnCall template
    (built there on its first bash call)."""
    v: Any = cluster.node(name)._json("GET", "/v1/fncall/languages")
    langs = v.get("languages", v) if isinstance(v, dict) else v
    assert isinstance(langs, list), v
    return any(lang.get("name") == "bash" and lang.get("ready") for lang in langs)


def test_fncall_runs_on_the_nodes_split_by_free_slots(env: Env, cluster: ShoalCluster) -> None:
    # Placement limited to n0 and n1, n0 full: the calls all go to n1 (an
    # even split would give n0 half), so one node builds its bash
    # template (a boot of the base image).
    c = ShoalCluster(namespace=NAMESPACE, nodes=["n0", "n1"], timeout=300)
    full = [cluster.create(template=TEMPLATE, node="n0") for _ in range(CAPS["n0"])]
    try:
        end = time.monotonic() + 30
        while (st := {n.name: n for n in c.nodes()})["n0"].free_slots > 0:
            assert time.monotonic() < end, st
            time.sleep(0.1)
        assert st["n1"].free_slots > 0, st
        calls = [FnCallArgs("bash", f"echo call-{i}", timeout_s=60) for i in range(4)]
        got = c.map_fncall(calls)
        assert [r.stdout for r in got] == [f"call-{i}\n" for i in range(4)], got
        assert all(r.status == "success" and r.exit_code == 0 for r in got), got
        one = c.run_fncall(language="bash", code="echo $((6 * 7))", timeout_s=60)
        assert one.status == "success" and one.stdout == "42\n", one
        # Only n1 ran calls (it built its template for them); n0 (no free
        # slot) and n2 (outside this client's placement) did not.
        assert _bash_ready(c, "n1")
        assert not _bash_ready(c, "n0") and not _bash_ready(c, "n2")
    finally:
        for sb in full:
            sb.kill(missing_ok=True)
        c.close()
    end = time.monotonic() + 30
    while {n.name: n for n in cluster.nodes()}["n0"].free_slots < CAPS["n0"]:
        assert time.monotonic() < end, cluster.nodes()
        time.sleep(0.2)


def test_a_node_whose_actor_dies_leaves_placement_and_its_sandboxes_are_lost(
    env: Env, cluster: ShoalCluster
) -> None:
    """The documented rule: no reports, no node. Its daemon (attached,
    not started by the actor) keeps running and keeps its sandboxes, but
    the cluster reports them lost (never running: nobody reports for that
    daemon) until an actor attaches to it again, when they are reachable
    again, as they were."""
    sb = cluster.create(template=TEMPLATE, node="n1")
    try:
        assert sb.exec(["echo", "a"]).text == "a\n"
        t0 = time.monotonic()
        ray.kill(ray.get_actor(node_actor_name("n1"), namespace=NAMESPACE))
        while "n1" in cluster.live_nodes():
            assert time.monotonic() - t0 < cluster.stale_s + 3, cluster.nodes()
            time.sleep(0.1)
        left = time.monotonic() - t0
        print(f"n1 left placement {left:.2f} s after its actor was killed (stale_s {cluster.stale_s:g})")
        st = {n.name: n for n in cluster.nodes()}["n1"]
        assert not st.live and "no report" in (st.reason or ""), st
        with pytest.raises(SandboxLost, match="n1"):
            sb.exec(["true"])
        with pytest.raises(SandboxLost):
            cluster.get(sb.id)
        assert sb.id not in {s.id for s in cluster.list()}
        made = [cluster.create(template=TEMPLATE) for _ in range(2)]
        assert "n1" not in {s.node for s in made}, [s.id for s in made]
        for m in made:
            m.kill()
        # The daemon outlived the actor: the sandbox still runs there.
        d = env.daemons["n1"]
        with shoal.Shoal(d.url, token=d.token) as direct:
            assert direct.get(sb.local_id).info.state == "running"
        # An actor attached to the same daemon: the same sandbox again.
        env.attach("n1")
        end = time.monotonic() + 15
        while "n1" not in cluster.live_nodes():
            assert time.monotonic() < end, cluster.nodes()
            time.sleep(0.1)
        assert sb.exec(["echo", "back"]).text == "back\n"
        assert cluster.get(sb.id).info.state == "running"
    finally:
        cluster.kill(sb.id, missing_ok=True)
