"""Hostile spec text and values against the bounded loader and both spec loaders.

Every input either loads or raises SpecError naming the field, within a time and memory budget:
random and truncated text, YAML alias bombs, deep nesting, huge numbers, NaN/Infinity, NUL,
non-UTF-8, oversized input, out-of-range values, and names that are not host-name-like.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.placement.jobs import check_peak, job_to_spec, load_job
from apps.placement.solvers import NoFit, place
from apps.placement.topology import (
    JOB_LIMITS,
    SpecError,
    SpecLimits,
    load_topology,
    parse_spec_text,
    read_spec_file,
)
from apps.placement.topology import ranges as R
from tests.unit.hostile_inputs import alias_bomb, within_budget
from tests.unit.placement.specs import generated

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TOPOLOGY_TEXT = (EXAMPLES / "case-4-4.yaml").read_text()
JOB_TEXT = (EXAMPLES / "case-4-4-job.yaml").read_text()
TOPOLOGY = yaml.safe_load(TOPOLOGY_TEXT)
JOB = load_job(parse_spec_text(JOB_TEXT))
JOB_SPEC = job_to_spec(JOB)

TIME_BUDGET_S = 2.0
MEMORY_BUDGET_B = 32 * 1024 * 1024
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def bounded(fn, *args):
    """fn(*args) within the time and memory budget: its result or the SpecError it raised."""

    def run():
        try:
            return fn(*args)
        except SpecError as exc:
            return exc

    return within_budget(run, seconds=TIME_BUDGET_S, peak_bytes=MEMORY_BUDGET_B)


def load_any(text):
    """Parse, then load as a topology and as a job: results or SpecErrors, nothing else."""
    data = parse_spec_text(text)
    out = []
    for loader in (load_topology, load_job):
        try:
            out.append(loader(data))
        except SpecError as exc:
            out.append(exc)
    return out


def assert_clear(exc, field: str | None = None, fragment: str = "") -> None:
    """A SpecError whose messages are short, naming `field` (and holding `fragment`) when given."""
    assert isinstance(exc, SpecError), exc
    for path, message in exc.errors:
        assert len(message) <= 400 and len(path) <= 200, (path, message[:200])
    if field is not None:
        messages = exc.as_dict().get(field, [])
        assert any(fragment in m for m in messages), exc.as_dict()


# Random and truncated text.


@FAST
@given(st.binary(max_size=3000))
def test_random_bytes_load_or_give_a_spec_error(raw):
    bounded(load_any, raw)


@FAST
@given(st.text(max_size=3000))
def test_random_text_loads_or_gives_a_spec_error(text):
    bounded(load_any, text)


@FAST
@given(
    st.sampled_from([TOPOLOGY_TEXT, JOB_TEXT, json.dumps(TOPOLOGY), json.dumps(JOB_SPEC)]),
    st.floats(0, 1),
)
def test_truncated_specs_load_or_give_a_spec_error(text, share):
    bounded(load_any, text[: int(len(text) * share)])


@FAST
@given(
    st.sampled_from([TOPOLOGY_TEXT, JOB_TEXT, json.dumps(TOPOLOGY)]), st.floats(0, 1), st.binary(min_size=1)
)
def test_specs_with_injected_bytes_load_or_give_a_spec_error(text, share, junk):
    raw = text.encode()
    at = int(len(raw) * share)
    bounded(load_any, raw[:at] + junk + raw[at:])


# Aliases, nesting, numbers, NUL, encodings, size.


def expanded_values(width: int, depth: int) -> int:
    """Values in `alias_bomb(width, depth)` once every alias is expanded (keys included)."""
    size, total = 1 + width, 1
    for _ in range(depth):
        total += 1 + size
        size = 1 + width * size
    return total


@FAST
@given(st.integers(2, 12), st.integers(2, 12))
def test_yaml_alias_bombs_are_refused_within_budget(width, depth):
    result = bounded(parse_spec_text, alias_bomb(width, depth))
    aliases = width * (depth - 1)
    if aliases > 64 or expanded_values(width, depth) > 2_000_000:
        assert_clear(result)
        assert "alias" in str(result)
    else:
        assert isinstance(result, dict)


def test_the_billion_laughs_bomb_is_refused_in_a_job_and_a_topology():
    bomb = alias_bomb(10, 9)
    for limits in (JOB_LIMITS, SpecLimits()):
        assert_clear(bounded(parse_spec_text, bomb, limits))


def test_an_alias_to_its_own_container_is_refused():
    assert "contains it" in str(bounded(parse_spec_text, "a: &a [1, *a]"))


@FAST
@given(st.integers(33, 50_000), st.sampled_from(["[", '{"a":', "- ", "a:\n  "]))
def test_deep_nesting_is_refused_without_recursion_error(depth, opener):
    if opener == "a:\n  ":
        levels = min(depth, 300)
        text = "".join(f"{'  ' * i}a{i}:\n" for i in range(levels)) + "  " * levels + "x"
    elif opener == "- ":
        text = "- " * min(depth, 2000) + "x"
    else:
        text = opener * depth
    result = bounded(parse_spec_text, text)
    assert_clear(result)
    assert "nesting" in str(result) or "not valid" in str(result)


@FAST
@given(st.integers(min_value=10**40, max_value=10**4000), st.sampled_from(["json", "yaml"]))
def test_long_integers_reach_the_field_checks_which_name_the_field(number, syntax):
    spec = with_value(JOB_SPEC, ("comm", 0, "count"), number)
    text = json.dumps(spec) if syntax == "json" else yaml.safe_dump(spec)
    result = bounded(lambda t: load_job(parse_spec_text(t)), text)
    assert_clear(result, "comm[0].count", "must be at most 1000000")
    assert len(str(number)) < 79 or f"({len(str(number))} characters)" in str(result)


@pytest.mark.parametrize("syntax", ["json", "yaml"])
def test_integers_past_python_digit_limit_and_long_decimals_are_refused(syntax):
    huge = "9" * 5000
    text = '{"a": ' + huge + "}" if syntax == "json" else f"a: {huge}\n"
    assert_clear(bounded(parse_spec_text, text))
    long_float = "1." + "0" * 50
    text = '{"a": ' + long_float + "}" if syntax == "json" else f"a: {long_float}\n"
    assert "non-integer number of 52 characters" in str(bounded(parse_spec_text, text))


@pytest.mark.parametrize(
    "literal", ["NaN", "Infinity", "-Infinity", ".nan", ".NaN", ".inf", "-.inf", "+.INF", "1e400", "-1e999"]
)
@pytest.mark.parametrize("syntax", ["json", "yaml"])
def test_nan_and_infinity_never_reach_a_spec(literal, syntax):
    data = dict(JOB_SPEC, estimated_runtime_s="@")
    text = json.dumps(data) if syntax == "json" else yaml.safe_dump(data)
    text = text.replace("'@'", literal).replace('"@"', literal)
    # The loader refuses the number, or reads a YAML word such as NaN as text the job loader refuses.
    result = bounded(lambda t: load_job(parse_spec_text(t)), text)
    assert_clear(result)
    assert "estimated_runtime_s" in result.as_dict() or "number a spec may hold" in str(result)


@FAST
@given(st.sampled_from([TOPOLOGY_TEXT, JOB_TEXT]), st.floats(0, 1))
def test_nul_anywhere_is_refused(text, share):
    at = int(len(text) * share)
    assert "NUL" in str(bounded(parse_spec_text, text[:at] + "\x00" + text[at:]))


@FAST
@given(
    st.sampled_from([TOPOLOGY_TEXT, JOB_TEXT]),
    st.floats(0, 1),
    st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"]),
)
def test_non_utf8_is_refused(text, share, bad):
    raw = text.encode()
    at = int(len(raw) * share)
    assert "UTF-8" in str(bounded(parse_spec_text, raw[:at] + bad + raw[at:]))


def test_oversized_text_and_files_are_refused_before_reading(tmp_path):
    assert "limit is 65536 bytes" in str(bounded(parse_spec_text, "#" * 70_000, JOB_LIMITS))
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(1024 * 1024 * 1024)  # sparse: 1 GB that costs no disk
    assert "the file is 1073741824 bytes" in str(bounded(read_spec_file, str(big)))


def test_too_many_values_are_refused():
    limits = SpecLimits(max_nodes=1000)
    assert "more than 1000 values" in str(bounded(parse_spec_text, json.dumps(list(range(2000))), limits))
    assert "more than 1000 values" in str(bounded(parse_spec_text, "a: [" + "1," * 2000 + "1]", limits))


def test_json_bodies_can_be_refused_as_yaml():
    assert parse_spec_text("{a: 1}") == {"a": 1}
    assert "not valid JSON" in str(bounded(lambda t: parse_spec_text(t, json_only=True), "{a: 1}"))


# Physical ranges of job spec v1.

HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1.0, 10**400, -(10**400), 2**63, True, None]),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
)

JOB_FIELDS = {
    "gpus": (("gpus",), R.MAX_CLUSTER_GPUS),
    "priority": (("priority",), R.MAX_PRIORITY),
    "parallelism.tp": (("parallelism", "tp"), R.MAX_CLUSTER_GPUS),
    "model.flops_per_step": (("model", "flops_per_step"), R.MAX_FLOPS_PER_STEP),
    "step.compute_ms": (("step", "compute_ms"), R.MAX_COMPUTE_MS),
    "step.overlap": (("step", "overlap"), 1.0),
    "comm[0].bytes": (("comm", 0, "bytes"), R.MAX_COMM_BYTES),
    "comm[0].count": (("comm", 0, "count"), R.MAX_COMM_COUNT),
    "estimated_runtime_s": (("estimated_runtime_s",), R.MAX_RUNTIME_S),
}


def with_value(spec: dict, keys: tuple, value) -> dict:
    out = copy.deepcopy(spec)
    target = out
    for k in keys[:-1]:
        target = target[k]
    target[keys[-1]] = value
    return out


def load_job_error(spec: dict) -> SpecError:
    with pytest.raises(SpecError) as err:
        load_job(spec)
    return err.value


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(JOB_FIELDS)), HOSTILE_NUMBERS)
def test_hostile_job_numbers_are_refused_naming_the_field(field, value):
    keys, maximum = JOB_FIELDS[field]
    if field == "estimated_runtime_s" and value is None:
        return  # optional: null means no estimate
    if isinstance(maximum, float) and type(value) in (int, float) and 0 < value <= maximum:
        return  # in range (2**63 FLOPs per step is a real figure)
    assert_clear(bounded(load_job_error, with_value(JOB_SPEC, keys, value)), field)


@pytest.mark.parametrize("field", sorted(JOB_FIELDS))
def test_job_numbers_just_past_their_range_are_refused_and_the_bound_itself_loads(field):
    keys, maximum = JOB_FIELDS[field]
    over = maximum + 1 if isinstance(maximum, int) else maximum * 1.001
    assert_clear(
        load_job_error(with_value(JOB_SPEC, keys, over)),
        field,
        str(maximum) if isinstance(maximum, int) else f"{maximum:g}",
    )
    if field in ("gpus", "parallelism.tp"):
        return  # the bound alone breaks tp*pp*dp == gpus
    assert load_job(with_value(JOB_SPEC, keys, maximum))


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("estimated_runtime_s", 1e18, "at most 3.16224e+07"),
        ("comm[0].count", 10**400, "(401 characters)"),
        ("comm[0].bytes", 1.7e308, "between 0 and 1e+15"),
        ("priority", 2**31, "at most 1000000"),
    ],
)
def test_the_values_that_stopped_scheduling_are_refused(field, value, fragment):
    keys, _ = JOB_FIELDS[field]
    assert_clear(load_job_error(with_value(JOB_SPEC, keys, value)), field, fragment)


def test_too_many_comm_entries_are_refused():
    spec = with_value(JOB_SPEC, ("comm",), JOB_SPEC["comm"] * (R.MAX_COMM_ENTRIES + 1))
    assert_clear(load_job_error(spec), "comm", "limit is 64")


def test_flops_beyond_the_gpu_peak_name_both_fields():
    check_peak(JOB, 312.0)  # case 4.4: 2.6e14 FLOPs in 100 ms on 16 A100s is 52% of peak
    fast = with_value(JOB_SPEC, ("step", "compute_ms"), 10.0)
    with pytest.raises(SpecError) as err:
        check_peak(load_job(fast), 312.0)
    assert set(err.value.as_dict()) == {"model.flops_per_step", "step.compute_ms"}
    assert "1625 TFLOPS per GPU" in str(err.value)
    with pytest.raises(SpecError):
        check_peak(load_job(with_value(JOB_SPEC, ("step", "compute_ms"), 0)), 312.0)


# Physical ranges and sizes of topology spec v1.

TOPOLOGY_FIELDS = {
    "gpu_models.A100-SXM4-80GB.peak_tflops": (
        ("gpu_models", "A100-SXM4-80GB", "peak_tflops"),
        R.MAX_PEAK_TFLOPS,
    ),
    "nodes[0].gpus": (("nodes", 0, "gpus"), R.MAX_NODE_GPUS),
    "nodes[0].nvlink.bw_GBps": (("nodes", 0, "nvlink", "bw_GBps"), R.MAX_BW_GBps),
    "nodes[0].nvlink.latency_us": (("nodes", 0, "nvlink", "latency_us"), R.MAX_LATENCY_US),
    "nodes[1].nics[0].bw_GBps": (("nodes", 1, "nics", 0, "bw_GBps"), R.MAX_BW_GBps),
    "nodes[1].nics[0].latency_us": (("nodes", 1, "nics", 0, "latency_us"), R.MAX_LATENCY_US),
}
GENERATE_FIELDS = {
    "spines": R.MAX_GEN_SWITCHES,
    "leaves": R.MAX_GEN_SWITCHES,
    "nodes_per_leaf": R.MAX_GEN_NODES_PER_LEAF,
    "gpus_per_node": R.MAX_NODE_GPUS,
    "peak_tflops": R.MAX_PEAK_TFLOPS,
    "nvlink_bw_GBps": R.MAX_BW_GBps,
    "nic_bw_GBps": R.MAX_BW_GBps,
    "uplink_bw_GBps": R.MAX_BW_GBps,
    "pods": R.MAX_GEN_PODS,
    "nvlink_latency_us": R.MAX_LATENCY_US,
}


def load_topology_error(spec: dict) -> SpecError:
    with pytest.raises(SpecError) as err:
        load_topology(spec)
    return err.value


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(TOPOLOGY_FIELDS)), HOSTILE_NUMBERS)
def test_hostile_topology_numbers_are_refused_naming_the_field(field, value):
    keys, _ = TOPOLOGY_FIELDS[field]
    assert_clear(bounded(load_topology_error, with_value(TOPOLOGY, keys, value)), field)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(GENERATE_FIELDS)), HOSTILE_NUMBERS)
def test_hostile_generator_numbers_are_refused_naming_the_field(field, value):
    spec = generated(**{field: value})
    assert_clear(bounded(load_topology_error, spec), f"generate.{field}")


@pytest.mark.parametrize("field", sorted(GENERATE_FIELDS))
def test_generator_numbers_past_their_range_are_refused(field):
    maximum = GENERATE_FIELDS[field]
    over = maximum + 1 if isinstance(maximum, int) else maximum * 1.001
    assert_clear(
        bounded(load_topology_error, generated(**{field: over})), f"generate.{field}", f"{maximum:g}"
    )


def test_a_node_with_a_billion_gpus_is_refused_before_building():
    spec = with_value(TOPOLOGY, ("nodes", 0, "gpus"), 10**9)
    assert_clear(bounded(load_topology_error, spec), "nodes[0].gpus", "at most 128")


@FAST
@given(st.integers(1, 1024), st.integers(1, 1024), st.integers(1, 64), st.integers(1, 8))
def test_generated_clusters_past_the_limits_are_refused_before_building(leaves, per_leaf, pods, spines):
    spec = generated(
        leaves=leaves,
        nodes_per_leaf=per_leaf,
        pods=pods,
        cores=1,
        spines=spines,
        gpus_per_node=8,
        nics_per_node=8,
    )
    gpus = leaves * per_leaf * pods * 8
    if gpus <= R.MAX_CLUSTER_GPUS and leaves * per_leaf * pods <= R.MAX_NODES:
        return  # small enough to build: not what this test is about
    result = bounded(load_topology_error, spec)
    assert_clear(result)
    assert "would generate" in str(result)


def test_a_thousand_by_thousand_generator_is_refused_up_front():
    spec = generated(leaves=1000, nodes_per_leaf=1000, spines=1000)
    assert_clear(
        bounded(load_topology_error, spec), "generate.nodes_per_leaf", "would generate 1000000 nodes"
    )


def test_too_many_nodes_in_full_form_are_refused_naming_the_list():
    node = TOPOLOGY["nodes"][0]
    spec = with_value(TOPOLOGY, ("nodes",), [dict(node, name=f"n{i}") for i in range(1100)])
    spec = with_value(spec, ("nodes",), spec["nodes"] * 30)
    assert_clear(bounded(load_topology_error, spec), "nodes", "limit is 32768")


# Names.

HOSTILE_NAMES = st.one_of(
    st.sampled_from(
        [
            "a;rm -rf /",
            "$(reboot)",
            "`id`",
            "a\nb",
            "-rf",
            "",
            " a",
            "a b",
            "x" * 101,
            "nodé",
            "a'b",
            "a\x00b",
            "*",
        ]
    ),
    st.text(min_size=1, max_size=120).filter(lambda s: not R.NAME_RE.match(s)),
    st.integers(),
    st.none(),
)
NAME_FIELDS = {
    "name": ("name",),
    "switches[0].name": ("switches", 0, "name"),
    "nodes[0].name": ("nodes", 0, "name"),
    "nodes[0].nics[0].name": ("nodes", 0, "nics", 0, "name"),
    "nodes[0].nvlink.domain": ("nodes", 0, "nvlink", "domain"),
}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(NAME_FIELDS)), HOSTILE_NAMES)
def test_names_that_are_not_host_name_like_are_refused(field, name):
    spec = with_value(TOPOLOGY, NAME_FIELDS[field], name)
    assert_clear(load_topology_error(spec), field)


@settings(max_examples=80, deadline=None)
@given(HOSTILE_NAMES)
def test_job_names_that_are_not_host_name_like_are_refused(name):
    assert_clear(load_job_error(with_value(JOB_SPEC, ("name",), name)), "name")


@given(st.from_regex(R.NAME_RE, fullmatch=True))
@settings(max_examples=50, deadline=None)
def test_host_name_like_names_load(name):
    assert load_topology(with_value(TOPOLOGY, ("name",), name)).name == name


def test_gpu_model_names_may_hold_spaces_but_not_shell_characters():
    spaced = copy.deepcopy(TOPOLOGY)
    spaced["gpu_models"] = {"NVIDIA H100 80GB HBM3": {"peak_tflops": 989}}
    for node in spaced["nodes"]:
        node["gpu_model"] = "NVIDIA H100 80GB HBM3"
    assert "NVIDIA H100 80GB HBM3" in load_topology(spaced).gpu_models
    spaced["gpu_models"] = {"H100;reboot": {"peak_tflops": 989}}
    assert_clear(load_topology_error(spaced), "gpu_models.H100;reboot", "string of at most 100")


def test_echoed_values_are_cut():
    err = load_job_error(with_value(JOB_SPEC, ("rank_order",), "x" * 100_000))
    assert_clear(err, "rank_order", "(100002 characters)")


# Cost model results.


def test_a_placement_without_a_finite_time_is_no_placement(case44, case44_job, monkeypatch):
    import apps.placement.solvers as solvers

    real = solvers.evaluate

    def unreachable(*args, **kwargs):
        p = real(*args, **kwargs)
        return dataclasses.replace(p, comm_ms=math.inf, step_ms=math.inf)

    monkeypatch.setattr(solvers, "evaluate", unreachable)
    for policy in ("naive", "first_fit", "tree_best_fit"):
        result = place(case44, np.ones(case44.n_gpus, dtype=bool), {}, case44_job, policy=policy)
        assert isinstance(result, NoFit) and "cannot all reach" in result.reason


def test_json_made_of_empty_containers_is_refused_before_parsing():
    text = "[" + ",".join(["[]"] * 600_000) + "]"
    assert "lists and mappings" in str(bounded(parse_spec_text, text))
