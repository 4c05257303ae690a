"""The node's per-NIC byte counters from sysfs, shipped in every sync: the server turns two of them
into NIC rates (measured NIC load) and, with the placement's flows, measured uplink load.

- InfiniBand ports: `class/infiniband/<device>/ports/<port>/counters/port_xmit_data` and
  `port_rcv_data`, which count 4-byte words (the IBTA's PortXmitData), so times 4 in bytes;
- network interfaces: `class/net/<interface>/statistics/tx_bytes` and `rx_bytes` (bytes), as
  port "0"; the loopback and interfaces without counters are left out.

`root` is the sysfs mount (/sys), so tests point it at a tree of their own. A counter that cannot
be read or is not a number is left out; the node's other counters still go."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

IB_WORD_BYTES = 4
MAX_NICS = 64  # ports shipped per sync (a node has a few dozen at most)
MAX_COUNTER = 2**63 - 1  # bytes a 64-bit counter holds; past it the reading is garbage
NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
PORT = re.compile(r"^[0-9]{1,3}$")
SKIPPED_INTERFACES = frozenset({"lo"})


def _counter(path: Path) -> int | None:
    try:
        value = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return value if 0 <= value <= MAX_COUNTER else None


def _entry(device: str, port: str, tx: int | None, rx: int | None) -> dict[str, Any] | None:
    tx, rx = (None if v is None or v > MAX_COUNTER else v for v in (tx, rx))
    if tx is None and rx is None:
        return None
    return {"device": device, "port": port, "tx_bytes": tx, "rx_bytes": rx}


def nic_counters(root: str | Path = "/sys") -> list[dict[str, Any]]:
    """Every InfiniBand port and network interface under `root` with its cumulative byte counters
    ({device, port, tx_bytes, rx_bytes}, None where one is missing), InfiniBand first, by name;
    at most MAX_NICS."""
    root = Path(root)
    out: list[dict[str, Any]] = []
    ib = root / "class" / "infiniband"
    for device in sorted(p.name for p in _children(ib) if NAME.match(p.name)):
        for port in sorted((p.name for p in _children(ib / device / "ports") if PORT.match(p.name)), key=int):
            counters = ib / device / "ports" / port / "counters"
            tx, rx = _counter(counters / "port_xmit_data"), _counter(counters / "port_rcv_data")
            entry = _entry(
                device,
                port,
                None if tx is None else tx * IB_WORD_BYTES,
                None if rx is None else rx * IB_WORD_BYTES,
            )
            if entry is not None:
                out.append(entry)
    net = root / "class" / "net"
    for name in sorted(p.name for p in _children(net) if NAME.match(p.name)):
        if name in SKIPPED_INTERFACES:
            continue
        stats = net / name / "statistics"
        entry = _entry(name, "0", _counter(stats / "tx_bytes"), _counter(stats / "rx_bytes"))
        if entry is not None:
            out.append(entry)
    return out[:MAX_NICS]


def _children(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []
