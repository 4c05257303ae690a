"""Example bodies of every write operation of the API, by operation id, for the docs page: what to
send (per media type: JSON objects, YAML text, multipart fields) and, for operations without a
body, what comes back. Attached to the schema by `apps.api.schemas.examples_attach`; a test keeps
every write operation covered and every request example accepted by the code that reads it."""

from __future__ import annotations

import yaml

JOB_SPEC = {
    "version": 1,
    "name": "bert-large-16",
    "cluster": "case-4-4",
    "priority": 0,
    "gpus": 16,
    "parallelism": {"tp": 1, "pp": 2, "dp": 8, "ep": 1},
    "model": {"flops_per_step": 2.6e14},
    "step": {"compute_ms": 100, "overlap": 0.0},
    "comm": [{"group": "dp", "collective": "volume", "bytes": 1.2e9}],
    "estimated_runtime_s": 3600,
}
JOB_SPEC_MEGATRON = {
    "version": 1,
    "name": "llm-tp8-pp2",
    "cluster": "pod-256",
    "priority": 5,
    "gpus": 64,
    "parallelism": {"tp": 8, "pp": 2, "dp": 4},
    "rank_order": "tp-ep-dp-pp",
    "model": {"flops_per_step": 1.9e16},
    "step": {"compute_ms": 500, "overlap": 0.2},
    "comm": [
        {"group": "tp", "collective": "allreduce", "bytes": 6.4e7, "count": 16},
        {"group": "dp", "collective": "allreduce", "bytes": 1e9},
        {"group": "pp", "collective": "p2p", "bytes": 3.2e7, "count": 8},
    ],
    "estimated_runtime_s": 7200,
    "policy": "topo",
}
TOPOLOGY_FULL = {
    "version": 1,
    "name": "case-4-4",
    "gpu_models": {"A100-SXM4-80GB": {"peak_tflops": 312}},
    "switches": [{"name": "leaf-1", "tier": "leaf"}],
    "links": [],
    "nodes": [
        {
            "name": f"node-{n}",
            "gpu_model": "A100-SXM4-80GB",
            "gpus": 8,
            "nvlink": {"domain": f"node-{n}", "bw_GBps": 450, "latency_us": 2.0},
            "nics": [
                {"name": "mlx5_0", "gpus": list(range(8)), "leaf": "leaf-1", "bw_GBps": 11, "latency_us": 1.5}
            ],
        }
        for n in ("a", "b")
    ],
}
TOPOLOGY_GENERATED = {
    "version": 1,
    "name": "pod-256",
    "generate": {
        "shape": "leaf-spine",
        "spines": 2,
        "leaves": 4,
        "nodes_per_leaf": 8,
        "gpus_per_node": 8,
        "gpu_model": "H100-SXM5-80GB",
        "peak_tflops": 989,
        "nvlink_bw_GBps": 450,
        "nic_bw_GBps": 50,
        "nics_per_node": 8,
        "uplink_bw_GBps": 400,
    },
}
JOB = {
    "id": 7,
    "name": "bert-large-16",
    "cluster": 1,
    "cluster_name": "case-4-4",
    "owner": "alice",
    "status": "running",
    "priority": 0,
    "policy": "topo",
    "placed_policy": "topo",
    "gpus": 16,
    "estimated_runtime_s": 3600.0,
    "submitted_at": "2026-12-03T10:17:54.510322Z",
    "placed_at": "2026-12-03T10:17:54.534790Z",
    "started_at": "2026-12-03T10:17:56.588135Z",
    "finished_at": None,
    "pending_reason": "",
    "overdue": False,
    "overdue_reason": "",
    "preemptions": 0,
    "requeues": 0,
    "predicted_comm_ms": 2.6666666666666665,
    "predicted_step_ms": 102.66666666666667,
    "predicted_mfu": 0.5073,
    "predicted": {
        "comm_ms": 2.6666666666666665,
        "step_ms": 102.66666666666667,
        "mfu": 0.5073,
        "groups": [
            {
                "group": "dp",
                "ranks": [0, 1, 2, 3, 4, 5, 6, 7],
                "level": "nvlink",
                "bottleneck_GBps": 450.0,
                "time_ms": 2.67,
            },
            {
                "group": "dp",
                "ranks": [8, 9, 10, 11, 12, 13, 14, 15],
                "level": "nvlink",
                "bottleneck_GBps": 450.0,
                "time_ms": 2.67,
            },
        ],
    },
    "flows": {},
    "spec": {**JOB_SPEC, "user": "alice", "rank_order": "tp-ep-dp-pp", "policy": None},
}
MAPPING = [{"rank": r, "node": "node-a" if r < 8 else "node-b", "gpu": r % 8} for r in range(16)]
PROPOSAL = {
    "id": 1,
    "job": 7,
    "job_name": "bert-large-16",
    "cluster": 1,
    "policy": "topo",
    "status": "applied",
    "predicted_gain": 0.509,
    "predicted_old_step_ms": 209.09,
    "predicted_new_step_ms": 102.67,
    "reason": "the topo placement on GPUs free now predicts 102.7 ms per step instead of 209.1 ms (51% faster)",
    "old_mapping": [
        {"rank": r, "node": "node-a" if (r // 4) % 2 == 0 else "node-b", "gpu": r % 4 + 4 * (r // 8)}
        for r in range(16)
    ],
    "new_mapping": MAPPING,
    "created_at": "2026-12-03T10:17:54.633930Z",
    "applied_at": "2026-12-03T10:19:02.100000Z",
    "decided_by": "ops",
}
NODE_HEALTH = {
    "id": 1,
    "name": "node-a",
    "cluster": 1,
    "cluster_name": "case-4-4",
    "state": "up",
    "reason": "",
    "last_seen": "2026-12-03T10:20:11.402000Z",
    "version": "1",
    "unhealthy_gpus": [],
    "running": 8,
}


def _spec_body(*named: tuple[str, str, dict], multipart: bool = False) -> dict:
    """Examples of a spec body as JSON and as YAML text (and as a multipart upload)."""
    out = {
        "application/json": {key: (summary, value) for key, summary, value in named},
        "application/yaml": {
            key: (summary, yaml.safe_dump(value, sort_keys=False)) for key, summary, value in named
        },
    }
    out["text/yaml"] = out["application/yaml"]
    if multipart:
        out["multipart/form-data"] = {
            "upload": ("A spec file as the multipart field `file`", {"file": "case-4-4.yaml"}),
        }
    return out


JOB_BODIES = (
    ("bert", "The seed's BERT-Large job: 16 GPUs, two DP groups of 8", JOB_SPEC),
    ("megatron", "A Megatron job: TP 8 inside a node, PP 2, DP 4", JOB_SPEC_MEGATRON),
)
TOPOLOGY_BODIES = (
    ("full", "Every node, NIC and switch written out", TOPOLOGY_FULL),
    ("generated", "A leaf-spine pod in the compact generator form", TOPOLOGY_GENERATED),
)


def _settings_body(key: str, summary: str, value: dict) -> dict:
    """Examples of a cluster-settings body as JSON, YAML text and multipart form fields."""
    text = yaml.safe_dump(value, sort_keys=False)
    return {
        "application/json": {key: (summary, value)},
        "application/yaml": {key: (summary, text)},
        "text/yaml": {key: (summary, text)},
        "multipart/form-data": {
            key: (summary, {k: str(v).lower() if isinstance(v, bool) else v for k, v in value.items()})
        },
    }


CLUSTER_SETTINGS = _settings_body(
    "settings",
    "Description, policy, preemption and backfill",
    {
        "description": "2 x 8 A100 lab",
        "policy": "topo",
        "preemption_enabled": False,
        "backfill_enabled": True,
    },
)
CLUSTER_POLICY = _settings_body("policy", "Switch the default placement policy", {"policy": "tree_best_fit"})

QOS_SCAVENGER = _settings_body(
    "scavenger",
    "A scavenger QOS: borrows idle GPUs only and any other QOS preempts it",
    {
        "cluster": "pod-256",
        "name": "scavenger",
        "priority": -50,
        "max_running_gpus_per_account": 0,
        "may_borrow": True,
        "preemptible": True,
    },
)
QOS_HIGH = _settings_body(
    "high",
    "A high QOS: a priority term, 16 running GPUs per user, a day per job",
    {
        "cluster": "pod-256",
        "name": "high",
        "priority": 50,
        "max_running_gpus_per_user": 16,
        "max_wall_s": 86400,
    },
)

# operationId -> {"request": {media type: {key: (summary, value)}}} for operations with a body,
# or {"response": (status, {key: (summary, value)})} for operations without one.
EXAMPLES: dict[str, dict] = {
    "v1_jobs_create": {"request": _spec_body(*JOB_BODIES)},
    "v1_placements_preview_create": {"request": _spec_body(*JOB_BODIES)},
    "v1_jobs_fail_create": {
        "request": {
            "application/json": {
                "reason": ("Why it failed", {"reason": "rank 3 exited with code 1: CUDA error"})
            },
            "application/yaml": {
                "reason": ("Why it failed", "reason: 'rank 3 exited with code 1: CUDA error'\n")
            },
            "text/yaml": {"reason": ("Why it failed", "reason: 'rank 3 exited with code 1: CUDA error'\n")},
        }
    },
    "v1_jobs_report_create": {
        "request": {
            "application/json": {
                "full": (
                    "Step time, tokens, FLOPs and communication per step",
                    {"step_ms": 212.5, "tokens_per_step": 524288, "flops_per_step": 2.6e14, "comm_ms": 108.0},
                ),
                "step": ("Step time only", {"step_ms": 212.5}),
            }
        }
    },
    "v1_jobs_cancel_create": {
        "response": (
            "200",
            {
                "cancelled": (
                    "The job, cancelled",
                    {
                        **JOB,
                        "status": "cancelled",
                        "finished_at": "2026-12-03T11:02:40.000000Z",
                        "pending_reason": "cancelled by alice",
                    },
                )
            },
        )
    },
    "v1_jobs_start_create": {"response": ("200", {"running": ("The job, now running", JOB)})},
    "v1_jobs_hold_create": {
        "response": (
            "200",
            {
                "held": (
                    "The job, held",
                    {
                        **JOB,
                        "status": "queued",
                        "held": True,
                        "pending_reason": "held by carol: it waits until released",
                    },
                )
            },
        )
    },
    "v1_jobs_release_create": {
        "response": (
            "200",
            {
                "released": (
                    "The job, released",
                    {**JOB, "status": "queued", "held": False, "pending_reason": "released by carol"},
                )
            },
        )
    },
    "v1_jobs_requeue_create": {
        "response": (
            "200",
            {
                "requeued": (
                    "The job, back in the queue",
                    {
                        **JOB,
                        "status": "queued",
                        "requeues": 1,
                        "requeue_reason": "by carol",
                        "pending_reason": "requeued: by carol",
                    },
                )
            },
        )
    },
    "v1_jobs_priority_create": {
        "request": {
            media: {"raise": ("Raise the job's requested priority", body)}
            for media, body in (
                ("application/json", {"priority": 40}),
                ("application/yaml", "priority: 40\n"),
                ("text/yaml", "priority: 40\n"),
            )
        }
    },
    "v1_jobs_complete_create": {
        "response": (
            "200",
            {
                "completed": (
                    "The job, completed",
                    {**JOB, "status": "completed", "finished_at": "2026-12-03T11:17:55.000000Z"},
                )
            },
        )
    },
    "v1_migrations_apply_create": {"response": ("200", {"applied": ("The proposal, applied", PROPOSAL)})},
    "v1_migrations_reject_create": {
        "response": (
            "200",
            {"rejected": ("The proposal, rejected", {**PROPOSAL, "status": "rejected", "applied_at": None})},
        )
    },
    "v1_node_health_drain_create": {
        "request": {
            "application/json": {"reason": ("Why the node is drained", {"reason": "firmware update"})}
        }
    },
    "v1_node_health_resume_create": {"response": ("200", {"up": ("The node, back in service", NODE_HEALTH)})},
    "v1_agents_sync_create": {
        "request": {
            "application/json": {
                "sync": (
                    "A heartbeat with the GPUs found, one running rank and one exit",
                    {
                        "node": "node-a",
                        "version": "1",
                        "addr": "10.0.0.11",
                        "gpus": [{"index": i, "name": "NVIDIA A100-SXM4-80GB"} for i in range(8)],
                        "unhealthy": [{"gpu": 5, "reason": "XID 79: fallen off the bus"}],
                        "running": [[7, 1, 0]],
                        "reports": [
                            {"job": 7, "generation": 1, "rank": 0, "event": "started", "pid": 4242},
                            {
                                "job": 6,
                                "generation": 1,
                                "rank": 3,
                                "event": "exited",
                                "pid": 4101,
                                "exit_code": 0,
                                "log_tail": "step 1000 done",
                            },
                        ],
                        "wait_s": 20,
                    },
                )
            }
        }
    },
    "v1_clusters_create": {"request": _spec_body(*TOPOLOGY_BODIES, multipart=True)},
    "v1_clusters_import_create": {"request": _spec_body(*TOPOLOGY_BODIES, multipart=True)},
    "v1_clusters_update": {"request": CLUSTER_SETTINGS},
    "v1_clusters_partial_update": {"request": CLUSTER_POLICY},
    "v1_memberships_update": {
        "request": {"application/json": {"only": ("The member may use QOS 2 and 5 only", {"qos": [2, 5]})}}
    },
    "v1_memberships_partial_update": {
        "request": {"application/json": {"all": ("The member may use every QOS of the account", {"qos": []})}}
    },
    "v1_qos_create": {"request": QOS_SCAVENGER},
    "v1_qos_update": {"request": QOS_HIGH},
    "v1_qos_partial_update": {
        "request": _settings_body("limit", "Cap a user's running GPUs", {"max_running_gpus_per_user": 16})
    },
}
