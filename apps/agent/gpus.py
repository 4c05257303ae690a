"""The node's GPU inventory from `nvidia-smi`, when the node has it."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

QUERY = ["--query-gpu=index,uuid,name", "--format=csv,noheader,nounits"]


def parse_inventory(text: str) -> list[dict[str, Any]]:
    """GPUs from `nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader` output."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3 and parts[0].isdigit():
            gpus.append({"index": int(parts[0]), "uuid": parts[1][:64], "name": parts[2][:128]})
    return gpus


def gpu_inventory() -> list[dict[str, Any]] | None:
    """The GPUs nvidia-smi lists, or None where there is no nvidia-smi (the server then takes
    the node's GPUs from the topology)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        out = subprocess.run([binary, *QUERY], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_inventory(out.stdout)
