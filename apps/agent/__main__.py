"""`python -m apps.agent --server URL --node NAME --token-file F`: run the node agent (F holds
the node's own token: `manage.py create_node_token CLUSTER NODE`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from .cgroups import CgroupError, detect
from .runner import DEFAULT_PIDS_MAX, DEFAULT_POLL_S, LOCKED_EXIT, MAX_MEMORY_MB, Agent, StateDirBusy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="topoweb-agent", description="TopoWeb node agent")
    parser.add_argument("--server", required=True, help="TopoWeb base URL, e.g. https://topoweb.example:443")
    parser.add_argument("--node", default=socket.gethostname(), help="this node's name in the topology")
    parser.add_argument(
        "--token-file",
        required=True,
        help="file holding this node's agent token (manage.py create_node_token CLUSTER NODE)",
    )
    parser.add_argument("--log-dir", default="/var/log/topoweb-agent", help="where rank output files go")
    parser.add_argument(
        "--poll-s",
        type=float,
        default=DEFAULT_POLL_S,
        help="long-poll wait, also the heartbeat (the server may answer sooner; at most 60)",
    )
    parser.add_argument("--addr", default="", help="address other nodes reach this one on (MASTER_ADDR)")
    parser.add_argument(
        "--state-dir",
        default="",
        help="where the agent records its ranks, to re-adopt them after a restart"
        " (default /var/lib/topoweb-agent/NODE)",
    )
    parser.add_argument(
        "--lock-dir",
        default="/var/lib/topoweb-agent",
        help="where the agent locks its node (NODE.lock): one agent per node on a host, and the"
        " last one's instance, so its successor on this host syncs at once",
    )
    parser.add_argument(
        "--cgroups",
        choices=["auto", "v1", "v2"],
        default="auto",
        help="cgroup hierarchy for the ranks: v2 where delegated, v1 freezer+pids(+devices) otherwise",
    )
    parser.add_argument(
        "--cgroup-name",
        default="",
        help="the agent's cgroup below its own, holding one cgroup per rank (default topoweb-NODE)",
    )
    parser.add_argument(
        "--no-cgroups",
        action="store_true",
        help="run without cgroups: forked or setsid children escape their rank and GPU device files"
        " are not restricted",
    )
    parser.add_argument(
        "--single-user",
        action="store_true",
        help="run every rank as the agent's own user (a one-user demo, not a shared cluster)",
    )
    parser.add_argument("--allow-root", action="store_true", help="allow ranks to run as uid 0")
    parser.add_argument(
        "--min-uid",
        type=int,
        default=None,
        help="the lowest uid a rank may run as (default: UID_MIN of /etc/login.defs, else 1000)",
    )
    parser.add_argument(
        "--pids-max",
        type=int,
        default=DEFAULT_PIDS_MAX,
        help=f"processes and threads a rank may have at once (its cgroup's pids.max; 0: no limit;"
        f" default {DEFAULT_PIDS_MAX})",
    )
    parser.add_argument(
        "--memory-max-mb",
        type=int,
        default=0,
        help="the most memory a rank may use, in MiB (its cgroup's memory.max or"
        " memory.limit_in_bytes; a job's memory_mb below it applies; 0: no ceiling)",
    )
    parser.add_argument(
        "--system-account",
        action="append",
        default=[],
        metavar="NAME",
        help="a service account below --min-uid that may run ranks all the same (repeatable)",
    )
    parser.add_argument(
        "--stop-ranks-on-exit",
        action="store_true",
        help="stop every rank when the agent stops (by default ranks keep running and are re-adopted)",
    )
    parser.add_argument(
        "--workdir-root",
        action="append",
        default=[],
        help="a directory a job's workdir may be in besides its owner's home (repeatable)",
    )
    parser.add_argument("--dev-dir", default="/dev", help="where the GPU device files /dev/nvidiaN are")
    parser.add_argument(
        "--sysfs-root",
        default="/sys",
        help="where sysfs is: the NICs' byte counters (class/infiniband, class/net) go in every sync"
        " for measured network load; empty: send none",
    )
    parser.add_argument(
        "--log-max-mb",
        type=float,
        default=256.0,
        help="rotate a rank's log file past this size (to <file>.1, one kept); 0: never",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the agent until SIGTERM or SIGINT; exit code 2 on a bad argument or token file, 75
    when another agent holds the state directory."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        token = Path(args.token_file).read_text().strip()
    except OSError as exc:
        print(f"--token-file: cannot read {args.token_file}: {exc}", file=sys.stderr)
        return 2
    if not token or len(token) > 200:
        print("--token-file: expected one node token", file=sys.stderr)
        return 2
    if args.log_max_mb < 0:
        print("--log-max-mb: must be 0 (no cap) or more", file=sys.stderr)
        return 2
    if not 0 < args.poll_s <= 60:
        print("--poll-s: must be between 0 and 60 seconds", file=sys.stderr)
        return 2
    if not 0 <= args.pids_max <= 4_194_304:
        print("--pids-max: must be 0 (no limit) to 4194304 (the kernel's pid_max bound)", file=sys.stderr)
        return 2
    if not 0 <= args.memory_max_mb <= MAX_MEMORY_MB:
        print(f"--memory-max-mb: must be 0 (no ceiling) to {MAX_MEMORY_MB} MiB (4 TiB)", file=sys.stderr)
        return 2
    if os.geteuid() != 0 and not args.single_user:
        print(
            "topoweb-agent: must run as root to start ranks as their owners (--single-user runs"
            " every rank as this user)",
            file=sys.stderr,
        )
        return 2
    if os.geteuid() == 0 and args.single_user and not args.allow_root:
        print("--single-user as root runs every rank as root: add --allow-root to mean it", file=sys.stderr)
        return 2
    cgroups = None
    if not args.no_cgroups:
        try:
            cgroups = detect(args.cgroups, args.cgroup_name or f"topoweb-{args.node}")
        except CgroupError as exc:
            print(f"topoweb-agent: {exc}", file=sys.stderr)
            return 2
        if cgroups is None:
            print(
                "topoweb-agent: no writable cgroup hierarchy; run as root with cgroups mounted, or"
                " pass --no-cgroups (forked and setsid children then escape their rank)",
                file=sys.stderr,
            )
            return 2
    else:
        logging.getLogger("topoweb.agent").warning(
            "running without cgroups (--no-cgroups): a rank's forked or setsid children escape its"
            " tracking and stop, re-adoption after a restart relies on process ids, and GPU device"
            " files are not restricted"
        )
    agent = Agent(
        server=args.server,
        node=args.node,
        token=token,
        log_dir=args.log_dir,
        poll_s=args.poll_s,
        addr=args.addr,
        state_dir=args.state_dir or f"/var/lib/topoweb-agent/{args.node}",
        cgroups=cgroups,
        single_user=args.single_user,
        allow_root=args.allow_root,
        min_uid=args.min_uid,
        system_accounts=tuple(args.system_account),
        pids_max=args.pids_max,
        memory_max_mb=args.memory_max_mb,
        stop_ranks_on_exit=args.stop_ranks_on_exit,
        workdir_roots=tuple(args.workdir_root),
        dev_dir=args.dev_dir,
        sysfs_root=args.sysfs_root or None,
        log_max_bytes=int(args.log_max_mb * 1024 * 1024),
        lock_dir=args.lock_dir,
    )

    try:
        agent.lock_state_dir()
    except StateDirBusy as exc:
        print(f"topoweb-agent: {exc}", file=sys.stderr)
        return LOCKED_EXIT
    except OSError as exc:
        print(f"topoweb-agent: cannot take the agent's locks: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.stop)
        await agent.run()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
