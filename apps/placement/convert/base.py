"""What every converter shares: input sources, import defaults, errors with file line numbers,
YAML with line numbers, and the converted cluster (`Imported`). The switch tree of the
tree-shaped formats is in `tree.py`."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..topology import SpecError, Topology, load_topology
from .hostlist import HostlistError, expand

# One input file may be at most this large: a 16,384-GPU cluster's spec is a few MiB.
MAX_SOURCE_BYTES = 32 * 1024 * 1024
MAX_YAML_DEPTH = 64
# A converted cluster has at most this many nodes (the largest benchmarked cluster has 12,800).
MAX_NODES = 100_000


@dataclass(frozen=True)
class Source:
    """One input file: a name for messages (the file name) and its text."""

    name: str
    text: str
    node: str = ""  # the node a per-node file describes, when given as NAME=path


def fail(where: str, message: str) -> SpecError:
    """A SpecError for one problem at `where` (`file:line` or a field path)."""
    return SpecError([(where, message)])


def at(source: Source, line: int | None) -> str:
    return f"{source.name}:{line}" if line else source.name


def check_size(source: Source) -> None:
    if len(source.text) > MAX_SOURCE_BYTES:
        raise fail(source.name, f"is larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB")


_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with lone surrogates escaped, safe to encode as UTF-8 in a message."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_text(source: Source) -> None:
    """Refuse a source whose node name or text holds a lone surrogate (no UTF-8 encoding exists
    for it: it comes from a JSON escape or an undecodable file name, never from UTF-8 text)."""
    if _SURROGATE.search(source.node):
        raise fail(printable(source.node), "the node name is not valid Unicode (a lone surrogate)")
    m = _SURROGATE.search(source.text)
    if m:
        line = source.text.count("\n", 0, m.start()) + 1
        col = m.start() - (source.text.rfind("\n", 0, m.start()) + 1) + 1
        raise fail(at(source, line), f"column {col}: not valid Unicode text (a lone surrogate)")


def printable_source(source: Source) -> Source:
    """The source with its file name safe to print (an undecodable file name's surrogates
    escaped): messages name the file, and the name of a per-node file's node comes from it."""
    name = printable(source.name)
    return source if name == source.name else Source(name, source.text, source.node)


def assumed(notes: list[str], defaults: Defaults, key: str, what: str, count: int, of: str) -> None:
    """A note that a default shaped `count` items (`what` with `{}` for the value), unless the
    operator gave the value: "1 NIC per node assumed (nics_per_node): 32 nodes"."""
    if count and key not in defaults.given:
        value = getattr(defaults, key)
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        notes.append(f"{what.format(shown)} assumed ({key}, not in the input): {count} {of}")


# ---- import defaults -------------------------------------------------------------------------


@dataclass
class Defaults:
    """What a foreign format may lack, with units in the names; `used` records what an import
    took from here so that it can say so."""

    name: str = "imported"
    gpus_per_node: int = 8
    gpu_model: str = "H100-SXM5-80GB"
    peak_tflops: float = 989.0
    nvlink_bw_GBps: float = 450.0
    nvlink_latency_us: float = 2.0
    nvlink_link_GBps: float = 25.0
    pcie_bw_GBps: float = 25.0
    pcie_latency_us: float = 5.0
    nics_per_node: int = 1
    nic_bw_GBps: float = 50.0
    nic_latency_us: float = 1.5
    uplink_bw_GBps: float = 400.0
    uplink_latency_us: float = 1.0
    link_speed_unit_GBps: float = 0.0
    blocks_are_nvlink_domains: bool = True
    rails: bool = True
    topology: str = ""
    nics: str = ""  # comma-separated shell patterns of the NICs that are fabric rails
    given: set[str] = field(default_factory=set, repr=False)
    used: set[str] = field(default_factory=set, repr=False)
    # Per-node counts from `gpus[HOSTLIST]=N` and `nics[HOSTLIST]=N`: node -> count.
    host_gpus: dict[str, int] = field(default_factory=dict, repr=False)
    host_nics: dict[str, int] = field(default_factory=dict, repr=False)

    def take(self, key: str) -> Any:
        """The value of `key`, remembered as used."""
        self.used.add(key)
        return getattr(self, key)

    def note(self) -> str | None:
        """One line naming the defaults an import used (given ones marked as such)."""
        keys = sorted(self.used)
        if not keys:
            return None
        parts = [f"{k}={getattr(self, k)}{'' if k in self.given else ' (default)'}" for k in keys]
        return "values not in the input: " + ", ".join(parts)

    @classmethod
    def fields(cls) -> dict[str, type]:
        return {
            f.name: f.type
            for f in dataclasses.fields(cls)
            if f.name not in ("given", "used", "host_gpus", "host_nics")
        }

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "defaults") -> Defaults:
        """Defaults with `values` (from a side file or `--set key=value`) applied; SpecError
        naming an unknown key or a value out of range."""
        d = cls()
        d.update(values, where)
        return d

    def update(self, values: Mapping[str, Any], where: str = "defaults") -> None:
        types = self.fields()
        errors = []
        for key, raw in values.items():
            per_host = _PER_HOST.match(str(key))
            if per_host:
                try:
                    self._per_host(per_host.group(1), per_host.group(2), raw)
                except ValueError as exc:
                    errors.append((f"{where}.{printable(str(key))}", str(exc)))
                continue
            if key not in types:
                errors.append((f"{where}.{key}", f"unknown default; one of {', '.join(sorted(types))}"))
                continue
            try:
                value = _coerce(types[key], raw)
            except ValueError as exc:
                errors.append((f"{where}.{key}", str(exc)))
                continue
            setattr(self, key, value)
            self.given.add(key)
        if errors:
            raise SpecError(errors)

    def _per_host(self, kind: str, hostlist: str, raw: Any) -> None:
        top = 1024 if kind.startswith("gpus") else 64
        if isinstance(raw, bool) or not str(raw).strip().isdigit() or not 0 <= int(str(raw)) <= top:
            raise ValueError(f"must be a whole number in 0..{top}, got {raw!r}")
        try:
            names = expand(hostlist)
        except HostlistError as exc:
            raise ValueError(f"bad hostlist: {exc}") from None
        target = self.host_gpus if kind.startswith("gpus") else self.host_nics
        for n in names:
            target[n] = int(str(raw))


# `gpus[gpu[001-064]]=8`: a count for the nodes of a hostlist.
_PER_HOST = re.compile(r"^(gpus|nics|gpus_per_node|nics_per_node)\[(.+)\]$")


def _coerce(kind: str, raw: Any) -> Any:
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"must be true or false, got {raw!r}")
    if kind == "str":
        if not isinstance(raw, str | int) or isinstance(raw, bool) or len(str(raw)) > 128:
            raise ValueError(f"must be a short text, got {raw!r}")
        return str(raw)
    try:
        value = float(raw) if kind == "float" else int(str(raw))
    except (TypeError, ValueError):
        raise ValueError(
            f"must be a {'number' if kind == 'float' else 'whole number'}, got {raw!r}"
        ) from None
    if isinstance(raw, bool) or not math.isfinite(value) or value < 0 or value > 1e7:
        raise ValueError(f"must be a number in 0..1e7, got {raw!r}")
    return value


# ---- YAML with line numbers -----------------------------------------------------------------


def yaml_documents(source: Source) -> list[tuple[Any, dict[int, int]]]:
    """Each YAML document of a source as (plain data, {id(container): line}); aliases are refused
    (a hostile file cannot multiply itself) and nesting is bounded."""
    check_size(source)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        for event in yaml.parse(source.text, Loader=loader):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark else None
                raise fail(at(source, line), "YAML aliases are not accepted")
        docs = list(yaml.compose_all(source.text, Loader=loader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise fail(at(source, line), f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    out = []
    for node in docs:
        if node is None:
            continue
        lines: dict[int, int] = {}
        out.append((_plain(node, lines, source, 0), lines))
    return out


def _plain(node: yaml.Node, lines: dict[int, int], source: Source, depth: int) -> Any:
    if depth > MAX_YAML_DEPTH:
        raise fail(at(source, node.start_mark.line + 1), f"nested deeper than {MAX_YAML_DEPTH} levels")
    if isinstance(node, yaml.MappingNode):
        obj: Any = {}
        for k, v in node.value:
            key = _plain(k, lines, source, depth + 1)
            if isinstance(key, dict | list):
                raise fail(at(source, k.start_mark.line + 1), "a mapping key must be plain text")
            obj[key] = _plain(v, lines, source, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        obj = [_plain(v, lines, source, depth + 1) for v in node.value]
    else:
        return _SCALAR_LOADER.construct_object(node, deep=True)
    lines[id(obj)] = node.start_mark.line + 1
    return obj


# Builds plain scalars (int, float, bool, text) from composed nodes, with the safe resolver's types.
_SCALAR_LOADER = yaml.SafeLoader("")


# Names one input file may expand to in all, repeats included: many lines of large hostlists must
# not add up to an unbounded amount of work. A gres.conf with a line per GPU of the largest
# cluster (32,768 nodes of 8) names 262,144.
MAX_EXPANDED_NAMES = 4 * MAX_NODES


class NameBudget:
    """Counts the names a file's hostlists expand to; SpecError past MAX_EXPANDED_NAMES."""

    def __init__(self, limit: int = MAX_EXPANDED_NAMES) -> None:
        self.limit = self.left = limit

    def spend(self, names: list[str], where: str) -> list[str]:
        self.left -= len(names)
        if self.left < 0:
            raise fail(where, f"the file's hostlists name more than {self.limit} nodes in all")
        return names


def hosts(value: Any, where: str, budget: NameBudget | None = None) -> list[str]:
    """Expand a hostlist (or a list of hostlists) found at `where`, within `budget` if given."""
    items = value if isinstance(value, list) else [value]
    names: list[str] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str):
            raise fail(where, f"a hostlist must be text, got {item!r}")
        try:
            names.extend(expand(item))
        except HostlistError as exc:
            raise fail(where, str(exc)) from None
    return budget.spend(names, where) if budget is not None else names


# ---- a converted cluster ---------------------------------------------------------------------


@dataclass
class Imported:
    """A converted cluster: spec v1 (full form) and what the import wants the operator to know."""

    spec: dict
    notes: list[str]
    origins: dict[str, str] = field(default_factory=dict, repr=False)

    def topology(self) -> Topology:
        """Validate with the spec v1 rules; errors name the input's file and line."""
        try:
            return load_topology(self.spec)
        except SpecError as exc:
            raise SpecError([(self._where(path), msg) for path, msg in exc.errors]) from None

    def _where(self, path: str) -> str:
        best = ""
        for prefix in self.origins:
            if (path == prefix or path.startswith(prefix + ".")) and len(prefix) > len(best):
                best = prefix
        return f"{self.origins[best]} ({path})" if best else path


def cluster_spec(defaults, models, switches, links, nodes, notes, origins) -> Imported:
    """The Imported of a converted cluster; the last note names the defaults it used."""
    spec = {
        "version": 1,
        "name": defaults.take("name"),
        "gpu_models": {m: {"peak_tflops": p} for m, p in models.items()},
        "switches": switches,
        "links": links,
        "nodes": nodes,
    }
    note = defaults.note()
    if note:
        notes.append(note)
    return Imported(spec, notes, origins)
