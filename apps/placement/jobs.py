"""Job spec v1: load and validate a training job (what it needs and how it communicates).

`load_job(data)` takes a parsed spec (see spec/job-v1.md) and returns a frozen `JobSpec`;
`job_to_spec(job)` gives the spec back. Unknown fields are errors; every error names its field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .launch import LAUNCH_FIELDS, LaunchSpec, launch_to_spec, load_launch
from .topology import (
    JOB_LIMITS,
    SpecError,
    _check_keys,
    _count,
    _Errors,
    _name,
    _positive,
    cut,
    read_spec_file,
)
from .topology.ranges import (
    GPU_MODEL_HELP,
    GPU_MODEL_RE,
    MAX_CLUSTER_GPUS,
    MAX_COMM_BYTES,
    MAX_COMM_COUNT,
    MAX_COMM_ENTRIES,
    MAX_COMPUTE_MS,
    MAX_FLOPS_PER_STEP,
    MAX_JOB_GPU_MODELS,
    MAX_PRIORITY,
    MAX_RUNTIME_S,
    MIN_COMM_BYTES,
    MIN_COMPUTE_MS,
    MIN_FLOPS_PER_STEP,
    MIN_RUNTIME_S,
    USER_HELP,
    USER_RE,
)

GROUP_KINDS = ("tp", "pp", "dp", "ep", "cp")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "p2p", "volume")
# The solver names a job may ask for; the solvers package exposes the same tuple as POLICIES.
POLICY_NAMES = ("topo", "naive", "first_fit", "tree_best_fit", "random")
RANK_DIMS = ("tp", "ep", "dp", "pp")
DEFAULT_RANK_ORDER = "tp-ep-dp-pp"

_TOP_REQUIRED = {"version", "name", "gpus", "parallelism", "step", "comm"}
_TOP_OPTIONAL = {
    "cluster",
    "user",
    "priority",
    "rank_order",
    "model",
    "estimated_runtime_s",
    "policy",
    "gpu_models",
    "account",
    "qos",
} | LAUNCH_FIELDS
_PARALLEL_KEYS = {"tp", "pp", "dp", "ep", "cp"}


@dataclass(frozen=True, slots=True)
class CommEntry:
    """One collective per step: `bytes` per rank (bytes), repeated `count` times per step;
    `overlap` (0..1) the share of its time hidden behind compute, None for the job's
    `step.overlap` (DP gradient allreduce overlaps the backward pass, TP allreduces do not)."""

    group: str
    collective: str
    bytes: float
    count: int = 1
    overlap: float | None = None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job spec v1. Times in ms, FLOPs per step of the whole job, runtime in s."""

    name: str
    cluster: str | None
    gpus: int
    tp: int
    pp: int
    dp: int
    ep: int
    cp: int
    rank_order: str
    priority: int
    user: str | None
    flops_per_step: float | None
    compute_ms: float
    overlap: float
    comm: tuple[CommEntry, ...]
    estimated_runtime_s: float | None
    policy: str | None
    launch: LaunchSpec = LaunchSpec()
    # Microbatches per step in each pipeline (1F1B schedule), None when not declared.
    microbatches: int | None = None
    # The GPU models the job may run on (empty: any), and the one `compute_ms` is for (None: the
    # fastest it may run on); a step runs at its slowest placed GPU (`costmodel.speed`).
    gpu_models: tuple[str, ...] = ()
    reference_model: str | None = None
    # The account it is submitted as and its QOS, by name (None: the defaults).
    account: str | None = None
    qos: str | None = None

    def entry_overlap(self, entry: CommEntry) -> float:
        """The share (0..1) of `entry`'s time hidden behind compute: its own or the job's."""
        return self.overlap if entry.overlap is None else entry.overlap

    @property
    def dims(self) -> tuple[str, ...]:
        """The rank-order dimensions, fastest-varying first (cp left out while it is 1)."""
        return tuple(self.rank_order.split("-"))


def load_job(data: Any) -> JobSpec:
    """Validate a parsed job spec v1 and build the JobSpec.

    Raises SpecError listing every offending field (e.g. `parallelism`: "tp*pp*dp=12 but gpus=16",
    `comm[1].collective`).
    """
    errs = _Errors()
    if not isinstance(data, Mapping):
        raise SpecError([("", f"a job spec must be a mapping, got {type(data).__name__}")])
    if not _check_keys(errs, "", data, _TOP_REQUIRED, _TOP_OPTIONAL):
        errs.raise_if_any()
    if data["version"] != 1:
        errs.add("version", f"must be 1, got {cut(data['version'])}")
    name = _name(errs, "name", data["name"])
    cluster = _optional_str(errs, "cluster", data.get("cluster"))
    user = data.get("user")
    if user is not None:
        user = _name(errs, "user", user, pattern=USER_RE, help=USER_HELP)
    priority = _count(errs, "priority", data.get("priority", 0), minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)
    gpus = _count(errs, "gpus", data["gpus"], maximum=MAX_CLUSTER_GPUS)

    tp = pp = dp = ep = cp = 1
    par = data["parallelism"]
    if _check_keys(errs, "parallelism", par, set(), _PARALLEL_KEYS):
        tp, pp, dp, ep, cp = (
            _count(errs, f"parallelism.{k}", par.get(k, 1), maximum=MAX_CLUSTER_GPUS)
            for k in ("tp", "pp", "dp", "ep", "cp")
        )
        if dp % ep:
            errs.add("parallelism.ep", f"ep={ep} must divide dp={dp}")
        if tp * cp * pp * dp != gpus:
            product = "tp*pp*dp" if cp == 1 else "tp*cp*pp*dp"
            errs.add("parallelism", f"{product}={tp * cp * pp * dp} but gpus={gpus}")
    rank_order = _rank_order(errs, data.get("rank_order", DEFAULT_RANK_ORDER), cp)

    flops = None
    model = data.get("model")
    if model is not None and _check_keys(errs, "model", model, {"flops_per_step"}):
        flops = _positive(
            errs,
            "model.flops_per_step",
            model["flops_per_step"],
            minimum=MIN_FLOPS_PER_STEP,
            maximum=MAX_FLOPS_PER_STEP,
        )

    compute_ms, overlap, microbatches, reference = 0.0, 0.0, None, None
    step = data["step"]
    if _check_keys(errs, "step", step, {"compute_ms"}, {"overlap", "microbatches", "gpu_model"}):
        compute_ms = _positive(
            errs,
            "step.compute_ms",
            step["compute_ms"],
            allow_zero=True,
            minimum=MIN_COMPUTE_MS,
            maximum=MAX_COMPUTE_MS,
        )
        overlap = _positive(errs, "step.overlap", step.get("overlap", 0.0), allow_zero=True, maximum=1.0)
        if step.get("microbatches") is not None:
            microbatches = _count(errs, "step.microbatches", step["microbatches"], maximum=MAX_COMM_COUNT)
        if step.get("gpu_model") is not None:
            reference = _name(
                errs, "step.gpu_model", step["gpu_model"], pattern=GPU_MODEL_RE, help=GPU_MODEL_HELP
            )
    gpu_models = _gpu_models(errs, data.get("gpu_models"))
    if reference is not None and gpu_models and reference not in gpu_models:
        errs.add("step.gpu_model", f"{reference!r} is not one of gpu_models")

    comm: list[CommEntry] = []
    if not isinstance(data["comm"], list):
        errs.add("comm", f"must be a list, got {type(data['comm']).__name__}")
    elif len(data["comm"]) > MAX_COMM_ENTRIES:
        errs.add("comm", f"holds {len(data['comm'])} entries; the limit is {MAX_COMM_ENTRIES}")
    else:
        for i, c in enumerate(data["comm"]):
            entry = _comm_entry(errs, f"comm[{i}]", c)
            if entry is not None:
                comm.append(entry)

    runtime = data.get("estimated_runtime_s")
    if runtime is not None:
        runtime = _positive(
            errs, "estimated_runtime_s", runtime, minimum=MIN_RUNTIME_S, maximum=MAX_RUNTIME_S
        )
    policy = data.get("policy")
    if policy is not None and (not isinstance(policy, str) or policy not in POLICY_NAMES):
        errs.add("policy", f"must be one of {', '.join(POLICY_NAMES)} or null, got {cut(policy)}")
    launch = load_launch(errs, data)
    account = _optional_str(errs, "account", data.get("account"))
    qos = _optional_str(errs, "qos", data.get("qos"))
    errs.raise_if_any()
    return JobSpec(
        name=name,
        cluster=cluster,
        gpus=gpus,
        tp=tp,
        pp=pp,
        dp=dp,
        ep=ep,
        cp=cp,
        rank_order=rank_order,
        priority=priority,
        user=user,
        flops_per_step=flops,
        compute_ms=compute_ms,
        overlap=overlap,
        comm=tuple(comm),
        estimated_runtime_s=runtime,
        policy=policy,
        launch=launch,
        microbatches=microbatches,
        gpu_models=gpu_models,
        reference_model=reference,
        account=account,
        qos=qos,
    )


def _gpu_models(errs: _Errors, value: Any) -> tuple[str, ...]:
    """`gpu_models`: a list of distinct GPU model names (at most MAX_JOB_GPU_MODELS), or null."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        errs.add("gpu_models", f"must be a non-empty list of GPU model names or null, got {cut(value)}")
        return ()
    if len(value) > MAX_JOB_GPU_MODELS:
        errs.add("gpu_models", f"holds {len(value)} models; the limit is {MAX_JOB_GPU_MODELS}")
        return ()
    out: list[str] = []
    for i, m in enumerate(value):
        name = _name(errs, f"gpu_models[{i}]", m, pattern=GPU_MODEL_RE, help=GPU_MODEL_HELP)
        if isinstance(name, str) and name in out:
            errs.add(f"gpu_models[{i}]", f"{name!r} is named twice")
        elif isinstance(name, str):
            out.append(name)
    return tuple(out)


def check_gpu_models(job: JobSpec, models: Mapping[str, Any]) -> None:
    """Raise SpecError naming `gpu_models[i]` or `step.gpu_model` for a model the cluster does not
    have (`models`: the cluster's GPU models by name, those some node has)."""
    errs = _Errors()
    known = ", ".join(sorted(models)) or "none"
    for i, m in enumerate(job.gpu_models):
        if m not in models:
            errs.add(f"gpu_models[{i}]", f"unknown GPU model {m!r}; this cluster has {known}")
    if job.reference_model is not None and job.reference_model not in models:
        errs.add("step.gpu_model", f"unknown GPU model {job.reference_model!r}; this cluster has {known}")
    errs.raise_if_any()


def _optional_str(errs: _Errors, path: str, value: Any) -> str | None:
    if value is None:
        return None
    return _name(errs, path, value)


def _rank_order(errs: _Errors, value: Any, cp: int = 1) -> str:
    """The rank order with cp in it when cp > 1 (right after tp unless placed, as Megatron's
    tp-cp-ep-dp-pp), without it while cp is 1 (its position then changes no rank's coordinates)."""
    if not isinstance(value, str):
        errs.add("rank_order", f"must be a string such as {DEFAULT_RANK_ORDER!r}, got {cut(value)}")
        return _with_cp(DEFAULT_RANK_ORDER.split("-"), cp)
    dims = value.strip().lower().split("-")
    core = [d for d in dims if d != "cp"]
    if sorted(core) != sorted(RANK_DIMS) or dims.count("cp") > 1:
        errs.add(
            "rank_order",
            f"must be a permutation of tp, ep, dp, pp (optionally with cp) joined by '-', got {cut(value)}",
        )
        return _with_cp(DEFAULT_RANK_ORDER.split("-"), cp)
    if cp == 1:
        return "-".join(core)
    return "-".join(dims) if "cp" in dims else _with_cp(dims, cp)


def _with_cp(dims: list[str], cp: int) -> str:
    if cp == 1:
        return "-".join(dims)
    at = dims.index("tp") + 1
    return "-".join([*dims[:at], "cp", *dims[at:]])


def _comm_entry(errs: _Errors, p: str, c: Any) -> CommEntry | None:
    if not _check_keys(errs, p, c, {"group", "collective", "bytes"}, {"count", "overlap"}):
        return None
    ok = True
    if not isinstance(c["group"], str) or c["group"] not in GROUP_KINDS:
        errs.add(f"{p}.group", f"must be one of {', '.join(GROUP_KINDS)}, got {cut(c['group'])}")
        ok = False
    if not isinstance(c["collective"], str) or c["collective"] not in COLLECTIVES:
        errs.add(f"{p}.collective", f"must be one of {', '.join(COLLECTIVES)}, got {cut(c['collective'])}")
        ok = False
    before = len(errs.items)
    nbytes = _positive(
        errs, f"{p}.bytes", c["bytes"], allow_zero=True, minimum=MIN_COMM_BYTES, maximum=MAX_COMM_BYTES
    )
    count = _count(errs, f"{p}.count", c.get("count", 1), maximum=MAX_COMM_COUNT)
    overlap = c.get("overlap")
    if overlap is not None:
        overlap = _positive(errs, f"{p}.overlap", overlap, allow_zero=True, maximum=1.0)
    if not ok or len(errs.items) > before:
        return None
    return CommEntry(c["group"], c["collective"], nbytes, count, overlap)


def check_peak(job: JobSpec, peak_tflops: float) -> None:
    """Raise SpecError naming `model.flops_per_step` and `step.compute_ms` when computing the job's
    FLOPs per step in compute_ms would take more than `peak_tflops` on each of its GPUs (an MFU
    above 100% even with no communication). `peak_tflops` is the fastest GPU model it may get."""
    if job.flops_per_step is None:
        return
    # FLOPs the GPUs can do in compute_ms at peak: TFLOPS * 1e12 per s, compute_ms / 1e3 s.
    capacity = job.gpus * peak_tflops * 1e12 * job.compute_ms / 1e3
    if job.flops_per_step > capacity:
        needed = job.flops_per_step / (job.gpus * job.compute_ms / 1e3) / 1e12 if job.compute_ms else math.inf
        msg = (
            f"{job.flops_per_step:g} FLOPs in {job.compute_ms:g} ms on {job.gpus} GPUs needs"
            f" {needed:.4g} TFLOPS per GPU; the fastest GPU model here peaks at {peak_tflops:g} TFLOPS"
        )
        raise SpecError([("model.flops_per_step", msg), ("step.compute_ms", msg)])


def job_to_spec(job: JobSpec) -> dict:
    """The job spec v1 form of a JobSpec (what `load_job` reads back identically)."""
    out: dict[str, Any] = {"version": 1, "name": job.name}
    if job.cluster is not None:
        out["cluster"] = job.cluster
    if job.user is not None:
        out["user"] = job.user
    out["priority"] = job.priority
    out["gpus"] = job.gpus
    out["parallelism"] = {"tp": job.tp, "pp": job.pp, "dp": job.dp, "ep": job.ep}
    if job.cp > 1:
        out["parallelism"]["cp"] = job.cp
    out["rank_order"] = job.rank_order
    if job.flops_per_step is not None:
        out["model"] = {"flops_per_step": job.flops_per_step}
    out["step"] = {"compute_ms": job.compute_ms, "overlap": job.overlap}
    if job.microbatches is not None:
        out["step"]["microbatches"] = job.microbatches
    if job.reference_model is not None:
        out["step"]["gpu_model"] = job.reference_model
    if job.gpu_models:
        out["gpu_models"] = list(job.gpu_models)
    out["comm"] = [
        {"group": c.group, "collective": c.collective, "bytes": c.bytes, "count": c.count}
        | ({} if c.overlap is None else {"overlap": c.overlap})
        for c in job.comm
    ]
    if job.estimated_runtime_s is not None:
        out["estimated_runtime_s"] = job.estimated_runtime_s
    if job.policy is not None:
        out["policy"] = job.policy
    if job.account is not None:
        out["account"] = job.account
    if job.qos is not None:
        out["qos"] = job.qos
    out.update(launch_to_spec(job.launch))
    return out


def load_job_file(path: str) -> JobSpec:
    """Read a YAML or JSON job spec file (within JOB_LIMITS) and load it."""
    return load_job(read_spec_file(path, JOB_LIMITS))
