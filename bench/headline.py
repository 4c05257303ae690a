"""The README's headline table, generated: the trace simulator's spread, not one lucky run.

Replays prefixes of the Philly multi-GPU trace on pod-256 (examples/pod-256.yaml) under topo,
naive and tree_best_fit with the production planner (apps.placement.sim), over three seeds, four
trace prefixes and three offered loads (RUNS), and prints the Markdown block that README.md
holds between `<!-- headline:start -->` and `<!-- headline:end -->`: one row per run (topo's
mean job completion time against naive's and tree_best_fit's, its fragmentation against
tree_best_fit's) and the spread (min, median, max) over the runs on the full trace's prefixes.
Every figure is deterministic (seeded profiles, a placement search budgeted in moves), so the
block is reproduced exactly by rerunning this command on any machine.

The first run replays examples/traces/philly_multigpu_first80.csv, the repository's own copy of
the trace's first 80 jobs: tests/unit/test_headline.py reruns it (`--only fixture`) and fails when
the README's row differs, and checks the README's spread row against its run rows. The others read
the full trace from --traces (the shared data folder); without it only the fixture row runs.

    .venv/bin/python bench/headline.py              # print the block (about a minute of CPU)
    .venv/bin/python bench/headline.py --write      # and put it into README.md
    .venv/bin/python bench/headline.py --only fixture
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.placement.sim import read_trace, simulate  # noqa: E402
from apps.placement.topology import load_topology_file  # noqa: E402

README = ROOT / "README.md"
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
FIXTURE = ROOT / "examples" / "traces" / "philly_multigpu_first80.csv"
TRACE = "philly_pollux_derived_multigpu_all_chrono.csv"
# As the simulations app finds them (SIMULATION_TRACE_DIR, else beside the checkout).
DEFAULT_TRACES = Path(os.environ.get("SIMULATION_TRACE_DIR") or ROOT.parent / "shared" / "data" / "traces")
POLICIES = ["topo", "naive", "tree_best_fit"]
COMMAND = "bench/headline.py"


@dataclass(frozen=True)
class Run:
    """One replay: the trace's first `jobs` jobs, profiles seeded by `seed`, at offered `load`."""

    name: str
    jobs: int
    seed: int
    load: float


RUNS = [
    Run("fixture", 80, 0, 0.6),
    Run("seed-0", 1000, 0, 0.6),
    Run("seed-1", 1000, 1, 0.6),
    Run("seed-2", 1000, 2, 0.6),
    Run("prefix-500", 500, 0, 0.6),
    Run("prefix-2000", 2000, 0, 0.6),
    Run("load-0.4", 1000, 0, 0.4),
    Run("load-0.8", 1000, 0, 0.8),
]
HEADER = (
    "| run | Philly jobs | seed | offered load | topo mean JCT / naive | / tree_best_fit"
    " | topo fragmentation / tree_best_fit | topo mean JCT |\n|---|---|---|---|---|---|---|---|"
)


def replay(run: Run, traces: Path) -> dict[str, float]:
    """topo's ratios and mean JCT (hours) in one replay."""
    path = FIXTURE if run.name == "fixture" else traces / TRACE
    trace = read_trace(str(path), "philly", limit=run.jobs, seed=run.seed)
    if len(trace.jobs) != run.jobs:
        raise SystemExit(f"{path}: {len(trace.jobs)} jobs, the {run.name} run needs {run.jobs}")
    topology = load_topology_file(str(ROOT / "examples" / "pod-256.yaml"))
    s = simulate(topology, trace, POLICIES, seed=run.seed, load=run.load).summaries
    jct = {p: s[p]["jct_s"]["mean"] for p in POLICIES}
    return {
        "naive": jct["topo"] / jct["naive"],
        "tree": jct["topo"] / jct["tree_best_fit"],
        "frag": s["topo"]["fragmentation"] / s["tree_best_fit"]["fragmentation"]
        if s["tree_best_fit"]["fragmentation"] > 0
        else float("nan"),
        "jct_h": jct["topo"] / 3600,
    }


def row(run: Run, r: dict[str, float]) -> str:
    """The table row of one run."""
    return (
        f"| {run.name} | {run.jobs:,} | {run.seed} | {run.load:.1f} | {r['naive']:.3f} | {r['tree']:.3f}"
        f" | {r['frag']:.3f} | {r['jct_h']:.1f} h |"
    )


ROW = re.compile(
    r"^\| (?P<name>[\w.-]+) \| [\d,]+ \| \d+ \| [\d.]+ \| (?P<naive>[\d.]+) \| (?P<tree>[\d.]+)"
    r" \| (?P<frag>[\d.]+|nan) \| [\d.]+ h \|$"
)


def spread(rows: dict[str, dict[str, float]]) -> str:
    """The spread row: min, median and max of each ratio over the runs on the full trace."""
    full = [r for name, r in rows.items() if name != "fixture"]
    cells = []
    for key in ("naive", "tree", "frag"):
        xs = [r[key] for r in full]
        cells.append(f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}")
    return f"| spread over {len(full)} runs (min / median / max) | | | | {' | '.join(cells)} | |"


def block(rows: dict[str, dict[str, float]], when: str) -> str:
    """The README block, between the markers (markers excluded)."""
    lines = [HEADER, *(row(run, rows[run.name]) for run in RUNS if run.name in rows)]
    if len(rows) > 1:
        lines.append(spread(rows))
    lines += [
        "",
        "Trace replays on pod-256 with the production planner, topo against naive and tree_best_fit (below",
        f"1 is better for topo); generated by `{COMMAND}` on {when}, which reproduces every figure",
        "exactly. Timed figures, with load averages and ratios to the previous release: [docs/performance.md](docs/performance.md).",
    ]
    return "\n".join(lines)


def readme_rows(text: str) -> dict[str, dict[str, float]]:
    """The run rows of the README's headline block, as numbers."""
    inside = text.split(START, 1)[1].split(END, 1)[0]
    out = {}
    for line in inside.splitlines():
        m = ROW.match(line.strip())
        if m:
            out[m["name"]] = {k: float(m[k]) for k in ("naive", "tree", "frag")}
    return out


def readme_spread(text: str) -> str | None:
    """The spread row of the README's headline block."""
    inside = text.split(START, 1)[1].split(END, 1)[0]
    return next((ln.strip() for ln in inside.splitlines() if ln.startswith("| spread over")), None)


def write(text: str, new_block: str) -> str:
    """`text` with the headline block replaced by `new_block`."""
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{new_block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder with the Philly trace")
    ap.add_argument("--only", action="append", choices=[r.name for r in RUNS], help="run only these")
    ap.add_argument("--write", action="store_true", help="write the block into README.md")
    args = ap.parse_args(argv)
    runs = [r for r in RUNS if not args.only or r.name in args.only]
    if not (args.traces / TRACE).exists():
        if args.write:
            raise SystemExit(f"--write needs the full trace: {args.traces / TRACE} is absent")
        print(f"({args.traces / TRACE} absent: the fixture run only)", file=sys.stderr)
        runs = [r for r in runs if r.name == "fixture"]
    rows = {}
    for run in runs:
        rows[run.name] = replay(run, args.traces)
        print(f"headline: {row(run, rows[run.name])}", file=sys.stderr, flush=True)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    text = block(rows, when)
    print(text)
    if args.write:
        README.write_text(write(README.read_text(), text))
        print("README.md: headline block written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
