"""bench/ab.py on a tiny fake benchmark in a throwaway git repository: a release found through
CHANGELOG.md without tags, alternate runs, medians and ratios, and the older output forms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import ab  # noqa: E402

FAKE = """\
import sys, time
from pathlib import Path
with open(sys.argv[1], "a") as log:
    log.write("{side}\\n")
{body}
"""


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message],
        check=True,
    )
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def run_ab(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(BENCH / "ab.py"),
            "--repo",
            str(repo),
            "--cache",
            str(tmp_path / "cache"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_release_name_resolves_through_the_changelog_and_sides_alternate(repo: Path, tmp_path: Path):
    # The old release prints its figure as JSON only; today's prints FIGURE lines, twice as fast.
    old = FAKE.format(side="ref", body='print(\'{"speed": {"jobs_per_s": 10}, "ok": true}\')')
    first = commit(repo, {"bench/fake.py": old, "requirements.txt": "# none\n"}, "first")
    new = FAKE.format(
        side="here", body='print("FIGURE speed.jobs_per_s=20 1/s")\nprint("FIGURE p99_ms=5 ms")'
    )
    changelog = f"# Changelog\n\n## Unreleased\n\n## v0.1 (2026-12-02, commit {first})\n\n- first\n"
    commit(repo, {"bench/fake.py": new, "CHANGELOG.md": changelog}, "second")
    log = tmp_path / "order.log"
    out_json = tmp_path / "ab.json"

    done = run_ab(
        repo, tmp_path, "--runs", "3", "--json", str(out_json), "v0.1", "--", "bench/fake.py", str(log)
    )

    assert done.returncode == 0, done.stderr
    assert log.read_text().split() == ["ref", "here", "here", "ref", "ref", "here"]
    data = json.loads(out_json.read_text())
    speed = next(r for r in data["figures"] if r["figure"] == "speed.jobs_per_s")
    assert speed["ref"] == [10.0] * 3 and speed["here"] == [20.0] * 3 and speed["ratio"] == 2.0
    assert speed["unit"] == "1/s"
    assert not any(r["figure"] == "ok" for r in data["figures"])  # booleans are not figures
    assert "speed.jobs_per_s" in done.stdout and "load average" in done.stdout
    # The temporary worktree is gone and its virtualenv stays cached for the next run.
    listed = subprocess.run(
        ["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert len(listed.strip().splitlines()) == 1
    assert [p.name for p in (tmp_path / "cache").glob("venv-*") if p.is_dir()]


def test_an_unknown_ref_is_a_usage_error_naming_the_releases(repo: Path, tmp_path: Path):
    first = commit(repo, {"bench/fake.py": "print('FIGURE x=1')\n"}, "first")
    commit(repo, {"CHANGELOG.md": f"## v0.1 (2026-12-02, commit {first})\n"}, "second")

    done = run_ab(repo, tmp_path, "v0.9", "--", "bench/fake.py")

    assert done.returncode == 2
    assert "v0.9" in done.stderr and "v0.1" in done.stderr


def test_a_benchmark_missing_at_the_ref_is_named(repo: Path, tmp_path: Path):
    commit(repo, {"README": "x\n"}, "first")
    commit(repo, {"bench/fake.py": "print('FIGURE x=1')\n"}, "second")

    done = run_ab(repo, tmp_path, "HEAD~1", "--", "bench/fake.py")

    assert done.returncode == 2 and "bench/fake.py does not exist at HEAD~1" in done.stderr


def test_figure_lines_win_over_json_and_units_are_kept():
    out = 'noise\nFIGURE placed_per_s=151.5 1/s\n{"placed_per_s": 3}\nFIGURE get_p99_ms=80 ms\n'
    assert ab.parse_figures(out, "bench/x.py") == {"placed_per_s": (151.5, "1/s"), "get_p99_ms": (80.0, "ms")}


def test_the_last_json_object_is_flattened_by_dotted_path():
    out = '{"a": 1}\nTOKEN x\n{\n  "a": 2,\n  "lat": {"p50": 4.5, "p99": 9},\n  "codes": [500]\n}\n'
    assert ab.parse_figures(out, "bench/x.py") == {
        "a": (2.0, ""),
        "lat.p50": (4.5, ""),
        "lat.p99": (9.0, ""),
        "codes.0": (500.0, ""),
    }


def test_the_first_releases_placement_speed_output_is_read():
    out = (
        "cluster     GPUs   job  topo p50      p99  tree p50      p99  (ms)\n"
        "1k          1024     8      0.60     0.90      0.20     0.30\n"
        "16k       131072     8      1.20     2.00      0.40     0.50\n"
        "16k       131072  1024     25.60    40.10      9.00    12.00\n"
        "\nplacements/s of 8-GPU jobs on 2048 nodes: 624\n"
    )
    figures = ab.parse_figures(out, "bench/placement_speed.py")
    assert figures["placements_per_s_8gpu"] == (624.0, "1/s")
    assert figures["topo_1024_on_16k_p50_ms"] == (25.6, "ms")
    assert figures["topo_8_on_16k_p50_ms"] == (1.2, "ms") and figures["tree_8_on_1k_p99_ms"] == (0.3, "ms")
    assert len(figures) == 13


def test_release_headings_give_name_and_commit():
    text = "## Unreleased\n- x\n## v0.2 (2026-12-03, commit 0be9d11)\n## v0.1 (2026-12-02, commit 1d9380a)\n"
    assert ab.releases(text) == {"v0.2": "0be9d11", "v0.1": "1d9380a"}


def test_this_projects_changelog_names_its_releases():
    text = (BENCH.parent / "CHANGELOG.md").read_text()
    named = ab.releases(text)
    assert named["v0.1"] == "1d9380a" and named["v0.2"] == "0be9d11"
    assert "## Unreleased" in text.split("## v0.2")[0]


def test_api_throughput_names_its_figures_as_ab_reads_its_old_json():
    import api_throughput

    assert api_throughput.unit_of("get_latency_during_submissions_ms.p99") == "ms"
    assert api_throughput.unit_of("get_latency_alone_ms.n") == "requests"
    assert api_throughput.unit_of("placed_per_s") == "1/s"
    result = {"placed_per_s": 150.5, "get_latency_alone_ms": {"p99": 80.0}, "targets": {"x": True}}
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        api_throughput.print_figures(result)
    assert ab.parse_figures(out.getvalue(), "bench/api_throughput.py") == {
        "placed_per_s": (150.5, "1/s"),
        "get_latency_alone_ms.p99": (80.0, "ms"),
    }


SIMULATE_TRACES_V03 = """\

alibaba-multigpu50 on pod-256: 7112 jobs, mean 1.67 GPUs, offered load 0.218, arrivals x0.1774 for 0.600 (asked 0.60); profiles {'single': 6129}; 25.8 s wall for 4 policies
  policy          jobs JCT mean h  median h     p95 h   queue h makespan h  comm GPU-h    MFU   util util win busy|wait   frag  stretch jobs/s CPU
  topo            7112       8.49      0.24      4.72      0.05    4069.64        2277   4.2%   8.6%    59.9%     99.4%   6.7%    1.003       1712
  tree_best_fit   7112       8.75      0.26      5.05      0.07    4543.16       11491   3.8%   8.5%    64.0%     99.3%  12.4%    1.033       1730
  first_fit       7112       8.99      0.27      5.17      0.16    5436.11       15476   3.1%   7.4%    65.0%     99.0%  16.0%    1.041       1119
  naive           7112       8.68      0.26      4.84      0.07    4543.16        7833   3.8%   8.2%    61.7%     99.1%  31.7%    1.016       1195
  topo mean JCT / naive 0.978 (target <= 0.7), / tree_best_fit 0.971 (target <= 0.9); fragmentation / tree_best_fit 0.540 (target < 1)

Targets (topo mean JCT <= 0.7 x naive and <= 0.9 x tree_best_fit; fragmentation below tree_best_fit)
  alibaba-multigpu50  pod-256      0.978  0.971  0.540  MISSED MISSED met

Scaling
  10,000 Philly jobs, topo, superpod-1024 (1024 GPUs): 8.0 s wall, 5.4 s CPU, 9564 cycles, 10000 jobs done
  10,000 Philly jobs, topo, 3tier-16384 (16384 GPUs): 11.1 s wall, 6.9 s CPU, 9472 cycles, 10000 jobs done
"""


def test_simulate_traces_tables_are_read_under_its_figure_names():
    figures = ab.parse_figures(SIMULATE_TRACES_V03, "bench/simulate_traces.py")
    name = "alibaba-multigpu50.pod-256"
    assert figures[f"{name}.topo.jct_mean_h"] == (8.49, "h")
    assert figures[f"{name}.naive.jobs_per_cpu_s"] == (1195.0, "1/s")
    assert figures[f"{name}.topo_jct_vs_naive"] == (0.978, "")
    assert figures[f"{name}.topo_frag_vs_tree_best_fit"] == (0.54, "")
    assert figures["scaling.3tier-16384.cpu_s"] == (6.9, "s")
    assert figures["scaling.superpod-1024.wall_s"] == (8.0, "s")
    assert len(figures) == 4 * 2 + 3 + 2 * 2


def test_dashboard_render_tables_are_read_by_column_name():
    head = ("GPUs", "nodes", "cold", "warm", "zoom", "server", "first", "HTML MB", "received")
    rows = [
        (2048, 256, 1400, 440, 160, 120, 130, 0.37, 300),
        (16384, 2048, 2100, 750, 210, 500, 1000, 3.1, 600),
    ]
    table = "".join(f"{h:>9}" for h in head) + "\n"
    table += "\n".join("".join(f"{c:>9}" for c in row) for row in rows)
    out = f"Navigation to drawn graph (ms, median)\n{table}\n16,384 GPUs (mixed), cold: 2100 ms, meets\n"
    figures = ab.parse_figures(out, "bench/dashboard_render.py")
    assert figures["gpus_16384.cold_ms"] == (2100.0, "ms")
    assert figures["gpus_2048.zoom_ms"] == (160.0, "ms")
    assert figures["gpus_16384.html_MB"] == (3.1, "MB")
    assert figures["gpus_2048.received_ms"] == (300.0, "ms")
    assert len(figures) == 2 * 7


def test_an_older_table_is_read_beside_the_json_summary_it_printed():
    head, row = ("GPUs", "nodes", "cold"), (2048, 256, 1400)
    out = (
        '{\n  "setup_s": 9.5\n}\n' + "".join(f"{h:>9}" for h in head) + "\n" + "".join(f"{c:>9}" for c in row)
    )
    assert ab.parse_figures(out, "bench/dashboard_render.py") == {
        "setup_s": (9.5, ""),
        "gpus_2048.cold_ms": (1400.0, "ms"),
    }


HISTORY_SCALE_V03 = """\
pages and cycle (ms, median): 10,000 jobs, 100,000 jobs, ratio
  queue history, last 7 days (500 rows)           131.5    147.7    1.1x
  API job list, ?page=last                         15.0    125.7    8.4x
  scheduling cycle                                  9.3      9.5    1.0x
worst query at 100,000 jobs: tiers 8.6 ms, ranked 90.3 ms (11x); tiers at 100,000 vs 10,000 jobs: 1.7x
"""


def test_history_scale_tables_are_read_under_its_figure_names():
    figures = ab.parse_figures(HISTORY_SCALE_V03, "bench/history_scale.py")
    assert figures["queue_history_last_7_days_500_rows.jobs_10000_ms"] == (131.5, "ms")
    assert figures["api_job_list_page_last.jobs_100000_ms"] == (125.7, "ms")
    assert figures["scheduling_cycle.jobs_100000_ms"] == (9.5, "ms")
    assert figures["worst_query.tiers_ms"] == (8.6, "ms")
    assert figures["worst_query.ranked_ms"] == (90.3, "ms")
    assert len(figures) == 3 * 2 + 2


METRICS_SCALE_V03 = """\
| pass over 512 endpoints, 4096 GPUs | measured | target |
|---|---|---|
| pass time, median / max of 3 | 2.18 / 2.44 s | < 15 s |
| pass time / interval | 0.15 | < 1 |
| fetch + parse | 1.67 s (77%) | |
| store | 0.42 s (19%) | |
| jobs | 0.08 s (4%) | |
| CPU time: parsers (in 2 processes) + collector process | 1.17 + 0.87 s | |
| CPU-bound pass on 2 idle cores (CPU time / cores; Postgres and exporter excluded) | 1.02 s | < 15 s |
"""


def test_metrics_scale_tables_are_read_under_its_figure_names():
    assert ab.parse_figures(METRICS_SCALE_V03, "bench/metrics_scale.py") == {
        "pass_s.median": (2.18, "s"),
        "pass_s.max": (2.44, "s"),
        "stage_s.fetch_parse": (1.67, "s"),
        "stage_s.store": (0.42, "s"),
        "stage_s.jobs": (0.08, "s"),
        "cpu_s.parsers": (1.17, "s"),
        "cpu_s.collector": (0.87, "s"),
        "cpu_bound_pass_s": (1.02, "s"),
    }


def test_list_items_in_json_are_named_by_index():
    out = '{"intervals": [{"poll_s": 30, "idle": {"rate": 8.5}}, {"poll_s": 60}], "ok": true}'
    assert ab.parse_figures(out, "bench/agents_scale.py") == {
        "intervals.0.poll_s": (30.0, ""),
        "intervals.0.idle.rate": (8.5, ""),
        "intervals.1.poll_s": (60.0, ""),
    }
