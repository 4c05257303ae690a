"""`python -m apps.agent --server URL --node NAME --token-file F`: run the node agent (F holds
the node's own token: `manage.py create_node_token CLUSTER NODE`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from pathlib import Path

from .runner import DEFAULT_POLL_S, Agent


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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the agent until SIGTERM or SIGINT; exit code 2 on a bad token file."""
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
    if not 0 < args.poll_s <= 60:
        print("--poll-s: must be between 0 and 60 seconds", file=sys.stderr)
        return 2
    agent = Agent(
        server=args.server,
        node=args.node,
        token=token,
        log_dir=args.log_dir,
        poll_s=args.poll_s,
        addr=args.addr,
    )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.stop)
        await agent.run()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
