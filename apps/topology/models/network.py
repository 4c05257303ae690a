"""Switches and the switch-to-switch links between them."""

from django.core.exceptions import ValidationError
from django.db import models

from ..choices import TIER_ORDER, SwitchTier
from .base import (
    NAME_MAX_LENGTH,
    ClusterRow,
    positive_constraint,
    validate_bw_GBps,
    validate_latency_us,
    validate_name,
)
from .cluster import Cluster


class Switch(ClusterRow):
    """A network switch of one tier (leaf, spine or core)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="switches")
    name = models.CharField(max_length=NAME_MAX_LENGTH, validators=[validate_name])
    tier = models.CharField(max_length=5, choices=SwitchTier.choices)
    position = models.PositiveIntegerField(default=0, help_text="Order in the exported spec.")

    class Meta:
        ordering = ["cluster_id", "position", "id"]
        verbose_name_plural = "switches"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="topology_switch_unique_name"),
            models.CheckConstraint(
                condition=models.Q(tier__in=SwitchTier.values),
                name="topology_switch_tier_valid",
                violation_error_message="tier must be one of leaf, spine, core",
            ),
        ]
        indexes = [models.Index(fields=["cluster", "tier"], name="topology_switch_tier_idx")]

    def __str__(self) -> str:
        return self.name


class Link(ClusterRow):
    """A switch-to-switch cable between adjacent tiers; parallel cables add up."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="links")
    a = models.ForeignKey(Switch, on_delete=models.CASCADE, related_name="links_as_a")
    b = models.ForeignKey(Switch, on_delete=models.CASCADE, related_name="links_as_b")
    bw_GBps = models.FloatField("bandwidth (GB/s)", validators=[validate_bw_GBps])
    latency_us = models.FloatField("latency (us)", validators=[validate_latency_us])
    position = models.PositiveIntegerField(default=0, help_text="Order in the exported spec.")

    class Meta:
        ordering = ["cluster_id", "position", "id"]
        constraints = [
            positive_constraint("link", "bw_GBps"),
            positive_constraint("link", "latency_us"),
            models.CheckConstraint(
                condition=~models.Q(a=models.F("b")),
                name="topology_link_distinct_ends",
                violation_error_message="a link must join two different switches",
            ),
        ]

    def __str__(self) -> str:
        if self.a_id is None or self.b_id is None:
            return "link"
        return f"{self.a.name} - {self.b.name}"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.a_id is not None and self.b_id is not None:
            a, b = self.a, self.b
            for end, switch in (("a", a), ("b", b)):
                if self.cluster_id is not None and switch.cluster_id != self.cluster_id:
                    errors[end] = f"switch {switch.name!r} belongs to another cluster"
            if a.pk == b.pk:
                errors["b"] = "a link must join two different switches"
            elif abs(TIER_ORDER[a.tier] - TIER_ORDER[b.tier]) != 1:
                errors["b"] = f"links join adjacent tiers (leaf-spine or spine-core), not {a.tier}-{b.tier}"
        if errors:
            raise ValidationError(errors)
