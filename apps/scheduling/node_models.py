"""The nodes and the ranks, whichever executor runs them: each node's health (`NodeHealth`), each
rank process's life (`RankRun`) and output (`RankLogChunk`), the nodes' credentials (`NodeToken`:
the node agent's sync and a node's metrics push) and the Unix account each user's ranks run as
(`UnixAccount`: the node agents and Slurm alike). Imported by `models.py` (Django finds models
there). The agents' server code that writes most of them is in `apps/executors/agents/`.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from .choices import ExitCause, NodeState, RankState

LOG_TAIL_CHARS = 8192


class NodeHealth(models.Model):
    """A node's health, whoever reports it (its node agent's heartbeats, or a Slurm sync): `state`
    up | draining | drained | down, when it was last heard from, what it runs, and the GPUs
    reported unhealthy (`unhealthy_gpus`: list of {"gpu": index, "reason": text}); `state_since`
    is when `state` last changed. A node without a row has never had an agent: it takes
    placements (an outside launcher may run its jobs), and the pages show it as "no agent", not
    as up. Its table keeps the name it had as NodeAgent; `node.agent` reaches it."""

    node = models.OneToOneField("topology.Node", on_delete=models.CASCADE, related_name="agent")
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.UP)
    reason = models.TextField(blank=True, default="", help_text="Why the node is down or draining.")
    state_since = models.DateTimeField(null=True, blank=True, help_text="When the state last changed.")
    last_seen = models.DateTimeField(null=True, blank=True)
    version = models.CharField(max_length=40, blank=True, default="")
    addr = models.CharField(max_length=255, blank=True, default="", help_text="Address ranks rendezvous on.")
    inventory = models.JSONField(default=list, blank=True, help_text="GPUs the agent found (nvidia-smi).")
    unhealthy_gpus = models.JSONField(default=list, blank=True)
    running = models.PositiveIntegerField(
        default=0, help_text="Rank processes running at the last heartbeat."
    )
    isolation = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="What isolation the agent gives its ranks (accounts, cgroups), as it reported it.",
    )
    # One agent process at a time syncs for a node: its instance (random per agent start), the
    # host it runs on and when it started. `last_seen` is its last answered sync.
    agent_instance = models.CharField(max_length=64, blank=True, default="")
    agent_host = models.CharField(max_length=255, blank=True, default="")
    agent_started_at = models.DateTimeField(null=True, blank=True)
    agent_refused = models.JSONField(
        default=dict,
        blank=True,
        help_text="The last agent refused because another held the node: {instance, host, addr, started_at, at}.",
    )
    orphans = models.JSONField(
        default=list,
        blank=True,
        help_text="Rank processes the agent found without a record of this server's and is stopping"
        " ({job, generation, rank, pids, server}): the node takes no placements until none is left.",
    )

    class Meta:
        db_table = "scheduling_nodeagent"
        ordering = ["node_id"]
        indexes = [models.Index(fields=["state", "last_seen"], name="nodeagent_state_seen")]

    def __str__(self) -> str:
        return f"agent of node {self.node_id}: {self.state}"

    @property
    def orphan_pids(self) -> int:
        """How many orphan processes the agent reported (at most 32 per orphan are listed)."""
        return sum(len(o.get("pids") or ()) for o in self.orphans if isinstance(o, dict))


class SyncPulse(models.Model):
    """The agents' sync endpoint as the nodes saw it (one row): `answered_at`, when it last
    answered any node (written at most every few seconds), and `back_at`, when it answered again
    after its last outage (a gap between answers longer than a poll). A node is blamed for its
    silence only over time the server was answering others: a web or database outage counts
    against no node."""

    answered_at = models.DateTimeField()
    back_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"sync answered at {self.answered_at}, since {self.back_at}"


class RankRun(models.Model):
    """One rank process of one job generation as its agent reported it: started, then exited with
    `exit_code` (negative: killed by that signal) for `exit_cause` (its own exit, or lost, fenced,
    stopped, a limit, refused, its node down). `log_tail` is the end of its output."""

    job = models.ForeignKey("scheduling.Job", on_delete=models.CASCADE, related_name="rank_runs")
    generation = models.PositiveIntegerField()
    rank = models.PositiveIntegerField()
    node = models.ForeignKey("topology.Node", on_delete=models.CASCADE, related_name="rank_runs")
    state = models.CharField(max_length=16, choices=RankState.choices, default=RankState.STARTED)
    pid = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_cause = models.CharField(
        max_length=16,
        choices=ExitCause.choices,
        blank=True,
        default="",
        help_text="Why it exited, apart from its code ('' while it runs).",
    )
    started_at = models.DateTimeField(default=timezone.now)
    exited_at = models.DateTimeField(null=True, blank=True)
    log_tail = models.TextField(blank=True, default="")
    stop_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its generation was left (job ended, requeued or migrating): it is stopping since then.",
    )

    class Meta:
        ordering = ["job_id", "generation", "rank"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "generation", "rank"], name="one_run_per_job_generation_rank"
            )
        ]
        indexes = [
            models.Index(fields=["node", "state"], name="rankrun_node_state"),
            models.Index(
                fields=["job", "generation"], condition=Q(state="started"), name="rankrun_live_by_job"
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} gen {self.generation} rank {self.rank}: {self.state}"


class RankLogChunk(models.Model):
    """A piece of a rank's output as its agent shipped it: `size` bytes of the rank's log file
    from byte `offset`, as text (invalid UTF-8 and NUL replaced). The chunks of a run, by offset,
    are its whole log up to the server's limit (TOPOWEB_RANK_LOG_MAX_MB)."""

    run = models.ForeignKey(RankRun, on_delete=models.CASCADE, related_name="log_chunks")
    offset = models.BigIntegerField()
    size = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["run_id", "offset"]
        constraints = [models.UniqueConstraint(fields=["run", "offset"], name="one_log_chunk_per_run_offset")]

    def __str__(self) -> str:
        return f"log of run {self.run_id} bytes {self.offset}+{self.size}"


NODE_KEY_PREFIX = "tn_"


def node_key_hash(key: str) -> str:
    """The stored form of a node token's key: its SHA-256 (the key is 256 random bits, so a fast
    hash is as strong as a slow one)."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_node_key() -> str:
    """A fresh node token key: `tn_` and 43 URL-safe characters."""
    return NODE_KEY_PREFIX + secrets.token_urlsafe(32)


class NodeToken(models.Model):
    """A node agent's credential (`Authorization: Node <key>`), bound to one node: it may sync,
    report and ship logs for that node's ranks only. Only the key's hash is stored; `prefix`
    (its first characters) tells tokens apart in the admin. A revoked token is refused."""

    node = models.ForeignKey("topology.Node", on_delete=models.CASCADE, related_name="tokens")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="The key's first characters.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["node_id", "created_at"]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else "active"
        return f"node token {self.prefix}… of node {self.node_id} ({state})"


UNIX_NAME = RegexValidator(
    r"^[a-z_][a-z0-9_.-]{0,31}$", "A Unix account name: lower-case letters, digits, '_', '.', '-'."
)


class UnixAccount(models.Model):
    """The Unix account a user's ranks run as on the nodes (without a row: the username)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="unix_account"
    )
    name = models.CharField(max_length=32, validators=[UNIX_NAME])

    class Meta:
        ordering = ["user_id"]

    def __str__(self) -> str:
        return f"{self.user_id} runs as {self.name}"
