"""A reference release's topo placements, for `placement_adversarial.py --against REF`.

`RefPlacer(REF)` extracts REF's `apps/` (a release named in CHANGELOG.md, or any commit) with
`git archive` into a temporary directory and runs this file there as a subprocess, which imports
that tree's solver only. Each request is one JSON line - the topology's full spec, the free GPUs,
the link load, the job's spec - and the answer one line: each rank's (node, GPU index), or why REF
could not place or read it. Fields REF does not know yet (a GPU model's `speed`, a job's
`gpu_models`) are dropped for it; a job's allowed models are already applied to the free set.

    .venv/bin/python bench/placement_ref.py REF_DIR    (the subprocess side: JSON lines on stdin)
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _strip_new_fields(topology: dict, job: dict) -> tuple[dict, dict]:
    """The specs without fields older releases refuse."""
    topology, job = copy.deepcopy(topology), copy.deepcopy(job)
    for model in topology.get("gpu_models", {}).values():
        model.pop("speed", None)
    job.pop("gpu_models", None)
    job.get("step", {}).pop("gpu_model", None)
    return topology, job


def _either(load, spec: dict, older: dict):
    """`load(spec)`, or `load(older)` (the spec without newer fields) when REF refuses `spec`."""
    try:
        return load(spec)
    except Exception:
        return load(older)


def serve(ref_dir: str) -> int:
    """The subprocess side: answer requests on stdin with REF's topo placements."""
    sys.path.insert(0, ref_dir)
    import numpy as np

    from apps.placement.jobs import load_job
    from apps.placement.solvers import NoFit, place
    from apps.placement.topology import load_topology

    cache: dict[str, object] = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            key = json.dumps(req["topology"], sort_keys=True)
            if key not in cache:
                cache.clear()
                cache[key] = _either(
                    load_topology, req["topology"], _strip_new_fields(req["topology"], {})[0]
                )
            topo = cache[key]
            job = _either(load_job, req["job"], _strip_new_fields({}, req["job"])[1])
            free = np.zeros(topo.n_gpus, dtype=bool)
            free[req["free"]] = True
            placed = place(topo, free, req["load"], job)
            if isinstance(placed, NoFit):
                out = {"error": f"no fit: {placed.reason}"}
            else:
                out = {"ranks": [list(topo.gpu_key(g)) for g in placed.gids]}
        except Exception as exc:  # REF cannot read or place this scenario: reported, not fatal.
            out = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)
    return 0


class RefPlacer:
    """REF's topo as a subprocess: `place(topology_spec, free_gids, load, job_spec)` gives each
    rank's (node name, GPU index), or a string saying why REF gave none."""

    def __init__(self, ref: str, repo: Path = ROOT):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from ab import resolve

        self.commit = resolve(repo, ref)
        self.dir = Path(tempfile.mkdtemp(prefix="topoweb-ref-"))
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", self.commit, "apps"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(self.dir)], input=archive, check=True)
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(self.dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=self.dir,
        )

    def place(self, topology: dict, free: list[int], load, job: dict) -> list[tuple[str, int]] | str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(
            json.dumps({"topology": topology, "free": free, "load": load, "job": job}) + "\n"
        )
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reference solver at {self.commit[:10]} exited")
        out = json.loads(line)
        return out["error"] if "error" in out else [(str(n), int(i)) for n, i in out["ranks"]]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
