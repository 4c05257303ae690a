"""Malformed topology files are rejected by `import_topology` with the entry and field, and
write nothing."""

import copy
import io

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.topology.models import Cluster

pytestmark = pytest.mark.django_db

VALID = {
    "version": 1,
    "name": "bad",
    "gpu_models": {"A100": {"peak_tflops": 312}},
    "switches": [{"name": "leaf-1", "tier": "leaf"}, {"name": "spine-1", "tier": "spine"}],
    "links": [{"a": "leaf-1", "b": "spine-1", "bw_GBps": 50, "latency_us": 1.0}],
    "nodes": [
        {
            "name": f"node-{x}",
            "gpu_model": "A100",
            "gpus": 8,
            "nvlink": {"domain": f"node-{x}", "bw_GBps": 450, "latency_us": 2.0},
            "nics": [
                {"name": "mlx5_0", "gpus": list(range(8)), "leaf": "leaf-1", "bw_GBps": 11, "latency_us": 1.5}
            ],
        }
        for x in ("a", "b")
    ],
}


def broken(change) -> dict:
    spec = copy.deepcopy(VALID)
    change(spec)
    return spec


def _generate(spec):
    spec.clear()
    spec.update(
        version=1,
        name="bad",
        generate={
            "shape": "fat-tree",
            "spines": 2,
            "leaves": 4,
            "nodes_per_leaf": 8,
            "gpus_per_node": 8,
            "gpu_model": "H100",
            "peak_tflops": 989,
            "nvlink_bw_GBps": 450,
            "nic_bw_GBps": 50,
            "nics_per_node": 3,
            "uplink_bw_GBps": 400,
        },
    )


# (case id, spec or raw text, expected field path, expected words of the message)
CASES = [
    ("yaml-syntax", "version: 1\nname: [unclosed\n", "(file)", "not valid YAML or JSON"),
    ("not-a-mapping", "- 1\n- 2\n", "(file)", "must be a mapping, got list"),
    ("wrong-version", broken(lambda s: s.update(version=2)), "version", "must be 1, got 2"),
    (
        "unknown-field",
        broken(lambda s: s["nodes"][1].update(colour="red")),
        "nodes[1].colour",
        "unknown field",
    ),
    (
        "missing-field",
        broken(lambda s: s["switches"][1].pop("tier")),
        "switches[1].tier",
        "required field is missing",
    ),
    (
        "unknown-leaf",
        broken(lambda s: s["nodes"][1]["nics"][0].update(leaf="leaf-9")),
        "nodes[1].nics[0].leaf",
        "unknown leaf switch 'leaf-9'",
    ),
    (
        "duplicate-node",
        broken(lambda s: s["nodes"][1].update(name="node-a")),
        "nodes[1].name",
        "duplicate node name 'node-a'",
    ),
    (
        "zero-bandwidth",
        broken(lambda s: s["links"][0].update(bw_GBps=0)),
        "links[0].bw_GBps",
        "must be positive",
    ),
    (
        "negative-latency",
        broken(lambda s: s["nodes"][0]["nvlink"].update(latency_us=-2)),
        "nodes[0].nvlink.latency_us",
        "must be positive",
    ),
    (
        "gpu-without-nic",
        broken(lambda s: s["nodes"][1]["nics"][0].update(gpus=[0, 1, 2, 3, 4, 5, 6])),
        "nodes[1].nics",
        "GPUs [7] of node 'node-b' have no NIC",
    ),
    (
        "gpu-on-two-nics",
        broken(
            lambda s: s["nodes"][0]["nics"].append(
                {"name": "mlx5_1", "gpus": [7], "leaf": "leaf-1", "bw_GBps": 11, "latency_us": 1.5}
            )
        ),
        "nodes[0].nics[1].gpus",
        "GPU 7 is already served by NIC 'mlx5_0'",
    ),
    (
        "leaf-to-leaf-link",
        broken(
            lambda s: (
                s["switches"].append({"name": "leaf-2", "tier": "leaf"}),
                s["links"].append({"a": "leaf-1", "b": "leaf-2", "bw_GBps": 50, "latency_us": 1.0}),
            )
        ),
        "links[1]",
        "links join adjacent tiers",
    ),
    ("generate-shape", broken(_generate), "generate.shape", "must be one of leaf-spine, rail-optimized"),
    ("name-too-long", broken(lambda s: s.update(name="x" * 101)), "name", "string of at most 100"),
]


@pytest.fixture
def existing(case44):
    """A cluster already in the database, which a rejected import must leave untouched."""
    return case44


@pytest.mark.parametrize(("case", "content", "field", "words"), CASES, ids=[c[0] for c in CASES])
def test_malformed_file_is_rejected_naming_the_field(
    case, content, field, words, tmp_path, existing, row_counts
):
    path = tmp_path / f"{case}.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    before = row_counts()
    stamp = Cluster.objects.get(pk=existing.pk).updated_at
    with pytest.raises(CommandError) as err:
        call_command("import_topology", str(path), stdout=io.StringIO())
    message = str(err.value)
    assert "nothing was imported" in message
    assert f"  {field}: " in message
    assert words in message
    assert row_counts() == before
    assert Cluster.objects.get(pk=existing.pk).updated_at == stamp


def test_a_missing_file_is_reported_by_path(db, tmp_path):
    with pytest.raises(CommandError, match="cannot read .*nope.yaml: No such file or directory"):
        call_command("import_topology", str(tmp_path / "nope.yaml"))


def test_the_command_exits_non_zero_on_a_bad_file(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(broken(lambda s: s["links"][0].update(bw_GBps=-1))))
    repo = Path(__file__).resolve().parents[3]
    env = {
        "PATH": "/usr/bin:/bin",
        "TOPOWEB_TESTING": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
    }
    run = subprocess.run(
        [sys.executable, "manage.py", "import_topology", str(path)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert "links[0].bw_GBps: must be positive, got -1" in run.stderr
