"""Slurm topology: topology.conf (`slurm-tree`: SwitchName lines; `slurm-block`: BlockName and
BlockSizes lines) and topology.yaml (`slurm-yaml`: several tree, block and flat topologies)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..topology import Topology
from .base import Defaults, Imported, NameBudget, Source, at, fail, hosts, yaml_documents
from .hostlist import compress
from .slurmnodes import conf_lines, read_node_info, split_sources
from .tree import SwitchTree, TreeSwitch, domain_groups, leaf_groups, tree_to_spec, uplinks

_KEYS = {
    "switchname": {"switches", "nodes", "linkspeed"},
    "blockname": {"nodes"},
    "blocksizes": set(),
    "ringname": {"nodes"},
}
_CANON = {"switches": "Switches", "nodes": "Nodes", "linkspeed": "LinkSpeed"}


@dataclass
class Statement:
    kind: str  # switchname | blockname | blocksizes | ringname
    name: str
    fields: dict[str, str]
    where: str


def parse_conf(source: Source) -> list[Statement]:
    """The statements of a topology.conf: comments dropped, `\\` continuation lines joined, keys
    case-insensitive; SpecError with the file's line number on anything else."""
    return [_statement(line, at(source, start)) for start, line in conf_lines(source)]


def _statement(line: str, where: str) -> Statement:
    pairs: list[tuple[str, str]] = []
    for token in line.split():
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise fail(where, f"expected Key=Value, got {token!r}")
        pairs.append((key.lower(), value))
    kind, name = pairs[0]
    if kind not in _KEYS:
        raise fail(
            where,
            f"unknown statement {pairs[0][0]!r}; expected SwitchName, BlockName, BlockSizes or RingName",
        )
    if not name:
        raise fail(where, f"{pairs[0][0]} needs a value")
    fields: dict[str, str] = {}
    for key, value in pairs[1:]:
        if key not in _KEYS[kind]:
            raise fail(where, f"unknown key {key!r} for {pairs[0][0]}")
        if key in fields:
            raise fail(where, f"{key!r} given twice")
        fields[key] = value
    return Statement(kind, name, fields, where)


def _link_speed(st: Statement) -> float | None:
    raw = st.fields.get("linkspeed")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise fail(st.where, f"LinkSpeed must be a number, got {raw!r}") from None
    if not 0 < value < 1e9:
        raise fail(st.where, f"LinkSpeed must be positive, got {raw!r}")
    return value


def _block_sizes(st: Statement) -> list[int]:
    sizes = []
    for item in st.name.split(","):
        if not item.strip().isdigit() or int(item) < 1:
            raise fail(st.where, f"BlockSizes must be positive whole numbers, got {st.name!r}")
        sizes.append(int(item))
    if sizes != sorted(set(sizes)):
        raise fail(st.where, f"BlockSizes must increase, got {st.name!r}")
    return sizes


def _tree_from_statements(statements: list[Statement], want: str, defaults: Defaults) -> SwitchTree:
    tree = SwitchTree()
    budget = NameBudget()
    sizes_at = None
    rings = 0
    for st in statements:
        if st.kind == "blocksizes":
            if want != "block":
                raise fail(st.where, "BlockSizes belongs to a block topology (--from slurm-block)")
            sizes_at = (st, _block_sizes(st))
            continue
        if st.kind == "switchname" and want != "tree":
            raise fail(st.where, "SwitchName belongs to a tree topology (--from slurm-tree)")
        if st.kind == "blockname" and want != "block":
            raise fail(st.where, "BlockName belongs to a block topology (--from slurm-block)")
        names = hosts(st.fields["nodes"], st.where, budget) if "nodes" in st.fields else []
        children = hosts(st.fields["switches"], st.where, budget) if "switches" in st.fields else []
        if st.kind != "switchname" and not names:
            raise fail(st.where, f"{st.kind} {st.name!r} needs Nodes=")
        if st.kind == "switchname" and not names and not children:
            raise fail(st.where, f"switch {st.name!r} needs Nodes= or Switches=")
        tree.add(TreeSwitch(st.name, st.where, children, names, _link_speed(st)))
        if st.kind == "ringname":
            rings += 1
        if st.kind == "blockname" and defaults.take("blocks_are_nvlink_domains"):
            for n in names:
                tree.domains[n] = st.name
    if not tree.switches:
        raise fail(statements[0].where if statements else "input", "no switches, blocks or rings")
    if rings:
        tree.notes.append(f"{rings} ring(s) imported as one leaf switch each; ring order is not modelled")
    if want == "block":
        as_domains = (
            "each an NVLink domain and a leaf" if defaults.blocks_are_nvlink_domains else "each a leaf"
        )
        tree.notes.append(f"{len(tree.switches)} blocks imported, {as_domains}")
        if sizes_at is not None:
            st, sizes = sizes_at
            small = min(len(s.nodes) for s in tree.switches.values())
            if sizes[0] > small:
                raise fail(
                    st.where,
                    f"the base block size {sizes[0]} is larger than the smallest block ({small} nodes)",
                )
            tree.notes.append(f"BlockSizes={st.name} noted; spec v1 has no block sizes")
    return tree


def import_tree(sources: list[Source], defaults: Defaults) -> Imported:
    """slurm-tree: one topology.conf with SwitchName lines (RingName lines become leaves), and
    optionally slurm.conf / gres.conf files giving each node's GPUs."""
    return _import_conf(sources, defaults, "tree")


def import_block(sources: list[Source], defaults: Defaults) -> Imported:
    """slurm-block: one topology.conf with BlockName (and BlockSizes) lines, and optionally
    slurm.conf / gres.conf files giving each node's GPUs."""
    return _import_conf(sources, defaults, "block")


def _import_conf(sources: list[Source], defaults: Defaults, want: str) -> Imported:
    topology, node_files = split_sources(sources, f"slurm-{want}")
    statements = parse_conf(topology)
    tree = _tree_from_statements(statements, want, defaults)
    _name_from_comments(topology, tree)
    read_node_info(node_files, tree)
    return tree_to_spec(tree, defaults)


# topograph writes the real switch or domain name above each line: `# switch.1.1=leaf-1-1`.
_NAME_COMMENT = re.compile(r"^\s*#\s*([A-Za-z0-9_.\[\]-]+)=([A-Za-z0-9][A-Za-z0-9._-]{0,99})\s*$")


def _name_from_comments(source: Source, tree: SwitchTree) -> None:
    """Rename switches and blocks to the names in topograph's comments, when they are unique."""
    names: dict[str, str] = {}
    for line in source.text.splitlines():
        m = _NAME_COMMENT.match(line)
        if m and m.group(1) in tree.switches:
            names[m.group(1)] = m.group(2)
    taken = set(tree.switches) - set(names)
    if not names or len(set(names.values())) != len(names) or taken & set(names.values()):
        return
    renamed: dict[str, TreeSwitch] = {}
    for name, sw in tree.switches.items():
        sw.name = names.get(name, name)
        sw.children = [names.get(c, c) for c in sw.children]
        renamed[sw.name] = sw
    tree.switches = renamed
    tree.domains = {n: names.get(d, d) for n, d in tree.domains.items()}
    tree.notes.append(f"{len(names)} switch and block names taken from the file's comments (topograph's)")


def import_yaml(sources: list[Source], defaults: Defaults) -> Imported:
    """slurm-yaml: topology.yaml, a list of topologies; imports the one named by the `topology`
    default, else the one holding the most GPU nodes (the cluster default on a tie); a block
    topology beside the imported tree gives the NVLink domains."""
    source, node_files = split_sources(sources, "slurm-yaml")
    tree = SwitchTree()
    read_node_info(node_files, tree)
    docs = yaml_documents(source)
    if len(docs) != 1 or not isinstance(docs[0][0], list) or not docs[0][0]:
        raise fail(source.name, "topology.yaml must be one non-empty list of topologies")
    data, lines = docs[0]
    found = []
    budget = NameBudget()
    for entry in data:
        where = at(source, lines.get(id(entry)))
        if not isinstance(entry, dict) or not isinstance(entry.get("topology"), str):
            raise fail(where, "each entry needs a `topology:` name")
        kinds = [k for k in ("tree", "block", "flat") if k in entry]
        unknown = set(entry) - {"topology", "cluster_default", "tree", "block", "flat", "nodes"}
        if len(kinds) != 1 or unknown:
            raise fail(where, f"topology {entry['topology']!r} needs exactly one of tree, block, flat")
        items = _yaml_items(entry, kinds[0], where, source, lines, budget)
        found.append((entry["topology"], kinds[0], where, items, entry.get("cluster_default") is True))
    listing = ", ".join(f"{name} ({kind})" for name, kind, *_ in found)
    gpu_nodes = {name: _gpu_nodes(items, tree, defaults) for name, _, _, items, _ in found}
    default = next((f for f in found if f[4]), found[0])
    wanted = defaults.topology
    if wanted:
        chosen = next((f for f in found if f[0] == wanted), None)
        if chosen is None:
            raise fail(source.name, f"no topology named {wanted!r}; have {listing}")
    else:
        usable = [f for f in found if f[1] != "flat"]
        if not usable:
            raise fail(default[2], f"every topology is flat ({listing}): none lists switches or nodes")
        best = max(gpu_nodes[f[0]] for f in usable)
        order = ([default] if default in usable else []) + usable
        chosen = next(f for f in order if gpu_nodes[f[0]] == best)
    name, kind, where, items, _ = chosen
    if kind == "flat":
        others = ", ".join(f"{f[0]} ({f[1]})" for f in found if f[1] != "flat") or "none"
        raise fail(where, f"topology {name!r} is flat: it lists no switches or nodes; the others: {others}")
    for sw_name, children, names, iw in items:
        tree.add(TreeSwitch(sw_name, iw, children, names))
        if kind == "block" and defaults.take("blocks_are_nvlink_domains"):
            for n in names:
                tree.domains[n] = sw_name
    tree.notes.append(f"topology.yaml holds {listing}; imported {name!r}")
    if not wanted and chosen is not default:
        why = "is flat" if default[1] == "flat" else f"holds {gpu_nodes[default[0]]} GPU nodes against {best}"
        tree.notes.append(
            f"warning: the cluster default topology {default[0]!r} is not the GPU fabric (it {why}); "
            f"imported {name!r}. Set topology={default[0]} to import the default"
        )
    if kind == "tree" and defaults.take("blocks_are_nvlink_domains"):
        _blocks_as_domains(found, tree)
    return tree_to_spec(tree, defaults)


def _yaml_items(entry: dict, kind: str, where: str, source: Source, lines: dict, budget: NameBudget) -> list:
    """(name, child switches, nodes, file:line) of each switch or block of one topology."""
    if kind == "flat":
        return []
    body = entry[kind]
    key = "switch" if kind == "tree" else "block"
    items = body.get("switches" if kind == "tree" else "blocks") if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        raise fail(where, f"{kind} of {entry['topology']!r} needs a list of {key}es")
    out = []
    for item in items:
        iw = at(source, lines.get(id(item)))
        if not isinstance(item, dict) or not isinstance(item.get(key), str):
            raise fail(iw, f"each entry needs `{key}:` with a name")
        extra = set(item) - {key, "children", "nodes"}
        if extra:
            raise fail(iw, f"unknown field(s) {', '.join(sorted(map(str, extra)))}")
        children = hosts(item["children"], iw, budget) if "children" in item else []
        names = hosts(item["nodes"], iw, budget) if "nodes" in item else []
        if not names and not children:
            raise fail(iw, f"{key} {item[key]!r} needs nodes or children")
        out.append((item[key], children, names, iw))
    return out


# Node names that say GPU when no slurm.conf or gpus[...] tells.
_GPU_NAME = re.compile(r"gpu|dgx|hgx|gb[23]00|[abh]100|h200|b200", re.IGNORECASE)


def _gpu_nodes(items: list, tree: SwitchTree, defaults: Defaults) -> int:
    """How many GPU nodes a topology holds on switches of GPU nodes only (a front-end Ethernet
    tree mixing CPU and GPU nodes scores less than the GPU fabric); a node has GPUs by the node
    descriptions given, else by its name."""
    known = {**tree.node_gpus, **defaults.host_gpus}

    def has_gpus(n: str) -> bool:
        return known[n] > 0 if n in known else (not known and bool(_GPU_NAME.search(n)))

    return sum(len(names) for _, _, names, _ in items if names and all(map(has_gpus, names)))


def _blocks_as_domains(found: list, tree: SwitchTree) -> None:
    """The first block topology's blocks become the NVLink domains of the imported tree's nodes."""
    blocks = [f for f in found if f[1] == "block"]
    if not blocks:
        return
    on_tree = {n for sw in tree.switches.values() for n in sw.nodes}
    name, _, _, items, _ = blocks[0]
    kept = 0
    for block, _, names, _ in items:
        members = [n for n in names if n in on_tree]
        kept += bool(members)
        for n in members:
            tree.domains.setdefault(n, block)
    tree.notes.append(f"block topology {name!r} kept as NVLink domains: {kept} blocks")


# ---- export ---------------------------------------------------------------------------------


def tree_levels(topo: Topology) -> list[tuple[str, str, list[str]]]:
    """(switch, "Nodes" | "Switches", members) for a Slurm tree: leaves that are some node's first
    leaf with their nodes, then spines and cores with the listed switches below them."""
    groups = leaf_groups(topo)
    ups = uplinks(topo)
    out = [(leaf, "Nodes", nodes) for leaf, nodes in groups.items()]
    listed = set(groups)
    for tier in ("spine", "core"):
        for s in topo.switches:
            if s.tier != tier:
                continue
            below = [c for c in ups[s.name] if c in listed]
            if below:
                out.append((s.name, "Switches", below))
        listed |= {name for name, kind, _ in out if kind == "Switches"}
    return out


def _header(topo: Topology, plugin: str) -> list[str]:
    return [f"# topology.conf ({plugin}) of cluster {topo.name}, written by TopoWeb from topology spec v1"]


def export_tree(topo: Topology) -> str:
    """topology.conf for topology/tree, hostlists compressed."""
    lines = _header(topo, "topology/tree")
    rails = sum(1 for s in topo.switches if s.tier == "leaf") - len(leaf_groups(topo))
    if rails > 0:
        lines.append(
            "# Each node is listed under the leaf of its first NIC (rail 0); its other rails' leaves are left out."
        )
    for name, kind, members in tree_levels(topo):
        lines.append(f"SwitchName={name} {kind}={compress(members)}")
    return "\n".join(lines) + "\n"


def blocks(topo: Topology) -> tuple[list[tuple[str, list[str]]], list[int], str]:
    """Slurm blocks: multi-node NVLink domains when there are any, else the leaves' node groups;
    with BlockSizes the base (smallest block) and its double and quadruple that fit."""
    domains = domain_groups(topo)
    if any(len(v) > 1 for v in domains.values()):
        out, basis = list(domains.items()), "NVLink domain"
    else:
        out, basis = list(leaf_groups(topo).items()), "leaf"
    base = min(len(v) for _, v in out)
    total = sum(len(v) for _, v in out)
    sizes = [base * k for k in (1, 2, 4) if base * k <= total]
    return out, sizes, basis


def _block_name(name: str) -> str:
    # Slurm names take no spaces, commas or brackets.
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def export_block(topo: Topology) -> str:
    """topology.conf for topology/block: one block per NVLink domain (or leaf), and BlockSizes."""
    out, sizes, basis = blocks(topo)
    lines = _header(topo, "topology/block") + [f"# one block per {basis}"]
    for name, nodes in out:
        lines.append(f"BlockName={_block_name(name)} Nodes={compress(nodes)}")
    lines.append("BlockSizes=" + ",".join(map(str, sizes)))
    return "\n".join(lines) + "\n"


def export_yaml(topo: Topology) -> str:
    """topology.yaml: the tree (cluster default), the blocks and a flat topology."""
    import yaml

    tree = []
    for name, kind, members in tree_levels(topo):
        tree.append({"switch": name, "nodes" if kind == "Nodes" else "children": compress(members)})
    out, sizes, _ = blocks(topo)
    data = [
        {"topology": "tree", "cluster_default": True, "tree": {"switches": tree}},
        {
            "topology": "block",
            "cluster_default": False,
            "block": {
                "block_sizes": sizes,
                "blocks": [{"block": _block_name(n), "nodes": compress(v)} for n, v in out],
            },
        },
        {"topology": "flat", "cluster_default": False, "flat": True},
    ]
    head = f"# topology.yaml of cluster {topo.name}, written by TopoWeb from topology spec v1\n"
    return head + yaml.safe_dump(data, sort_keys=False, width=120)
