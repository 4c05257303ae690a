"""`python -m apps.cli COMMAND ...`: the TopoWeb user CLI (see `--help`)."""

from __future__ import annotations

import argparse
import sys

from . import commands
from .client import Api, CliError, settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="topoweb", description="Submit and follow TopoWeb jobs.")
    p.add_argument("--config", help="config file (default ~/.config/topoweb/config)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("submit", help="submit a job spec v1 file (YAML or JSON)")
    s.add_argument("file")
    s.add_argument("--cluster", help="cluster name (default: the spec's cluster)")
    s.add_argument(
        "--wait",
        action="store_true",
        help="wait until it finishes; exit 0 completed, 1 otherwise (Ctrl-C: 130, the job keeps running"
        " unless you cancel it when asked)",
    )
    s.add_argument(
        "--gpu-models",
        metavar="MODEL[,MODEL...]",
        help="run only on these GPU models of the cluster (sets the spec's gpu_models; as Slurm's"
        " --gpus=h100:8 or a Kueue resource flavor)",
    )
    s.add_argument("--poll-s", type=float, default=2.0)
    s.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help=f"with --wait: stop waiting after this long, exit {commands.EXIT_TIMEOUT} (the job keeps running)",
    )
    s.set_defaults(run=commands.submit)

    s = sub.add_parser("status", help="one job, or your recent jobs")
    s.add_argument("job", nargs="?", type=int)
    s.add_argument("--limit", type=int, default=50)
    s.set_defaults(run=commands.status)

    s = sub.add_parser("queue", help="jobs waiting or holding GPUs")
    s.add_argument("--cluster")
    s.add_argument("--limit", type=int, default=500)
    s.set_defaults(run=commands.queue)

    s = sub.add_parser("cancel", help="cancel a job")
    s.add_argument("job", type=int)
    s.set_defaults(run=commands.cancel)

    s = sub.add_parser("logs", help="each rank's output tail, or one rank's whole output")
    s.add_argument("job", type=int)
    s.add_argument("--rank", type=int, help="this rank's whole output, read from the server page by page")
    s.add_argument("--tail", action="store_true", help="with --rank: only the tail")
    s.add_argument("--generation", type=int)
    s.set_defaults(run=commands.logs)

    s = sub.add_parser("rankmap", help="the job's rank map for a launcher")
    s.add_argument("job", type=int)
    s.add_argument("--format", choices=commands.RANKMAP_FORMATS, default="json")
    s.add_argument("--entrypoint", help="training script for the launcher line (default train.py)")
    s.set_defaults(run=commands.rankmap)

    s = sub.add_parser("nodes", help="nodes and their health (as sinfo)")
    s.add_argument("--cluster")
    s.add_argument(
        "--state",
        choices=("up", "draining", "drained", "down", "no_agent", "unhealthy"),
        help="only nodes in this state (unhealthy: a GPU reported unhealthy)",
    )
    s.set_defaults(run=commands.nodes)

    for name, run, text in (
        ("drain", commands.drain, "drain a node"),
        ("resume", commands.resume, "resume a node"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("node")
        s.add_argument("--cluster")
        if name == "drain":
            s.add_argument("--reason", required=True)
        s.set_defaults(run=run)
    return p


def main(argv: list[str] | None = None, *, transport=None) -> int:
    """Run one command; returns the exit code (0 done, 1 job failed, 2 usage, 3 server, 4 a
    `--timeout-s` wait ran out, 130 interrupted)."""
    args = parser().parse_args(argv)
    try:
        server, token = settings(args.config)
        api = Api(server, token, transport=transport)
        return args.run(api, args)
    except CliError as exc:
        print(f"topoweb: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("\ntopoweb: interrupted", file=sys.stderr)
        return commands.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
