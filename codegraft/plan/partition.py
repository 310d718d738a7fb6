"""Grouping annotated units into cycle-free partitions.

NOTE: the algorithm is a Kahn topological sort with one ready-queue per backend.  It keeps
draining the queue of the backend it is currently filling; only when that queue is empty does
it close the partition and switch to another backend (the host first, so that accelerator
partitions open as late, and therefore as large, as possible).  Every partition is thus a
contiguous stretch of one topological order, so partition-level edges only point forward and
no cycle can arise, by construction.  Each unit and edge is touched a constant number of times:
O(units + edges).

A *unit* is a single node or a composite (a pattern match claimed whole); the partitioner never
looks inside one, which is how composites and quantized units are never split.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from codegraft.core.gcpause import without_gc


@dataclass(frozen=True)
class Group:
    """One partition: the backend that runs it and its units, in a valid execution order."""

    backend: str
    units: tuple[int, ...]


@without_gc
def partition_units(
    backends: Sequence[str],
    predecessors: Sequence[Sequence[int]],
    *,
    host: str,
    preference: Sequence[str] = (),
) -> list[Group]:
    """Group units into cycle-free partitions, returned in execution order.

    ``backends[u]`` is the backend chosen for unit ``u``; ``predecessors[u]`` the units whose
    outputs ``u`` reads.  ``preference`` orders backends when several could open the next
    partition (the host always goes first).

    >>> partition_units(["a", "h", "a"], [[], [0], [1]], host="h")
    [Group(backend='a', units=(0,)), Group(backend='h', units=(1,)), Group(backend='a', units=(2,))]
    """
    count = len(backends)
    successors: list[list[int]] = [[] for _ in range(count)]
    pending = [0] * count
    for unit, preds in enumerate(predecessors):
        for pred in set(preds):
            successors[pred].append(unit)
            pending[unit] += 1

    rank = {host: -1}
    for index, name in enumerate(preference):
        rank.setdefault(name, index)
    ready: dict[str, deque[int]] = {}
    for unit in range(count):
        if pending[unit] == 0:
            ready.setdefault(backends[unit], deque()).append(unit)

    groups: list[Group] = []
    while True:
        current = _next_backend(ready, rank)
        if current is None:
            break
        queue = ready[current]
        members: list[int] = []
        while queue:
            unit = queue.popleft()
            members.append(unit)
            for succ in successors[unit]:
                pending[succ] -= 1
                if pending[succ] == 0:
                    ready.setdefault(backends[succ], deque()).append(succ)
        groups.append(Group(current, tuple(members)))

    placed = sum(len(g.units) for g in groups)
    if placed != count:
        raise ValueError(f"the graph has a cycle: {count - placed} units could not be ordered")
    return groups


def _next_backend(ready: dict[str, deque[int]], rank: dict[str, int]) -> str | None:
    candidates = [name for name, queue in ready.items() if queue]
    if not candidates:
        return None
    return min(candidates, key=lambda name: (rank.get(name, len(rank)), name))


def demote_small_groups(
    groups: Sequence[Group],
    backends: list[str],
    *,
    host: str,
    min_nodes: int,
    unit_sizes: Sequence[int],
    exempt: Collection[str] = (),
) -> bool:
    """Send the units of non-host groups of fewer than ``min_nodes`` nodes back to the host.

    Mutates ``backends``; returns whether anything changed (the caller re-partitions).
    """
    changed = False
    for group in groups:
        if group.backend == host or group.backend in exempt:
            continue
        if sum(unit_sizes[u] for u in group.units) < min_nodes:
            for unit in group.units:
                backends[unit] = host
            changed = True
    return changed
