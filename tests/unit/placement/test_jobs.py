"""Job spec v1: loading, defaults, round trip, and bad input rejected naming the field."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.placement.jobs import CommEntry, job_to_spec, load_job
from apps.placement.topology import SpecError

BASE = {
    "version": 1,
    "name": "bert-large-16",
    "cluster": "case-4-4",
    "user": "alice",
    "priority": 3,
    "gpus": 16,
    "parallelism": {"tp": 1, "pp": 2, "dp": 8, "ep": 1},
    "model": {"flops_per_step": 2.6e14},
    "step": {"compute_ms": 100, "overlap": 0.25},
    "comm": [
        {"group": "dp", "collective": "volume", "bytes": 1.2e9},
        {"group": "pp", "collective": "p2p", "bytes": 4e7, "count": 8},
    ],
    "estimated_runtime_s": 3600,
}


def spec(**changes):
    s = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is KeyError:
            s.pop(key)
        else:
            s[key] = value
    return s


def errors_of(data) -> dict[str, list[str]]:
    with pytest.raises(SpecError) as exc:
        load_job(data)
    return exc.value.as_dict()


def test_case_4_4_job_file_loads_with_its_numbers(case44_job):
    j = case44_job
    assert (j.name, j.cluster, j.gpus, j.tp, j.pp, j.dp, j.ep, j.cp) == (
        "bert-large-16",
        "case-4-4",
        16,
        1,
        2,
        8,
        1,
        1,
    )
    assert j.flops_per_step == 2.6e14 and j.compute_ms == 100.0 and j.overlap == 0.0
    assert j.comm == (CommEntry("dp", "volume", 1.2e9, 1),)
    assert j.rank_order == "tp-ep-dp-pp" and j.estimated_runtime_s == 3600.0


def test_user_priority_and_policy_are_kept():
    j = load_job(spec(policy="tree_best_fit"))
    assert (j.user, j.priority, j.policy) == ("alice", 3, "tree_best_fit")
    assert j.comm[1] == CommEntry("pp", "p2p", 4e7, 8)


def test_optional_fields_take_their_defaults():
    j = load_job(
        spec(
            cluster=KeyError,
            user=KeyError,
            priority=KeyError,
            model=KeyError,
            estimated_runtime_s=KeyError,
            step={"compute_ms": 5},
            parallelism={"dp": 16},
        )
    )
    assert (j.cluster, j.user, j.priority, j.flops_per_step, j.estimated_runtime_s, j.policy) == (
        None,
        None,
        0,
        None,
        None,
        None,
    )
    assert (j.tp, j.pp, j.dp, j.ep, j.overlap) == (1, 1, 16, 1, 0.0)


def test_job_to_spec_round_trips():
    j = load_job(spec(policy="topo", rank_order="tp-dp-ep-pp"))
    assert load_job(job_to_spec(j)) == j


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-ep-dp-pp", "TP-EP-DP-PP", "cp-tp-ep-dp-pp"])
def test_cp_in_the_rank_order_changes_nothing_while_cp_is_1(order):
    assert load_job(spec(rank_order=order)).rank_order == "tp-ep-dp-pp"


def test_parallelism_that_does_not_multiply_to_gpus_names_the_products():
    errs = errors_of(spec(parallelism={"tp": 2, "pp": 2, "dp": 3}))
    assert errs["parallelism"] == ["tp*pp*dp=12 but gpus=16"]


BAD = [
    ({"colour": "red"}, "colour", "unknown field"),
    ({"version": 2}, "version", "must be 1"),
    ({"name": ""}, "name", "non-empty string"),
    ({"gpus": 0}, "gpus", "at least 1"),
    ({"gpus": 16.0}, "gpus", "whole number"),
    ({"priority": "high"}, "priority", "whole number"),
    ({"parallelism": {"tp": 1, "pp": 2, "dp": 8, "ep": 3}}, "parallelism.ep", "ep=3 must divide dp=8"),
    ({"parallelism": {"tp": 1, "pp": 1, "dp": 8, "cp": 4}}, "parallelism", "tp*cp*pp*dp=32 but gpus=16"),
    ({"parallelism": {"tp": 1, "pp": 1, "dp": 8, "cp": 0}}, "parallelism.cp", "at least 1"),
    ({"parallelism": {"tp": 1, "pp": 2, "dp": 8, "sp": 2}}, "parallelism.sp", "unknown field"),
    ({"parallelism": {"tp": 0, "pp": 2, "dp": 8}}, "parallelism.tp", "at least 1"),
    ({"rank_order": "tp-dp-pp"}, "rank_order", "permutation of tp, ep, dp, pp"),
    ({"rank_order": "tp-tp-dp-pp"}, "rank_order", "permutation"),
    ({"rank_order": "tp-cp-cp-ep-dp-pp"}, "rank_order", "permutation"),
    ({"rank_order": 7}, "rank_order", "must be a string"),
    ({"model": {"flops_per_step": 1e14, "params": 3}}, "model.params", "unknown field"),
    ({"model": {"flops_per_step": -1}}, "model.flops_per_step", "positive"),
    ({"step": {"overlap": 0.5}}, "step.compute_ms", "required field is missing"),
    ({"step": {"compute_ms": 10, "overlap": 1.5}}, "step.overlap", "between 0 and 1"),
    ({"step": {"compute_ms": 10, "overlap": -0.1}}, "step.overlap", "non-negative"),
    ({"step": {"compute_ms": -1}}, "step.compute_ms", "non-negative"),
    ({"comm": {"group": "dp"}}, "comm", "must be a list"),
    ({"estimated_runtime_s": 0}, "estimated_runtime_s", "positive"),
    ({"policy": "best"}, "policy", "must be one of topo, naive, first_fit, tree_best_fit, random"),
    ({"gpus": KeyError}, "gpus", "required field is missing"),
]


@pytest.mark.parametrize(("changes", "field", "fragment"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_job_is_rejected_naming_the_field(changes, field, fragment):
    errs = errors_of(spec(**changes))
    assert any(fragment in m for m in errs.get(field, [])), errs


COMM_BAD = [
    ({"group": "sp"}, "comm[1].group", "must be one of tp, pp, dp, ep, cp"),
    (
        {"collective": "broadcast"},
        "comm[1].collective",
        "allreduce, allgather, reducescatter, alltoall, p2p, volume",
    ),
    ({"bytes": -5}, "comm[1].bytes", "non-negative"),
    ({"bytes": "1GB"}, "comm[1].bytes", "must be a number"),
    ({"count": 0}, "comm[1].count", "at least 1"),
    ({"size": 3}, "comm[1].size", "unknown field"),
]


@pytest.mark.parametrize(("changes", "field", "fragment"), COMM_BAD, ids=[b[1] for b in COMM_BAD])
def test_bad_comm_entry_is_rejected_naming_its_index_and_field(changes, field, fragment):
    entry = {**BASE["comm"][1], **changes}
    errs = errors_of(spec(comm=[BASE["comm"][0], entry]))
    assert any(fragment in m for m in errs.get(field, [])), errs


def test_every_error_is_reported_at_once():
    errs = errors_of(spec(version=3, gpus=12, policy="x"))
    assert {"version", "parallelism", "policy"} <= set(errs)


def test_a_spec_that_is_not_a_mapping_is_rejected():
    with pytest.raises(SpecError, match="must be a mapping"):
        load_job([1, 2])


JUNK = [None, -1, 0, 2.5, "x", True, [], {}, [1], {"a": 1}, float("inf")]


def _paths(obj, prefix=()):
    if prefix:
        yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(list(_paths(BASE))), st.sampled_from(JUNK))
def test_any_single_bad_value_is_a_spec_error_never_a_crash(path, junk):
    s = copy.deepcopy(BASE)
    obj = s
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = junk
    try:
        load_job(s)
    except SpecError as exc:
        assert all(field and msg for field, msg in exc.errors)


@pytest.mark.parametrize(
    ("order", "stored"),
    [
        ("tp-ep-dp-pp", "tp-cp-ep-dp-pp"),
        ("pp-tp-ep-dp", "pp-tp-cp-ep-dp"),
        ("cp-tp-ep-dp-pp", "cp-tp-ep-dp-pp"),
    ],
)
def test_context_parallelism_enters_the_rank_order_after_tp_unless_placed(order, stored):
    j = load_job(spec(parallelism={"tp": 2, "cp": 2, "pp": 2, "dp": 2}, rank_order=order))
    assert (j.cp, j.rank_order) == (2, stored)
    assert load_job(job_to_spec(j)) == j


def test_dims_list_the_rank_order_fastest_first():
    assert load_job(spec(rank_order="pp-cp-tp-dp-ep")).dims == ("pp", "tp", "dp", "ep")
