"""ShoalCluster on a local 3-node Ray cluster with 3 real shoald daemons
and real guests: routing by id, placement by free capacity, a full node
skipped, a node lost mid-burst and its return. The tests run in file
order; the last one kills and brings back node n2."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import ray

import shoal
from shoal.cluster import ClusterSandbox, NodeLost, SandboxLost, ShoalCluster, node_actor_name

from conftest import CAPS, NAMESPACE, NAMES, TEMPLATE, Env


def _kill_all(sbs: list[ClusterSandbox]) -> None:
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda s: s.kill(missing_ok=True), sbs))


def _wait_empty(cluster: ShoalCluster) -> None:
    """Until every node's report shows all its slots free (kills are not
    counted by the placer: the next reports show them, once the killed
    sandboxes' VMMs are gone)."""
    end = time.monotonic() + 30
    while any(n.sandboxes or n.free_slots < CAPS[n.name] for n in cluster.nodes() if n.live):
        assert time.monotonic() < end, cluster.nodes()
        time.sleep(0.2)


@ray.remote(num_cpus=0)
def _exec_in_task(sandbox_id: str) -> str:
    """A Ray task: its own ShoalCluster, the sandbox by id alone."""
    c = ShoalCluster(namespace=NAMESPACE)
    return c.get(sandbox_id).exec(["echo", "from-task"]).text


@ray.remote(num_cpus=0)
def _create_in_task(cluster: ShoalCluster) -> str:
    """A Ray task given the client itself: creates there, placed."""
    sb = cluster.create(template=TEMPLATE, metadata={"from": "task"})
    return sb.id


@ray.remote(num_cpus=0)
def _exec_passed(sb: Any) -> str:
    """A Ray task given the sandbox object itself."""
    return str(sb.id) + " " + sb.exec(["echo", "passed"]).text


def test_ids_route_to_their_node(env: Env, cluster: ShoalCluster) -> None:
    sbs = [cluster.create(template=TEMPLATE, node=n) for n in NAMES]
    try:
        for name, sb in zip(NAMES, sbs):
            assert sb.id == f"{name}.{sb.local_id}" == sb.info.id
            assert sb.node == name and sb.info.state == "running"
            assert sb.exec(["echo", name]).text == f"{name}\n"
            sb.files.write("/tmp/who", name.encode())
            assert sb.files.read("/tmp/who") == name.encode()
            # The id names the node: its daemon has the local id, the
            # others do not.
            for other in NAMES:
                d = env.daemons[other]
                with shoal.Shoal(d.url, token=d.token) as direct:
                    if other == name:
                        assert direct.get(sb.local_id).info.state == "running"
                    else:
                        with pytest.raises(shoal.SandboxNotFound):
                            direct.get(sb.local_id)
            again = cluster.get(sb.id)
            assert again.id == sb.id and again.node == name
        assert {s.id for s in sbs} <= {s.id for s in cluster.list()}
        # Any client, from a Ray task, reaches the sandbox from its id.
        assert ray.get(_exec_in_task.remote(sbs[1].id), timeout=120) == "from-task\n"
        assert ray.get(_exec_passed.remote(sbs[2]), timeout=120) == f"{sbs[2].id} passed\n"
        made = ray.get(_create_in_task.remote(cluster), timeout=120)
        sbs.append(cluster.get(made))
        assert sbs[-1].info.metadata == {"from": "task"}
        # A fork stays on its node, with a cluster id.
        clones = sbs[1].fork(1)
        assert len(clones) == 1 and clones[0].id.startswith("n1.")
        assert clones[0].files.read("/tmp/who") == b"n1"
        clones[0].kill()
        with pytest.raises(shoal.BadRequest):
            cluster.get("no-dot-here")
        with pytest.raises(SandboxLost):
            cluster.get("n9.abcdef")
    finally:
        _kill_all(sbs)
    with pytest.raises(shoal.SandboxNotFound):
        cluster.get(sbs[0].id)
    _wait_empty(cluster)


def test_creates_spread_by_free_capacity_and_skip_a_full_node(cluster: ShoalCluster) -> None:
    made: list[ClusterSandbox] = []
    try:
        # One burst of 9 (reports are 0.5 s apart: the in-flight overlay
        # spreads it) over caps 3 / 6 / 9.
        with ThreadPoolExecutor(9) as ex:
            burst = list(ex.map(lambda _: cluster.create(template=TEMPLATE), range(9)))
        made += burst
        got = Counter(s.node for s in burst)
        print("burst of 9 over caps 3/8/9:", dict(got))
        assert all(got[n] <= CAPS[n] for n in NAMES), got
        assert got["n2"] >= got["n0"] and max(got.values()) < 9, got
        _kill_all(made)
        made.clear()
        _wait_empty(cluster)
        # Fill n0, then: it refuses, and placement skips it.
        made += [cluster.create(template=TEMPLATE, node="n0") for _ in range(CAPS["n0"])]
        with pytest.raises(shoal.HostFull):
            cluster.create(template=TEMPLATE, node="n0")
        with ThreadPoolExecutor(6) as ex:
            more = list(ex.map(lambda _: cluster.create(template=TEMPLATE), range(6)))
        made += more
        assert "n0" not in {s.node for s in more}, [s.id for s in more]
    finally:
        _kill_all(made)
    _wait_empty(cluster)


def test_a_lost_node_fails_its_sandboxes_and_a_returning_one_is_used(
    env: Env, cluster: ShoalCluster
) -> None:
    sbs = [cluster.create(template=TEMPLATE, node=n) for n in NAMES for _ in range(2)]
    stop = threading.Event()
    ok: Counter[str] = Counter()
    errs: dict[str, list[BaseException]] = {s.id: [] for s in sbs}
    created: list[ClusterSandbox] = []
    create_errs: list[BaseException] = []

    def exec_loop(sb: ClusterSandbox) -> None:
        while not stop.is_set():
            try:
                assert sb.exec(["echo", "x"], timeout=60).text == "x\n"
                ok[sb.id] += 1
            except Exception as e:  # noqa: BLE001 - checked below
                errs[sb.id].append(e)
                time.sleep(0.2)

    def create_loop() -> None:
        # Paced: about half before the kill, half after (within the
        # room n0 and n1 have left).
        while not stop.is_set() and len(created) < 8:
            try:
                created.append(cluster.create(template=TEMPLATE))
            except Exception as e:  # noqa: BLE001 - checked below
                create_errs.append(e)
            time.sleep(0.6)

    threads = [threading.Thread(target=exec_loop, args=(s,)) for s in sbs]
    threads.append(threading.Thread(target=create_loop))
    for t in threads:
        t.start()
    try:
        time.sleep(3)
        # Node n2 goes: its daemon (SIGKILL) and its actor.
        t_kill = time.monotonic()
        env.daemons["n2"].proc.send_signal(signal.SIGKILL)
        ray.kill(ray.get_actor(node_actor_name("n2"), namespace=NAMESPACE))
        while "n2" in cluster.live_nodes():
            assert time.monotonic() - t_kill < 5, "n2 still in placement 5 s after it died"
            time.sleep(0.1)
        left_after = time.monotonic() - t_kill
        print(f"n2 left placement {left_after:.2f} s after its daemon and actor were killed")
        time.sleep(4)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    for pid in env.daemons["n2"].vmm_pids():
        os.kill(pid, signal.SIGKILL)
    try:
        # No request lost on the other nodes; the lost ones fail clearly.
        for sb in sbs:
            if sb.node == "n2":
                assert errs[sb.id], f"{sb.id}: no error after its node died"
                for e in errs[sb.id]:
                    assert isinstance(e, SandboxLost), repr(e)
                    assert f"sandbox {sb.id} is lost" in str(e) and "n2" in str(e)
                with pytest.raises(SandboxLost):
                    cluster.get(sb.id)
            else:
                assert not errs[sb.id], (sb.id, errs[sb.id])
                assert ok[sb.id] > 0
        assert not create_errs, create_errs
        assert len(created) >= 6, len(created)
        for sb in created:
            if sb.node == "n2":
                with pytest.raises(SandboxLost):
                    sb.exec(["true"])
            else:
                assert sb.exec(["echo", "y"]).text == "y\n"
        assert not [s for s in cluster.list() if s.node == "n2"]
        # Another client (as another process would) sees why n2 is out.
        fresh = ShoalCluster(namespace=NAMESPACE)
        st = {n.name: n for n in fresh.nodes()}
        assert not st["n2"].live and st["n2"].reason
        assert fresh.live_nodes() == ["n0", "n1"]
        with pytest.raises(NodeLost):
            fresh.create(template=TEMPLATE, node="n2")
        fresh.close()
        _kill_all([s for s in created if s.node != "n2"] + [s for s in sbs if s.node != "n2"])
        _wait_empty(cluster)

        # n2 comes back: a new actor that starts its own daemon this time
        # (without the template: it is made there on first use).
        env.daemons.pop("n2").stop()
        env.start("n2")
        end = time.monotonic() + 10
        while "n2" not in cluster.live_nodes():
            assert time.monotonic() < end, cluster.nodes()
            time.sleep(0.1)
        back = cluster.create(template=TEMPLATE, node="n2")
        assert back.exec(["echo", "back"]).text == "back\n"
        # The old sandboxes of n2 are not there: never reported running.
        old = next(s for s in sbs if s.node == "n2")
        with pytest.raises(shoal.SandboxNotFound):
            cluster.get(old.id)
        with pytest.raises(SandboxLost):
            old.exec(["true"])
        # Placement uses it again: spread goes to the emptiest (n2: cap 9).
        again = [cluster.create(template=TEMPLATE, spread=True) for _ in range(3)]
        assert "n2" in {s.node for s in again}, [s.id for s in again]
        _kill_all([back, *again])
    finally:
        stop.set()
