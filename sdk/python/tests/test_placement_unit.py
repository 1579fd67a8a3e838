"""Placement (shoal._placement): power-of-k choices with the in-flight
overlay, on synthetic capacities (pure logic: no daemon, no Ray)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from shoal._placement import Capacity, NodeLoad, Placer, free_slots


def cap(max_vms: int, vms: int = 0) -> Capacity:
    return Capacity(
        max_vms=max_vms,
        vms=vms,
        memory_budget_mib=1 << 20,
        memory_mib=0,
        vcpu_budget=1 << 10,
        vcpus=0,
    )


def test_free_slots_is_the_tightest_limit() -> None:
    c = Capacity(max_vms=100, vms=10, memory_budget_mib=1024, memory_mib=512, vcpu_budget=8,
                 vcpus=2, available_mib=10_000, min_available_mib=0, memory_overcommit=8)
    assert free_slots(c, 128, 1) == 4  # memory: 512 MiB left / 128
    assert free_slots(c, 64, 1) == 6  # vCPUs: 6 left
    assert free_slots(c, 64, 2) == 3
    low = Capacity(100, 0, 1 << 20, 0, 1 << 10, 0, available_mib=300, min_available_mib=256,
                   memory_overcommit=8)
    assert free_slots(low, 128, 1) == 2  # 44 MiB of real memory / 16 per guest
    assert free_slots(cap(3, 5)) == 0  # over its cap: never negative


def test_k_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Placer(0)


def test_a_burst_spreads_by_free_capacity() -> None:
    """120 creates in one burst (no report in between) over nodes of 20,
    40 and 60 free slots: the in-flight overlay fills them in proportion,
    and none is asked for more than it has."""
    p = Placer(2, rng=random.Random(1))
    nodes = [NodeLoad("a", cap(20)), NodeLoad("b", cap(40)), NodeLoad("c", cap(60))]
    got: Counter[str] = Counter()
    for _ in range(120):
        n = p.choose(nodes)
        assert n is not None
        p.begin(n)
        got[n] += 1
    assert got == {"a": 20, "b": 40, "c": 60}
    assert p.choose(nodes) is None  # every slot is taken


def test_completed_placements_count_until_a_later_report() -> None:
    p = Placer(2, rng=random.Random(2))
    nodes = [NodeLoad("a", cap(1), sampled_at=10.0), NodeLoad("b", cap(1), sampled_at=10.0)]
    t = p.begin("a")
    p.end(t, placed=True, now=11.0)
    assert p.pending("a", 10.0) == 1
    assert p.choose(nodes) == "b"
    # A report sampled after the create shows it: the overlay drops it.
    assert p.pending("a", 12.0) == 0
    t2 = p.begin("b")
    p.end(t2, placed=False, now=11.0)  # refused: nothing held there
    assert p.pending("b", 10.0) == 0
    p.end(t2, placed=True, now=11.0)  # ending twice counts once
    assert p.pending("b", 10.0) == 0


def test_full_and_excluded_nodes_are_skipped() -> None:
    p = Placer(2, rng=random.Random(3))
    nodes = [NodeLoad("full", cap(4, 4)), NodeLoad("ok", cap(4)), NodeLoad("bad", cap(50))]
    for _ in range(50):
        assert p.choose(nodes, exclude=["bad"]) == "ok"
    assert p.choose(nodes, exclude=["bad", "ok"]) is None


def test_affinity_spread_and_templates() -> None:
    p = Placer(2, rng=random.Random(4))
    nodes = [
        NodeLoad("a", cap(10), templates=frozenset({"t"})),
        NodeLoad("b", cap(30)),
        NodeLoad("c", cap(20), templates=frozenset({"t"})),
    ]
    assert p.choose(nodes, node="b") == "b"
    assert p.choose(nodes, node="zzz") is None
    assert p.choose(nodes, spread=True) == "b"
    # Only nodes that have the template, while one has it ...
    assert {p.choose(nodes, template="t") for _ in range(40)} <= {"a", "c"}
    # ... and any node when none has it and the cluster can make it there.
    assert p.choose(nodes, template="u", spread=True) == "b"
    assert p.choose(nodes, template="u", buildable=False) is None


def test_warm_pools_first() -> None:
    """A burst goes where the template's warm pool still has sandboxes
    (counting this client's placements since the report), then anywhere."""
    p = Placer(2, rng=random.Random(6))
    t = frozenset({"t"})
    nodes = [
        NodeLoad("a", cap(100), templates=t, pool_ready={"t": 3}),
        NodeLoad("b", cap(100), templates=t, pool_ready={"t": 0}),
        NodeLoad("c", cap(100), templates=t, pool_ready={"t": 2}),
    ]
    first = []
    for _ in range(5):
        n = p.choose(nodes, template="t")
        assert n is not None
        p.begin(n)
        first.append(n)
    assert Counter(first) == {"a": 3, "c": 2}
    assert p.choose(nodes, template="t", spread=True) == "b"  # pools used up: by free slots


def test_power_of_two_beats_random_on_imbalance() -> None:
    """Equal nodes, sequential creates with no departures: the spread of
    counts under k=2 is far below k=1 (random) and near least-loaded."""

    def spread(k: int) -> int:
        p = Placer(k, rng=random.Random(5))
        nodes = [NodeLoad(f"n{i}", cap(10_000)) for i in range(50)]
        got: Counter[str] = Counter()
        for _ in range(5_000):
            n = p.choose(nodes)
            assert n is not None
            p.begin(n)
            got[n] += 1
        return max(got.values()) - min(got[x.name] for x in nodes)

    assert spread(2) * 3 < spread(1)
    assert spread(50) <= 1
