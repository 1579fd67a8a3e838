"""Reports from nodes are input from another process: each field is
checked (pure: no Ray cluster, no daemon)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shoal.cluster._report import BadReport, capacity_from_stats, parse_report, split_id


def good() -> dict[str, Any]:
    stats = {
        "usage": {"vms": 2, "vcpus": 2, "memory_mib": 256, "by_state": {"running": 1, "pooled": 1}},
        "limits": {"max_vms": 10, "min_available_mib": 1024, "memory_overcommit": 8.0},
        "memory_budget_mib": 8192,
        "vcpu_budget": 64,
        "host": {"memory_available_mib": 20000},
    }
    return {
        "v": 1,
        "node": "n1",
        "url": "http://127.0.0.1:7070",
        "token": "t0k",
        "ok": True,
        "seq": 3,
        "capacity": capacity_from_stats(stats),
        "templates": {"py": {"memory_mib": 256, "vcpus": 2}},
        "pools": {"py": [4, 1]},
        "images": ["tiny"],
    }


def test_a_good_report_parses() -> None:
    r = parse_report("n1", good())
    assert r.ok and r.sandboxes == 1 and r.capacity.max_vms == 10 and r.capacity.vms == 2
    assert r.templates["py"].memory_mib == 256 and r.pools["py"] == (4, 1)
    assert r.images == frozenset({"tiny"})


@pytest.mark.parametrize(
    "path,value",
    [
        (("v",), 2),
        (("node",), "n2"),
        (("url",), "file:///etc/passwd"),
        (("url",), "http://a b"),
        (("ok",), "yes"),
        (("token",), ""),
        (("capacity", "vms"), -1),
        (("capacity", "max_vms"), "10"),
        (("capacity", "memory_budget_mib"), float("nan")),
        (("capacity", "memory_overcommit"), 0),
        (("capacity", "vcpus"), True),
        (("templates",), ["py"]),
        (("templates", "py", "memory_mib"), 0),
        (("pools", "py"), [1]),
        (("images",), "tiny"),
    ],
)
def test_a_bad_field_is_refused(path: tuple[str, ...], value: Any) -> None:
    r = copy.deepcopy(good())
    at = r
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    with pytest.raises(BadReport):
        parse_report("n1", r)


def test_a_report_of_a_daemon_that_does_not_answer_has_no_capacity() -> None:
    r = good()
    r.update(ok=False, error="shoald at http://127.0.0.1:7070 does not answer", capacity=None)
    p = parse_report("n1", r)
    assert not p.ok and p.capacity.max_vms == 0 and "does not answer" in (p.error or "")


def test_stats_without_a_field_are_refused() -> None:
    with pytest.raises(BadReport):
        capacity_from_stats({"usage": {}, "limits": {}, "host": {}})


def test_ids() -> None:
    assert split_id("n1.5f0c1a2b9e7d") == ("n1", "5f0c1a2b9e7d")
    for bad in ("5f0c1a2b9e7d", "N1.abc", ".abc", "n1.", "n1.a/b", "n1.a.b", 7):
        with pytest.raises(ValueError):
            split_id(bad)  # type: ignore[arg-type]
