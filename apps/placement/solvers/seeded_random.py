"""`random`: uniformly random free GPUs in a random rank order, reproducible from `seed`."""

from __future__ import annotations

import numpy as np

from ..jobs import JobSpec
from ..topology import Topology
from .base import shortage


def choose(topology: Topology, free: np.ndarray, link_load, job: JobSpec, seed: int = 0):
    """`job.gpus` free gids drawn without replacement by numpy's generator seeded with `seed`."""
    missing = shortage(job, free)
    if missing is not None:
        return missing
    rng = np.random.default_rng(seed)
    picked = rng.choice(np.flatnonzero(free), size=job.gpus, replace=False)
    return tuple(int(g) for g in picked)
