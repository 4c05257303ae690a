"""Which executor runs a cluster's jobs, and what the Slurm executor keeps: the Slurm job of each
TopoWeb job generation and the GPUs that jobs submitted straight to Slurm hold."""

from __future__ import annotations

import secrets

from django.db import models
from django.utils import timezone


def new_server_id() -> str:
    """A random name for one TopoWeb server's executor of one cluster (8 hex digits)."""
    return secrets.token_hex(4)


class ExecutorKind(models.TextChoices):
    """`agents`: TopoWeb's node agents start the ranks (the default). `slurm`: a Slurm cluster runs
    them; TopoWeb places each job and submits it through slurmrestd."""

    AGENTS = "agents", "agents"
    SLURM = "slurm", "slurm"


class ClusterExecutor(models.Model):
    """A cluster's executor and its Slurm connection (a cluster without a row uses the agents).

    `slurmrestd_url`: `unix:/path/to/socket` (rest_auth/local: TopoWeb acts as slurmrestd's user)
    or `http(s)://host:port` (rest_auth/jwt). With JWT, `slurm_user` is the user TopoWeb acts as
    and either `slurm_token` (that user's token) or `jwt_key` (the cluster's HS256 key, base64,
    to mint a short-lived token per job owner when `submit_as_owner`). Credentials live here, never
    in the topology file."""

    cluster = models.OneToOneField("topology.Cluster", on_delete=models.CASCADE, related_name="executor")
    kind = models.CharField(max_length=16, choices=ExecutorKind.choices, default=ExecutorKind.AGENTS)
    slurmrestd_url = models.CharField(max_length=500, blank=True, default="")
    slurm_user = models.CharField(max_length=64, blank=True, default="")
    slurm_token = models.TextField(blank=True, default="")
    jwt_key = models.TextField(blank=True, default="", help_text="base64 of Slurm's jwt_hs256.key")
    submit_as_owner = models.BooleanField(
        default=False, help_text="Submit each job as its owner's Slurm user (needs jwt_key)."
    )
    partition = models.CharField(max_length=64, blank=True, default="")
    output_dir = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="Where job output goes (default: the job's workdir).",
    )
    foreign_gbps_per_gpu = models.FloatField(
        default=0.0,
        help_text="Network rate (GB/s per GPU) assumed for a job run in Slurm without TopoWeb that spans "
        "leaf switches: priced as load on those leaves' uplinks (0: their traffic is not priced).",
    )
    server_id = models.CharField(
        max_length=16,
        default=new_server_id,
        help_text="Names this TopoWeb in the comment of every Slurm job it submits: it stops only Slurm "
        "jobs with its own name, so TopoWeb servers sharing a Slurm never stop each other's jobs.",
    )
    scontrol_nodes = models.BooleanField(
        default=False,
        help_text="Drain and resume made in TopoWeb run `scontrol update nodename=N state=drain|resume` "
        "(TopoWeb's host has Slurm's commands and may change node states); off: refused with how to in Slurm.",
    )
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=ExecutorKind.values), name="executors_clusterexecutor_kind_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} executor of cluster {self.cluster_id}"


class SlurmSubmission(models.Model):
    """The Slurm job running generation `generation` of a TopoWeb job, and its last seen state."""

    job = models.ForeignKey("scheduling.Job", on_delete=models.CASCADE, related_name="slurm_submissions")
    generation = models.PositiveIntegerField()
    slurm_job_id = models.PositiveIntegerField(null=True, blank=True)
    slurm_user = models.CharField(max_length=64, blank=True, default="")
    state = models.CharField(max_length=32, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    submitted_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job_id", "generation"]
        constraints = [
            models.UniqueConstraint(fields=["job", "generation"], name="one_slurm_job_per_job_generation")
        ]

    def __str__(self) -> str:
        return f"slurm job {self.slurm_job_id} for job {self.job_id} gen {self.generation}"


class ForeignAllocation(models.Model):
    """A GPU that a job submitted straight to Slurm (not by TopoWeb) holds: out of the free set,
    shown on the graph as "slurm job N (user)"."""

    cluster = models.ForeignKey(
        "topology.Cluster", on_delete=models.CASCADE, related_name="foreign_allocations"
    )
    node = models.ForeignKey("topology.Node", on_delete=models.CASCADE, related_name="foreign_allocations")
    gpu_index = models.PositiveSmallIntegerField()
    slurm_job_id = models.PositiveIntegerField()
    user = models.CharField(max_length=64, blank=True, default="")
    name = models.CharField(max_length=200, blank=True, default="")
    seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["cluster_id", "node_id", "gpu_index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "gpu_index"], name="one_foreign_allocation_per_gpu")
        ]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        return (
            f"slurm job {self.slurm_job_id} ({self.user})" if self.user else f"slurm job {self.slurm_job_id}"
        )
