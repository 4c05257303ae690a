"""Enumerations of the topology app (values match topology spec v1 and the placement core)."""

from django.db import models


class SwitchTier(models.TextChoices):
    """A switch's tier; links join adjacent tiers only (leaf-spine, spine-core)."""

    LEAF = "leaf", "Leaf"
    SPINE = "spine", "Spine"
    CORE = "core", "Core"


class PlacementPolicy(models.TextChoices):
    """Placement solvers of the core (`apps.placement.solvers.POLICIES`)."""

    TOPO = "topo", "Topology-aware (topo)"
    NAIVE = "naive", "Free-GPU-first (naive)"
    FIRST_FIT = "first_fit", "Lowest GPU ids (first_fit)"
    TREE_BEST_FIT = "tree_best_fit", "Slurm topology/tree (tree_best_fit)"
    RANDOM = "random", "Random"


TIER_ORDER = {SwitchTier.LEAF: 0, SwitchTier.SPINE: 1, SwitchTier.CORE: 2}
