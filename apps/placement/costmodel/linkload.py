"""`link_load`: other jobs' rates on the fabric's switch links, as the per-leaf and per-pod loads
the cost model shares uplinks by.

Keys (GB/s each, non-negative): a leaf (its uplinks, pooled as before); a spine with core links
(its core links); a spine without (its links to leaves); a core switch (its links to spines); or
one link, `a/b` (two switch names joined by a link, either order). A switch's load is spread over
its links in proportion to their rates. Flows between leaves are spread over the spines as ECMP
does (each leaf's uplinks carry its flows in proportion to their rates), and since the hash that
puts a flow on a path is unknown, every flow is priced at the hottest path it may take: a leaf's
uplinks give its flows the least share any of them gives. With C the leaf's total uplinks, c_l one
uplink's rate, L the leaf's pooled load and x_l the load named on that link (or spread onto it),
that least share is C / (L + max_l x_l C / c_l + D) for the leaf's own demand D, which is the
pooled form with the load L + max_l x_l C / c_l (`load_array`'s value for the leaf). A pod's core
links the same way. A load spread evenly over every link (in proportion to the rates) prices as
before; a hot spine slows every leaf linked to it, by the share of that leaf's uplinks it holds.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..topology import Topology

_LINKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class FabricLinks:
    """The switch links above the leaves, parallel cables summed: leaf-spine links (`up_*`, one
    per leaf and spine) and spine-core links (`core_*`, one per spine and core)."""

    up_leaf: np.ndarray  # leaf index
    up_spine: tuple[str, ...]
    up_bw: np.ndarray  # GB/s
    core_spine: tuple[str, ...]
    core_core: tuple[str, ...]
    core_pod: np.ndarray  # the spine's pod
    core_bw: np.ndarray
    spine_pod: Mapping[str, int]  # each spine with core links -> its pod
    tier: Mapping[str, str]  # switch name -> tier
    index: Mapping[tuple[str, str], tuple[str, int]]  # (lower, upper switch) -> ("up" | "core", i)
    # A switch's links: spine -> its uplinks from leaves, spine or core -> its spine-core links.
    spine_ups: Mapping[str, np.ndarray]
    switch_cores: Mapping[str, np.ndarray]

    def named(self, a: str, b: str) -> tuple[str, int] | None:
        """("up" or "core", index) of the link joining switches a and b (either order), None if none."""
        return self.index.get((a, b)) or self.index.get((b, a))


def fabric_links(topo: Topology) -> FabricLinks:
    """`FabricLinks` of `topo`, memoised."""
    cached = _LINKS.get(topo)
    if cached is not None:
        return cached
    tier = {s.name: s.tier for s in topo.switches}
    pair_bw: dict[tuple[str, str], float] = {}
    for lk in topo.links:
        a, b = (lk.a, lk.b) if _rank(tier[lk.a]) < _rank(tier[lk.b]) else (lk.b, lk.a)
        pair_bw[(a, b)] = pair_bw.get((a, b), 0.0) + lk.bw_GBps
    ups = [(a, b, bw) for (a, b), bw in pair_bw.items() if tier[a] == "leaf" and tier[b] == "spine"]
    spine_pod = {s: int(topo.leaf_pod[topo.leaf_by_name[leaf]]) for leaf, s, _ in ups}
    cores = [
        (a, b, bw)
        for (a, b), bw in pair_bw.items()
        if tier[a] == "spine" and tier[b] == "core" and a in spine_pod
    ]
    index = {(a, b): ("up", i) for i, (a, b, _) in enumerate(ups)}
    index |= {(a, b): ("core", i) for i, (a, b, _) in enumerate(cores)}
    spine_ups: dict[str, list[int]] = {}
    for i, (_, b, _) in enumerate(ups):
        spine_ups.setdefault(b, []).append(i)
    switch_cores: dict[str, list[int]] = {}
    for i, (a, b, _) in enumerate(cores):
        switch_cores.setdefault(a, []).append(i)
        switch_cores.setdefault(b, []).append(i)
    out = FabricLinks(
        up_leaf=np.array([topo.leaf_by_name[u[0]] for u in ups], dtype=np.int64),
        up_spine=tuple(u[1] for u in ups),
        up_bw=np.array([u[2] for u in ups], dtype=float),
        core_spine=tuple(c[0] for c in cores),
        core_core=tuple(c[1] for c in cores),
        core_pod=np.array([spine_pod[c[0]] for c in cores], dtype=np.int64),
        core_bw=np.array([c[2] for c in cores], dtype=float),
        spine_pod={s: spine_pod[s] for s in sorted({c[0] for c in cores})},
        tier=tier,
        index=index,
        spine_ups={k: np.array(v, dtype=np.int64) for k, v in spine_ups.items()},
        switch_cores={k: np.array(v, dtype=np.int64) for k, v in switch_cores.items()},
    )
    _LINKS[topo] = out
    return out


def _rank(tier: str) -> int:
    return ("leaf", "spine", "core").index(tier)


def _spread(values: np.ndarray, where: np.ndarray, bw: np.ndarray, amount: float) -> None:
    # `amount` over the links `where` selects, in proportion to their rates.
    total = bw[where].sum()
    if total > 0:
        values[where] += amount * bw[where] / total


def load_array(topo: Topology, link_load: Mapping[str, float] | np.ndarray | None) -> np.ndarray:
    """`link_load` as one array: the load (GB/s) each leaf's uplinks are priced at, then each pod's
    core links (module docstring: pooled loads plus the hottest link's). Keys name leaves, spines,
    cores or links `a/b`; ValueError naming `link_load` for any other key or a negative rate. An
    array passes through: one value per leaf, optionally then one per pod."""
    n_leaves, n_pods = len(topo.leaf_names), len(topo.pod_core_bw)
    out = np.zeros(n_leaves + n_pods)
    if link_load is None:
        return out
    if isinstance(link_load, np.ndarray):
        if link_load.shape == (n_leaves,):
            out[:n_leaves] = link_load
            return out
        if link_load.shape != out.shape:
            raise ValueError(
                f"link_load: expected {n_leaves} values (one per leaf) or {out.size} (then one per pod), "
                f"got {link_load.shape}"
            )
        return link_load.astype(float)
    fab = fabric_links(topo)
    up = np.zeros(fab.up_bw.size)
    core = np.zeros(fab.core_bw.size)
    for name, flows in link_load.items():
        if not flows >= 0:
            raise ValueError(f"link_load[{name!r}]: rates (GB/s) must be non-negative, got {flows!r}")
        kind = fab.tier.get(name) if isinstance(name, str) else None
        if kind == "leaf" and name in topo.leaf_by_name:
            out[topo.leaf_by_name[name]] += flows
        elif (kind == "spine" and name in fab.spine_pod) or kind == "core":
            _spread(core, fab.switch_cores.get(name, _NONE), fab.core_bw, flows)
        elif kind == "spine":
            _spread(up, fab.spine_ups.get(name, _NONE), fab.up_bw, flows)
        elif isinstance(name, str) and name.count("/") == 1 and (hit := fab.named(*name.split("/"))):
            (up if hit[0] == "up" else core)[hit[1]] += flows
        elif isinstance(name, str) and name.count("/") == 1:
            a, b = name.split("/")
            raise ValueError(f"link_load: no link joins switches {a!r} and {b!r} (a link key is 'a/b')")
        else:
            raise ValueError(
                f"link_load: unknown switch {name!r} (keys name leaves, spines, cores, or links 'a/b')"
            )
    if up.any():
        # The hottest uplink's load, scaled to the leaf's total: C / (L + x C / c + D) = c / (x + ...).
        totals = topo.leaf_uplink_total_bw[fab.up_leaf]
        hot = np.zeros(n_leaves)
        np.maximum.at(hot, fab.up_leaf, up * totals / fab.up_bw)
        out[:n_leaves] += hot
    if core.any():
        from .paths import pod_core_total

        totals = pod_core_total(topo)[fab.core_pod]
        hot = np.zeros(n_pods)
        np.maximum.at(hot, fab.core_pod, core * totals / fab.core_bw)
        out[n_leaves:] += hot
    return out


def core_flow_names(topo: Topology, core_flows: np.ndarray) -> dict[str, float]:
    """This job's rates on each pod's core links, spread over the pod's core-linked spines in
    proportion to their core links' rates (so that adding them to `link_load` puts them back on
    the pod at the same load)."""
    if not core_flows.any():
        return {}
    fab = fabric_links(topo)
    spine_bw = {s: float(fab.core_bw[fab.switch_cores[s]].sum()) for s in fab.spine_pod}
    out: dict[str, float] = {}
    for pod in np.flatnonzero(core_flows):
        spines = [s for s, p in fab.spine_pod.items() if p == pod]
        total = sum(spine_bw[s] for s in spines)
        for s in spines:
            out[s] = float(core_flows[pod]) * spine_bw[s] / total
    return out
