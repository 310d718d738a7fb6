"""The partitioner: cycle-free by construction, every unit placed once, near-linear."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from codegraft.plan.partition import Group, demote_small_groups, merge_independent_groups, partition_units


def _check(groups: list[Group], backends: list[str], preds: list[list[int]]) -> None:
    placed = [u for g in groups for u in g.units]
    assert sorted(placed) == list(range(len(backends))), "every unit exactly once"
    group_of = {u: i for i, g in enumerate(groups) for u in g.units}
    for g in groups:
        assert all(backends[u] == g.backend for u in g.units)
    # Groups run in list order, so every edge must point to the same or a later group:
    # that is exactly "no cycle between partitions" plus "a valid schedule".
    position = {u: k for k, u in enumerate(placed)}
    for unit, ps in enumerate(preds):
        for p in ps:
            assert group_of[p] <= group_of[unit]
            assert position[p] < position[unit]


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[list[str], list[list[int]]]:
    count = draw(st.integers(1, 40))
    backends = [draw(st.sampled_from(["host", "a", "b"])) for _ in range(count)]
    preds = [
        sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3)))) if i else [] for i in range(count)
    ]
    return backends, preds


@given(random_dags())
def test_random_dags_partition_without_cycles(dag: tuple[list[str], list[list[int]]]) -> None:
    backends, preds = dag
    groups = partition_units(backends, preds, host="host", preference=["a", "b"])
    _check(groups, backends, preds)


@given(random_dags())
def test_merging_groups_keeps_them_cycle_free_and_never_adds_one(dag: tuple[list[str], list[list[int]]]) -> None:
    backends, preds = dag
    groups = partition_units(backends, preds, host="host", preference=["a", "b"])
    merged = merge_independent_groups(groups, preds)
    _check(merged, backends, preds)
    assert len(merged) <= len(groups)
    # no pair left that could merge: the function's own check finds nothing more
    assert merge_independent_groups(merged, preds) == merged


def test_host_work_only_the_host_reads_waits_for_the_hosts_next_partition() -> None:
    # lengths (h0) -> mask (h2, after a1's convolution): h0 joins h2 instead of opening first
    backends, preds = ["host", "a", "host"], [[], [], [0, 1]]
    groups = partition_units(backends, preds, host="host")
    _check(groups, backends, preds)
    assert groups == [Group("a", (1,)), Group("host", (0, 2))]


def test_groups_of_one_backend_merge_where_nothing_between_needs_the_first() -> None:
    # h0 -> h2 -> a3, a1 -> h2: h0 leads to a3 (so it opens first) but a1 does not need it
    backends, preds = ["host", "a", "host", "a"], [[], [], [0, 1], [1, 2]]
    groups = partition_units(backends, preds, host="host")
    assert [g.backend for g in groups] == ["host", "a", "host", "a"]
    merged = merge_independent_groups(groups, preds)
    _check(merged, backends, preds)
    assert merged == [Group("a", (1,)), Group("host", (0, 2)), Group("a", (3,))]


def test_diamond_with_host_in_one_branch_splits_into_three() -> None:
    # a0 -> (a1, h2) -> a3: a3 must wait for h2, so a0/a1 and a3 cannot share a partition.
    backends = ["a", "a", "host", "a"]
    preds = [[], [0], [0], [1, 2]]
    groups = partition_units(backends, preds, host="host")
    _check(groups, backends, preds)
    assert [g.backend for g in groups] == ["a", "host", "a"]


def test_independent_chains_merge_into_one_partition_per_backend() -> None:
    backends = ["a", "a", "a", "a"]
    preds = [[], [0], [], [2]]
    assert partition_units(backends, preds, host="host") == [Group("a", (0, 2, 1, 3))]


def test_cycle_in_input_is_reported() -> None:
    try:
        partition_units(["a", "a"], [[1], [0]], host="host")
    except ValueError as error:
        assert "cycle" in str(error)
    else:
        raise AssertionError("a cyclic graph must be rejected")


def test_small_groups_go_back_to_the_host() -> None:
    backends = ["a", "host", "a", "a"]
    preds = [[], [0], [1], [2]]
    groups = partition_units(backends, preds, host="host")
    assert demote_small_groups(groups, backends, host="host", min_nodes=2, unit_sizes=[1, 1, 1, 1])
    assert backends == ["host", "host", "a", "a"]
    assert not demote_small_groups(
        partition_units(backends, preds, host="host"), backends, host="host", min_nodes=2, unit_sizes=[1] * 4
    )


def test_composite_units_count_their_nodes() -> None:
    backends = ["a"]
    groups = partition_units(backends, [[]], host="host")
    assert not demote_small_groups(groups, backends, host="host", min_nodes=3, unit_sizes=[3])
