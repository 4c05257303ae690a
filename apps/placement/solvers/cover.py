"""Best-fit covering: which children of a block supply a number of GPUs."""

from __future__ import annotations

import numpy as np


def best_fit_cover(capacity: np.ndarray, need: int, load: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Children (by position in `capacity`) and how many GPUs each gives, summing to `need`.

    Slurm-style best fit: while one child alone covers what is still needed, take the one with the
    smallest such capacity and stop; otherwise take the child with the largest capacity whole and
    repeat. Ties go to lower `load`, then to the lower position. ValueError if the total is short.
    """
    cap = np.asarray(capacity, dtype=np.int64)
    if int(cap.sum()) < need:
        raise ValueError(f"need: {need} GPUs asked of children holding {int(cap.sum())}")
    tie = np.zeros(cap.size) if load is None else np.asarray(load, dtype=float)
    # Capacity descending, then load ascending, then position ascending.
    order = np.lexsort((np.arange(cap.size), tie, -cap))
    order = order[cap[order] > 0]
    sorted_cap = cap[order]
    plan: list[tuple[int, int]] = []
    i = 0
    while need > 0:
        if sorted_cap[i] >= need:
            # The run of equal capacities closest above `need` starts where -cap first reaches it.
            neg = -sorted_cap[i:]
            last = int(np.searchsorted(neg, -need, side="right")) - 1
            first_equal = int(np.searchsorted(neg, neg[last], side="left"))
            plan.append((int(order[i + first_equal]), need))
            return plan
        plan.append((int(order[i]), int(sorted_cap[i])))
        need -= int(sorted_cap[i])
        i += 1
    return plan
