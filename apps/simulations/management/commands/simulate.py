"""`manage.py simulate --cluster C --trace X`: replay a trace on a stored cluster, record the run.

The run is recorded as a SimulationRun (so it shows on the simulations page beside the others)
and executed here, with a progress bar on stderr and the JSON summary on stdout. `--trace` is the
file name of a trace in the trace folders (`examples/traces`, SIMULATION_TRACE_DIR); to replay
any file on a topology file, use `python -m apps.placement simulate`.
"""

from __future__ import annotations

import json
import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.placement.sim.cli import DEFAULT_POLICIES, ProgressBar, parse_policies
from apps.simulations.choices import RunStatus
from apps.simulations.services import available_traces, simulation_execute, simulation_start
from apps.topology.models import Cluster


class Command(BaseCommand):
    help = "Replay a trace on a stored cluster under several policies; print the comparison as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", required=True, help="name of a stored cluster")
        parser.add_argument("--trace", help="file name of a trace in the trace folders (see --list)")
        parser.add_argument("--policies", default=DEFAULT_POLICIES)
        parser.add_argument("--limit", type=int, default=1000, help="replay the first N jobs (default 1000)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--load", type=float, help="scale arrivals to this offered load")
        parser.add_argument("--json", action="store_true", help="the JSON summary on one line")
        parser.add_argument("--list", action="store_true", help="list the traces that can be replayed")

    def handle(self, *args, **opts):
        if opts["list"]:
            for name, path in available_traces().items():
                self.stdout.write(f"{name}\t{path}")
            return
        if not opts["trace"]:
            raise CommandError("--trace: name a trace (see --list)")
        cluster = Cluster.objects.filter(name=opts["cluster"]).first()
        if cluster is None:
            raise CommandError(f"--cluster: no cluster named {opts['cluster']!r}")
        try:
            policies = parse_policies(opts["policies"])
            # Recorded, then executed here rather than by a queued task.
            run = simulation_start(
                cluster=cluster,
                trace=opts["trace"],
                policies=policies,
                job_limit=opts["limit"],
                seed=opts["seed"],
                load=opts["load"],
                defer=True,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        except ValidationError as exc:
            text = "; ".join(
                f"--{f.replace('job_limit', 'limit')}: {' '.join(m)}" for f, m in exc.message_dict.items()
            )
            raise CommandError(text) from exc
        run = simulation_execute(run_id=run.pk, progress=ProgressBar(sys.stderr))
        if run is None or run.status != RunStatus.DONE:
            raise CommandError(
                f"simulation {run.pk if run else '?'} failed: {run.error if run else 'taken elsewhere'}"
            )
        result = dict(run.result)
        result.pop("series", None)
        result["run"] = run.pk
        self.stdout.write(json.dumps(result, indent=None if opts["json"] else 2))
