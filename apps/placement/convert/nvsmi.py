"""`nvidia-smi topo -m` / `-mp`: the GPU and NIC matrix of one node (NV#, PIX, PXB, PHB, NODE,
SYS), the NIC legend, CPU and NUMA affinity; one file per node, merged into a cluster.

Read as people paste it: tab-separated as printed, or re-aligned with runs of spaces (a terminal,
an issue, a wiki), indented, quoted or as a Markdown table, with or without the legend, with the NIC columns named
`NIC0` (and a `NIC0: mlx5_0` legend) or by their device names (older drivers). `nvidia-smi -L`
lines pasted with it (`GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)`) name the GPU model."""

from __future__ import annotations

import re

from .base import Defaults, Imported, Source, at, check_size, check_text, fail, printable
from .hardware import gpu_kind, nic_fabric
from .node import PCIE_CLASSES, NodeHW, node_name, nodes_to_spec, nv_links

_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS)$")
_LEGEND = re.compile(r"^(NIC\d+):\s*(\S.*?)\s*$")
_GPU_LINE = re.compile(r"^GPU (\d+): (.+?)(?: \(UUID: [^)]*\))?\s*$")
_DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")
# Where the device columns end: the affinity columns' headers.
_AFFINITY = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID")
# Quote marks and prompts a paste may carry at the start of each line.
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
MAX_DEVICES = 256


def _lines(text: str) -> list[str]:
    # Cells never hold `|`: a matrix pasted as a Markdown table reads as space-aligned.
    return [_QUOTE.sub("", ln).replace("\u00a0", " ").replace("|", " ").rstrip() for ln in text.splitlines()]


def _header(lines: list[str]) -> int | None:
    for i, ln in enumerate(lines):
        tokens = ln.split()
        if tokens and tokens[0] == "GPU0" and (len(tokens) == 1 or not _CELL.match(tokens[1])):
            return i
    return None


def _cells(line: str, n: int) -> tuple[list[str], list[str]] | None:
    """(label and device cells, affinity cells) of a row: tab-separated cells when the row has
    tabs, else whitespace tokens (cells never hold spaces; ` X ` is `X`)."""
    if "\t" in line.strip() and len(line.strip().split("\t")) > n:
        cells = [c.strip() for c in line.strip().split("\t")]
        return cells[: n + 1], cells[n + 1 :]
    tokens = line.split()
    return tokens[: n + 1], tokens[n + 1 :]


def parse_matrix(source: Source, assume_nics: int = 0) -> NodeHW:
    """One node from an `nvidia-smi topo -m` matrix; SpecError with the file's line number.
    `assume_nics`: NICs to assume when the matrix has no NIC columns (else that is an error)."""
    check_size(source)
    check_text(source)
    lines = _lines(source.text)
    header_no = _header(lines)
    if header_no is None:
        raise fail(
            source.name, "no matrix header with GPU0 found (paste the whole `nvidia-smi topo -m` output)"
        )
    header = lines[header_no]
    cut = _AFFINITY.search(header)
    devices = header[: cut.start() if cut else len(header)].split()
    extra = _AFFINITY.findall(header)
    if len(devices) > MAX_DEVICES:
        raise fail(at(source, header_no + 1), f"more than {MAX_DEVICES} devices")
    for d in devices:
        if not _DEVICE.match(d):
            raise fail(at(source, header_no + 1), f"column {printable(d)!r} is not a device name")
    gpus = [d for d in devices if re.fullmatch(r"GPU\d+", d)]
    if [f"GPU{i}" for i in range(len(gpus))] != gpus:
        raise fail(
            at(source, header_no + 1), f"GPU columns must be GPU0..GPU{len(gpus) - 1}, got {', '.join(gpus)}"
        )
    nic_cols = [d for d in devices if d not in gpus]
    legend: dict[str, str] = {}
    models: dict[int, str] = {}
    for ln in lines:
        m = _LEGEND.match(ln.strip())
        if m:
            legend[m.group(1)] = m.group(2)
        g = _GPU_LINE.match(ln.strip())
        if g:
            models[int(g.group(1))] = g.group(2).strip()
    rows: dict[str, tuple[list[str], list[str], int]] = {}
    for i in range(header_no + 1, len(lines)):
        tokens = lines[i].split()
        if not tokens or tokens[0] not in devices:
            if rows and not tokens:
                break
            continue
        label_cells, affinity = _cells(lines[i], len(devices))
        label, body = label_cells[0], label_cells[1:]
        if len(body) < len(devices):
            raise fail(at(source, i + 1), f"row {label} has {len(body)} cells, expected {len(devices)}")
        for c in body:
            if not _CELL.match(c):
                raise fail(
                    at(source, i + 1),
                    f"row {label}: unknown link class {printable(c)!r} "
                    f"(expected X, NV#, {', '.join(PCIE_CLASSES)})",
                )
        if label in rows:
            raise fail(at(source, i + 1), f"row {label} appears twice (lines {rows[label][2]} and {i + 1})")
        rows[label] = (body, [c for c in affinity if c], i + 1)
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise fail(source.name, f"no rows for {', '.join(missing)}")
    if not nic_cols and not assume_nics:
        raise fail(
            at(source, header_no + 1),
            "the matrix has no NIC columns (only GPU0..GPU"
            f"{len(gpus) - 1}): nvidia-smi lists NICs when their RDMA driver is loaded. Paste the output "
            "of a node with its NICs, or give nics_per_node to assume that many NICs",
        )
    hw = NodeHW(node_name(source), source.name, len(gpus))
    col = {d: k for k, d in enumerate(devices)}
    numa_at = extra.index("NUMA Affinity") if "NUMA Affinity" in extra else None
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
            hw.nic_class[(_nic_name(n, legend), gi)] = c
        if numa_at is not None and numa_at < len(affinity):
            hw.numa[gi] = affinity[numa_at]
    hw.nics = [_nic_name(n, legend) for n in nic_cols]
    if len(set(hw.nics)) != len(hw.nics):
        raise fail(source.name, f"NIC names repeat: {', '.join(hw.nics)}")
    for n in nic_cols:
        fabric = nic_fabric(_nic_name(n, legend), legend.get(n, ""))
        if fabric:
            hw.nic_fabric[_nic_name(n, legend)] = fabric
    if not nic_cols:
        _assume_nics(hw, assume_nics, source)
    # `topo -mp` prints PCIe classes only and a legend without the NV# line: NVLink is unknown.
    legend_at = next((i for i, ln in enumerate(lines) if ln.strip() == "Legend:"), None)
    has_nv_legend = any(ln.strip().startswith("NV#") for ln in lines)
    hw.nvlink_known = legend_at is None or has_nv_legend or any(nv_links(c) for c in hw.pairs.values())
    kinds = {models[g] for g in models}
    if len(kinds) == 1:
        hw.model = kinds.pop()
        hw.kind = gpu_kind(model=hw.model)
    return hw


def _nic_name(column: str, legend: dict[str, str]) -> str:
    """A NIC's device name: its legend entry's first word (`NIC0: mlx5_0`), else the column."""
    entry = legend.get(column)
    if not entry:
        return column
    name = entry.split()[0]
    return name if _DEVICE.match(name) else column


def import_matrices(sources: list[Source], defaults: Defaults) -> Imported:
    """nvidia-smi: one matrix file per node, merged into a cluster. A matrix without NIC columns
    is accepted only with nics_per_node given: that many NICs, each serving an equal run of GPUs."""
    if not sources:
        raise fail("input", "nvidia-smi needs at least one matrix file")
    assume = defaults.take("nics_per_node") if "nics_per_node" in defaults.given else 0
    nodes = [parse_matrix(s, assume_nics=assume) for s in sources]
    imported = nodes_to_spec(nodes, defaults)
    guessed = sum(1 for hw in nodes if hw.nics_assumed)
    if guessed:
        imported.notes.insert(0, f"{assume} NICs per node assumed (nics_per_node): {guessed} nodes")
    return imported


def _assume_nics(hw: NodeHW, count: int, source: Source) -> None:
    if count > hw.gpus or hw.gpus % count:
        raise fail(source.name, f"nics_per_node ({count}) must divide the {hw.gpus} GPUs")
    per = hw.gpus // count
    hw.nics = [f"nic{k}" for k in range(count)]
    for k, nic in enumerate(hw.nics):
        for g in range(hw.gpus):
            hw.nic_class[(nic, g)] = "PIX" if g // per == k else "SYS"
    hw.nics_assumed = True
