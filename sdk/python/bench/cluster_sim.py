"""Placement at DSec's scale, simulated: 160 nodes, 5,000 creates/s with
Poisson arrivals and exponential lifetimes, per-node capacities scaled
from one measured on this host; every create placed by the real
:class:`shoal._placement.Placer` (power-of-2, random = k 1, least-loaded
= k all) of one of several independent clients, each seeing the nodes'
reports as of their last period (0.5 s, staggered) plus its own
placements since. A create sent to a node that is in fact full is
refused there (node-side admission) and placed again, excluding it.

Reported per strategy: the load imbalance (max / mean of the nodes'
utilisation, sampled each simulated second after the warm-up), its
spread, the refusals per 1,000 creates, and the placer's own time per
create (``choose`` + ``begin`` + ``end``)."""

from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from typing import Any

from shoal._placement import Capacity, NodeLoad, Placer


def _cap(slots: int, used: int) -> Capacity:
    # Only the sandbox count binds: the other budgets are made ample, so
    # free_slots(...) is exactly slots - used.
    return Capacity(
        max_vms=slots,
        vms=used,
        memory_budget_mib=1 << 40,
        memory_mib=0,
        vcpu_budget=1 << 40,
        vcpus=0,
    )


def simulate(
    strategy: str,
    *,
    capacities: list[int],
    rate: float = 5000.0,
    duration_s: float = 20.0,
    warmup_s: float = 8.0,
    load: float = 0.8,
    report_s: float = 0.5,
    clients: int = 8,
    seed: int = 1,
) -> dict[str, Any]:
    n = len(capacities)
    k = {"power_of_2": 2, "random": 1, "least_loaded": n}[strategy]
    rng = random.Random(seed)
    placers = [Placer(k, rng=random.Random(seed * 100 + i)) for i in range(clients)]
    total = sum(capacities)
    mean_life = load * total / rate
    used = [0] * n
    names = [f"h{i}" for i in range(n)]
    index = {name: i for i, name in enumerate(names)}
    # Each node's report: sampled every report_s, staggered; a heap of
    # the next due times, and the loads list rebuilt only where one is due.
    due = [(rng.random() * report_s, i) for i in range(n)]
    heapq.heapify(due)
    loads = [NodeLoad(names[i], _cap(capacities[i], 0), -report_s) for i in range(n)]
    departures: list[tuple[float, int]] = []
    t = 0.0
    next_sample = warmup_s
    imbalance: list[float] = []
    utilisation: list[float] = []
    refusals = 0
    placed = 0
    lost = 0
    placer_s = 0.0
    while t < duration_s:
        t += rng.expovariate(rate)
        while departures and departures[0][0] <= t:
            _, i = heapq.heappop(departures)
            used[i] -= 1
        while due[0][0] <= t:
            at, i = heapq.heappop(due)
            loads[i] = NodeLoad(names[i], _cap(capacities[i], used[i]), at)
            heapq.heappush(due, (at + report_s, i))
        while t >= next_sample:
            utils = [used[i] / capacities[i] for i in range(n)]
            mean = sum(utils) / n
            if mean > 0:
                imbalance.append(max(utils) / mean)
                utilisation.append(mean)
            next_sample += 1.0
        p = placers[int(rng.random() * clients)]
        tried: list[str] = []
        while True:
            t0 = time.perf_counter()
            name = p.choose(loads, exclude=tried)
            ticket = p.begin(name) if name is not None else None
            placer_s += time.perf_counter() - t0
            if name is None or ticket is None:
                lost += 1
                break
            i = index[name]
            ok = used[i] < capacities[i]
            t0 = time.perf_counter()
            p.end(ticket, placed=ok, now=t)
            placer_s += time.perf_counter() - t0
            if ok:
                used[i] += 1
                placed += 1
                heapq.heappush(departures, (t + rng.expovariate(1.0 / mean_life), i))
                break
            refusals += 1
            tried.append(name)
    return {
        "strategy": strategy,
        "k": k,
        "nodes": n,
        "rate_per_s": rate,
        "simulated_s": duration_s,
        "target_load": load,
        "creates": placed + lost,
        "placed": placed,
        "unplaced": lost,
        "refusals_per_1000": 1000.0 * refusals / max(1, placed + lost),
        "utilisation_mean": statistics.fmean(utilisation) if utilisation else math.nan,
        "imbalance_mean": statistics.fmean(imbalance) if imbalance else math.nan,
        "imbalance_max": max(imbalance) if imbalance else math.nan,
        "placer_us_per_create": 1e6 * placer_s / max(1, placed + lost),
    }


def fleet(measured: int, n: int = 160, seed: int = 3) -> list[int]:
    """Per-node capacities: ``measured`` (this host's free slots) scaled by
    0.5, 1 or 2 (a mixed fleet: a third of each)."""
    rng = random.Random(seed)
    return [max(1, int(measured * rng.choice((0.5, 1.0, 2.0)))) for _ in range(n)]
