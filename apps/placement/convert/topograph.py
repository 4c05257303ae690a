"""NVIDIA topograph: its cluster model YAML in (`switches:` tree, `blocks:` of nodes with NVLink
domain annotations); its topology graph JSON out (a tree of switch vertices down to nodes, and the
NVLink domains)."""

from __future__ import annotations

import json

from ..topology import Topology
from .base import Defaults, Imported, Source, at, fail, hosts, yaml_documents
from .tree import SwitchTree, TreeSwitch, node_hierarchy, tree_to_spec

_DOMAIN_KEYS = ("/accelerator", "/domain")


def import_model(sources: list[Source], defaults: Defaults) -> Imported:
    """topograph: one model YAML (`switches` mapping, `blocks` list)."""
    if len(sources) != 1:
        raise fail("input", f"topograph takes one model file, got {len(sources)}")
    source = sources[0]
    docs = yaml_documents(source)
    if len(docs) != 1 or not isinstance(docs[0][0], dict):
        raise fail(source.name, "a topograph model is one mapping with switches and blocks")
    data, lines = docs[0]
    unknown = set(data) - {"switches", "blocks", "nodes", "capacity_blocks"}
    if unknown:
        raise fail(source.name, f"unknown top-level field(s) {', '.join(sorted(map(str, unknown)))}")
    tree = SwitchTree()
    switches = data.get("switches") or {}
    if not isinstance(switches, dict):
        raise fail(
            at(source, lines.get(id(switches))), "switches must be a mapping of name to {switches, labels}"
        )
    for name, body in switches.items():
        where = at(source, lines.get(id(body)))
        if not isinstance(body, dict):
            raise fail(where, f"switch {name!r} must be a mapping")
        children = body.get("switches") or []
        if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
            raise fail(where, f"switch {name!r}: switches must be a list of names")
        tree.add(TreeSwitch(str(name), where, list(children)))
    blocks = data.get("blocks", data.get("capacity_blocks")) or []
    if not isinstance(blocks, list) or not blocks:
        raise fail(source.name, "a model needs a list of blocks with nodes")
    for block in blocks:
        where = at(source, lines.get(id(block)))
        if not isinstance(block, dict) or not isinstance(block.get("switch"), str):
            raise fail(where, "each block needs `switch:` and `nodes:`")
        names = hosts(block.get("nodes") or [], where)
        if not names:
            raise fail(where, f"block on switch {block['switch']!r} has no nodes")
        sw = tree.switches.get(block["switch"])
        if sw is None:
            tree.add(TreeSwitch(block["switch"], where, [], names))
        elif sw.children:
            raise fail(where, f"switch {sw.name!r} has switches below it and cannot also hold nodes")
        else:
            sw.nodes.extend(names)
        notes = block.get("annotations") or block.get("labels") or {}
        domain = (
            next((str(v) for k, v in notes.items() if str(k).endswith(_DOMAIN_KEYS)), None)
            if isinstance(notes, dict)
            else None
        )
        if domain:
            for n in names:
                tree.domains[n] = domain
    # Children named but never described are empty racks.
    for sw in list(tree.switches.values()):
        for c in sw.children:
            if c not in tree.switches:
                tree.switches[c] = TreeSwitch(c, sw.where)
    n_dom = len(set(tree.domains.values()))
    if n_dom:
        tree.notes.append(f"{n_dom} NVLink domains from the blocks' domain annotations")
    return tree_to_spec(tree, defaults)


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
