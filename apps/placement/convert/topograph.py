"""NVIDIA topograph: its cluster model YAML in (`switches:` tree, `blocks:` of nodes with NVLink
domain annotations); its topology graph JSON out (a tree of switch vertices down to nodes, and the
NVLink domains)."""

from __future__ import annotations

import json

from ..topology import Topology
from .base import Defaults, Imported, NameBudget, Source, at, fail, hosts, yaml_documents
from .tree import SwitchTree, TreeSwitch, node_hierarchy, tree_to_spec

_DOMAIN_KEYS = ("/accelerator", "/domain")
# topograph's accelerated-domain labels by level, innermost first: `.../domain-0`, `.../level-0`.
ACCELERATED = "accelerated.topology.nvidia.com/"


def domain_label(labels) -> str | None:
    """The NVLink domain named by labels or annotations: topograph's innermost accelerated domain
    (`accelerated.topology.nvidia.com/domain-0`), else a key ending in /accelerator or /domain."""
    if not isinstance(labels, dict):
        return None
    levels = sorted(
        (str(k)[len(ACCELERATED) :], str(v)) for k, v in labels.items() if str(k).startswith(ACCELERATED)
    )
    if levels:
        return levels[0][1]
    return next((str(v) for k, v in labels.items() if str(k).endswith(_DOMAIN_KEYS)), None)


# A leaf for nodes that a model lists without a switch (the network is not described for them).
UNSWITCHED = "leaf-unswitched"


def _mapping(value, where: str, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(where, f"{what} must be a mapping")
    return value


def _nvlink_attr(body: dict, where: str, what: str) -> str | None:
    attrs = _mapping(body.get("attributes"), where, f"{what}: attributes")
    value = attrs.get("nvlink")
    if value is None:
        return None
    if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
        raise fail(where, f"{what}: attributes.nvlink must be a domain name, got {value!r}")
    return str(value)


def import_model(sources: list[Source], defaults: Defaults) -> Imported:
    """topograph: one model YAML in any form topograph documents: a `switches` mapping (children
    and nodes per switch), `blocks` (a list of switch, nodes and domain annotations), `nodes` (a
    mapping with capacity_block and attributes.nvlink) and `capacity_blocks` (a mapping of
    accelerated domains with nodes and attributes.nvlink)."""
    if len(sources) != 1:
        raise fail("input", f"topograph takes one model file, got {len(sources)}")
    source = sources[0]
    docs = yaml_documents(source)
    if len(docs) != 1 or not isinstance(docs[0][0], dict):
        raise fail(source.name, "a topograph model is one mapping with switches, nodes and capacity_blocks")
    data, lines = docs[0]
    unknown = set(data) - {"switches", "blocks", "nodes", "capacity_blocks"}
    if unknown:
        raise fail(
            source.name,
            f"unknown top-level field(s) {', '.join(sorted(map(str, unknown)))}; a model has switches, "
            "nodes, capacity_blocks (and blocks in the older form)",
        )
    tree = SwitchTree()
    budget = NameBudget()
    switches = data.get("switches") or {}
    if not isinstance(switches, dict):
        raise fail(
            at(source, lines.get(id(switches))), "switches must be a mapping of name to {switches, nodes}"
        )
    for name, body in switches.items():
        where = at(source, lines.get(id(body)))
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise fail(where, f"switch {name!r} must be a mapping")
        children = body.get("switches") or []
        if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
            raise fail(where, f"switch {name!r}: switches must be a list of names")
        names = hosts(body.get("nodes") or [], where, budget)
        if names and children:
            raise fail(where, f"switch {name!r} has switches below it and cannot also hold nodes")
        tree.add(TreeSwitch(str(name), where, list(children), names))
    _old_blocks(data, source, lines, tree, budget)
    named = _node_domains(data, source, lines, tree, budget)
    # Children named but never described are empty racks.
    for sw in list(tree.switches.values()):
        for c in sw.children:
            if c not in tree.switches:
                tree.switches[c] = TreeSwitch(c, sw.where)
    on_switch = {n for sw in tree.switches.values() for n in sw.nodes}
    loose = sorted(n for n in named if n not in on_switch)
    if loose:
        tree.add(TreeSwitch(UNSWITCHED, source.name, [], loose))
        tree.notes.append(f"{len(loose)} nodes on no switch put on one leaf {UNSWITCHED!r}")
    if not on_switch and not loose:
        raise fail(source.name, "the model lists no nodes (under switches, blocks, nodes or capacity_blocks)")
    n_dom = len(set(tree.domains.values()))
    if n_dom:
        tree.notes.append(f"{n_dom} NVLink domains from the model's accelerated domains")
    return tree_to_spec(tree, defaults)


def _old_blocks(data: dict, source: Source, lines: dict, tree: SwitchTree, budget: NameBudget) -> None:
    """The older form: `blocks` (or a `capacity_blocks` list) of {switch, nodes, annotations}."""
    blocks = data.get("blocks")
    if blocks is None and isinstance(data.get("capacity_blocks"), list):
        blocks = data["capacity_blocks"]
    if blocks is None:
        return
    if not isinstance(blocks, list):
        raise fail(at(source, lines.get(id(blocks))), "blocks must be a list of {switch, nodes}")
    for block in blocks:
        where = at(source, lines.get(id(block)))
        if not isinstance(block, dict) or not isinstance(block.get("switch"), str):
            raise fail(where, "each block needs `switch:` and `nodes:`")
        names = hosts(block.get("nodes") or [], where, budget)
        if not names:
            raise fail(where, f"block on switch {block['switch']!r} has no nodes")
        sw = tree.switches.get(block["switch"])
        if sw is None:
            tree.add(TreeSwitch(block["switch"], where, [], names))
        elif sw.children:
            raise fail(where, f"switch {sw.name!r} has switches below it and cannot also hold nodes")
        else:
            sw.nodes.extend(names)
        domain = domain_label(block.get("annotations") or block.get("labels") or {})
        if domain:
            for n in names:
                tree.domains[n] = domain


def _node_domains(data: dict, source: Source, lines: dict, tree: SwitchTree, budget: NameBudget) -> set[str]:
    """The current form: a node's accelerated domain is its attributes.nvlink, else its capacity
    block's attributes.nvlink, else the capacity block itself. Returns the nodes named there."""
    raw_nodes, raw_blocks = data.get("nodes"), data.get("capacity_blocks")
    nodes = _mapping(raw_nodes, at(source, lines.get(id(raw_nodes))), "nodes")
    blocks = (
        {}
        if isinstance(raw_blocks, list)
        else _mapping(raw_blocks, at(source, lines.get(id(raw_blocks))), "capacity_blocks")
    )
    block_of: dict[str, str] = {}
    block_nvlink: dict[str, str | None] = {}
    for bid, body in blocks.items():
        where = at(source, lines.get(id(body)))
        body = _mapping(body, where, f"capacity block {bid!r}")
        block_nvlink[str(bid)] = _nvlink_attr(body, where, f"capacity block {bid!r}")
        for n in hosts(body.get("nodes") or [], where, budget):
            block_of[n] = str(bid)
    node_nvlink: dict[str, str] = {}
    for name, body in nodes.items():
        where = at(source, lines.get(id(body)))
        body = _mapping(body, where, f"node {name!r}")
        cb = body.get("capacity_block")
        if cb is not None:
            if str(name) in block_of and block_of[str(name)] != str(cb):
                raise fail(
                    where,
                    f"node {name!r} is in capacity block {cb!r} here but in "
                    f"{block_of[str(name)]!r} under capacity_blocks",
                )
            block_of[str(name)] = str(cb)
        nv = _nvlink_attr(body, where, f"node {name!r}")
        if nv:
            node_nvlink[str(name)] = nv
    named = {str(n) for n in nodes} | set(block_of)
    for n in named:
        dom = node_nvlink.get(n) or block_nvlink.get(block_of.get(n, "")) or block_of.get(n)
        if dom:
            tree.domains[n] = dom
    return named


def export_graph(topo: Topology) -> str:
    """topograph-style graph JSON: `tiers` (vertices from the top switches down to the nodes) and
    `domains` (NVLink domain -> nodes)."""
    root: dict = {"id": "", "vertices": {}}
    for node, (leaf, spine, core) in zip(topo.nodes, node_hierarchy(topo), strict=True):
        parent = root
        for tier, sw in (("core", core), ("spine", spine), ("leaf", leaf)):
            if sw is None:
                continue
            parent = parent["vertices"].setdefault(sw, {"id": sw, "name": tier, "vertices": {}})
        parent["vertices"][node.name] = {"id": node.name, "name": node.name}
    domains = {name: list(d.nodes) for name, d in topo.domains.items()}
    return json.dumps({"tiers": root, "domains": domains}, indent=2) + "\n"
