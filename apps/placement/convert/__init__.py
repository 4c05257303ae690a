"""Convert clusters between topology spec v1 and other tools' formats (Django-free).

`import_sources(fmt, sources, defaults)` reads one format into spec v1 (an `Imported`: the spec
and notes naming what came from defaults); `Imported.topology()` validates it with the spec v1
rules, errors naming the input's file and line. `export_topology(fmt, topology)` writes a
validated Topology in another format. Formats:

- `topology-v1`: spec v1 itself (YAML or JSON in, YAML out)
- `slurm-tree`, `slurm-block`: Slurm topology.conf; `slurm-yaml`: Slurm topology.yaml (each with
  optional slurm.conf / gres.conf files giving the nodes' GPUs)
- `nvidia-smi`: `nvidia-smi topo -m` matrices, one per node (import only)
- `nccl-xml`: NCCL topology XML, one per node (import only)
- `topograph`: NVIDIA topograph's model YAML in, its topology graph JSON out
- `kueue`: Kueue Topology and node label manifests out; node labels in
"""

from __future__ import annotations

import json
from collections.abc import Callable

import yaml

from ..topology import Topology, parse_spec_text, topology_to_spec
from . import kueue, nccl, nvsmi, slurm, topograph
from .base import Defaults, Imported, Source, check_size, check_text, fail, printable_source

# The C emitter when PyYAML was built with libyaml: much faster on large clusters.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _import_spec(sources: list[Source], defaults: Defaults) -> Imported:
    if len(sources) != 1:
        raise fail("input", f"topology-v1 takes one file, got {len(sources)}")
    check_size(sources[0])
    text = sources[0].text
    if text.lstrip().startswith("{"):
        # JSON needs no YAML parser: the stdlib's C decoder reads a 16,384-GPU spec in a fraction of a second.
        try:
            return Imported(json.loads(text), [])
        except json.JSONDecodeError as exc:
            raise fail(f"{sources[0].name}:{exc.lineno}", f"not valid JSON: {exc.msg}") from None
    return Imported(parse_spec_text(text), [])


def _export_spec(topo: Topology) -> str:
    return yaml.dump(
        topology_to_spec(topo), Dumper=_DUMPER, sort_keys=False, default_flow_style=None, width=120
    )


IMPORTERS: dict[str, Callable[[list[Source], Defaults], Imported]] = {
    "topology-v1": _import_spec,
    "slurm-tree": slurm.import_tree,
    "slurm-block": slurm.import_block,
    "slurm-yaml": slurm.import_yaml,
    "nvidia-smi": nvsmi.import_matrices,
    "nccl-xml": nccl.import_xml,
    "topograph": topograph.import_model,
    "kueue": kueue.import_labels,
}
EXPORTERS: dict[str, Callable[[Topology], str]] = {
    "topology-v1": _export_spec,
    "slurm-tree": slurm.export_tree,
    "slurm-block": slurm.export_block,
    "slurm-yaml": slurm.export_yaml,
    "topograph": topograph.export_graph,
    "kueue": kueue.export_kueue,
}
# Formats that describe one node per file (a cluster is several files).
PER_NODE = ("nvidia-smi", "nccl-xml")
# What each export is, for HTTP responses and file names.
MEDIA_TYPES = {
    "topology-v1": ("application/yaml", "yaml"),
    "slurm-tree": ("text/plain", "conf"),
    "slurm-block": ("text/plain", "conf"),
    "slurm-yaml": ("application/yaml", "yaml"),
    "topograph": ("application/json", "json"),
    "kueue": ("application/yaml", "yaml"),
}


def import_sources(fmt: str, sources: list[Source], defaults: Defaults | None = None) -> Imported:
    """Read `sources` in format `fmt` into spec v1; SpecError naming the file and line."""
    if fmt not in IMPORTERS:
        raise fail("format", f"unknown input format {fmt!r}; one of {', '.join(IMPORTERS)}")
    sources = [printable_source(s) for s in sources]
    for source in sources:
        check_size(source)
        check_text(source)
    return IMPORTERS[fmt](sources, defaults if defaults is not None else Defaults())


def export_topology(fmt: str, topology: Topology) -> str:
    """A validated topology written in format `fmt` (text)."""
    if fmt not in EXPORTERS:
        raise fail("format", f"unknown output format {fmt!r}; one of {', '.join(EXPORTERS)}")
    return EXPORTERS[fmt](topology)


__all__ = [
    "EXPORTERS",
    "IMPORTERS",
    "MEDIA_TYPES",
    "PER_NODE",
    "Defaults",
    "Imported",
    "Source",
    "export_topology",
    "import_sources",
]
