"""The cluster client's pure decisions on real report payloads (no Ray
cluster, no daemon): which node pulls an OCI image before a create, and
how ``map_fncall`` splits calls by free slots."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

from shoal.cluster import Placer, needs_pull, split_by_capacity
from shoal.cluster._client import ShoalCluster, _Node
from shoal.cluster._report import parse_report

from test_report_unit import good

REF = "127.0.0.1:5000/team/task:1"


def report(name: str, images: list[str], max_vms: int = 10) -> Any:
    r = copy.deepcopy(good())
    r["node"], r["images"] = name, images
    r["capacity"]["max_vms"] = max_vms
    return parse_report(name, r)


def test_an_oci_image_the_node_lacks_is_pulled_first() -> None:
    has = report("n1", [REF, "sha256:" + "a" * 64])
    lacks = report("n2", [])
    assert not needs_pull(has.images, REF, None)
    assert not needs_pull(has.images, "sha256:" + "a" * 64, None)
    assert needs_pull(lacks.images, REF, None)
    # Built-in images and templates are never pulled.
    assert not needs_pull(lacks.images, "tiny", None) and not needs_pull(lacks.images, "base", None)
    assert not needs_pull(lacks.images, None, "py") and not needs_pull(lacks.images, REF, "py")


def test_placement_prefers_the_nodes_that_have_the_image() -> None:
    nodes = [report("n1", [REF], max_vms=4), report("n2", [], max_vms=40)]
    loads = [ShoalCluster._load(_Node(r, None, 0.0)) for r in nodes]  # type: ignore[arg-type]
    p = Placer(2)
    assert {p.choose(loads, image=REF) for _ in range(20)} == {"n1"}
    # None has it: every node is eligible (the chosen one pulls it).
    other = "127.0.0.1:5000/team/other:2"
    assert {p.choose(loads, image=other, spread=True) for _ in range(5)} == {"n2"}


@pytest.mark.parametrize(
    "free,count,shares",
    [
        ([3, 6, 9], 18, [3, 6, 9]),
        ([3, 6, 9], 10, [2, 3, 5]),
        ([0, 4, 0], 5, [0, 5, 0]),
        ([0, 0, 0], 4, [2, 1, 1]),
        ([5, 5], 0, [0, 0]),
        ([1, 1, 1], 2, [1, 1, 0]),
    ],
)
def test_map_fncall_splits_by_free_slots(free: list[int], count: int, shares: list[int]) -> None:
    parts = split_by_capacity(free, count)
    assert [len(p) for p in parts] == shares
    assert sorted(i for p in parts for i in p) == list(range(count))
    assert all(p == sorted(p) for p in parts)


def test_split_interleaves_the_range() -> None:
    parts = split_by_capacity([1, 3], 8)
    # Each node takes calls from the whole range, not one contiguous block.
    assert Counter(i < 4 for i in parts[1]) == Counter({True: 3, False: 3})
