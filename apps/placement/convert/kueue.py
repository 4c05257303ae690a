"""Kubernetes: a Kueue `Topology` (levels) and the node labels of each level as manifests for
`kubectl apply`; import of node labels from `kubectl get nodes -o json` (topograph's, GKE's,
AWS's and NVIDIA's `nvidia.com/gpu.clique`), or from the manifests this module writes."""

from __future__ import annotations

import json
import re

import yaml

from ..topology import Topology
from .base import Defaults, Imported, Source, at, check_size, fail, yaml_documents
from .tree import SwitchTree, TreeSwitch, node_hierarchy, tree_to_spec

HOSTNAME = "kubernetes.io/hostname"
ACCELERATOR = "network.topology.nvidia.com/accelerator"
TIER_LABELS = {
    "leaf": "network.topology.nvidia.com/leaf",
    "spine": "network.topology.nvidia.com/spine",
    "core": "network.topology.nvidia.com/core",
}
# Label families, closest-to-the-node level first.
FAMILIES = (
    (
        "topograph",
        (
            "network.topology.nvidia.com/leaf",
            "network.topology.nvidia.com/spine",
            "network.topology.nvidia.com/core",
        ),
    ),
    (
        "topograph (block/datacenter)",
        (
            "network.topology.nvidia.com/block",
            "network.topology.nvidia.com/spine",
            "network.topology.nvidia.com/datacenter",
        ),
    ),
    (
        "topograph (tier-0)",
        (
            "network.topology.nvidia.com/tier-0",
            "network.topology.nvidia.com/tier-1",
            "network.topology.nvidia.com/tier-2",
        ),
    ),
    (
        "topograph (levels)",
        (
            "network.topology.nvidia.com/level-0",
            "network.topology.nvidia.com/level-1",
            "network.topology.nvidia.com/level-2",
        ),
    ),
    (
        "topograph (tiers)",
        (
            "network.topology.nvidia.com/tier-1",
            "network.topology.nvidia.com/tier-2",
            "network.topology.nvidia.com/tier-3",
        ),
    ),
    (
        "GKE",
        (
            "cloud.google.com/gce-topology-host",
            "cloud.google.com/gce-topology-subblock",
            "cloud.google.com/gce-topology-block",
        ),
    ),
    (
        "AWS",
        (
            "topology.k8s.aws/network-node-layer-3",
            "topology.k8s.aws/network-node-layer-2",
            "topology.k8s.aws/network-node-layer-1",
        ),
    ),
    ("OCI", ("oci.oraclecloud.com/host.rack_id", "oci.oraclecloud.com/host.network_block_id")),
    ("Kueue", ("cloud.provider.com/topology-rack", "cloud.provider.com/topology-block")),
)
DOMAIN_LABELS = (
    "accelerated.topology.nvidia.com/domain-0",
    "accelerated.topology.nvidia.com/level-0",
    ACCELERATOR,
    "nvidia.com/gpu.clique",
)
# Stands in for a leaf label when nodes carry NVLink cliques only.
FALLBACK_LEAF = "topoweb/leaf"
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


def _label(value: str) -> str:
    # Label values: at most 63 characters of [A-Za-z0-9_.-].
    return _LABEL_VALUE.sub("_", value)[:63]


def export_kueue(topo: Topology) -> str:
    """A Kueue Topology and one Node manifest per node carrying its level labels (YAML documents)."""
    hier = node_hierarchy(topo)
    has_spine = any(s for _, s, _ in hier)
    has_core = any(c for _, _, c in hier)
    # The accelerator level sits between leaf and host only when each NVLink domain is inside one leaf.
    dom_leaf: dict[str, set] = {}
    for node, (leaf, _, _) in zip(topo.nodes, hier, strict=True):
        dom_leaf.setdefault(node.domain, set()).add(leaf)
    nested = all(len(v) == 1 for v in dom_leaf.values())
    multi = any(len(d.nodes) > 1 for d in topo.domains.values())
    levels = [TIER_LABELS[t] for t, on in (("core", has_core), ("spine", has_spine), ("leaf", True)) if on]
    if multi and nested:
        levels.append(ACCELERATOR)
    levels.append(HOSTNAME)
    docs = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "Topology",
            "metadata": {"name": _label(topo.name)},
            "spec": {"levels": [{"nodeLabel": lab} for lab in levels]},
        }
    ]
    for node, (leaf, spine, core) in zip(topo.nodes, hier, strict=True):
        labels = {}
        for tier, sw in (("leaf", leaf), ("spine", spine), ("core", core)):
            if sw is not None:
                labels[TIER_LABELS[tier]] = _label(sw)
        labels[ACCELERATOR] = _label(node.domain)
        labels["nvidia.com/gpu.count"] = str(node.gpus)
        labels["nvidia.com/gpu.product"] = _label(node.gpu_model)
        docs.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": labels}})
    head = f"# Kueue Topology and node labels of cluster {topo.name} (kubectl apply -f), written by TopoWeb\n"
    return head + yaml.safe_dump_all(docs, sort_keys=False, width=120)


def _nodes(source: Source) -> list[tuple[dict, str]]:
    """(Node object, file:line) from `kubectl get nodes -o json` or from YAML manifests."""
    check_size(source)
    text = source.text.lstrip()
    items: list[tuple[dict, str]] = []
    if text.startswith(("{", "[")):
        try:
            data = json.loads(source.text)
        except json.JSONDecodeError as exc:
            raise fail(at(source, exc.lineno), f"not valid JSON: {exc.msg}") from None
        objs = data.get("items") if isinstance(data, dict) and "items" in data else data
        objs = objs if isinstance(objs, list) else [objs]
        for obj in objs:
            items.append((obj, at(source, _line_of(source.text, obj))))
    else:
        for data, lines in yaml_documents(source):
            objs = data.get("items") if isinstance(data, dict) and "items" in data else [data]
            for obj in objs if isinstance(objs, list) else []:
                items.append((obj, at(source, lines.get(id(obj)))))
    return items


def _line_of(text: str, obj) -> int | None:
    name = obj.get("metadata", {}).get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str):
        return None
    pos = text.find(json.dumps(name))
    return text.count("\n", 0, pos) + 1 if pos >= 0 else None


def _family(parsed: list) -> tuple[str, tuple[str, ...]] | None:
    """The label family every node carries, from its lowest level present on all of them: a GKE
    list with block labels only takes the block as the leaf level."""
    for lo in range(3):
        for fname, keys in FAMILIES:
            if lo < len(keys) and all(keys[lo] in lab for _, lab, _, _ in parsed):
                return (fname if lo == 0 else f"{fname}, from {keys[lo]} up"), keys[lo:]
    return None


def import_labels(sources: list[Source], defaults: Defaults) -> Imported:
    """kueue: nodes and their topology labels from `kubectl get nodes -o json` (or manifests)."""
    objects = [item for s in sources for item in _nodes(s)]
    nodes = [(o, w) for o, w in objects if not (isinstance(o, dict) and o.get("kind") not in (None, "Node"))]
    # The Topology this module writes names the cluster, unless the operator gave a name.
    topologies = [o for o, _ in objects if isinstance(o, dict) and o.get("kind") == "Topology"]
    name = (topologies[0].get("metadata") or {}).get("name") if topologies else None
    if isinstance(name, str) and name and "name" not in defaults.given:
        defaults.update({"name": name}, where="Topology.metadata")
    if not nodes:
        raise fail(sources[0].name if sources else "input", "no Node objects found")
    parsed = []
    for obj, where in nodes:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise fail(where, "a Node needs metadata.name")
        labels = meta.get("labels") or {}
        if not isinstance(labels, dict):
            raise fail(where, f"node {meta['name']!r}: metadata.labels must be a mapping")
        parsed.append((meta["name"], {str(k): str(v) for k, v in labels.items()}, obj, where))
    family = _family(parsed)
    tree = SwitchTree()
    if family is None:
        # Some nodes with a leaf label: name one without. None: every node needs a clique.
        labelled = any(k in lab for _, lab, _, _ in parsed for _, keys in FAMILIES for k in keys)
        lacking = next(
            (
                (n, w)
                for n, lab, _, w in parsed
                if not any(k in lab for _, keys in FAMILIES for k in keys)
                and (labelled or not any(lab.get(k) for k in DOMAIN_LABELS))
            ),
            None,
        )
        if lacking is not None:
            known = ", ".join(keys[0] for _, keys in FAMILIES)
            raise fail(
                lacking[1],
                f"node {lacking[0]!r} has no topology label (such as {known}) and no NVLink clique",
            )
        # NVLink cliques only (GB200 racks labelled by the GPU operator): the network is not described.
        family = ("NVLink clique only", (FALLBACK_LEAF,))
        for _, lab, _, _ in parsed:
            lab[FALLBACK_LEAF] = "leaf-1"
        tree.notes.append("no network labels: every node is put on one leaf, leaf-1")
    fname, keys = family
    used_names: dict[tuple[int, str], str] = {}
    taken: set[str] = set()

    def switch(level: int, value: str, where: str) -> TreeSwitch:
        key = (level, value)
        if key not in used_names:
            name = value if value not in taken else f"{('leaf', 'spine', 'core')[level]}-{value}"
            used_names[key] = name
            taken.add(name)
            tree.add(TreeSwitch(name, where))
        return tree.switches[used_names[key]]

    for name, labels, obj, where in parsed:
        chain = [labels.get(k) for k in keys]
        below: TreeSwitch | None = None
        for level, value in enumerate(chain):
            if value is None:
                if any(v is not None for v in chain[level:]):
                    raise fail(where, f"node {name!r} has {keys[level + 1]} but not {keys[level]}")
                break
            sw = switch(level, value, where)
            if below is None:
                sw.nodes.append(name)
            elif below.name not in sw.children:
                sw.children.append(below.name)
            below = sw
        dom = next((labels[k] for k in DOMAIN_LABELS if labels.get(k)), None)
        if dom:
            tree.domains[name] = dom
        count = labels.get("nvidia.com/gpu.count") or (obj.get("status", {}).get("capacity", {}) or {}).get(
            "nvidia.com/gpu"
        )
        if count is not None:
            if not str(count).isdigit() or not 0 < int(count) <= 1024:
                raise fail(where, f"node {name!r}: GPU count {count!r} is not a whole number in 1..1024")
            tree.node_gpus[name] = int(count)
        product = labels.get("nvidia.com/gpu.product") or labels.get("cloud.google.com/gke-accelerator")
        if product:
            tree.node_model[name] = product
    tree.notes.append(f"{len(parsed)} nodes with {fname} labels ({', '.join(keys)})")
    return tree_to_spec(tree, defaults)
