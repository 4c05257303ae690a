"""GPUs per node from Slurm's own node descriptions, given beside a topology file: slurm.conf
`NodeName=gpu[001-064] ... Gres=gpu:h100:8` lines and gres.conf `NodeName=... Name=gpu
File=/dev/nvidia[0-7]` (or `Count=8`) lines. A slurm.conf node without a gpu Gres has no GPUs."""

from __future__ import annotations

import re

from ..topology.ranges import GPU_MODEL_RE
from .base import NameBudget, Source, at, check_size, fail, hosts
from .hardware import gres_kind
from .hostlist import HostlistError, expand
from .tree import SwitchTree

_NODE_LINE = re.compile(r"^\s*nodename\s*=", re.IGNORECASE)
_TOPOLOGY_LINE = re.compile(r"^\s*(switchname|blockname|blocksizes|ringname)\s*=", re.IGNORECASE)
# One GPU entry of a Gres value: gpu[:type]:count[(S:0-1)] or gpu[:type] (count 1); in
# "gpu:8" the 8 is the count (a type never is all digits, as Slurm reads it).
_GRES_GPU = re.compile(r"^gpu(?::(?!\d+(?:\(|$))([A-Za-z0-9_.-]+))?(?::(\d+))?(?:\([^)]*\))?$", re.IGNORECASE)
MAX_NODE_GPUS = 1024


def conf_lines(source: Source):
    """(first line number, text) of each statement of a Slurm config file: comments dropped,
    `\\` continuation lines joined, blank statements skipped."""
    check_size(source)
    pending, start = "", 0
    for no, raw in enumerate(source.text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = no
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip():
            yield start, line
    if pending.strip():
        yield start, pending


def is_node_info(source: Source) -> bool:
    """Whether a file describes nodes (slurm.conf, gres.conf) rather than the topology."""
    lines = [ln.split("#", 1)[0] for ln in source.text.splitlines()]
    return any(_NODE_LINE.match(ln) for ln in lines) and not any(_TOPOLOGY_LINE.match(ln) for ln in lines)


def split_sources(sources: list[Source], fmt: str) -> tuple[Source, list[Source]]:
    """(the topology file, the node description files) of a Slurm import."""
    node_files = [s for s in sources if is_node_info(s)]
    topology = [s for s in sources if s not in node_files]
    if len(topology) != 1:
        names = ", ".join(s.name for s in topology) or "none"
        raise fail("input", f"{fmt} takes one topology file (and slurm.conf/gres.conf files); got {names}")
    return topology[0], node_files


def _pairs(line: str, where: str) -> list[tuple[str, str]]:
    out = []
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out.append((key.lower(), value.strip('"')))
    return out


def _gres_model(value: str) -> str | None:
    """The GPU model a Gres value's typed gpu entries name: a known type's SXM model (`gpu:h100:8`
    -> H100-SXM5-80GB), any other type as it is (`gpu:l40s:8` -> l40s, so a job's `gpu_models`
    can ask for it as Slurm's `--gpus=l40s:8` does); None when untyped or of more than one model."""
    kinds = set()
    for item in re.split(r",(?![^(]*\))", value):
        m = _GRES_GPU.match(item.strip())
        if m:
            gres_type = m.group(1) or ""
            kind = gres_kind(gres_type)
            kinds.add(kind.model if kind else gres_type if GPU_MODEL_RE.match(gres_type) else None)
    return kinds.pop() if len(kinds) == 1 else None


def _gres_gpus(value: str, where: str) -> int:
    total = 0
    for item in re.split(r",(?![^(]*\))", value):
        m = _GRES_GPU.match(item.strip())
        if m:
            total += int(m.group(2) or 1)
    if total > MAX_NODE_GPUS:
        raise fail(where, f"Gres={value!r} gives {total} GPUs; at most {MAX_NODE_GPUS} per node")
    return total


def _file_count(value: str, where: str, budget: NameBudget) -> int:
    try:
        return len(budget.spend(expand(value), where))
    except HostlistError as exc:
        raise fail(where, f"File={value!r}: {exc}") from None


def read_node_info(sources: list[Source], tree: SwitchTree) -> None:
    """GPUs per node from slurm.conf and gres.conf lines into `tree.node_gpus` (0: no GPUs)."""
    for source in sources:
        budget = NameBudget()
        slurm_conf: dict[str, int] = {}
        gres_conf: dict[str, int] = {}
        default_gres = ""
        unattributed = 0
        for start, line in conf_lines(source):
            where = at(source, start)
            pairs = _pairs(line, where)
            fields = dict(pairs)
            if "nodename" not in fields:
                if fields.get("name", "").lower() == "gpu":
                    unattributed += 1  # a gres.conf line for the node that reads it
                continue
            names_raw = fields["nodename"]
            if names_raw.upper() == "DEFAULT":
                default_gres = fields.get("gres", default_gres)
                continue
            names = hosts(names_raw, where, budget)
            if "name" in fields:  # gres.conf
                if fields["name"].lower() != "gpu":
                    continue
                if "count" in fields:
                    if not fields["count"].isdigit() or not 0 < int(fields["count"]) <= MAX_NODE_GPUS:
                        raise fail(where, f"Count must be 1..{MAX_NODE_GPUS}, got {fields['count']!r}")
                    count = int(fields["count"])
                elif "file" in fields:
                    count = _file_count(fields["file"], where, budget)
                else:
                    count = 1
                for n in names:
                    gres_conf[n] = gres_conf.get(n, 0) + count
                    if gres_conf[n] > MAX_NODE_GPUS:
                        raise fail(where, f"node {n!r} has more than {MAX_NODE_GPUS} GPUs")
            else:  # slurm.conf
                gres = fields.get("gres", default_gres)
                count = _gres_gpus(gres, where)
                model = _gres_model(gres)
                for n in names:
                    slurm_conf[n] = count
                    if model:
                        tree.node_model[n] = model
        # gres.conf counts the devices; slurm.conf says which nodes have none.
        tree.node_gpus.update(slurm_conf)
        tree.node_gpus.update(gres_conf)
        tree.described = tree.described or bool(slurm_conf or gres_conf)
        described = len(set(slurm_conf) | set(gres_conf))
        with_gpus = sum(1 for n in set(slurm_conf) | set(gres_conf) if tree.node_gpus[n] > 0)
        tree.notes.append(f"{source.name}: GPUs of {described} nodes ({with_gpus} with GPUs)")
        if unattributed:
            tree.notes.append(
                f"{source.name}: {unattributed} gpu lines without NodeName= describe the node that "
                "reads the file and were not used"
            )
