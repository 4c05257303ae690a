"""Rank groups from a job's parallelism and rank order (Megatron-Core semantics).

Ranks 0..gpus-1 are laid out over the dimensions of `rank_order`, leftmost varying fastest. The
data-parallel dimension of size `dp` is split into `ep` (expert index, the faster part) and
`dp/ep` (the slower part): a rank's DP coordinate is `ep_index + ep * dp_index`. So
- a TP / PP group is the ranks that differ only in their tp / pp coordinate;
- a DP group is the `dp` ranks that share tp and pp coordinates (dense gradients are all-reduced
  over all of them), listed by DP coordinate;
- an EP group is `ep` consecutive DP coordinates: the ranks that share tp, pp and dp_index;
- a CP group (context parallelism, cp > 1) is the ranks that differ only in their cp coordinate;
  Megatron's order puts cp right after tp (tp-cp-ep-dp-pp). DP groups keep one cp coordinate:
  a `dp` entry prices the gradient reduction of each context slice's data-parallel replicas.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .jobs import GROUP_KINDS, JobSpec


def rank_groups(job: JobSpec) -> dict[str, list[tuple[int, ...]]]:
    """Every TP, PP, DP and EP group of `job` as rank tuples, keyed by kind.

    Groups of one kind are listed by their first rank; inside a group ranks follow the group's
    own coordinate (stage order for PP, DP coordinate for DP). Size-1 groups are included.
    """
    arrays = group_arrays(job)
    return {kind: [tuple(row) for row in arrays[kind].tolist()] for kind in GROUP_KINDS}


def group_arrays(job: JobSpec) -> dict[str, np.ndarray]:
    """The groups of each kind as a read-only int64 array of shape (n_groups, group_size).

    Cached per parallelism, so solvers can call it in their inner loops.
    """
    return _group_arrays(job.gpus, job.tp, job.pp, job.dp, job.ep, job.rank_order, job.cp)


@lru_cache(maxsize=512)
def _group_arrays(
    gpus: int, tp: int, pp: int, dp: int, ep: int, rank_order: str, cp: int = 1
) -> dict[str, np.ndarray]:
    if tp * cp * pp * dp != gpus or dp % ep:
        raise ValueError(f"parallelism tp={tp} cp={cp} pp={pp} dp={dp} ep={ep} does not fit gpus={gpus}")
    # "dpo" is the slower, outer part of the data-parallel dimension (dp_index, size dp/ep).
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dpo": dp // ep, "pp": pp}
    dims = ["dpo" if d == "dp" else d for d in rank_order.split("-")]
    if "cp" not in dims:
        dims.insert(dims.index("tp") + 1, "cp")
    # C order puts the last axis fastest, so the fastest dimension goes last.
    axes = dims[::-1]
    grid = np.arange(gpus, dtype=np.int64).reshape([sizes[d] for d in axes])

    def along(*group_dims: str) -> np.ndarray:
        # Move the group's dimensions to the end, slowest first, and flatten them into one.
        idx = [axes.index(d) for d in group_dims]
        rest = [i for i in range(len(axes)) if i not in idx]
        rows = grid.transpose(rest + idx).reshape(-1, int(np.prod([sizes[d] for d in group_dims])))
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        rows.setflags(write=False)
        return rows

    return {
        "tp": along("tp"),
        "pp": along("pp"),
        "dp": along("dpo", "ep"),
        "ep": along("ep"),
        "cp": along("cp"),
    }


def rank_coordinates(job: JobSpec, rank: int) -> dict[str, int]:
    """A rank's coordinates: tp, pp, ep (expert index), dp (its DP coordinate), dp_index and cp."""
    if not 0 <= rank < job.gpus:
        raise ValueError(f"rank {rank} is outside 0..{job.gpus - 1}")
    sizes = {"tp": job.tp, "cp": job.cp, "ep": job.ep, "dp": job.dp // job.ep, "pp": job.pp}
    coords: dict[str, int] = {}
    rest = rank
    for d in job.rank_order.split("-"):
        coords[d] = rest % sizes[d]
        rest //= sizes[d]
    dp_index = coords["dp"]
    return {
        "tp": coords["tp"],
        "pp": coords["pp"],
        "ep": coords["ep"],
        "dp": coords["ep"] + job.ep * dp_index,
        "dp_index": dp_index,
        "cp": coords.get("cp", 0),
    }
