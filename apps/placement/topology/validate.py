"""`load_topology`: validate a parsed spec v1 (full or `generate:` form) into a Topology."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .build import _build
from .checks import _bw, _check_keys, _count, _Errors, _key, _latency, _name, _positive
from .generate import generate_spec
from .intra import load_intra
from .model import TIERS, GpuModel, Link, Nic, Node, SpecError, Switch, Topology
from .ranges import (
    GPU_MODEL_HELP,
    GPU_MODEL_RE,
    MAX_CLUSTER_GPUS,
    MAX_GPU_MODELS,
    MAX_GPU_SPEED,
    MAX_LINKS,
    MAX_NODE_GPUS,
    MAX_NODE_NICS,
    MAX_NODES,
    MAX_PEAK_TFLOPS,
    MAX_SWITCHES,
    MAX_URL_CHARS,
    MIN_GPU_SPEED,
    MIN_PEAK_TFLOPS,
)
from .safeload import cut


def load_topology(data: Any) -> Topology:
    """Validate a parsed spec v1 (full or `generate:` form) and build the Topology.

    Raises SpecError naming every offending entry and field. Sizes (entries per list, GPUs in the
    cluster) are checked before anything is built; ranges are in `ranges`.
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
        errs.add("gpu_models", "must be a mapping of model name to {peak_tflops, speed?}")
    elif len(data["gpu_models"]) > MAX_GPU_MODELS:
        errs.add("gpu_models", f"holds {len(data['gpu_models'])} models; the limit is {MAX_GPU_MODELS}")
    else:
        for mname, m in data["gpu_models"].items():
            p = f"gpu_models.{_key(mname)}"
            mname = _name(errs, p, mname, pattern=GPU_MODEL_RE, help=GPU_MODEL_HELP)
            if _check_keys(errs, p, m, {"peak_tflops"}, {"speed"}):
                peak = _positive(
                    errs,
                    f"{p}.peak_tflops",
                    m["peak_tflops"],
                    minimum=MIN_PEAK_TFLOPS,
                    maximum=MAX_PEAK_TFLOPS,
                )
                speed = m.get("speed")
                if speed is not None:
                    speed = _positive(errs, f"{p}.speed", speed, minimum=MIN_GPU_SPEED, maximum=MAX_GPU_SPEED)
                gpu_models[mname] = GpuModel(mname, peak, speed)
        measured = [m for m in gpu_models.values() if m.speed is not None]
        if measured and len(measured) < len(gpu_models):
            unset = next(m.name for m in gpu_models.values() if m.speed is None)
            errs.add(
                f"gpu_models.{_key(unset)}.speed",
                "set on every GPU model or on none: speeds are compared with each other, not with peaks",
            )

    switches: list[Switch] = []
    tier_of: dict[str, str] = {}
    for i, s in enumerate(_list(errs, "switches", data["switches"], MAX_SWITCHES)):
        p = f"switches[{i}]"
        if not _check_keys(errs, p, s, {"name", "tier"}):
            continue
        sname = _name(errs, f"{p}.name", s["name"])
        if not isinstance(s["tier"], str) or s["tier"] not in TIERS:
            errs.add(f"{p}.tier", f"must be one of {', '.join(TIERS)}, got {cut(s['tier'])}")
        if sname in tier_of:
            errs.add(f"{p}.name", f"duplicate switch name {sname!r}")
            continue
        tier_of[sname] = s["tier"]
        switches.append(Switch(sname, s["tier"]))

    links: list[Link] = []
    for i, lk in enumerate(_list(errs, "links", data.get("links") or [], MAX_LINKS)):
        p = f"links[{i}]"
        if not _check_keys(errs, p, lk, {"a", "b", "bw_GBps", "latency_us"}):
            continue
        a, b = _name(errs, f"{p}.a", lk["a"]), _name(errs, f"{p}.b", lk["b"])
        for end, sw in (("a", a), ("b", b)):
            if sw not in tier_of:
                errs.add(f"{p}.{end}", f"unknown switch {cut(sw)}")
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
                _bw(errs, f"{p}.bw_GBps", lk["bw_GBps"]),
                _latency(errs, f"{p}.latency_us", lk["latency_us"]),
            )
        )

    nodes: list[Node] = []
    domains: dict[str, dict] = {}
    node_names: set[str] = set()
    node_list = _list(errs, "nodes", data["nodes"], MAX_NODES)
    if not _cluster_gpus_ok(errs, node_list):
        errs.raise_if_any()
    for i, n in enumerate(node_list):
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
        errs.add("version", f"must be 1, got {cut(data.get('version'))}")


def _list(errs: _Errors, path: str, value: Any, maximum: int) -> list:
    if not isinstance(value, list):
        errs.add(path, f"must be a list, got {type(value).__name__}")
        return []
    if len(value) > maximum:
        errs.add(path, f"holds {len(value)} entries; the limit is {maximum}")
        return []
    return value


def _cluster_gpus_ok(errs: _Errors, nodes: list) -> bool:
    """The cluster's GPU count against MAX_CLUSTER_GPUS, before any node is built."""
    total = 0
    for n in nodes:
        gpus = n.get("gpus") if isinstance(n, Mapping) else None
        if isinstance(gpus, int) and not isinstance(gpus, bool) and 0 < gpus <= MAX_NODE_GPUS:
            total += gpus
    if total > MAX_CLUSTER_GPUS:
        errs.add("nodes", f"the nodes hold {total} GPUs; the limit is {MAX_CLUSTER_GPUS} per cluster")
        return False
    return True


def _load_node(errs, p, n, gpu_models, tier_of, domains) -> Node | None:
    if not _check_keys(
        errs, p, n, {"name", "gpu_model", "gpus", "nvlink"}, {"nics", "dcgm_url", "standalone", "intra"}
    ):
        return None
    nname = _name(errs, f"{p}.name", n["name"])
    if not isinstance(n["gpu_model"], str) or n["gpu_model"] not in gpu_models:
        errs.add(f"{p}.gpu_model", f"unknown GPU model {cut(n['gpu_model'])}")
    gpus = _count(errs, f"{p}.gpus", n["gpus"], maximum=MAX_NODE_GPUS)
    standalone = n.get("standalone", False)
    if not isinstance(standalone, bool):
        errs.add(f"{p}.standalone", "must be true or false")
        standalone = False
    dcgm = n.get("dcgm_url")
    if dcgm is not None and (
        not isinstance(dcgm, str)
        or not dcgm.startswith(("http://", "https://"))
        or len(dcgm) > MAX_URL_CHARS
        or any(ch.isspace() or not ch.isprintable() for ch in dcgm)
    ):
        errs.add(
            f"{p}.dcgm_url",
            f"must be an http(s) URL of at most {MAX_URL_CHARS} characters without spaces, got {cut(dcgm)}",
        )
        dcgm = None
    nv = n["nvlink"]
    domain = nname
    if _check_keys(errs, f"{p}.nvlink", nv, {"domain", "bw_GBps", "latency_us"}, {"nvls"}):
        domain = _name(errs, f"{p}.nvlink.domain", nv["domain"])
        bw = _bw(errs, f"{p}.nvlink.bw_GBps", nv["bw_GBps"])
        lat = _latency(errs, f"{p}.nvlink.latency_us", nv["latency_us"])
        nvls = nv.get("nvls")
        if nvls is not None and not isinstance(nvls, bool):
            errs.add(f"{p}.nvlink.nvls", f"must be true or false, got {cut(nvls)}")
            nvls = None
        d = domains.setdefault(domain, {"bw": bw, "lat": lat, "nodes": [], "nvls": nvls})
        if (d["bw"], d["lat"]) != (bw, lat):
            errs.add(
                f"{p}.nvlink",
                f"domain {domain!r} already has bw_GBps {d['bw']} and latency_us {d['lat']}; a domain's GPUs share one value",
            )
        elif nvls is not None and d["nvls"] not in (None, nvls):
            errs.add(
                f"{p}.nvlink.nvls",
                f"domain {domain!r} already has nvls {d['nvls']}; a domain's nodes share one value",
            )
        elif nvls is not None:
            d["nvls"] = nvls
        d["nodes"].append(nname)
    nics: list[Nic] = []
    served: dict[int, str] = {}
    nic_names: set[str] = set()
    for k, c in enumerate(_list(errs, f"{p}.nics", n.get("nics") or [], MAX_NODE_NICS)):
        q = f"{p}.nics[{k}]"
        if not _check_keys(errs, q, c, {"name", "gpus", "leaf", "bw_GBps", "latency_us"}):
            continue
        cname = _name(errs, f"{q}.name", c["name"])
        if cname in nic_names:
            errs.add(f"{q}.name", f"duplicate NIC name {cname!r} on node {nname!r}")
        nic_names.add(cname)
        if not isinstance(c["leaf"], str) or tier_of.get(c["leaf"]) != "leaf":
            errs.add(f"{q}.leaf", f"unknown leaf switch {cut(c['leaf'])}")
        idx = c["gpus"]
        if not isinstance(idx, list) or not idx:
            errs.add(f"{q}.gpus", "must be a non-empty list of GPU indices")
            idx = []
        for g in idx:
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < gpus:
                errs.add(f"{q}.gpus", f"GPU index {cut(g)} is not on this node (0..{gpus - 1})")
            elif g in served:
                errs.add(f"{q}.gpus", f"GPU {g} is already served by NIC {served[g]!r}; one NIC per GPU")
            else:
                served[g] = cname
        nics.append(
            Nic(
                cname,
                tuple(int(g) for g in idx if isinstance(g, int)),
                c["leaf"],
                _bw(errs, f"{q}.bw_GBps", c["bw_GBps"]),
                _latency(errs, f"{q}.latency_us", c["latency_us"]),
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
