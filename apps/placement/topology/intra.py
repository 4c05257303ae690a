"""The optional intra-node link description of spec v1 (`nodes[].intra`): for nodes whose GPUs
are not one uniform NVLink domain (PCIe-only GPUs on two sockets, a partial NVLink mesh such as a
DGX-1's hybrid cube mesh, GPUs sharing PCIe switches with NICs).

```yaml
intra:
  links:            # one row per GPU: the class of the link to every GPU, X on the diagonal
    - [X, PIX, PHB]
    - [PIX, X, SYS]
    - [PHB, SYS, X]
  classes:          # each class used: bandwidth in one direction (GB/s) and latency (us)
    PIX: {bw_GBps: 24, latency_us: 5}
    PHB: {bw_GBps: 14, latency_us: 6}
    SYS: {bw_GBps: 8, latency_us: 8}
  nic_links:        # optional: the class from each NIC to each GPU; caps that GPU's NIC path
    mlx5_0: [PIX, PHB, SYS]
```
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checks import _bw, _check_keys, _Errors, _latency

# Best k-subset bandwidths are exact (every subset tried, 2^n of them) up to this many GPUs.
EXACT_MAX_GPUS = 12
# Best k-subset bandwidths by matrix: nodes of one model share them.
_SUBSET_BW: dict[bytes, np.ndarray] = {}
_CLASS = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,15}$")


@dataclass(frozen=True, eq=False)
class IntraLinks:
    """A node's GPU-pair links: class names, (n, n) bandwidth (GB/s) and latency (us) matrices
    (the diagonal is inf / 0), and the class from each NIC to each GPU."""

    links: tuple[tuple[str, ...], ...]
    classes: dict[str, tuple[float, float]]
    nic_links: dict[str, tuple[str, ...]]
    bw: np.ndarray
    latency: np.ndarray

    def best_subset_bw(self) -> np.ndarray:
        """Per k (index 0..n): the highest slowest-pair bandwidth (GB/s) any k GPUs of the node
        reach; exact up to EXACT_MAX_GPUS GPUs, else the fastest pair (an upper bound)."""
        cached = _SUBSET_BW.get(self.bw.tobytes())
        if cached is not None:
            return cached
        n = self.bw.shape[0]
        off = self.bw[~np.eye(n, dtype=bool)]
        top = float(off.max()) if off.size else math.inf
        out = np.full(n + 1, top)
        out[:2] = math.inf
        if n <= EXACT_MAX_GPUS:
            for k in range(2, n + 1):
                out[k] = max(
                    float(self.bw[np.ix_(s, s)][~np.eye(k, dtype=bool)].min())
                    for s in itertools.combinations(range(n), k)
                )
        _SUBSET_BW[self.bw.tobytes()] = out
        return out

    def nic_bw(self, nic: str, gpu: int) -> float:
        """What the PCIe path between a NIC and a GPU carries (GB/s), inf when not described."""
        row = self.nic_links.get(nic)
        return self.classes[row[gpu]][0] if row else math.inf

    def to_spec(self) -> dict:
        out: dict[str, Any] = {
            "links": [list(r) for r in self.links],
            "classes": {c: {"bw_GBps": bw, "latency_us": lat} for c, (bw, lat) in self.classes.items()},
        }
        if self.nic_links:
            out["nic_links"] = {n: list(r) for n, r in self.nic_links.items()}
        return out


def load_intra(errs: _Errors, p: str, value: Any, gpus: int, nic_names: list[str]) -> IntraLinks | None:
    """Check a node's `intra` block; None (with errors recorded) when it is not usable."""
    if not _check_keys(errs, p, value, {"links", "classes"}, {"nic_links"}):
        return None
    classes: dict[str, tuple[float, float]] = {}
    if not isinstance(value["classes"], dict) or not value["classes"]:
        errs.add(f"{p}.classes", "must be a mapping of class name to {bw_GBps, latency_us}")
        return None
    for name, c in value["classes"].items():
        q = f"{p}.classes.{name}"
        if not isinstance(name, str) or not _CLASS.match(name) or name == "X":
            errs.add(q, "a class name is a letter then up to 15 letters, digits or _ (not X)")
            continue
        if _check_keys(errs, q, c, {"bw_GBps", "latency_us"}):
            classes[name] = (
                _bw(errs, f"{q}.bw_GBps", c["bw_GBps"]),
                _latency(errs, f"{q}.latency_us", c["latency_us"]),
            )
    rows = value["links"]
    if not isinstance(rows, list) or len(rows) != gpus:
        errs.add(f"{p}.links", f"must have one row per GPU ({gpus})")
        return None
    bw = np.full((gpus, gpus), math.inf)
    lat = np.zeros((gpus, gpus))
    links = []
    for i, row in enumerate(rows):
        q = f"{p}.links[{i}]"
        if not isinstance(row, list) or len(row) != gpus:
            errs.add(q, f"must list {gpus} classes")
            return None
        for j, c in enumerate(row):
            if i == j:
                if c != "X":
                    errs.add(f"{q}[{j}]", "a GPU against itself is X")
                continue
            other = rows[j][i] if isinstance(rows[j], list) and len(rows[j]) == gpus else c
            if c not in classes:
                errs.add(f"{q}[{j}]", f"unknown class {c!r}; define it under classes")
            elif other != c:
                errs.add(f"{q}[{j}]", f"GPU {i}-{j} is {c} but {j}-{i} is {other}; links are symmetric")
            else:
                bw[i, j], lat[i, j] = classes[c]
        links.append(tuple(str(c) for c in row))
    nic_links: dict[str, tuple[str, ...]] = {}
    raw = value.get("nic_links") or {}
    if not isinstance(raw, dict):
        errs.add(f"{p}.nic_links", "must be a mapping of NIC name to one class per GPU")
        raw = {}
    for nic, row in raw.items():
        q = f"{p}.nic_links.{nic}"
        if nic not in nic_names:
            errs.add(q, f"unknown NIC {nic!r} on this node")
        elif not isinstance(row, list) or len(row) != gpus or any(c not in classes for c in row):
            errs.add(q, f"must list {gpus} classes defined under classes")
        else:
            nic_links[nic] = tuple(row)
    return IntraLinks(tuple(links), classes, nic_links, bw, lat)
