"""Metrics sources behind one interface (no Django): `collect(targets) -> list[NodeResult]`.

`dcgm` fetches each node's dcgm-exporter concurrently; `prometheus` queries a Prometheus server
that already scrapes them. Both return parsed readings per node, or the node's error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..exposition import Scrape

# One INFO line per request would be thousands per pass; node states carry the failures.
logging.getLogger("httpx").setLevel(logging.WARNING)


@dataclass(frozen=True, slots=True)
class Target:
    """A node to measure: its row id, name, dcgm-exporter URL ("" if none) and GPU count."""

    node_id: int
    name: str
    url: str
    n_gpus: int


@dataclass(slots=True)
class NodeResult:
    """One node's outcome: the parsed scrape, or an error message; times in milliseconds."""

    node_id: int
    scrape: Scrape | None = None
    error: str = ""
    fetch_ms: float = 0.0
    parse_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.scrape is not None


class Source(Protocol):
    """What the collection service needs from a source."""

    def collect(self, targets: Sequence[Target]) -> list[NodeResult]: ...


def short_error(exc: BaseException) -> str:
    """An exception as one line for the node state ("ReadTimeout: timed out")."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__
