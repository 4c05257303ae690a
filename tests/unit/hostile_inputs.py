"""Hypothesis strategies of hostile topology spec documents (as bytes), for every importer's tests.

Each class of the hardening issue is one branch: YAML alias bombs, deep nesting (JSON and YAML),
long and huge numbers, NaN/Infinity, NUL, non-UTF-8, truncation, sizes that must be refused before
anything is built, names that are not host-name-like. None of them is a valid cluster.
"""

from __future__ import annotations

import copy
import json
import time
import tracemalloc
from pathlib import Path

import yaml
from hypothesis import strategies as st

from apps.placement.topology.safeload import parse_spec_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOPOLOGY_TEXT = (EXAMPLES / "case-4-4.yaml").read_text()
TOPOLOGY = yaml.safe_load(TOPOLOGY_TEXT)


def within_budget(fn, *, seconds: float, peak_bytes: int):
    """fn() timed, then run again under tracemalloc for its peak memory (tracemalloc slows
    allocation-heavy code by orders of magnitude, so the two are measured apart); fn()'s result.
    The time is this thread's CPU time, not wall time: on a loaded machine the wall time also
    counts waiting for a core, and the budget is about the work done."""
    t0 = time.thread_time()
    result = fn()
    elapsed = time.thread_time() - t0
    assert elapsed < seconds, f"took {elapsed:.2f} s of CPU time"
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < peak_bytes, f"peak {peak / 1e6:.1f} MB"
    return result


def alias_bomb(width: int, depth: int) -> str:
    """`depth` levels of anchors, each a list of `width` aliases of the one before."""
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    for d in range(1, depth):
        lines.append(f"l{d}: &l{d} [" + ", ".join([f"*l{d - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def with_value(spec: dict, keys: tuple, value) -> dict:
    """A deep copy of `spec` with the value at `keys` replaced."""
    out = copy.deepcopy(spec)
    target = out
    for k in keys[:-1]:
        target = target[k]
    target[keys[-1]] = value
    return out


def _as_text(spec: dict, syntax: str) -> str:
    return json.dumps(spec) if syntax == "json" else yaml.safe_dump(spec, sort_keys=False)


def _inject(text: str, share: float, junk: bytes) -> bytes:
    raw = text.encode()
    at = int(len(raw) * share)
    return raw[:at] + junk + raw[at:]


def _bomb_in_spec(width: int, depth: int) -> bytes:
    # The bomb sits under an unknown field of an otherwise valid spec.
    return (TOPOLOGY_TEXT + "x_" + alias_bomb(width, depth).replace("\nl", "\nx_l")).encode()


NUMERIC_PATHS = [
    ("nodes", 0, "gpus"),
    ("nodes", 0, "nvlink", "bw_GBps"),
    ("nodes", 1, "nics", 0, "latency_us"),
    ("gpu_models", "A100-SXM4-80GB", "peak_tflops"),
]
NAME_PATHS = [("name",), ("switches", 0, "name"), ("nodes", 0, "name"), ("nodes", 1, "nics", 0, "name")]
BAD_NAMES = ["a;rm -rf /", "$(reboot)", "a\nb", "-rf", "", "x" * 101, "n\u00f6de", "a b"]


def hostile_topology_documents() -> st.SearchStrategy[bytes]:
    """Topology spec documents that every importer must refuse with a clear error."""
    syntax = st.sampled_from(["json", "yaml"])
    return st.one_of(
        st.builds(_bomb_in_spec, st.integers(9, 12), st.integers(8, 10)),
        st.builds(lambda d: ("[" * d + "]" * d).encode(), st.integers(33, 20_000)),
        st.builds(
            lambda d: (
                "a:\n" + "".join(f"{'  ' * (i + 1)}k{i}:\n" for i in range(d)) + "  " * (d + 1) + "x"
            ).encode(),
            st.integers(33, 300),
        ),
        st.builds(
            lambda path, n, s: _as_text(with_value(TOPOLOGY, path, n), s).encode(),
            st.sampled_from(NUMERIC_PATHS),
            st.sampled_from([10**400, 10**9, -1, 0, 1e308]),
            syntax,
        ),
        st.builds(
            lambda path, lit: _as_text(with_value(TOPOLOGY, path, "@"), "json").replace('"@"', lit).encode(),
            st.sampled_from(NUMERIC_PATHS),
            st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"]),
        ),
        st.builds(
            _inject, st.just(TOPOLOGY_TEXT), st.floats(0, 1), st.sampled_from([b"\x00", b"\xff", b"\xc3("])
        ),
        # Cut before the first node's NICs: no prefix up to there is a whole cluster.
        st.builds(lambda at: TOPOLOGY_TEXT.encode()[:at], st.integers(0, TOPOLOGY_TEXT.index("nics:"))),
        st.builds(
            lambda leaves, per_leaf: json.dumps(
                {
                    "version": 1,
                    "name": "huge",
                    "generate": {
                        "shape": "leaf-spine",
                        "spines": 8,
                        "leaves": leaves,
                        "nodes_per_leaf": per_leaf,
                        "gpus_per_node": 8,
                        "gpu_model": "H100",
                        "peak_tflops": 989,
                        "nvlink_bw_GBps": 450,
                        "nic_bw_GBps": 50,
                        "nics_per_node": 8,
                        "uplink_bw_GBps": 400,
                    },
                }
            ).encode(),
            st.integers(200, 1000),
            st.integers(100, 1000),
        ),
        st.builds(
            lambda path, name, s: _as_text(with_value(TOPOLOGY, path, name), s).encode(),
            st.sampled_from(NAME_PATHS),
            st.sampled_from(BAD_NAMES),
            syntax,
        ),
    )


JOB_TEXT = (EXAMPLES / "case-4-4-job.yaml").read_text()
# The server's YAML reading (PyYAML's safe_load reads `2.6e14` as a string, which JSON would keep).
JOB = parse_spec_text(JOB_TEXT)
JOB_NUMERIC_PATHS = [
    ("gpus",),
    ("priority",),
    ("estimated_runtime_s",),
    ("step", "compute_ms"),
    ("step", "overlap"),
    ("model", "flops_per_step"),
    ("comm", 0, "bytes"),
]
# Pairs of those paths and values that are valid: a priority below the default, and no runtime
# estimate (null is "not given").
VALID_JOB_VALUES = [(("priority",), -1), (("estimated_runtime_s",), None)]


def hostile_job_documents() -> st.SearchStrategy[bytes]:
    """Job spec documents that submission and preview must refuse: out-of-range and non-numeric
    values in every numeric field, bad names, and every hostile topology document."""
    syntax = st.sampled_from(["json", "yaml"])
    return st.one_of(
        st.builds(
            lambda path_value, s: _as_text(with_value(JOB, *path_value), s).encode(),
            st.tuples(
                st.sampled_from(JOB_NUMERIC_PATHS),
                st.sampled_from([10**400, -(10**400), 1e18 * 1e18, -1, "7", [], None, True]),
            ).filter(
                lambda pv: not any(
                    pv[0] == path and type(pv[1]) is type(value) and pv[1] == value
                    for path, value in VALID_JOB_VALUES
                )
            ),
            syntax,
        ),
        st.builds(
            lambda name, s: _as_text(with_value(JOB, ("name",), name), s).encode(),
            st.sampled_from(BAD_NAMES),
            syntax,
        ),
        st.builds(_inject, st.just(JOB_TEXT), st.floats(0, 1), st.sampled_from([b"\x00", b"\xff"])),
        hostile_topology_documents(),
    )
