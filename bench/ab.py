"""A/B runner: one benchmark at a reference commit and in this checkout, run alternately.

    .venv/bin/python bench/ab.py [--runs 3] REF -- BENCH [ARGS...]
    .venv/bin/python bench/ab.py v0.1 -- bench/placement_speed.py --quick

REF is a release name from CHANGELOG.md (`## v0.1 (2026-12-02, commit 1d9380a)`, so no tags are
needed), or anything `git rev-parse` knows (tag, branch, commit). REF is checked out into a
temporary git worktree, removed at the end, and runs with its own virtualenv, cached under
~/.cache/topoweb-ab (or --cache) by the hash of REF's requirements.txt and the Python version.
This checkout, uncommitted changes included, runs with the Python running this script.

The two sides run alternately, REF first in odd rounds and here first in even ones, so slow drift
of the machine's load falls on both. Figures are read from each run's output:
- `FIGURE name=value [unit]` lines (the benchmarks' machine-readable form);
- failing those, the last JSON object printed, numeric leaves named by their dotted path
  (`get_latency_during_submissions_ms.p99`);
- and, for older benchmarks known to this script, what their human output says (LEGACY below).
Printed: each figure's median at REF and here, here/REF, the per-run values, and the 1-minute
load average before every run (the machine's other work skews every figure: quote it).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from figures import slug

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "topoweb-ab"

FIGURE_LINE = re.compile(r"^FIGURE ([A-Za-z0-9_.:/-]+)=(-?[0-9.eE+-]+|nan|inf)(?: +(\S+))?\s*$")
RELEASE_HEADING = re.compile(r"^## (v\d+(?:\.\d+)*) \([^)]*\bcommit ([0-9a-f]{7,40})\)\s*$")


def legacy_placement_speed(output: str) -> dict[str, tuple[float, str]]:
    """placement_speed.py before FIGURE lines: its latency table and its placements/s line."""
    figures = {}
    row = re.compile(r"^(\w+)\s+\d+\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$", re.M)
    for m in row.finditer(output):
        cluster, gpus, *values = m.groups()
        for (policy, q), value in zip(
            [("topo", 50), ("topo", 99), ("tree", 50), ("tree", 99)], values, strict=True
        ):
            figures[f"{policy}_{gpus}_on_{cluster}_p{q}_ms"] = (float(value), "ms")
    m = re.search(r"^placements/s of 8-GPU jobs on \d+ nodes: ([0-9.]+)", output, re.M)
    if m:
        figures["placements_per_s_8gpu"] = (float(m.group(1)), "1/s")
    return figures


SIM_BLOCK = re.compile(r"^(\S+) on (\S+): \d+ jobs", re.M)
SIM_ROW = re.compile(r"^  (topo|tree_best_fit|first_fit|naive) +\d+ +([0-9.]+|-) .* ([0-9]+|-)\s*$", re.M)
SIM_RATIOS = re.compile(
    r"topo mean JCT / naive ([0-9.]+|inf).*?/ tree_best_fit ([0-9.]+|inf).*?fragmentation / tree_best_fit ([0-9.]+|inf)"
)
SIM_SCALING = re.compile(r"10,000 Philly jobs, topo, (\S+) \(\d+ GPUs\): ([0-9.]+) s wall, ([0-9.]+) s CPU")


def legacy_simulate_traces(output: str) -> dict[str, tuple[float, str]]:
    """simulate_traces.py before FIGURE lines: each replay's table (mean JCT, jobs per CPU second)
    and topo's ratios, and the scaling lines."""
    figures: dict[str, tuple[float, str]] = {}
    blocks = list(SIM_BLOCK.finditer(output))
    for i, block in enumerate(blocks):
        name = f"{block.group(1)}.{block.group(2)}"
        text = output[block.end() : blocks[i + 1].start() if i + 1 < len(blocks) else len(output)]
        for row in SIM_ROW.finditer(text):
            policy, jct, speed = row.groups()
            if jct != "-":
                figures[f"{name}.{policy}.jct_mean_h"] = (float(jct), "h")
            if speed != "-":
                figures[f"{name}.{policy}.jobs_per_cpu_s"] = (float(speed), "1/s")
        ratios = SIM_RATIOS.search(text)
        if ratios:
            for key, value in zip(
                ("topo_jct_vs_naive", "topo_jct_vs_tree_best_fit", "topo_frag_vs_tree_best_fit"),
                ratios.groups(),
                strict=True,
            ):
                figures[f"{name}.{key}"] = (float(value), "")
    for m in SIM_SCALING.finditer(output):
        figures[f"scaling.{m.group(1)}.wall_s"] = (float(m.group(2)), "s")
        figures[f"scaling.{m.group(1)}.cpu_s"] = (float(m.group(3)), "s")
    return figures


def legacy_dashboard_render(output: str) -> dict[str, tuple[float, str]]:
    """dashboard_render.py before FIGURE lines: its table of 9-character columns, headed by
    `GPUs nodes cold warm ...`, one row per cluster size (columns of older versions by name)."""
    figures: dict[str, tuple[float, str]] = {}
    lines = output.splitlines()
    for i, line in enumerate(lines):
        cells = [line[k : k + 9].strip() for k in range(0, len(line), 9)]
        if cells[:2] != ["GPUs", "nodes"]:
            continue
        for row in lines[i + 1 :]:
            values = [row[k : k + 9].strip() for k in range(0, len(row), 9)]
            if len(values) != len(cells) or not values[0].isdigit():
                break
            for header, value in zip(cells[2:], values[2:], strict=True):
                try:
                    number = float(value)
                except ValueError:
                    continue
                unit = "MB" if header == "HTML MB" else "ms"
                figures[f"gpus_{values[0]}.{header.split()[0].lower()}_{unit}"] = (number, unit)
    return figures


HISTORY_SIZES = re.compile(r"^pages and cycle \(ms, median\): ([0-9,]+) jobs, ([0-9,]+) jobs, ratio$", re.M)
HISTORY_ROW = re.compile(r"^  (.{44})\s*([0-9.]+)\s+([0-9.]+)\s+[0-9.]+x$")
HISTORY_WORST = re.compile(r"^worst query at [0-9,]+ jobs: tiers ([0-9.]+) ms, ranked ([0-9.]+) ms", re.M)


def legacy_history_scale(output: str) -> dict[str, tuple[float, str]]:
    """history_scale.py before FIGURE lines: its table of pages and the cycle at the two history
    sizes, and its worst search query."""
    figures: dict[str, tuple[float, str]] = {}
    sizes = HISTORY_SIZES.search(output)
    if sizes:
        small, large = (int(g.replace(",", "")) for g in sizes.groups())
        for line in output[sizes.end() :].splitlines()[1:]:
            row = HISTORY_ROW.match(line)
            if row is None:
                break
            name = slug(row.group(1))
            figures[f"{name}.jobs_{small}_ms"] = (float(row.group(2)), "ms")
            figures[f"{name}.jobs_{large}_ms"] = (float(row.group(3)), "ms")
    worst = HISTORY_WORST.search(output)
    if worst:
        figures["worst_query.tiers_ms"] = (float(worst.group(1)), "ms")
        figures["worst_query.ranked_ms"] = (float(worst.group(2)), "ms")
    return figures


METRICS_ROWS = {
    "pass_s": re.compile(r"^\| pass time, median / max of \d+ \| ([0-9.]+) / ([0-9.]+) s", re.M),
    "stage_s": re.compile(r"^\| (fetch \+ parse|store|jobs) \| ([0-9.]+) s \(", re.M),
    "cpu_s": re.compile(r"^\| CPU time: parsers .*? \| ([0-9.]+) \+ ([0-9.]+) s", re.M),
    "cpu_bound_pass_s": re.compile(r"^\| CPU-bound pass .*? \| ([0-9.]+) s", re.M),
}


def legacy_metrics_scale(output: str) -> dict[str, tuple[float, str]]:
    """metrics_scale.py before FIGURE lines: its table of the pass time, its stages and CPU."""
    figures: dict[str, tuple[float, str]] = {}
    if m := METRICS_ROWS["pass_s"].search(output):
        figures["pass_s.median"], figures["pass_s.max"] = (float(m.group(1)), "s"), (float(m.group(2)), "s")
    for m in METRICS_ROWS["stage_s"].finditer(output):
        figures[f"stage_s.{m.group(1).replace(' + ', '_')}"] = (float(m.group(2)), "s")
    if m := METRICS_ROWS["cpu_s"].search(output):
        figures["cpu_s.parsers"], figures["cpu_s.collector"] = (
            (float(m.group(1)), "s"),
            (float(m.group(2)), "s"),
        )
    if m := METRICS_ROWS["cpu_bound_pass_s"].search(output):
        figures["cpu_bound_pass_s"] = (float(m.group(1)), "s")
    return figures


# Human output of benchmark versions that predate FIGURE lines, read into the names the current
# version's FIGURE lines use, per script name.
LEGACY = {
    "placement_speed.py": legacy_placement_speed,
    "simulate_traces.py": legacy_simulate_traces,
    "dashboard_render.py": legacy_dashboard_render,
    "history_scale.py": legacy_history_scale,
    "metrics_scale.py": legacy_metrics_scale,
}


class AbError(Exception):
    """A usage or set-up problem, reported as one line with exit code 2."""


@dataclass
class Side:
    """One side of the comparison: where it runs, with which Python, and what it printed."""

    label: str
    root: Path
    python: str
    figures: dict[str, list[float]] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)


def git(repo: Path, *args: str) -> str:
    """stdout of `git -C repo args` (AbError with git's message when it fails)."""
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise AbError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def releases(changelog: str) -> dict[str, str]:
    """Release name -> abbreviated commit, from CHANGELOG.md's `## vX.Y (..., commit <hash>)` headings."""
    out = {}
    for line in changelog.splitlines():
        m = RELEASE_HEADING.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def resolve(repo: Path, ref: str) -> str:
    """The full commit hash REF names: a release in CHANGELOG.md first, then git's own names."""
    changelog = repo / "CHANGELOG.md"
    named = releases(changelog.read_text()) if changelog.exists() else {}
    target = named.get(ref, ref)
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{target}^{{commit}}")
    except AbError:
        known = ", ".join(sorted(named)) or "none"
        hint = " (a shallow clone may lack it: git fetch --unshallow)" if ref in named else ""
        raise AbError(
            f"REF {ref!r}: no such release or commit{hint}; releases in CHANGELOG.md: {known}"
        ) from None


def parse_figures(output: str, bench: str) -> dict[str, tuple[float, str]]:
    """Figures a benchmark printed: FIGURE lines, else its last JSON object and, for a benchmark
    known to LEGACY, what its older human output says (a table printed beside a JSON summary)."""
    figures: dict[str, tuple[float, str]] = {}
    for line in output.splitlines():
        m = FIGURE_LINE.match(line)
        if m:
            figures[m.group(1)] = (float(m.group(2)), m.group(3) or "")
    if figures:
        return figures
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"^\{", output, re.M)]
    for start in reversed(starts):
        try:
            obj, _ = decoder.raw_decode(output, start)
        except ValueError:
            continue
        if isinstance(obj, dict):
            flatten(obj, "", figures)
            if figures:
                break
    legacy = LEGACY.get(Path(bench).name)
    return {**figures, **legacy(output)} if legacy else figures


def flatten(obj: object, prefix: str, out: dict[str, tuple[float, str]]) -> None:
    """Numeric leaves of a JSON value (booleans left out), named by their dotted path; a list's
    items by their index (`intervals.0.idle.sync_requests_per_s`)."""
    if isinstance(obj, (dict, list)):
        for key, value in obj.items() if isinstance(obj, dict) else enumerate(obj):
            flatten(value, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix] = (float(obj), "")


def requirements_key(repo: Path, commit: str) -> str:
    """Hash of REF's requirements.txt (empty when it has none) and this Python's version."""
    try:
        text = git(repo, "show", f"{commit}:requirements.txt")
    except AbError:
        text = ""
    digest = hashlib.sha256(f"{sys.version_info[:2]}\n{text}".encode()).hexdigest()
    return digest[:16]


def cached_venv(cache: Path, key: str, requirements: Path) -> Path:
    """The Python of the virtualenv for `key` under `cache`, built from `requirements` on first use
    (a lock keeps two runs from building the same one; a half-built one is rebuilt)."""
    cache.mkdir(parents=True, exist_ok=True)
    venv = cache / f"venv-{key}"
    python = venv / "bin" / "python"
    with open(cache / f"venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".installed").exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        needs_pip = requirements.exists() and any(
            line.strip() and not line.lstrip().startswith("#")
            for line in requirements.read_text().splitlines()
        )
        print(f"ab: building {venv} from {requirements.name if needs_pip else 'nothing'}", file=sys.stderr)
        cmd = [sys.executable, "-m", "venv", str(venv)]
        subprocess.run(cmd + ([] if needs_pip else ["--without-pip"]), check=True)
        if needs_pip:
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            done = subprocess.run([*pip, "-r", str(requirements)])
            if done.returncode != 0:
                raise AbError(f"pip install -r {requirements} failed for {venv}")
        (venv / ".installed").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
    return python


def run_once(side: Side, bench: list[str], timeout_s: float) -> tuple[float, float]:
    """Run the benchmark once on `side`, record its figures; (load average before, seconds)."""
    load = os.getloadavg()[0]
    script = side.root / bench[0]
    if not script.exists():
        raise AbError(f"{bench[0]} does not exist at {side.label}")
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [side.python, str(script), *bench[1:]],
            cwd=side.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise AbError(f"{bench[0]} at {side.label} ran over {timeout_s:.0f} s") from None
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise AbError(f"{bench[0]} at {side.label} exited with {done.returncode}")
    figures = parse_figures(done.stdout, bench[0])
    if not figures:
        sys.stderr.write(done.stdout[-3000:])
        raise AbError(f"{bench[0]} at {side.label} printed no figures ab.py can read")
    for name, (value, unit) in figures.items():
        side.figures.setdefault(name, []).append(value)
        if unit:
            side.units[name] = unit
    side.seconds.append(seconds)
    return load, seconds


def fmt(x: float) -> str:
    """A figure to 3-4 significant digits."""
    if x != x:
        return "nan"
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.0f}"


def report(ref: Side, here: Side, loads: list[float]) -> tuple[str, dict]:
    """The comparison table (text) and the same as a dict for --json."""
    names = [n for n in here.figures if n in ref.figures] + [n for n in here.figures if n not in ref.figures]
    names += [n for n in ref.figures if n not in here.figures]
    rows = []
    lines = [f"{'figure':<44}{'unit':>8}{ref.label[:12]:>13}{'here':>11}{'here/ref':>10}  runs (ref | here)"]
    for name in names:
        a = ref.figures.get(name, [])
        b = here.figures.get(name, [])
        ma = statistics.median(a) if a else float("nan")
        mb = statistics.median(b) if b else float("nan")
        ratio = mb / ma if a and b and ma else float("nan")
        unit = here.units.get(name) or ref.units.get(name, "")
        runs = " ".join(fmt(v) for v in a) + " | " + " ".join(fmt(v) for v in b)
        lines.append(f"{name:<44}{unit:>8}{fmt(ma):>13}{fmt(mb):>11}{fmt(ratio):>10}  {runs}")
        rows.append({"figure": name, "unit": unit, "ref": a, "here": b, "ref_median": ma, "here_median": mb})
        rows[-1]["ratio"] = ratio
    lines.append(
        f"1-min load average before each run: {' '.join(f'{x:.2f}' for x in loads)}"
        f" (median {statistics.median(loads):.2f}, {os.cpu_count()} CPUs)"
    )
    lines.append(
        f"seconds per run: ref {statistics.median(ref.seconds):.1f}, here {statistics.median(here.seconds):.1f}"
    )
    return "\n".join(lines), {"figures": rows, "load_avg_1m": loads, "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: ab.py [options] REF -- BENCH [ARGS...]   (see --help)", file=sys.stderr)
        if "-h" in argv or "--help" in argv:
            print(__doc__)
            return 0
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref", help="release name (CHANGELOG.md), tag, branch or commit")
    ap.add_argument("--runs", type=int, default=3, help="runs of each side (default 3)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout to compare (default: this one)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where REF's virtualenvs are kept")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    ap.add_argument("--json", type=Path, help="also write the comparison here as JSON")
    args = ap.parse_args(argv[:cut])
    bench = argv[cut + 1 :]
    if not bench:
        print("ab.py: nothing after --: name the benchmark script", file=sys.stderr)
        return 2
    if args.runs < 1:
        print("ab.py: --runs must be at least 1", file=sys.stderr)
        return 2
    repo = args.repo.resolve()
    worktree = None
    try:
        here_root = Path(git(repo, "rev-parse", "--show-toplevel"))
        commit = resolve(here_root, args.ref)
        worktree = Path(tempfile.mkdtemp(prefix="topoweb-ab-"))
        git(here_root, "worktree", "add", "--detach", "--quiet", str(worktree), commit)
        python = cached_venv(args.cache, requirements_key(here_root, commit), worktree / "requirements.txt")
        ref = Side(args.ref, worktree, str(python))
        here = Side("here", here_root, sys.executable)
        print(f"ab: {args.ref} = {commit[:10]} against {here_root}; {args.runs} runs each", file=sys.stderr)
        loads = []
        for i in range(args.runs):
            for side in (ref, here) if i % 2 == 0 else (here, ref):
                load, seconds = run_once(side, bench, args.timeout)
                loads.append(load)
                print(f"ab: run {i + 1} {side.label}: {seconds:.1f} s, load {load:.2f}", file=sys.stderr)
        text, data = report(ref, here, loads)
        print(f"ab.py {args.ref} ({commit[:10]}) -- {' '.join(bench)}")
        print(text)
        if args.json:
            data.update(ref=args.ref, commit=commit, bench=bench)
            args.json.write_text(json.dumps(data, indent=2) + "\n")
        return 0
    except AbError as exc:
        print(f"ab.py: {exc}", file=sys.stderr)
        return 2
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(worktree)], capture_output=True
            )
            shutil.rmtree(worktree, ignore_errors=True)
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
