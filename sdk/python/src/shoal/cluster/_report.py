"""Node reports: what a :class:`ShoalNode` tells the registry about its
daemon, and the checks a client makes on what comes back (a report is
input from another process: every field is validated, a bad one drops
the node from placement with the reason)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from .._placement import Capacity

#: A node's name: what the first part of a cluster sandbox id is.
NODE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
#: A node-local sandbox id, as shoald makes them.
LOCAL_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
#: Most templates / images / pools a report may list.
MAX_ITEMS = 10_000
REPORT_VERSION = 1


class BadReport(ValueError):
    """A node's report does not have the expected shape."""


def check_node_name(name: str) -> str:
    if not isinstance(name, str) or not NODE_NAME.match(name):
        raise ValueError(
            f"node name {name!r}: 1-63 of a-z, 0-9, '-', '_' starting with a letter or digit "
            "(it is the first part of every sandbox id placed there)"
        )
    return name


def split_id(sandbox_id: str) -> tuple[str, str]:
    """``<node>.<local id>`` -> (node, local id); ValueError if it is not one."""
    if not isinstance(sandbox_id, str):
        raise ValueError(f"sandbox id {sandbox_id!r}: not a string")
    node, dot, local = sandbox_id.partition(".")
    if not dot or not NODE_NAME.match(node) or not LOCAL_ID.match(local):
        raise ValueError(
            f"sandbox id {sandbox_id!r}: a cluster sandbox id is <node>.<id> "
            "(made by ShoalCluster.create)"
        )
    return node, local


def _int(v: Any, what: str, lo: int = 0, hi: int = 1 << 50) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadReport(f"{what}: {v!r} is not a number")
    if not lo <= v <= hi:
        raise BadReport(f"{what}: {v!r} out of range [{lo}, {hi}]")
    return int(v)


def capacity_from_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    """The capacity fields of a daemon's ``GET /v1/stats`` answer."""
    try:
        usage, limits, host = stats["usage"], stats["limits"], stats["host"]
        return {
            "max_vms": limits["max_vms"],
            "vms": usage["vms"],
            "memory_budget_mib": stats["memory_budget_mib"],
            "memory_mib": usage["memory_mib"],
            "vcpu_budget": stats["vcpu_budget"],
            "vcpus": usage["vcpus"],
            "available_mib": host["memory_available_mib"],
            "min_available_mib": limits["min_available_mib"],
            "memory_overcommit": limits["memory_overcommit"],
            "sandboxes": sum(
                int(n) for s, n in (usage.get("by_state") or {}).items() if s != "pooled"
            ),
        }
    except (KeyError, TypeError, ValueError) as e:
        raise BadReport(f"the daemon's /v1/stats lacks a field: {e}") from e


@dataclass(frozen=True)
class TemplateShape:
    memory_mib: int
    vcpus: int


@dataclass(frozen=True)
class NodeReport:
    """A validated report."""

    node: str
    url: str
    token: str | None
    ok: bool
    error: str | None
    seq: int
    capacity: Capacity
    sandboxes: int
    templates: Mapping[str, TemplateShape]
    pools: Mapping[str, tuple[int, int]]
    images: frozenset[str]


def parse_report(name: str, r: Any) -> NodeReport:
    """Checks a report the registry holds for node ``name``."""
    if not isinstance(r, Mapping):
        raise BadReport(f"report of {name}: not an object")
    if r.get("v") != REPORT_VERSION:
        raise BadReport(f"report of {name}: version {r.get('v')!r}, expected {REPORT_VERSION}")
    if r.get("node") != name:
        raise BadReport(f"report of {name} names node {r.get('node')!r}")
    url = r.get("url")
    if not isinstance(url, str) or not re.match(r"^http://[A-Za-z0-9.\[\]:_-]+$", url):
        raise BadReport(f"report of {name}: daemon url {url!r} is not http://HOST:PORT")
    token = r.get("token")
    if token is not None and (not isinstance(token, str) or not 0 < len(token) <= 4096):
        raise BadReport(f"report of {name}: bad token")
    ok = r.get("ok")
    if not isinstance(ok, bool):
        raise BadReport(f"report of {name}: ok is {ok!r}")
    err = r.get("error")
    c = r.get("capacity") if ok else None
    if ok:
        if not isinstance(c, Mapping):
            raise BadReport(f"report of {name}: no capacity")
        over = c.get("memory_overcommit", 1.0)
        if isinstance(over, bool) or not isinstance(over, (int, float)) or not 0 < over < 1e6:
            raise BadReport(f"report of {name}: memory_overcommit {over!r}")
        cap = Capacity(
            max_vms=_int(c.get("max_vms"), "max_vms"),
            vms=_int(c.get("vms"), "vms"),
            memory_budget_mib=_int(c.get("memory_budget_mib"), "memory_budget_mib"),
            memory_mib=_int(c.get("memory_mib"), "memory_mib"),
            vcpu_budget=_int(c.get("vcpu_budget"), "vcpu_budget"),
            vcpus=_int(c.get("vcpus"), "vcpus"),
            available_mib=_int(c.get("available_mib"), "available_mib"),
            min_available_mib=_int(c.get("min_available_mib"), "min_available_mib"),
            memory_overcommit=float(over),
        )
        sandboxes = _int(c.get("sandboxes", 0), "sandboxes")
    else:
        cap = Capacity(0, 0, 0, 0, 0, 0)
        sandboxes = 0
    templates: dict[str, TemplateShape] = {}
    tv = r.get("templates") or {}
    if not isinstance(tv, Mapping) or len(tv) > MAX_ITEMS:
        raise BadReport(f"report of {name}: templates is not an object")
    for t, shape in tv.items():
        if not isinstance(t, str) or not isinstance(shape, Mapping):
            raise BadReport(f"report of {name}: bad template entry {t!r}")
        templates[t] = TemplateShape(
            memory_mib=_int(shape.get("memory_mib", 128), f"template {t} memory", 1),
            vcpus=_int(shape.get("vcpus", 1), f"template {t} vcpus", 1),
        )
    pools: dict[str, tuple[int, int]] = {}
    pv = r.get("pools") or {}
    if not isinstance(pv, Mapping) or len(pv) > MAX_ITEMS:
        raise BadReport(f"report of {name}: pools is not an object")
    for t, p in pv.items():
        if not isinstance(p, (list, tuple)) or len(p) != 2:
            raise BadReport(f"report of {name}: bad pool entry {t!r}")
        pools[str(t)] = (_int(p[0], "pool target"), _int(p[1], "pool ready"))
    iv = r.get("images") or []
    if not isinstance(iv, (list, tuple)) or len(iv) > MAX_ITEMS:
        raise BadReport(f"report of {name}: images is not a list")
    return NodeReport(
        node=name,
        url=url,
        token=token,
        ok=ok,
        error=str(err)[:2000] if err is not None else None,
        seq=_int(r.get("seq", 0), "seq"),
        capacity=cap,
        sandboxes=sandboxes,
        templates=templates,
        pools=pools,
        images=frozenset(str(i) for i in iv),
    )
