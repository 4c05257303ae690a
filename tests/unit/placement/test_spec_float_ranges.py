"""Every float field of job spec v1 (and a GPU model's peak): any float either loads or is a
SpecError naming that field, and a spec that loads prices to finite numbers on a cluster whose
fastest GPU has any valid peak. Subnormals (5e-324) once reached `check_peak` and divided by zero."""

from __future__ import annotations

import copy
import math
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from apps.placement.bounds import lower_bound
from apps.placement.jobs import check_peak, load_job
from apps.placement.solvers import NoFit, place
from apps.placement.topology import SpecError, load_topology
from apps.placement.topology.ranges import (
    MAX_COMM_BYTES,
    MAX_COMPUTE_MS,
    MAX_FLOPS_PER_STEP,
    MAX_PEAK_TFLOPS,
    MAX_RUNTIME_S,
    MIN_COMM_BYTES,
    MIN_COMPUTE_MS,
    MIN_FLOPS_PER_STEP,
    MIN_PEAK_TFLOPS,
    MIN_RUNTIME_S,
)
from tests.unit.placement.specs import generated

SUBNORMAL = 5e-324

BASE = {
    "version": 1,
    "name": "floats",
    "gpus": 8,
    "parallelism": {"tp": 2, "pp": 2, "dp": 2},
    "model": {"flops_per_step": 1e12},
    "step": {"compute_ms": 100.0, "overlap": 0.5, "microbatches": 4},
    "comm": [
        {"group": "tp", "collective": "allreduce", "bytes": 1e6},
        {"group": "dp", "collective": "allreduce", "bytes": 1e8, "overlap": 0.2},
        {"group": "pp", "collective": "p2p", "bytes": 1e6, "count": 4},
    ],
    "estimated_runtime_s": 3600.0,
}

# (field path, how to set it in the spec)
FIELDS = {
    "model.flops_per_step": lambda s, v: s["model"].__setitem__("flops_per_step", v),
    "step.compute_ms": lambda s, v: s["step"].__setitem__("compute_ms", v),
    "step.overlap": lambda s, v: s["step"].__setitem__("overlap", v),
    "comm[0].bytes": lambda s, v: s["comm"][0].__setitem__("bytes", v),
    "comm[1].overlap": lambda s, v: s["comm"][1].__setitem__("overlap", v),
    "estimated_runtime_s": lambda s, v: s.__setitem__("estimated_runtime_s", v),
}

# Any float at all: subnormals, signed zeros, the edges of each range, huge, inf and nan.
ANY_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from(
        [SUBNORMAL, -SUBNORMAL, sys.float_info.min, 1e-300, 1e-9, 9.99e-4, 0.0, -0.0, 1e308, 1e-3, 1.0]
    ),
)


def _cluster(peak: float):
    return load_topology(generated(peak_tflops=peak))


def _finite_prediction(prediction) -> None:
    assert math.isfinite(prediction.comm_ms) and prediction.comm_ms >= 0
    assert math.isfinite(prediction.step_ms) and prediction.step_ms >= 0
    assert prediction.mfu is None or (math.isfinite(prediction.mfu) and 0 <= prediction.mfu)


@pytest.fixture(scope="module")
def clusters():
    return {peak: _cluster(peak) for peak in (MIN_PEAK_TFLOPS, 989.0, MAX_PEAK_TFLOPS)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(FIELDS)), value=ANY_FLOAT)
@example(field="step.compute_ms", value=SUBNORMAL)
@example(field="model.flops_per_step", value=SUBNORMAL)
@example(field="comm[0].bytes", value=SUBNORMAL)
@example(field="estimated_runtime_s", value=SUBNORMAL)
def test_any_float_loads_or_names_its_field(clusters, field, value):
    data = copy.deepcopy(BASE)
    FIELDS[field](data, value)
    try:
        spec = load_job(data)
    except SpecError as exc:
        assert [path for path, _ in exc.errors] == [field], exc.errors
        return
    for peak, topology in clusters.items():
        try:
            check_peak(spec, peak)
        except SpecError as exc:
            assert {path for path, _ in exc.errors} == {"model.flops_per_step", "step.compute_ms"}
            continue
        _finite_prediction(lower_bound(topology, spec))
        result = place(topology, np.ones(topology.n_gpus, dtype=bool), {}, spec, policy="first_fit")
        assert not isinstance(result, NoFit), result
        _finite_prediction(result.prediction)


@pytest.mark.parametrize(
    ("field", "low", "high"),
    [
        ("model.flops_per_step", MIN_FLOPS_PER_STEP, MAX_FLOPS_PER_STEP),
        ("step.compute_ms", MIN_COMPUTE_MS, MAX_COMPUTE_MS),
        ("comm[0].bytes", MIN_COMM_BYTES, MAX_COMM_BYTES),
        ("estimated_runtime_s", MIN_RUNTIME_S, MAX_RUNTIME_S),
    ],
)
def test_each_range_has_a_physical_lower_bound(field, low, high):
    for value in (SUBNORMAL, low / 2, np.nextafter(low, 0)):
        data = copy.deepcopy(BASE)
        FIELDS[field](data, float(value))
        with pytest.raises(SpecError) as exc:
            load_job(data)
        assert exc.value.errors[0][0] == field
        assert f"at least {low:g}" in exc.value.errors[0][1]
    for value in (low, high):
        data = copy.deepcopy(BASE)
        FIELDS[field](data, value)
        load_job(data)


def test_zero_stays_allowed_where_it_means_none():
    data = copy.deepcopy(BASE)
    data["step"]["compute_ms"] = 0
    data["comm"][0]["bytes"] = 0
    data.pop("model")
    spec = load_job(data)
    assert spec.compute_ms == 0 and spec.comm[0].bytes == 0


@given(peak=ANY_FLOAT)
@settings(max_examples=100, deadline=None)
@example(peak=SUBNORMAL)
def test_gpu_model_peak_loads_or_names_its_field(peak):
    try:
        topology = _cluster(peak)
    except SpecError as exc:
        assert [path for path, _ in exc.errors] == ["generate.peak_tflops"], exc.errors
        return
    assert MIN_PEAK_TFLOPS <= topology.node_peak_tflops.max() <= MAX_PEAK_TFLOPS
