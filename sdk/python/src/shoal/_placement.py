"""Placement of sandboxes over the nodes of a cluster: power-of-k choices.

Pure logic (no I/O, no Ray): :class:`ShoalCluster` feeds it the nodes'
last reported capacity and asks where the next create goes. Each create
samples ``k`` eligible nodes uniformly at random and takes the one with
the most free slots left once the placements not yet visible in that
node's last report are counted (the in-flight overlay: creates under way,
and those done since the report was sampled), so a burst between two
reports spreads instead of landing on the node that looked emptiest.

``k`` = 1 is random placement; ``k`` >= the node count is least-loaded.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import AbstractSet, Iterable, Mapping, Sequence

__all__ = [
    "BUILTIN_IMAGES",
    "Capacity",
    "NodeLoad",
    "Placer",
    "Ticket",
    "free_slots",
    "needs_pull",
    "split_by_capacity",
]


@dataclass(frozen=True)
class Capacity:
    """What a node's daemon reported (``GET /v1/stats``): its admission
    limits and what sandboxes hold."""

    max_vms: int
    vms: int
    memory_budget_mib: int
    memory_mib: int
    vcpu_budget: int
    vcpus: int
    available_mib: int = 1 << 40
    min_available_mib: int = 0
    memory_overcommit: float = 1.0


def free_slots(c: Capacity, memory_mib: int = 128, vcpus: int = 1) -> int:
    """How many more sandboxes of ``memory_mib`` and ``vcpus`` the node
    admits: the tightest of its sandbox cap, its guest memory and vCPU
    budgets, and its real memory left above the refusal threshold (a
    restored guest costs about its memory over the overcommit)."""
    memory_mib = max(1, memory_mib)
    vcpus = max(1, vcpus)
    by_count = c.max_vms - c.vms
    by_mem = (c.memory_budget_mib - c.memory_mib) // memory_mib
    by_cpu = (c.vcpu_budget - c.vcpus) // vcpus
    per_guest_real = max(1.0, memory_mib / max(1.0, c.memory_overcommit))
    by_real = int((c.available_mib - c.min_available_mib) // per_guest_real)
    return max(0, min(by_count, by_mem, by_cpu, by_real))


@dataclass(frozen=True)
class NodeLoad:
    """A live node as placement sees it.

    ``sampled_at`` is when its report was taken, on the placer's clock
    (``time.monotonic()`` of the client); placements completed after it
    are not in ``capacity`` yet and are counted by the placer.
    """

    name: str
    capacity: Capacity
    sampled_at: float = 0.0
    templates: frozenset[str] = frozenset()
    images: frozenset[str] = frozenset()
    pool_ready: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Ticket:
    """One placement under way (from :meth:`Placer.begin` to :meth:`Placer.end`)."""

    node: str
    done: bool = False


class Placer:
    """Power-of-k choices with an in-flight overlay. Thread-safe."""

    def __init__(self, k: int = 2, *, rng: random.Random | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1 (got {k})")
        self.k = k
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._inflight: dict[str, int] = {}
        # Completed placements per node, by completion time: counted until
        # a report sampled after them arrives.
        self._recent: dict[str, list[float]] = {}

    def pending(self, node: str, sampled_at: float) -> int:
        """Placements on ``node`` its report sampled at ``sampled_at``
        does not show: those under way and those completed since."""
        with self._lock:
            return self._pending(node, sampled_at)

    def _pending(self, node: str, sampled_at: float) -> int:
        recent = self._recent.get(node)
        if recent:
            recent[:] = [t for t in recent if t > sampled_at]
        return self._inflight.get(node, 0) + len(recent or ())

    def choose(
        self,
        nodes: Sequence[NodeLoad],
        *,
        template: str | None = None,
        image: str | None = None,
        memory_mib: int = 128,
        vcpus: int = 1,
        node: str | None = None,
        spread: bool = False,
        exclude: Iterable[str] = (),
        buildable: bool = True,
    ) -> str | None:
        """The node for the next create, or None when no node can take it.

        Eligible: every node not in ``exclude`` (``node`` alone when
        given) that has ``template`` (or ``image``) ready; when none has
        it and ``buildable`` (the cluster can make it on a node), every
        node. Of those, the ones whose warm pool of ``template`` still has
        sandboxes after the overlay, when any has (a create from a pool
        takes milliseconds, one restored on demand far longer). Among the
        eligible with free slots left after the overlay, ``spread`` takes
        the one with most (least-loaded over all), otherwise the best of
        ``k`` sampled uniformly.
        """
        skip = set(exclude)
        live = [n for n in nodes if n.name not in skip]
        if node is not None:
            live = [n for n in live if n.name == node]
        want = template if template is not None else image
        if want is not None:
            have = [
                n
                for n in live
                if (want in n.templates if template is not None else want in n.images)
            ]
            live = have if have or not buildable else live
        if not live:
            return None

        def score(n: NodeLoad) -> int:
            free = free_slots(n.capacity, memory_mib, vcpus)
            return free - self._pending(n.name, n.sampled_at)

        with self._lock:
            if template is not None:
                warm = [
                    n
                    for n in live
                    if n.pool_ready.get(template, 0) > self._pending(n.name, n.sampled_at)
                ]
                live = warm or live
            scored: list[tuple[int, str]] = []
            if not spread and self.k < len(live):
                # The k sampled first (O(k) per create at any cluster
                # size); only when none of them has room, every node.
                scored = [(f, n.name) for n in self._rng.sample(live, self.k) if (f := score(n)) > 0]
            if not scored:
                scored = [(f, n.name) for n in live if (f := score(n)) > 0]
                if not scored:
                    return None
                if not spread and self.k < len(scored):
                    scored = self._rng.sample(scored, self.k)
            best = max(f for f, _ in scored)
            return self._rng.choice([name for f, name in scored if f == best])

    def begin(self, node: str) -> Ticket:
        """Counts a placement on ``node`` as under way."""
        with self._lock:
            self._inflight[node] = self._inflight.get(node, 0) + 1
        return Ticket(node)

    def end(self, ticket: Ticket, *, placed: bool, now: float) -> None:
        """Ends a placement: ``placed`` (it holds a sandbox there now) is
        counted until a report sampled after ``now`` shows it."""
        with self._lock:
            if ticket.done:
                return
            ticket.done = True
            left = self._inflight.get(ticket.node, 0) - 1
            if left > 0:
                self._inflight[ticket.node] = left
            else:
                self._inflight.pop(ticket.node, None)
            if placed:
                self._recent.setdefault(ticket.node, []).append(now)

    def forget(self, node: str) -> None:
        """Drops what is counted for ``node`` (it left the cluster)."""
        with self._lock:
            self._inflight.pop(node, None)
            self._recent.pop(node, None)


#: The daemon's built-in images (never pulled: ``shoal_images::artifacts::IMAGES``).
BUILTIN_IMAGES = frozenset({"tiny", "base"})


def needs_pull(images: AbstractSet[str], image: str | None, template: str | None) -> bool:
    """Whether a create of ``image`` on a node whose report lists
    ``images`` must pull it there first: an OCI image (not a built-in
    one, no template) not listed (by reference or id)."""
    return (
        template is None
        and image is not None
        and image not in BUILTIN_IMAGES
        and image not in images
    )


def split_by_capacity(free: Sequence[int], count: int) -> list[list[int]]:
    """``count`` call indexes over nodes with ``free`` slots each: shares
    proportional to the free slots (largest remainders), interleaved so
    each node gets calls from the whole range; all nodes evenly when
    none has a free slot."""
    weights = [max(0, int(f)) for f in free]
    if sum(weights) == 0:
        weights = [1] * len(weights)
    total = sum(weights)
    quota = [count * w / total for w in weights]
    shares = [int(q) for q in quota]
    for i in sorted(range(len(quota)), key=lambda i: shares[i] - quota[i])[: count - sum(shares)]:
        shares[i] += 1
    parts: list[list[int]] = [[] for _ in weights]
    given = [0] * len(weights)
    for idx in range(count):
        # The node furthest behind its share takes the next call.
        j = min(
            (j for j in range(len(weights)) if given[j] < shares[j]),
            key=lambda j: (given[j] / shares[j], j),
        )
        parts[j].append(idx)
        given[j] += 1
    return parts
