"""`python -m apps.placement simulate`: replay a trace under several policies and compare them.

  simulate --topology T --trace X [--format F] [--policies topo,tree_best_fit,first_fit,naive]
           [--limit N] [--seed S] [--load L] [--strict] [--migration] [--preemption]
           [--json] [--report DIR]

A progress bar goes to stderr, the JSON summary (`Comparison.as_dict`) to stdout (one line with
--json, indented otherwise), and with --report an HTML report with Plotly charts into DIR.
Malformed trace rows are reported on stderr with their line numbers and skipped (--strict: the
first one is an error). Exit status: 0 done, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..solvers import POLICIES
from ..topology import SpecError, Topology
from . import FORMATS, SimConfig, TraceError, read_trace, simulate
from .report import write_report

DEFAULT_POLICIES = "topo,tree_best_fit,first_fit,naive"
MAX_LIMIT = 1_000_000


def add_parser(sub) -> None:
    """Add the `simulate` subcommand to the CLI's subparsers."""
    s = sub.add_parser("simulate", help="replay a cluster trace under several policies and compare them")
    s.add_argument("--topology", required=True, help="topology spec v1 file (YAML or JSON)")
    s.add_argument("--trace", required=True, help="trace CSV file")
    s.add_argument(
        "--format", default="auto", choices=("auto", *FORMATS), help="trace format (default: from the header)"
    )
    s.add_argument(
        "--policies", default=DEFAULT_POLICIES, help=f"comma-separated (default {DEFAULT_POLICIES})"
    )
    s.add_argument("--limit", type=int, help="replay only the first N jobs by arrival")
    s.add_argument("--seed", type=int, default=0, help="seed of the workload profile mix")
    s.add_argument(
        "--load", type=float, help="scale arrival times to this offered load (fraction of the cluster)"
    )
    s.add_argument("--strict", action="store_true", help="a malformed trace row is an error, not skipped")
    s.add_argument("--migration", action="store_true", help="apply the planner's migration options")
    s.add_argument("--preemption", action="store_true", help="let higher-priority jobs preempt")
    s.add_argument("--json", action="store_true", help="the JSON summary on one line")
    s.add_argument("--report", metavar="DIR", help="write an HTML report with charts into DIR")


class ProgressBar:
    """A one-line progress bar on a stream (redrawn in place, at most 10 times a second)."""

    def __init__(self, stream=None, width: int = 30):
        self.stream, self.width, self.last = stream or sys.stderr, width, 0.0
        self.finished: set[str] = set()

    def __call__(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if label in self.finished or (done < total and now - self.last < 0.1):
            return
        self.last = now
        share = done / total if total else 1.0
        filled = int(share * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r{label:>14} [{bar}] {share:6.1%} {done}/{total} jobs")
        if done >= total:
            self.finished.add(label)
            self.stream.write("\n")
        self.stream.flush()


def parse_policies(text: str) -> list[str]:
    """Policy names from a comma-separated list; ValueError naming a bad one."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    for p in names:
        if p not in POLICIES:
            raise ValueError(f"--policies: unknown policy {p!r}, expected some of {', '.join(POLICIES)}")
    if not names or len(set(names)) != len(names):
        raise ValueError("--policies: name one or more distinct policies")
    return names


def run(args: argparse.Namespace, read_topology) -> int:
    """Run the subcommand; `read_topology(path, flag)` reads and validates the topology."""
    try:
        if args.limit is not None and not 1 <= args.limit <= MAX_LIMIT:
            raise ValueError(f"--limit: must be in 1..{MAX_LIMIT}, got {args.limit}")
        policies = parse_policies(args.policies)
        topology: Topology = read_topology(args.topology, "--topology")
        trace = read_trace(args.trace, args.format, strict=args.strict, limit=args.limit, seed=args.seed)
        for line, reason in trace.malformed[:20]:
            print(f"{args.trace}:{line}: skipped: {reason}", file=sys.stderr)
        if len(trace.malformed) > 20:
            print(f"{args.trace}: {len(trace.malformed) - 20} more malformed rows skipped", file=sys.stderr)
        if not trace.jobs:
            raise ValueError(f"--trace: {args.trace} holds no job to replay")
        config = SimConfig(migration=args.migration, preemption=args.preemption)
        result = simulate(
            topology, trace, policies, seed=args.seed, config=config, load=args.load, progress=ProgressBar()
        )
    except TraceError as exc:
        print(f"error: --trace: {args.trace}: {exc}", file=sys.stderr)
        return 2
    except (ValueError, SpecError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    out = result.as_dict(series=bool(args.report))
    if args.report:
        path = write_report(out, args.report)
        print(f"report: {path}", file=sys.stderr)
        out.pop("series")
    json.dump(out, sys.stdout, indent=None if args.json else 2, allow_nan=False)
    sys.stdout.write("\n")
    return 0
