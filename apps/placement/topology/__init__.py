"""Topology spec v1: load, validate and generate clusters, and the GPU-pair path model.

`load_topology(data)` takes a parsed spec (full or `generate:` form) and returns an immutable
`Topology`; `topology_to_spec(topo)` gives the full form back. GPUs are numbered 0..n_gpus-1
node by node in file order ("gid"); `Topology.path(g, h)` is O(1) after an O(GPUs) index.

Modules: `model` (constants, SpecError, the dataclasses, Topology and its path model), `checks`
(field checks the spec loaders share), `generate` (generate_spec), `validate` (load_topology),
`build` (the index arrays), `safeload` (bounded YAML/JSON text and files), `io`
(topology_to_spec and topology files).
"""

from .checks import _check_keys, _count, _Errors, _name, _positive
from .generate import generate_spec
from .io import load_topology_file, topology_to_spec
from .model import (
    LEVEL_RANK,
    LEVELS,
    SHAPES,
    TIERS,
    GpuModel,
    Link,
    Nic,
    Node,
    NvlinkDomain,
    Path,
    SpecError,
    Switch,
    Topology,
)
from .safeload import JOB_LIMITS, TOPOLOGY_LIMITS, SpecLimits, cut, parse_spec_text, read_spec_file, shorten
from .validate import load_topology

__all__ = [
    "JOB_LIMITS",
    "LEVELS",
    "LEVEL_RANK",
    "SHAPES",
    "TIERS",
    "TOPOLOGY_LIMITS",
    "GpuModel",
    "Link",
    "Nic",
    "Node",
    "NvlinkDomain",
    "Path",
    "SpecError",
    "SpecLimits",
    "Switch",
    "Topology",
    "cut",
    "generate_spec",
    "load_topology",
    "load_topology_file",
    "parse_spec_text",
    "read_spec_file",
    "shorten",
    "topology_to_spec",
    # Field checks the job spec loader (apps.placement.jobs) shares.
    "_Errors",
    "_check_keys",
    "_count",
    "_name",
    "_positive",
]
