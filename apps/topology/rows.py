"""Translation between topology rows and spec v1: the only module that knows both shapes.

`create_rows` writes a validated `Topology` as rows with bulk inserts; `rows_to_spec` reads a
cluster's rows back into the full spec form (in stored order) plus the problems that spec v1 cannot
express (a node split across NVLink domains, gaps in GPU indices, a GPU on another node's NIC).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from apps.placement.topology import SpecError, Topology

from .models import (
    NAME_MAX_LENGTH,
    URL_MAX_LENGTH,
    Cluster,
    Gpu,
    GpuModel,
    Link,
    Nic,
    Node,
    NvlinkDomain,
    Switch,
)

# Gpu.index is a PositiveSmallIntegerField.
MAX_GPU_INDEX = 32767


def check_storable(topo: Topology) -> None:
    """Raise SpecError for values a valid spec may hold but the columns cannot (name lengths)."""
    problems: list[tuple[str, str]] = []

    def name(path: str, value: str, limit: int = NAME_MAX_LENGTH) -> None:
        if len(value) > limit:
            problems.append((path, f"is {len(value)} characters long, at most {limit} are stored"))

    name("name", topo.name)
    for model in topo.gpu_models:
        name(f"gpu_models.{model}", model)
    for i, switch in enumerate(topo.switches):
        name(f"switches[{i}].name", switch.name)
    seen_domains: set[str] = set()
    for i, node in enumerate(topo.nodes):
        name(f"nodes[{i}].name", node.name)
        if node.dcgm_url:
            name(f"nodes[{i}].dcgm_url", node.dcgm_url, URL_MAX_LENGTH)
        if node.gpus - 1 > MAX_GPU_INDEX:
            problems.append((f"nodes[{i}].gpus", f"at most {MAX_GPU_INDEX + 1} GPUs per node are stored"))
        if node.domain not in seen_domains:
            seen_domains.add(node.domain)
            name(f"nodes[{i}].nvlink.domain", node.domain)
        for k, nic in enumerate(node.nics):
            name(f"nodes[{i}].nics[{k}].name", nic.name)
    if problems:
        raise SpecError(problems)


def create_rows(*, cluster: Cluster, topo: Topology) -> None:
    """Insert every row of `topo` under `cluster` (which must have none) with bulk inserts."""
    models = GpuModel.objects.bulk_create(
        [
            GpuModel(cluster=cluster, name=m.name, peak_tflops=m.peak_tflops, speed=m.speed)
            for m in topo.gpu_models.values()
        ]
    )
    model_id = {m.name: m.pk for m in models}
    switches = Switch.objects.bulk_create(
        [Switch(cluster=cluster, name=s.name, tier=s.tier, position=i) for i, s in enumerate(topo.switches)]
    )
    switch_id = {s.name: s.pk for s in switches}
    Link.objects.bulk_create(
        [
            Link(
                cluster=cluster,
                a_id=switch_id[lk.a],
                b_id=switch_id[lk.b],
                bw_GBps=lk.bw_GBps,
                latency_us=lk.latency_us,
                position=i,
            )
            for i, lk in enumerate(topo.links)
        ]
    )
    domains = NvlinkDomain.objects.bulk_create(
        [
            NvlinkDomain(
                cluster=cluster, name=d.name, bw_GBps=d.bw_GBps, latency_us=d.latency_us, nvls=d.nvls
            )
            for d in topo.domains.values()
        ]
    )
    domain_id = {d.name: d.pk for d in domains}
    nodes = Node.objects.bulk_create(
        [
            Node(
                cluster=cluster,
                name=n.name,
                gpu_model_id=model_id[n.gpu_model],
                leaf_id=switch_id[n.nics[0].leaf] if n.nics else None,
                dcgm_url=n.dcgm_url or "",
                standalone=n.standalone,
                position=i,
                intra=n.intra.to_spec() if n.intra is not None else None,
            )
            for i, n in enumerate(topo.nodes)
        ]
    )
    nics = Nic.objects.bulk_create(
        [
            Nic(
                node_id=row.pk,
                name=c.name,
                leaf_id=switch_id[c.leaf],
                bw_GBps=c.bw_GBps,
                latency_us=c.latency_us,
            )
            for row, n in zip(nodes, topo.nodes, strict=True)
            for c in n.nics
        ]
    )
    gpus: list[Gpu] = []
    nic_rows = iter(nics)
    for row, n in zip(nodes, topo.nodes, strict=True):
        nic_of: dict[int, int] = {}
        for c in n.nics:
            nic_pk = next(nic_rows).pk
            for index in c.gpus:
                nic_of[index] = nic_pk
        dom = domain_id[n.domain]
        gpus.extend(Gpu(node_id=row.pk, index=i, domain_id=dom, nic_id=nic_of.get(i)) for i in range(n.gpus))
    Gpu.objects.bulk_create(gpus)


def delete_rows(*, cluster: Cluster) -> None:
    """Delete every row under `cluster` (not the cluster itself), dependents first."""
    Gpu.objects.filter(node__cluster=cluster).delete()
    Nic.objects.filter(node__cluster=cluster).delete()
    Node.objects.filter(cluster=cluster).delete()
    NvlinkDomain.objects.filter(cluster=cluster).delete()
    GpuModel.objects.filter(cluster=cluster).delete()
    Link.objects.filter(cluster=cluster).delete()
    Switch.objects.filter(cluster=cluster).delete()


def rows_to_spec(*, cluster: Cluster) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The cluster's rows as a full spec v1 dict (not yet validated) and the row-level problems
    found on the way, as (spec field path, message) pairs."""
    problems: list[tuple[str, str]] = []
    models = dict(GpuModel.objects.filter(cluster=cluster).order_by("id").values_list("id", "name"))
    peaks = (
        GpuModel.objects.filter(cluster=cluster).order_by("id").values_list("name", "peak_tflops", "speed")
    )
    switch_rows = list(
        Switch.objects.filter(cluster=cluster).order_by("position", "id").values_list("id", "name", "tier")
    )
    switch_name = {pk: name for pk, name, _ in switch_rows}
    links = []
    link_rows = Link.objects.filter(cluster=cluster).order_by("position", "id")
    for i, (a, b, bw, lat) in enumerate(link_rows.values_list("a_id", "b_id", "bw_GBps", "latency_us")):
        for end, pk in (("a", a), ("b", b)):
            if pk not in switch_name:
                problems.append((f"links[{i}].{end}", "the switch belongs to another cluster"))
        links.append(
            {
                "a": switch_name.get(a, f"#{a}"),
                "b": switch_name.get(b, f"#{b}"),
                "bw_GBps": bw,
                "latency_us": lat,
            }
        )
    domains = {
        pk: (name, bw, lat, nvls)
        for pk, name, bw, lat, nvls in NvlinkDomain.objects.filter(cluster=cluster).values_list(
            "id", "name", "bw_GBps", "latency_us", "nvls"
        )
    }
    nics_by_node: dict[int, list[tuple]] = defaultdict(list)
    for row in (
        Nic.objects.filter(node__cluster=cluster)
        .order_by("id")
        .values_list("id", "node_id", "name", "leaf_id", "bw_GBps", "latency_us")
    ):
        nics_by_node[row[1]].append(row)
    gpus_by_node: dict[int, list[tuple]] = defaultdict(list)
    for row in (
        Gpu.objects.filter(node__cluster=cluster)
        .order_by("node_id", "index")
        .values_list("node_id", "index", "domain_id", "nic_id")
    ):
        gpus_by_node[row[0]].append(row)

    nodes = []
    node_rows = Node.objects.filter(cluster=cluster).order_by("position", "id")
    for i, (pk, name, model_id, leaf_id, dcgm_url, standalone, intra) in enumerate(
        node_rows.values_list("id", "name", "gpu_model_id", "leaf_id", "dcgm_url", "standalone", "intra")
    ):
        entry, node_problems = _node_entry(
            f"nodes[{i}]",
            name,
            models.get(model_id),
            leaf_id,
            dcgm_url,
            standalone,
            gpus_by_node.get(pk, []),
            nics_by_node.get(pk, []),
            domains,
            switch_name,
        )
        problems.extend(node_problems)
        if intra is not None:
            entry["intra"] = intra
        nodes.append(entry)
    spec = {
        "version": 1,
        "name": cluster.name,
        "gpu_models": {
            name: {"peak_tflops": peak} | ({} if speed is None else {"speed": speed})
            for name, peak, speed in peaks
        },
        "switches": [{"name": name, "tier": tier} for _, name, tier in switch_rows],
        "links": links,
        "nodes": nodes,
    }
    return spec, problems


def _node_entry(p, name, model, leaf_id, dcgm_url, standalone, gpus, nics, domains, switch_name):
    problems: list[tuple[str, str]] = []
    if model is None:
        problems.append((f"{p}.gpu_model", "the GPU model belongs to another cluster"))
    entry: dict[str, Any] = {"name": name, "gpu_model": model, "gpus": len(gpus)}
    indices = [g[1] for g in gpus]
    if not gpus:
        problems.append((f"{p}.gpus", f"node {name!r} has no GPUs"))
    elif indices != list(range(len(gpus))):
        problems.append((f"{p}.gpus", f"node {name!r} has GPU indices {indices}; they must run 0..n-1"))
    domain_ids = sorted({g[2] for g in gpus})
    if len(domain_ids) > 1:
        names = ", ".join(domains[d][0] for d in domain_ids if d in domains)
        problems.append(
            (f"{p}.nvlink", f"node {name!r} has GPUs in several NVLink domains ({names}); spec v1 needs one")
        )
    if domain_ids:
        if domain_ids[0] in domains:
            dname, bw, lat, nvls = domains[domain_ids[0]]
            entry["nvlink"] = {"domain": dname, "bw_GBps": bw, "latency_us": lat}
            if nvls is not None:
                entry["nvlink"]["nvls"] = nvls
        else:
            problems.append((f"{p}.nvlink.domain", "the NVLink domain belongs to another cluster"))
    if dcgm_url:
        entry["dcgm_url"] = dcgm_url
    if standalone:
        entry["standalone"] = True
    nic_gpus: dict[int, list[int]] = defaultdict(list)
    nic_ids = {c[0] for c in nics}
    for _, index, _, nic_id in gpus:
        if nic_id is None:
            continue
        if nic_id in nic_ids:
            nic_gpus[nic_id].append(index)
        else:
            problems.append((f"{p}.nics", f"GPU {index} of node {name!r} uses a NIC of another node"))
    if nics or not standalone:
        entry["nics"] = []
        for k, (nic_id, _, cname, nic_leaf, bw, lat) in enumerate(nics):
            if nic_leaf not in switch_name:
                problems.append((f"{p}.nics[{k}].leaf", "the leaf switch belongs to another cluster"))
            entry["nics"].append(
                {
                    "name": cname,
                    "gpus": nic_gpus.get(nic_id, []),
                    "leaf": switch_name.get(nic_leaf, f"#{nic_leaf}"),
                    "bw_GBps": bw,
                    "latency_us": lat,
                }
            )
    expected_leaf = nics[0][3] if nics else None
    if leaf_id != expected_leaf:
        want = switch_name.get(expected_leaf, "none") if expected_leaf else "none"
        problems.append(
            (
                f"{p}.leaf",
                f"node {name!r} is on leaf {switch_name.get(leaf_id, 'none')} but its first NIC is on {want}",
            )
        )
    return entry, problems
