"""NVLink domains, nodes, their NICs and their GPUs."""

from django.core.exceptions import ValidationError
from django.db import models

from ..choices import SwitchTier
from .base import (
    NAME_MAX_LENGTH,
    URL_MAX_LENGTH,
    ClusterRow,
    positive_constraint,
    validate_bw_GBps,
    validate_http_url,
    validate_latency_us,
    validate_name,
)
from .cluster import Cluster, GpuModel
from .network import Switch


def _leaf_errors(leaf: Switch, cluster_id: int | None) -> str | None:
    if cluster_id is not None and leaf.cluster_id != cluster_id:
        return f"switch {leaf.name!r} belongs to another cluster"
    if leaf.tier != SwitchTier.LEAF:
        return f"switch {leaf.name!r} is a {leaf.tier} switch, not a leaf"
    return None


class NvlinkDomain(ClusterRow):
    """GPUs joined by NVLink/NVSwitch at one per-GPU bandwidth; may span nodes (NVL72 racks)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nvlink_domains")
    name = models.CharField(max_length=NAME_MAX_LENGTH, validators=[validate_name])
    bw_GBps = models.FloatField("bandwidth per GPU (GB/s)", validators=[validate_bw_GBps])
    latency_us = models.FloatField("latency (us)", validators=[validate_latency_us])
    nvls = models.BooleanField(
        "NVLS",
        null=True,
        blank=True,
        help_text="Whether its switches run NVLS (NVLink SHARP); unset: from the GPU model (H100/H200, NVL72 yes).",
    )

    class Meta:
        ordering = ["cluster_id", "id"]
        verbose_name = "NVLink domain"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="topology_nvlinkdomain_unique_name"),
            positive_constraint("nvlinkdomain", "bw_GBps"),
            positive_constraint("nvlinkdomain", "latency_us"),
        ]

    def __str__(self) -> str:
        return self.name


class Node(ClusterRow):
    """A host with GPUs; `leaf` is its first NIC's leaf (null if standalone), kept by the services."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=NAME_MAX_LENGTH, validators=[validate_name])
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.RESTRICT, related_name="nodes")
    leaf = models.ForeignKey(Switch, on_delete=models.RESTRICT, related_name="nodes", null=True, blank=True)
    dcgm_url = models.CharField(
        "dcgm-exporter URL", max_length=URL_MAX_LENGTH, blank=True, validators=[validate_http_url]
    )
    standalone = models.BooleanField(default=False, help_text="A node without NICs.")
    position = models.PositiveIntegerField(default=0, help_text="Order in the exported spec.")
    # Spec v1's optional `intra` block as written (checked by the spec loader on every snapshot).
    intra = models.JSONField(
        null=True, blank=True, help_text="Intra-node links by GPU pair (PCIe-only or partial NVLink nodes)."
    )

    class Meta:
        ordering = ["cluster_id", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="topology_node_unique_name"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.gpu_model_id is not None and self.cluster_id is not None:
            if self.gpu_model.cluster_id != self.cluster_id:
                errors["gpu_model"] = f"GPU model {self.gpu_model.name!r} belongs to another cluster"
        if self.leaf_id is not None:
            if self.standalone:
                errors["leaf"] = "a standalone node has no leaf switch"
            elif problem := _leaf_errors(self.leaf, self.cluster_id):
                errors["leaf"] = problem
        if errors:
            raise ValidationError(errors)


class Nic(ClusterRow):
    """A network adapter (HCA) of a node, cabled to one leaf switch."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="nics")
    name = models.CharField(max_length=NAME_MAX_LENGTH, validators=[validate_name])
    leaf = models.ForeignKey(Switch, on_delete=models.RESTRICT, related_name="nics")
    bw_GBps = models.FloatField("bandwidth (GB/s)", validators=[validate_bw_GBps])
    latency_us = models.FloatField("latency (us)", validators=[validate_latency_us])

    class Meta:
        ordering = ["node_id", "id"]
        verbose_name = "NIC"
        constraints = [
            models.UniqueConstraint(fields=["node", "name"], name="topology_nic_unique_name"),
            positive_constraint("nic", "bw_GBps"),
            positive_constraint("nic", "latency_us"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.name}" if self.node_id else self.name

    def owning_cluster_id(self) -> int | None:
        return self.node.cluster_id if self.node_id else None

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.node_id is not None and self.node.standalone:
            errors["node"] = "a standalone node has no NICs"
        if self.leaf_id is not None:
            cluster_id = self.node.cluster_id if self.node_id is not None else None
            if problem := _leaf_errors(self.leaf, cluster_id):
                errors["leaf"] = problem
        if errors:
            raise ValidationError(errors)


class Gpu(ClusterRow):
    """One GPU: its index on the node, its NVLink domain and the one NIC it uses (none if standalone)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    domain = models.ForeignKey(NvlinkDomain, on_delete=models.RESTRICT, related_name="gpus")
    nic = models.ForeignKey(Nic, on_delete=models.RESTRICT, related_name="gpus", null=True, blank=True)

    class Meta:
        ordering = ["node_id", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="topology_gpu_unique_index"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index}" if self.node_id else f"GPU {self.index}"

    def owning_cluster_id(self) -> int | None:
        return self.node.cluster_id if self.node_id else None

    def clean(self) -> None:
        errors: dict[str, str] = {}
        node = self.node if self.node_id is not None else None
        if node is not None and self.domain_id is not None and self.domain.cluster_id != node.cluster_id:
            errors["domain"] = f"NVLink domain {self.domain.name!r} belongs to another cluster"
        if node is not None and node.standalone:
            if self.nic_id is not None:
                errors["nic"] = "a standalone node's GPUs have no NIC"
        elif self.nic_id is None:
            errors["nic"] = "required: every GPU of a networked node uses exactly one NIC"
        elif node is not None and self.nic.node_id != node.pk:
            errors["nic"] = f"NIC {self.nic.name!r} is on node {self.nic.node.name!r}, not on {node.name!r}"
        if errors:
            raise ValidationError(errors)
