"""`first_fit`: the job's ranks on the lowest free GPU ids, in id order (blind to everything)."""

from __future__ import annotations

import numpy as np

from ..jobs import JobSpec
from ..topology import Topology
from .base import shortage


def choose(topology: Topology, free: np.ndarray, link_load, job: JobSpec, seed: int = 0):
    """Rank r gets the r-th lowest free gid; NoFit when fewer than `job.gpus` are free."""
    missing = shortage(job, free)
    if missing is not None:
        return missing
    return tuple(int(g) for g in np.flatnonzero(free)[: job.gpus])
