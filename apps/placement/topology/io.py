"""Spec files and `topology_to_spec`; spec text is parsed by `safeload.parse_spec_text`."""

from __future__ import annotations

from typing import Any

from .model import Topology
from .safeload import read_spec_file
from .validate import load_topology


def topology_to_spec(topo: Topology) -> dict:
    """The full spec v1 form of a topology (what `load_topology` reads back identically)."""
    nodes = []
    for n in topo.nodes:
        d = topo.domains[n.domain]
        entry: dict[str, Any] = {
            "name": n.name,
            "gpu_model": n.gpu_model,
            "gpus": n.gpus,
            "nvlink": {"domain": d.name, "bw_GBps": d.bw_GBps, "latency_us": d.latency_us},
        }
        if d.nvls is not None:
            entry["nvlink"]["nvls"] = d.nvls
        if n.dcgm_url:
            entry["dcgm_url"] = n.dcgm_url
        if n.standalone:
            entry["standalone"] = True
        else:
            entry["nics"] = [
                {
                    "name": c.name,
                    "gpus": list(c.gpus),
                    "leaf": c.leaf,
                    "bw_GBps": c.bw_GBps,
                    "latency_us": c.latency_us,
                }
                for c in n.nics
            ]
        if n.intra is not None:
            entry["intra"] = n.intra.to_spec()
        nodes.append(entry)
    return {
        "version": 1,
        "name": topo.name,
        "gpu_models": {
            m.name: {"peak_tflops": m.peak_tflops} | ({} if m.speed is None else {"speed": m.speed})
            for m in topo.gpu_models.values()
        },
        "switches": [{"name": s.name, "tier": s.tier} for s in topo.switches],
        "links": [
            {"a": lk.a, "b": lk.b, "bw_GBps": lk.bw_GBps, "latency_us": lk.latency_us} for lk in topo.links
        ],
        "nodes": nodes,
    }


def load_topology_file(path: str) -> Topology:
    """Read a YAML or JSON spec file (YAML is a superset of JSON) and load it."""
    return load_topology(read_spec_file(path))
