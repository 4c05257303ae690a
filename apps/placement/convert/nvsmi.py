"""`nvidia-smi topo -m` / `-mp`: the GPU and NIC matrix of one node (NV#, PIX, PXB, PHB, NODE,
SYS), the NIC legend, CPU and NUMA affinity; one file per node, merged into a cluster."""

from __future__ import annotations

import re

from .base import Defaults, Imported, Source, at, check_size, fail
from .node import PCIE_CLASSES, NodeHW, node_name, nodes_to_spec

_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS)$")
_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")
MAX_DEVICES = 256


def parse_matrix(source: Source) -> NodeHW:
    """One node from an `nvidia-smi topo -m` matrix; SpecError with the file's line number."""
    check_size(source)
    lines = source.text.splitlines()
    header_no = next((i for i, ln in enumerate(lines) if "GPU0" in ln.split()), None)
    if header_no is None:
        raise fail(source.name, "no matrix header with GPU0 found")
    header = [c.strip() for c in lines[header_no].split("\t") if c.strip()]
    devices = [c for c in header if " " not in c and c not in ("Affinity",)]
    devices = devices[
        : next(
            (i for i, c in enumerate(header) if c.endswith("Affinity") or c.startswith("GPU NUMA")),
            len(header),
        )
    ]
    extra = header[len(devices) :]
    if len(devices) > MAX_DEVICES:
        raise fail(at(source, header_no + 1), f"more than {MAX_DEVICES} devices")
    gpus = [d for d in devices if re.fullmatch(r"GPU\d+", d)]
    if [f"GPU{i}" for i in range(len(gpus))] != gpus:
        raise fail(
            at(source, header_no + 1), f"GPU columns must be GPU0..GPU{len(gpus) - 1}, got {', '.join(gpus)}"
        )
    nic_cols = [d for d in devices if d not in gpus]
    legend = {}
    for ln in lines[header_no + 1 :]:
        m = _LEGEND.match(ln)
        if m:
            legend[m.group(1)] = m.group(2)
    rows: dict[str, tuple[list[str], list[str], int]] = {}
    for i in range(header_no + 1, len(lines)):
        cells = [c.strip() for c in lines[i].split("\t")]
        if not cells or cells[0] not in devices:
            if rows and not lines[i].strip():
                break
            continue
        label, body = cells[0], cells[1:]
        if len(body) < len(devices):
            raise fail(at(source, i + 1), f"row {label} has {len(body)} cells, expected {len(devices)}")
        for c in body[: len(devices)]:
            if not _CELL.match(c):
                raise fail(
                    at(source, i + 1),
                    f"row {label}: unknown link class {c!r} (expected X, NV#, {', '.join(PCIE_CLASSES)})",
                )
        rows[label] = (body[: len(devices)], [c for c in body[len(devices) :] if c], i + 1)
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise fail(source.name, f"no rows for {', '.join(missing)}")
    hw = NodeHW(node_name(source), source.name, len(gpus))
    col = {d: k for k, d in enumerate(devices)}
    for gi, g in enumerate(gpus):
        cells, affinity, line = rows[g]
        if cells[col[g]] != "X":
            raise fail(at(source, line), f"{g} must be X against itself")
        for hj, h in enumerate(gpus):
            if hj == gi:
                continue
            c, back = cells[col[h]], rows[h][0][col[g]]
            if c != back:
                raise fail(
                    at(source, line), f"{g}-{h} is {c} but {h}-{g} is {back}; the matrix must be symmetric"
                )
            if c == "X":
                raise fail(at(source, line), f"{g}-{h} is X; only a device against itself is")
            hw.pairs[(gi, hj)] = c
        for n in nic_cols:
            c = cells[col[n]]
            if c.startswith("NV") or c == "X":
                raise fail(at(source, line), f"{g}-{n} is {c}; a NIC is reached over PCIe")
            hw.nic_class[(legend.get(n, n), gi)] = c
        numa_at = next((k for k, name in enumerate(extra) if name == "NUMA Affinity"), None)
        if numa_at is not None and numa_at < len(affinity):
            hw.numa[gi] = affinity[numa_at]
    hw.nics = [legend.get(n, n) for n in nic_cols]
    return hw


def import_matrices(sources: list[Source], defaults: Defaults) -> Imported:
    """nvidia-smi: one matrix file per node, merged into a cluster."""
    if not sources:
        raise fail("input", "nvidia-smi needs at least one matrix file")
    return nodes_to_spec([parse_matrix(s) for s in sources], defaults)
