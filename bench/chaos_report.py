"""Print the fault matrix's figures (`make chaos` writes them): per fault class, the runs, how many
passed, GPU-seconds of double use, ranks run twice (and rank-seconds), samples with a job alive in
two generations, healthy `requeue: true` jobs failed, and the recovery time (fault injected →
every affected job running again or in its expected end), median and worst.

    python bench/chaos_report.py [RESULTS]   (default: $TOPOWEB_CHAOS_RESULTS or tests/chaos/.results.jsonl)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "chaos" / ".results.jsonl"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(rows: list[dict]) -> str:
    head = (
        "class",
        "runs",
        "passed",
        "GPU-s double",
        "ranks twice (rank-s)",
        "overlap gens",
        "requeue failed",
        "recovery s (median/max)",
    )
    lines = [head]
    classes: dict[str, list[dict]] = {}
    for row in rows:
        classes.setdefault(row["class"], []).append(row)
    for name, runs in classes.items():
        rec = [r["recovery_s"] for r in runs if r.get("recovery_s") is not None]
        failed = [r["healthy_requeue_failed"] for r in runs if r.get("healthy_requeue_failed") is not None]
        lines.append(
            (
                name,
                str(len(runs)),
                str(sum(r["outcome"] == "passed" for r in runs)),
                f"{sum(r['gpu_double_s'] for r in runs):.1f}",
                f"{sum(r['ranks_twice'] for r in runs)} ({sum(r['rank_twice_s'] for r in runs):.1f})",
                str(sum(r["generation_overlaps"] for r in runs)),
                str(sum(failed)) if failed else "?",
                f"{statistics.median(rec):.1f}/{max(rec):.1f}" if rec else "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    notes = [
        f"{r['class']} round {r['round']}: {r['error']}"
        for r in rows
        if r["outcome"] != "passed" and r.get("error")
    ]
    return "\n".join(out + ([""] + notes if notes else []))


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else Path(os.environ.get("TOPOWEB_CHAOS_RESULTS") or DEFAULT)
    if not path.exists():
        print(f"no results at {path} (run `make chaos` first)", file=sys.stderr)
        return 1
    print(table(load(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
