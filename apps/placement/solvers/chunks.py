"""Equal domain chunks of any size: the job cut into m pieces of c GPUs, one per NVLink domain,
for every divisor c of its GPU count (not only powers of two), where NVLink domains span several
nodes (NVL72 racks, domains straddling leaves).

A hierarchical collective across domains runs its inter-domain phase once per rail of the
smallest piece, so 4 x 12 over four domains can beat 19 + 19 + 10 over three, and a domain of 24
free GPUs gives 24 + 8 or 3 x 16 only if those sizes are tried. For each divisor c (largest
first, a multiple of the TP group so none straddles domains), the m = n / c domains with room
for c, a window of m consecutive ones in hierarchy order that spans the fewest units; c GPUs
from each (best-fit nodes). The caller prices them with the cost model.
"""

from __future__ import annotations

import numpy as np

from ..jobs import JobSpec
from .base import HierarchyIndex
from .blocks import Free, canonical, take_nodes

# Chunk sizes tried per job, largest first.
CHUNKS_TRIED = 3


def domain_chunk_sets(idx: HierarchyIndex, counts: Free, job: JobSpec) -> list[np.ndarray]:
    """GPU sets (canonical order) of the job in equal pieces over NVLink domains; none on
    clusters whose domains are single nodes (best fit's node chunks cover those)."""
    n = job.gpus
    if idx.max_domain_gpus <= idx.max_node_gpus:
        return []
    group = job.tp * job.cp
    members, off = idx.nodes_of_domain
    # Each domain's first free GPU's place in hierarchy order and its unit.
    first_free = np.full(idx.n_domains, -1, dtype=np.int64)
    doms = idx.gpu_domain[counts.ids]
    order = np.argsort(idx.position[counts.ids], kind="stable")
    first_free[doms[order][::-1]] = counts.ids[order][::-1]
    out: list[np.ndarray] = []
    for c in range(min(n // 2, int(counts.domain.max())), 1, -1):
        if len(out) >= CHUNKS_TRIED:
            break
        if n % c or c % group:
            continue
        m = n // c
        ok = np.flatnonzero(counts.domain >= c)
        if ok.size < m:
            continue
        ok = ok[np.argsort(idx.position[first_free[ok]], kind="stable")]
        units = idx.gpu_unit[first_free[ok]]
        spans = [np.unique(units[k : k + m]).size for k in range(ok.size - m + 1)]
        start = int(np.argmin(spans))
        parts = [take_nodes(idx, counts, members[off[d] : off[d + 1]], c) for d in ok[start : start + m]]
        out.append(canonical(idx, np.concatenate(parts)))
    return out
