"""Spec text and files: YAML/JSON parsing, reading a spec file, and `topology_to_spec`."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from .model import SpecError, Topology
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
        "gpu_models": {m.name: {"peak_tflops": m.peak_tflops} for m in topo.gpu_models.values()},
        "switches": [{"name": s.name, "tier": s.tier} for s in topo.switches],
        "links": [
            {"a": lk.a, "b": lk.b, "bw_GBps": lk.bw_GBps, "latency_us": lk.latency_us} for lk in topo.links
        ],
        "nodes": nodes,
    }


def load_topology_file(path: str) -> Topology:
    """Read a YAML or JSON spec file (YAML is a superset of JSON) and load it."""
    return load_topology(read_spec_file(path))


def read_spec_file(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return parse_spec_text(fh.read())


_FLOAT_RE = (
    r"^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)"
    r"|\.(?:nan|NaN|NAN))$"
)


@lru_cache(maxsize=1)
def _spec_yaml_loader():
    """A safe YAML loader that reads `1.2e9` as a float (YAML 1.2 / JSON), not as a string."""
    import yaml

    class SpecLoader(yaml.SafeLoader):
        pass

    SpecLoader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT_RE), list("-+0123456789."))
    return SpecLoader


def parse_spec_text(text: str) -> Any:
    """Parse YAML or JSON text; a syntax error becomes a SpecError."""
    import yaml

    try:
        return yaml.load(text, Loader=_spec_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SpecError([("", f"not valid YAML or JSON: {exc}")]) from exc
