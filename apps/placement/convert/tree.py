"""The switch tree the tree-shaped formats (Slurm tree and yaml, topograph, Kueue labels) read
into spec v1, and the tree view of a Topology their exporters write."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..topology import Topology
from .base import MAX_NODES, Defaults, Imported, assumed, cluster_spec, fail
from .hardware import GpuKind, gpu_kind
from .hostlist import compress


@dataclass
class TreeSwitch:
    name: str
    where: str  # file:line
    children: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    link_speed: float | None = None


@dataclass
class SwitchTree:
    """Switches by name with their child switches and nodes, as the tree formats describe them."""

    switches: dict[str, TreeSwitch] = field(default_factory=dict)
    domains: dict[str, str] = field(default_factory=dict)  # node -> NVLink domain
    node_gpus: dict[str, int] = field(default_factory=dict)  # 0: a node without GPUs (left out)
    node_nics: dict[str, int] = field(default_factory=dict)
    described: bool = False  # node_gpus comes from files that describe every node (slurm.conf)
    node_model: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, sw: TreeSwitch) -> None:
        if sw.name in self.switches:
            raise fail(sw.where, f"switch {sw.name!r} is already defined at {self.switches[sw.name].where}")
        self.switches[sw.name] = sw


TIER_NAMES = ("leaf", "spine", "core")


def _components(live: Mapping[str, TreeSwitch], parents: Mapping[str, list[str]]) -> int:
    """How many separate networks the switches form (full-mesh spines over shared leaves are one)."""
    root = {n: n for n in live}

    def find(x: str) -> str:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    for child, ps in parents.items():
        for p in ps:
            root[find(child)] = find(p)
    return len({find(n) for n in live})


def tree_to_spec(tree: SwitchTree, defaults: Defaults) -> Imported:
    """Spec v1 from a switch tree: switches with nodes are leaves, their parents spines, theirs
    cores; unconnected tops are joined by an added switch; what the tree lacks comes from
    `defaults` (named in the notes)."""
    notes = list(tree.notes)
    sw = tree.switches
    _leave_out_cpu_nodes(tree, defaults, notes)
    rack_gpus = _nvl72_racks(tree, defaults, notes)
    for s in sw.values():
        if s.nodes and s.children:
            raise fail(
                s.where, f"switch {s.name!r} has both nodes and switches; spec v1 cables nodes to leaves"
            )
        for c in s.children:
            if c not in sw:
                raise fail(s.where, f"switch {s.name!r} lists unknown switch {c!r}")
    # Switches that reach no node (empty racks) carry nothing.
    height: dict[str, int] = {}

    def h(name: str, trail: tuple[str, ...]) -> int:
        if name in height:
            return height[name]
        if name in trail:
            raise fail(sw[name].where, f"switch {name!r} is its own descendant")
        s = sw[name]
        if s.nodes:
            height[name] = 0
        else:
            below = [h(c, (*trail, name)) for c in s.children]
            below = [x for x in below if x >= 0]
            height[name] = 1 + max(below) if below else -1
        return height[name]

    for name in sw:
        h(name, ())
    empty = [n for n, v in height.items() if v < 0]
    if empty:
        notes.append(
            f"switches without nodes left out: {', '.join(empty[:10])}{' ...' if len(empty) > 10 else ''}"
        )
    live = {n: s for n, s in sw.items() if height[n] >= 0}
    if not live:
        raise fail(next(iter(sw.values())).where if sw else "input", "no switch has nodes")
    for s in live.values():
        if height[s.name] > 2:
            raise fail(
                s.where,
                f"switch {s.name!r} is {height[s.name] + 1} tiers deep; spec v1 has leaf, spine and core",
            )
    parents: dict[str, list[str]] = {n: [] for n in live}
    for s in live.values():
        for c in s.children:
            if c in live:
                parents[c].append(s.name)
                if height[s.name] - height[c] != 1:
                    raise fail(
                        s.where,
                        f"switch {s.name!r} ({TIER_NAMES[height[s.name]]}) links to {c!r} "
                        f"({TIER_NAMES[height[c]]}); spec v1 links adjacent tiers only",
                    )
    roots = [n for n in live if not parents[n]]
    added: list[tuple[str, str]] = []
    if len(roots) > 1 and _components(live, parents) > 1:
        top = max(height[r] for r in roots)
        low = [r for r in roots if height[r] != top]
        if low or top >= 2:
            r = (low or roots)[0]
            raise fail(
                live[r].where,
                f"switch {r!r} has no common parent with {roots[0] if roots[0] != r else roots[1]!r} and "
                "they cannot be joined by one more tier; spec v1 needs every leaf to reach every other",
            )
        root = "root"
        while root in live:
            root += "-0"
        added = [(root, TIER_NAMES[top + 1])]
        for r in roots:
            parents[r].append(root)
        notes.append(
            f"added switch {root!r} ({TIER_NAMES[top + 1]}) joining {len(roots)} switches without a "
            "common parent in the input"
        )

    switches = [{"name": n, "tier": TIER_NAMES[height[n]]} for n in live] + [
        {"name": n, "tier": t} for n, t in added
    ]
    links = []
    origins: dict[str, str] = {}
    for i, n in enumerate(live):
        origins[f"switches[{i}]"] = live[n].where
    for child, ps in parents.items():
        for p in ps:
            bw = None
            speed = live[child].link_speed
            if speed is not None and defaults.link_speed_unit_GBps > 0:
                bw = speed * defaults.take("link_speed_unit_GBps")
            if bw is None:
                bw = defaults.take("uplink_bw_GBps")
            origins[f"links[{len(links)}]"] = live[child].where
            links.append(
                {"a": child, "b": p, "bw_GBps": bw, "latency_us": defaults.take("uplink_latency_us")}
            )
    if any(s.link_speed is not None for s in live.values()) and defaults.link_speed_unit_GBps <= 0:
        notes.append(
            "LinkSpeed is in units of the site's choosing and was not used; set link_speed_unit_GBps "
            "to turn it into bandwidth"
        )

    nodes = []
    seen: dict[str, str] = {}
    models: dict[str, float] = {}
    total = 0
    assumed_gpus = assumed_nics = assumed_nvlink = assumed_model = 0
    for s in live.values():
        total += len(s.nodes)
        if total > MAX_NODES:
            raise fail(s.where, f"the tree names more than {MAX_NODES} nodes")
    for s in live.values():
        if not s.nodes:
            continue
        for nname in s.nodes:
            if nname in seen:
                # Real files list a node twice by mistake; spec v1 cables it to one leaf.
                notes.append(
                    f"node {nname!r} at {s.where} is already on a switch at {seen[nname]}; kept there"
                )
                continue
            seen[nname] = s.where
            gpus = defaults.host_gpus.get(nname) or rack_gpus.get(nname) or tree.node_gpus.get(nname)
            if not gpus:
                gpus = defaults.take("gpus_per_node")
                assumed_gpus += 1
            nics = defaults.host_nics.get(nname) or tree.node_nics.get(nname)
            if not nics:
                nics = defaults.take("nics_per_node")
                assumed_nics += 1
            rack = nname in rack_gpus and "gpu_model" not in defaults.given
            model = tree.node_model.get(nname) or (GB200.model if rack else None)
            if model is None:
                model = defaults.take("gpu_model")
                assumed_model += 1
            if model not in models:
                named = nname in tree.node_model  # by Slurm's GRES type or a node label
                kind = GB200 if model == GB200.model else (gpu_kind(model=model) if named else None)
                given = "peak_tflops" in defaults.given
                models[model] = kind.peak_tflops if kind and not given else defaults.take("peak_tflops")
            if nname in rack_gpus and "nvlink_bw_GBps" not in defaults.given:
                nvlink_bw = GB200.nvlink_bw_GBps
            else:
                nvlink_bw = defaults.take("nvlink_bw_GBps")
                assumed_nvlink += 1
            dom = tree.domains.get(nname, nname)
            if nics < 1 or gpus % nics:
                raise fail(s.where, f"{nics} NICs per node must divide the {gpus} GPUs of node {nname!r}")
            per = gpus // nics
            origins[f"nodes[{len(nodes)}]"] = s.where
            nodes.append(
                {
                    "name": nname,
                    "gpu_model": model,
                    "gpus": gpus,
                    "nvlink": {
                        "domain": dom,
                        "bw_GBps": nvlink_bw,
                        "latency_us": defaults.take("nvlink_latency_us"),
                    },
                    "nics": [
                        {
                            "name": f"mlx5_{k}",
                            "gpus": list(range(k * per, (k + 1) * per)),
                            "leaf": s.name,
                            "bw_GBps": defaults.take("nic_bw_GBps"),
                            "latency_us": defaults.take("nic_latency_us"),
                        }
                        for k in range(nics)
                    ],
                }
            )
    assumed(notes, defaults, "gpus_per_node", "{} GPUs per node", assumed_gpus, "nodes")
    assumed(notes, defaults, "gpu_model", "GPU model {}", assumed_model, "nodes")
    assumed(notes, defaults, "nics_per_node", "{} NIC per node", assumed_nics, "nodes")
    assumed(notes, defaults, "nic_bw_GBps", "{} GB/s per NIC", len(nodes), "nodes")
    assumed(
        notes, defaults, "nvlink_bw_GBps", "{} GB/s NVLink per GPU", assumed_nvlink, "nodes in NVLink domains"
    )
    return cluster_spec(defaults, models, switches, links, nodes, notes, origins)


def _leave_out_cpu_nodes(tree: SwitchTree, defaults: Defaults, notes: list[str]) -> None:
    """Drop the nodes that have no GPUs (a Slurm node without a gpu Gres, `gpus[...]=0`), and,
    when node descriptions were given, the nodes they do not describe."""

    def no_gpus(n: str) -> bool:
        if n in defaults.host_gpus:
            return defaults.host_gpus[n] == 0
        return tree.node_gpus.get(n) == 0

    dropped, undescribed = [], []
    for s in tree.switches.values():
        kept = []
        for n in s.nodes:
            if no_gpus(n):
                dropped.append(n)
            elif tree.described and n not in tree.node_gpus and n not in defaults.host_gpus:
                undescribed.append(n)
            else:
                kept.append(n)
        s.nodes = kept
    if dropped:
        notes.append(f"{len(dropped)} nodes without GPUs left out: {compress(dropped)}")
    if undescribed:
        notes.append(
            f"{len(undescribed)} nodes without GPUs in the node descriptions given left out: "
            f"{compress(undescribed)} (set gpus[HOSTLIST]=N to keep them)"
        )


# A multi-node NVLink domain of 18 nodes is a GB200/GB300 NVL72 rack: 18 trays of 4 GPUs.
NVL72_NODES, NVL72_NODE_GPUS = 18, 4
GB200 = GpuKind("GB200", 18, 50.0, 2250.0)


def _nvl72_racks(tree: SwitchTree, defaults: Defaults, notes: list[str]) -> dict[str, int]:
    """GPUs per node of the nodes in 18-node NVLink domains (4, the NVL72 tray), unless the GPU
    count is given; noted."""
    if "gpus_per_node" in defaults.given:
        return {}
    members: dict[str, list[str]] = {}
    for node, dom in tree.domains.items():
        members.setdefault(dom, []).append(node)
    racks = [
        d
        for d, ns in members.items()
        if len(ns) == NVL72_NODES
        and all(tree.node_gpus.get(n, NVL72_NODE_GPUS) == NVL72_NODE_GPUS for n in ns)
    ]
    out = {n: NVL72_NODE_GPUS for d in racks for n in members[d]}
    if out:
        notes.append(
            f"{len(racks)} NVLink domains of {NVL72_NODES} nodes taken as GB200 NVL72 racks: "
            f"{NVL72_NODE_GPUS} {GB200.model} GPUs per node at {GB200.nvlink_bw_GBps:g} GB/s NVLink, "
            f"{NVL72_NODES * NVL72_NODE_GPUS} GPUs per domain ({len(out)} nodes; set gpus_per_node, "
            "gpu_model and nvlink_bw_GBps to override)"
        )
    return out


# ---- what exporters read from a Topology ----------------------------------------------------


def leaf_groups(topo: Topology) -> dict[str, list[str]]:
    """Each leaf that is some node's first leaf, with those nodes in file order (the node's other
    rails, if any, share its first leaf's node set in rail-optimized clusters)."""
    out: dict[str, list[str]] = {}
    for ni, node in enumerate(topo.nodes):
        li = int(topo.node_leaf[ni])
        if li >= 0:
            out.setdefault(topo.leaf_names[li], []).append(node.name)
    return out


def uplinks(topo: Topology) -> dict[str, list[str]]:
    """Each spine or core switch with the switches one tier below it that link to it."""
    tier = {s.name: s.tier for s in topo.switches}
    out: dict[str, list[str]] = {s.name: [] for s in topo.switches if s.tier != "leaf"}
    order = {s.name: i for i, s in enumerate(topo.switches)}
    for lk in topo.links:
        lo, hi = (lk.a, lk.b) if TIER_NAMES.index(tier[lk.a]) < TIER_NAMES.index(tier[lk.b]) else (lk.b, lk.a)
        if lo not in out[hi]:
            out[hi].append(lo)
    for v in out.values():
        v.sort(key=order.__getitem__)
    return out


def domain_groups(topo: Topology) -> dict[str, list[str]]:
    """NVLink domains with their nodes in file order."""
    return {name: list(d.nodes) for name, d in topo.domains.items()}


def node_hierarchy(topo: Topology) -> list[tuple[str, str | None, str | None]]:
    """Per node (file order): its first leaf, the spine group above it (named after the group's
    first spine) and the core group above that (named after its first core); None where absent.
    A tree view of a Clos: every leaf of a pod links to every spine of it."""
    ups = uplinks(topo)
    up_of: dict[str, list[str]] = {}
    for hi, lows in ups.items():
        for lo in lows:
            up_of.setdefault(lo, []).append(hi)
    order = {s.name: i for i, s in enumerate(topo.switches)}

    def first_up(name: str | None) -> str | None:
        if name is None or not up_of.get(name):
            return None
        return min(up_of[name], key=order.__getitem__)

    out = []
    for ni in range(len(topo.nodes)):
        li = int(topo.node_leaf[ni])
        leaf = topo.leaf_names[li] if li >= 0 else None
        spine = first_up(leaf)
        out.append((leaf, spine, first_up(spine)))
    return out
