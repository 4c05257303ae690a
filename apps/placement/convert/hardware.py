"""What a node-level file names but does not measure: the NVLink of SXM/NVSwitch GPU models (by
PCI device id or model name), NIC vendors and speeds (by PCI ids), and which NICs are Ethernet
front ends rather than fabric rails (by name). Figures are the vendors' published ones."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

NVIDIA = "0x10de"


@dataclass(frozen=True)
class GpuKind:
    """An NVLink GPU model: its name, NVLinks per GPU, GB/s per link per direction, dense BF16
    peak, and how its GPUs are joined (`nvswitch`: every pair at full rate; `cube-mesh`: the
    DGX-1 hybrid cube mesh of V100 SXM2)."""

    model: str
    links: int
    link_GBps: float
    peak_tflops: float
    fabric: str = "nvswitch"

    @property
    def nvlink_bw_GBps(self) -> float:
        return self.links * self.link_GBps


# PCI device ids of NVIDIA's SXM parts (vendor 0x10de).
GPU_BY_DEVICE = {
    "0x1db1": GpuKind("V100-SXM2-16GB", 6, 25.0, 125.0, "cube-mesh"),
    "0x1db5": GpuKind("V100-SXM2-32GB", 6, 25.0, 125.0, "cube-mesh"),
    "0x1db8": GpuKind("V100-SXM3-32GB", 6, 25.0, 125.0),
    "0x20b0": GpuKind("A100-SXM4-40GB", 12, 25.0, 312.0),
    "0x20b2": GpuKind("A100-SXM4-80GB", 12, 25.0, 312.0),
    "0x2324": GpuKind("H800-SXM5-80GB", 8, 25.0, 989.0),
    "0x2329": GpuKind("H20", 18, 25.0, 148.0),
    "0x2330": GpuKind("H100-SXM5-80GB", 18, 25.0, 989.0),
    "0x2335": GpuKind("H200-SXM-141GB", 18, 25.0, 989.0),
    "0x2901": GpuKind("B200", 18, 50.0, 2250.0),
}
# Model names as nvidia-smi, Slurm and Kubernetes labels spell them, to the same kinds; PCIe and
# NVL cards ("H100 PCIe", "H100 NVL") match none of these.
_NAME_PATTERNS = (
    (re.compile(r"V100[- ]SXM2.*32"), "0x1db5"),
    (re.compile(r"V100[- ]SXM2"), "0x1db1"),
    (re.compile(r"V100[- ]SXM3"), "0x1db8"),
    (re.compile(r"A100[- ]SXM4?[- ]80|A100[- ]SXM.*80"), "0x20b2"),
    (re.compile(r"A100[- ]SXM"), "0x20b0"),
    (re.compile(r"H800(?!.*PCIE)"), "0x2324"),
    (re.compile(r"\bH20\b(?!.*PCIE)"), "0x2329"),
    (re.compile(r"H100[- ](SXM|80GB[- ]HBM3\b)"), "0x2330"),
    (re.compile(r"H200(?!.*NVL)"), "0x2335"),
    (re.compile(r"\bB200\b"), "0x2901"),
)


# Slurm GRES types as sites name them (`Gres=gpu:h100:8`): the SXM part of that name.
GRES_TYPES = {
    "v100": "0x1db5",
    "a100": "0x20b2",
    "h800": "0x2324",
    "h20": "0x2329",
    "h100": "0x2330",
    "h200": "0x2335",
    "b200": "0x2901",
}


def gres_kind(gres_type: str) -> GpuKind | None:
    """The GPU model of a Slurm GRES type: a full model name (`gpu_kind`), or a short one
    (`h100`, `a100`, ...: the SXM part, 80 GB for A100); None for PCIe or unknown types."""
    if not gres_type:
        return None
    short = GRES_TYPES.get(gres_type.lower())
    return GPU_BY_DEVICE[short] if short else gpu_kind(model=gres_type)


def gpu_kind(*, vendor: str = "", device: str = "", model: str = "") -> GpuKind | None:
    """The NVLink GPU model of a PCI id or a model name; None for PCIe cards and unknown parts."""
    if vendor.lower() == NVIDIA and device.lower() in GPU_BY_DEVICE:
        return GPU_BY_DEVICE[device.lower()]
    name = model.upper().replace("_", "-")
    for pattern, dev in _NAME_PATTERNS:
        if pattern.search(name):
            return GPU_BY_DEVICE[dev]
    return None


# The DGX-1 (V100 SXM2) hybrid cube mesh: NVLinks between GPU pairs; pairs not listed have none.
CUBE_MESH = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}  # fmt: skip


def pair_links(kind: GpuKind, gpus: int, i: int, j: int) -> int:
    """NVLinks between GPUs i and j of a node of `gpus` GPUs of `kind` (0: none)."""
    if kind.fabric == "cube-mesh":
        if gpus != 8:
            return 0
        return CUBE_MESH.get((min(i, j), max(i, j)), 0)
    return kind.links


@dataclass(frozen=True)
class NicKind:
    vendor: str  # "Mellanox", "Amazon EFA", ...
    prefix: str  # how its RDMA devices are named: mlx5_0, efa_0, ...
    fabric: str  # "infiniband", "ethernet", "efa", "" (either)
    bw_GBps: float | None  # line rate per port, GB/s; None when the part comes in several speeds


NIC_VENDORS = {
    "0x15b3": NicKind("Mellanox/NVIDIA", "mlx5_", "", None),
    "0x1d0f": NicKind("Amazon EFA", "efa_", "efa", 12.5),
    "0x14e4": NicKind("Broadcom", "bnxt_re", "ethernet", None),
    "0x8086": NicKind("Intel", "irdma", "ethernet", None),
    "0x1dd8": NicKind("AMD Pensando", "ionic_", "ethernet", None),
}
# Line rates of known parts, GB/s (Gb/s / 8).
NIC_SPEED_BY_DEVICE = {
    ("0x15b3", "0x1017"): 12.5,  # ConnectX-5, 100 Gb/s
    ("0x15b3", "0x1019"): 12.5,  # ConnectX-5 Ex
    ("0x15b3", "0x101b"): 25.0,  # ConnectX-6, HDR 200 Gb/s
    ("0x15b3", "0x101d"): 25.0,  # ConnectX-6 Dx, 200 GbE
    ("0x15b3", "0x1021"): 50.0,  # ConnectX-7, NDR 400 Gb/s
    ("0x15b3", "0x1023"): 100.0,  # ConnectX-8, XDR 800 Gb/s
    ("0x1d0f", "0xefa0"): 12.5,  # EFA (p4d: 4 x 100 Gb/s)
    ("0x1d0f", "0xefa1"): 12.5,  # EFA gen 2 (p5: 32 x 100 Gb/s)
    ("0x1d0f", "0xefa2"): 25.0,  # EFA gen 3 (p5en: 16 x 200 Gb/s)
}


def nic_kind(vendor: str, device: str) -> tuple[NicKind | None, float | None]:
    """The vendor of a NIC's PCI id and its line rate (GB/s) when the part is known."""
    v, d = vendor.lower(), device.lower()
    kind = NIC_VENDORS.get(v)
    return kind, NIC_SPEED_BY_DEVICE.get((v, d), kind.bw_GBps if kind else None)


# RDMA and network device names that are Ethernet (RoCE or plain) or InfiniBand by construction.
_ETHERNET_NAMES = re.compile(
    r"^(roce|rocep|irdma|bnxt_re|erdma|ionic|qedr|hns|eth|en[opsx]|bond|mlx5_bond)", re.IGNORECASE
)
_IB_NAMES = re.compile(r"^ib[p_0-9]", re.IGNORECASE)
_EFA_NAMES = re.compile(r"^(efa|rdmap)", re.IGNORECASE)


def nic_fabric(name: str, description: str = "") -> str:
    """`ethernet`, `infiniband`, `efa`, or "" (a name such as mlx5_0 that can be either)."""
    text = description.lower()
    if "roce" in text or "ethernet" in text:
        return "ethernet"
    if "infiniband" in text:
        return "infiniband"
    if _EFA_NAMES.match(name):
        return "efa"
    if _IB_NAMES.match(name):
        return "infiniband"
    if _ETHERNET_NAMES.match(name):
        return "ethernet"
    return ""


def matches(name: str, patterns: str) -> bool:
    """Whether `name` matches one of the comma-separated shell patterns (`mlx5_[0-3],ibp*`)."""
    return any(fnmatch.fnmatchcase(name, p.strip()) for p in patterns.split(",") if p.strip())
