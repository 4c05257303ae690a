"""Example intra-node link matrices (`nodes[].intra`, docs/topology-intra.md) of 8-GPU nodes, as
`nvidia-smi topo -m` prints them, with link classes at representative rates: the fleets the
adversarial bench (`bench/placement_adversarial.py`) and the tests build nodes with intra links
from.

- `PCIE_TWO_SOCKETS`: PCIe GPUs on two sockets, a switch per GPU pair (as the DGX-1's PCIe view):
  PIX within a switch, PHB within a socket, SYS across.
- `DGX1_CUBE_MESH`: the DGX-1 V100 hybrid cube mesh, NVLink between some pairs only (NV1 one link,
  NV2 two), SYS for the rest.
"""

from __future__ import annotations

PCIE_TWO_SOCKETS = [
    ["X" if i == j else "PIX" if i // 2 == j // 2 else "PHB" if i // 4 == j // 4 else "SYS" for j in range(8)]
    for i in range(8)
]
DGX1_CUBE_MESH = [
    ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"],
    ["NV1", "X", "NV2", "NV1", "SYS", "NV2", "SYS", "SYS"],
    ["NV1", "NV2", "X", "NV2", "SYS", "SYS", "NV1", "SYS"],
    ["NV2", "NV1", "NV2", "X", "SYS", "SYS", "SYS", "NV1"],
    ["NV2", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV2"],
    ["SYS", "NV2", "SYS", "SYS", "NV1", "X", "NV2", "NV1"],
    ["SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2"],
    ["SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"],
]
# GB/s and us per class: V100 NVLink at 25 GB/s a link, PCIe 3 x16 through a switch, the host
# bridge and the socket interconnect.
LINK_CLASSES = {
    "NV1": {"bw_GBps": 25, "latency_us": 2},
    "NV2": {"bw_GBps": 50, "latency_us": 2},
    "PIX": {"bw_GBps": 24, "latency_us": 5},
    "PHB": {"bw_GBps": 14, "latency_us": 5},
    "SYS": {"bw_GBps": 8, "latency_us": 5},
}


def intra_spec(links: list[list[str]]) -> dict:
    """A node's `intra` spec for `links`, with the classes of LINK_CLASSES it uses."""
    used = {c for row in links for c in row if c != "X"}
    return {
        "links": [list(row) for row in links],
        "classes": {c: dict(v) for c, v in LINK_CLASSES.items() if c in used},
    }
