"""`load_topology`: validate a parsed spec v1 (full or `generate:` form) into a Topology."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .build import _build
from .checks import _check_keys, _count, _Errors, _name, _positive
from .generate import generate_spec
from .intra import load_intra
from .model import TIERS, GpuModel, Link, Nic, Node, SpecError, Switch, Topology


def load_topology(data: Any) -> Topology:
    """Validate a parsed spec v1 (full or `generate:` form) and build the Topology.

    Raises SpecError naming every offending entry and field.
    """
    errs = _Errors()
    if not isinstance(data, Mapping):
        raise SpecError([("", f"a topology spec must be a mapping, got {type(data).__name__}")])
    if "generate" in data:
        _check_keys(errs, "", data, {"version", "name", "generate"})
        _check_version(errs, data)
        errs.raise_if_any()
        data = generate_spec(_name(errs, "name", data["name"]), data["generate"])
    _check_keys(errs, "", data, {"version", "name", "gpu_models", "switches", "nodes"}, {"links"})
    errs.raise_if_any()
    _check_version(errs, data)
    name = _name(errs, "name", data["name"])

    gpu_models: dict[str, GpuModel] = {}
    if not isinstance(data["gpu_models"], Mapping):
        errs.add("gpu_models", "must be a mapping of model name to {peak_tflops}")
    else:
        for mname, m in data["gpu_models"].items():
            p = f"gpu_models.{mname}"
            if _check_keys(errs, p, m, {"peak_tflops"}):
                gpu_models[str(mname)] = GpuModel(
                    str(mname), _positive(errs, f"{p}.peak_tflops", m["peak_tflops"])
                )

    switches: list[Switch] = []
    tier_of: dict[str, str] = {}
    for i, s in enumerate(_list(errs, "switches", data["switches"])):
        p = f"switches[{i}]"
        if not _check_keys(errs, p, s, {"name", "tier"}):
            continue
        sname = _name(errs, f"{p}.name", s["name"])
        if not isinstance(s["tier"], str) or s["tier"] not in TIERS:
            errs.add(f"{p}.tier", f"must be one of {', '.join(TIERS)}, got {s['tier']!r}")
        if sname in tier_of:
            errs.add(f"{p}.name", f"duplicate switch name {sname!r}")
            continue
        tier_of[sname] = s["tier"]
        switches.append(Switch(sname, s["tier"]))

    links: list[Link] = []
    for i, lk in enumerate(_list(errs, "links", data.get("links") or [])):
        p = f"links[{i}]"
        if not _check_keys(errs, p, lk, {"a", "b", "bw_GBps", "latency_us"}):
            continue
        a, b = _name(errs, f"{p}.a", lk["a"]), _name(errs, f"{p}.b", lk["b"])
        for end, sw in (("a", a), ("b", b)):
            if sw not in tier_of:
                errs.add(f"{p}.{end}", f"unknown switch {sw!r}")
        if a == b:
            errs.add(f"{p}.b", "a link must join two different switches")
        elif tier_of.get(a) in TIERS and tier_of.get(b) in TIERS:
            ta, tb = TIERS.index(tier_of[a]), TIERS.index(tier_of[b])
            if abs(ta - tb) != 1:
                errs.add(
                    p, f"links join adjacent tiers (leaf-spine or spine-core), not {tier_of[a]}-{tier_of[b]}"
                )
        links.append(
            Link(
                a,
                b,
                _positive(errs, f"{p}.bw_GBps", lk["bw_GBps"]),
                _positive(errs, f"{p}.latency_us", lk["latency_us"]),
            )
        )

    nodes: list[Node] = []
    domains: dict[str, dict] = {}
    node_names: set[str] = set()
    for i, n in enumerate(_list(errs, "nodes", data["nodes"])):
        node = _load_node(errs, f"nodes[{i}]", n, gpu_models, tier_of, domains)
        if node is None:
            continue
        if node.name in node_names:
            errs.add(f"nodes[{i}].name", f"duplicate node name {node.name!r}")
            continue
        node_names.add(node.name)
        nodes.append(node)
    if not nodes and not errs.items:
        errs.add("nodes", "a cluster needs at least one node")
    errs.raise_if_any()
    return _build(name, gpu_models, switches, links, nodes, domains, errs)


def _check_version(errs: _Errors, data: Mapping) -> None:
    if data.get("version") != 1:
        errs.add("version", f"must be 1, got {data.get('version')!r}")


def _list(errs: _Errors, path: str, value: Any) -> list:
    if not isinstance(value, list):
        errs.add(path, f"must be a list, got {type(value).__name__}")
        return []
    return value


def _load_node(errs, p, n, gpu_models, tier_of, domains) -> Node | None:
    if not _check_keys(
        errs, p, n, {"name", "gpu_model", "gpus", "nvlink"}, {"nics", "dcgm_url", "standalone", "intra"}
    ):
        return None
    nname = _name(errs, f"{p}.name", n["name"])
    if not isinstance(n["gpu_model"], str) or n["gpu_model"] not in gpu_models:
        errs.add(f"{p}.gpu_model", f"unknown GPU model {n['gpu_model']!r}")
    gpus = _count(errs, f"{p}.gpus", n["gpus"])
    standalone = n.get("standalone", False)
    if not isinstance(standalone, bool):
        errs.add(f"{p}.standalone", "must be true or false")
        standalone = False
    dcgm = n.get("dcgm_url")
    if dcgm is not None and (not isinstance(dcgm, str) or not dcgm.startswith(("http://", "https://"))):
        errs.add(f"{p}.dcgm_url", f"must be an http(s) URL, got {dcgm!r}")
    nv = n["nvlink"]
    domain = nname
    if _check_keys(errs, f"{p}.nvlink", nv, {"domain", "bw_GBps", "latency_us"}):
        domain = _name(errs, f"{p}.nvlink.domain", nv["domain"])
        bw = _positive(errs, f"{p}.nvlink.bw_GBps", nv["bw_GBps"])
        lat = _positive(errs, f"{p}.nvlink.latency_us", nv["latency_us"])
        d = domains.setdefault(domain, {"bw": bw, "lat": lat, "nodes": []})
        if (d["bw"], d["lat"]) != (bw, lat):
            errs.add(
                f"{p}.nvlink",
                f"domain {domain!r} already has bw_GBps {d['bw']} and latency_us {d['lat']}; a domain's GPUs share one value",
            )
        d["nodes"].append(nname)
    nics: list[Nic] = []
    served: dict[int, str] = {}
    nic_names: set[str] = set()
    for k, c in enumerate(_list(errs, f"{p}.nics", n.get("nics") or [])):
        q = f"{p}.nics[{k}]"
        if not _check_keys(errs, q, c, {"name", "gpus", "leaf", "bw_GBps", "latency_us"}):
            continue
        cname = _name(errs, f"{q}.name", c["name"])
        if cname in nic_names:
            errs.add(f"{q}.name", f"duplicate NIC name {cname!r} on node {nname!r}")
        nic_names.add(cname)
        if not isinstance(c["leaf"], str) or tier_of.get(c["leaf"]) != "leaf":
            errs.add(f"{q}.leaf", f"unknown leaf switch {c['leaf']!r}")
        idx = c["gpus"]
        if not isinstance(idx, list) or not idx:
            errs.add(f"{q}.gpus", "must be a non-empty list of GPU indices")
            idx = []
        for g in idx:
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < gpus:
                errs.add(f"{q}.gpus", f"GPU index {g!r} is not on this node (0..{gpus - 1})")
            elif g in served:
                errs.add(f"{q}.gpus", f"GPU {g} is already served by NIC {served[g]!r}; one NIC per GPU")
            else:
                served[g] = cname
        nics.append(
            Nic(
                cname,
                tuple(int(g) for g in idx if isinstance(g, int)),
                c["leaf"],
                _positive(errs, f"{q}.bw_GBps", c["bw_GBps"]),
                _positive(errs, f"{q}.latency_us", c["latency_us"]),
            )
        )
    if not standalone:
        missing = [g for g in range(gpus) if g not in served]
        if missing:
            errs.add(
                f"{p}.nics",
                f"GPUs {missing} of node {nname!r} have no NIC (mark the node standalone: true if intended)",
            )
    elif nics:
        errs.add(f"{p}.standalone", "a standalone node has no NICs")
    intra = None
    if n.get("intra") is not None:
        intra = load_intra(errs, f"{p}.intra", n["intra"], gpus, [c.name for c in nics])
    return Node(
        nname,
        str(n["gpu_model"]),
        gpus,
        domain,
        tuple(nics),
        dcgm if isinstance(dcgm, str) else None,
        standalone,
        intra,
    )
