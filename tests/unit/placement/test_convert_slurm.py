"""Slurm topology.conf (tree, block) and topology.yaml import and export."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from apps.placement.convert import Defaults, Source, export_topology, import_sources
from apps.placement.convert.hostlist import expand
from apps.placement.jobs import load_job
from apps.placement.solvers import place
from apps.placement.topology import SpecError, load_topology
from tests.unit.placement.specs import generated, switch_node_sets

SAMPLES = Path(__file__).parent / "convert_samples"
SHARED = Path("/work/shared/data/slurm")


def convert(fmt, text, name="topology.conf", **defaults):
    imported = import_sources(fmt, [Source(name, text)], Defaults.from_mapping(defaults))
    return imported, imported.topology()


def test_tree_reads_comments_continuations_any_key_case_and_hostlists():
    text = (
        "# a comment\n"
        "switchname=s0 NODES=tux[0-3,12]   # trailing comment\n"
        "SwitchName=s1 \\\n"
        "   Nodes=tux[004-005]\n"
        "SWITCHNAME=s2 switches=s[0-1] LinkSpeed=100\n"
    )
    imported, topo = convert("slurm-tree", text, gpus_per_node=4)
    assert [n.name for n in topo.nodes] == ["tux0", "tux1", "tux2", "tux3", "tux12", "tux004", "tux005"]
    assert {s.name: s.tier for s in topo.switches} == {"s0": "leaf", "s1": "leaf", "s2": "spine"}
    assert all(n.gpus == 4 for n in topo.nodes)
    note = " ".join(imported.notes)
    assert "gpus_per_node=4," in note and "nic_bw_GBps=50.0 (default)" in note
    assert "LinkSpeed" in note


def test_link_speed_becomes_bandwidth_with_a_unit():
    text = "SwitchName=s0 Nodes=a[1-2] LinkSpeed=100\nSwitchName=s1 Switches=s0\n"
    _, topo = convert("slurm-tree", text, link_speed_unit_GBps=0.5)
    assert [lk.bw_GBps for lk in topo.links] == [50.0]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("SwitchName=s0 Nodes=a[1-2]\n\nSwitchName=s1 Nodes=b[1-\n", 3, "unclosed"),
        ("SwitchName=s0 Nodes=a1\nSwitchName=s1 Switches=s9\n", 2, "unknown switch 's9'"),
        ("SwitchName=s0 Nodes=a1\nSwitchName=s0 Nodes=a2\n", 2, "already defined"),
        ("SwitchName=s0 Nodes=a1 Color=red\n", 1, "unknown key"),
        ("# x\nBlockName=b1 Nodes=a1\n", 2, "block topology"),
        ("SwitchName=s0 Nodes=a1\nFrobName=x\n", 2, "unknown statement"),
        (
            "SwitchName=s0 Nodes=a1\nSwitchName=s1 Nodes=a2\nSwitchName=s2 Switches=s0\n",
            2,
            "no common parent",
        ),
    ],
)
def test_tree_errors_name_the_file_line(text, line, message):
    with pytest.raises(SpecError) as exc:
        convert("slurm-tree", text)
    where, msg = exc.value.errors[0]
    assert where == f"topology.conf:{line}"
    assert message in msg


def test_spec_rule_violations_point_at_the_line_that_made_the_node():
    text = "SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=b1\nSwitchName=s2 Switches=s[0-1]\n"
    with pytest.raises(SpecError) as exc:
        convert("slurm-tree", text, gpus_per_node=6, nics_per_node=4)
    assert exc.value.errors[0][0] == "topology.conf:1"
    assert "must divide" in exc.value.errors[0][1]


def test_unconnected_switches_get_a_common_parent_and_a_note():
    imported, topo = convert("slurm-tree", "SwitchName=s0 Nodes=a1\nSwitchName=s1 Nodes=b1\n")
    assert {s.name: s.tier for s in topo.switches}["root"] == "spine"
    assert any("added switch 'root'" in n for n in imported.notes)
    assert topo.path(0, 8).level == "spine"


def test_blocks_become_nvlink_domains_and_leaves():
    text = "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n"
    imported, topo = convert("slurm-block", text, name="blk")
    assert sorted(topo.domains) == ["b1", "b2"]
    assert topo.domains["b1"].nodes == ("n1", "n2", "n3", "n4")
    assert any("BlockSizes=4,8" in n for n in imported.notes)
    with pytest.raises(SpecError, match="base block size"):
        convert("slurm-block", "BlockName=b1 Nodes=n[1-2]\nBlockSizes=4\n")


@pytest.mark.parametrize("fmt", ["slurm-tree", "slurm-block", "slurm-yaml"])
def test_exports_re_import_to_the_same_switch_to_node_sets(fmt):
    topo = load_topology(generated(spines=2, leaves=4, nodes_per_leaf=3, nics_per_node=1))
    text = export_topology(fmt, topo)
    _, back = convert(fmt, text, gpus_per_node=4)
    assert {n.name for n in back.nodes} == {n.name for n in topo.nodes}
    if fmt == "slurm-block":
        assert switch_node_sets(back)["leaf"] == switch_node_sets(topo)["leaf"]
    else:
        assert switch_node_sets(back) == switch_node_sets(topo)


def test_block_export_derives_blocks_from_nvlink_domains_with_valid_sizes():
    topo = load_topology(generated(leaves=2, nodes_per_leaf=4, nvlink_domain_nodes=2, nics_per_node=1))
    text = export_topology("slurm-block", topo)
    blocks = re.findall(r"^BlockName=(\S+) Nodes=(\S+)$", text, re.M)
    assert [set(expand(n)) for _, n in blocks] == [set(d.nodes) for d in topo.domains.values()]
    sizes = [int(x) for x in re.search(r"^BlockSizes=(\S+)$", text, re.M).group(1).split(",")]
    assert sizes == [2, 4, 8]
    assert all(b % sizes[0] == 0 and (b // sizes[0]) & (b // sizes[0] - 1) == 0 for b in sizes)


def test_topology_yaml_imports_the_cluster_default_or_the_named_one():
    text = (
        "- topology: t1\n  cluster_default: false\n  tree:\n    switches:\n"
        "    - switch: s0\n      nodes: a[1-2]\n"
        "- topology: t2\n  cluster_default: true\n  block:\n    block_sizes: [2]\n    blocks:\n"
        "    - block: b1\n      nodes: c[1-2]\n"
        "- topology: t3\n  flat: true\n"
    )
    imported, topo = convert("slurm-yaml", text, name="y")
    assert [n.name for n in topo.nodes] == ["c1", "c2"]
    assert "imported 't2'" in " ".join(imported.notes)
    _, topo = convert("slurm-yaml", text, topology="t1")
    assert [n.name for n in topo.nodes] == ["a1", "a2"]
    with pytest.raises(SpecError) as exc:
        convert("slurm-yaml", text, topology="t3")
    assert exc.value.errors[0][0] == "topology.conf:14"


def _expected_conf(path: Path):
    """The statements of a topograph expected file, switches renamed by its `# a=b` comments."""
    text = path.read_text()
    rename = dict(re.findall(r"^# (\S+)=(\S+)$", text, re.M))
    out = {}
    for name, key, members in re.findall(r"^(?:Switch|Block)Name=(\S+) (\w+)=(\S+)$", text, re.M):
        names = [rename.get(m, m) for m in expand(members)]
        out[rename.get(name, name)] = (key, frozenset(names))
    sizes = re.search(r"^BlockSizes=(\S+)$", text, re.M)
    return out, sizes.group(1) if sizes else None


def _ours(text: str):
    out = {}
    for name, key, members in re.findall(r"^(?:Switch|Block)Name=(\S+) (\w+)=(\S+)$", text, re.M):
        out[name] = (key, frozenset(expand(members)))
    sizes = re.search(r"^BlockSizes=(\S+)$", text, re.M)
    return out, sizes.group(1) if sizes else None


@pytest.mark.parametrize(
    ("expected", "fmt"),
    [
        ("topograph_expected.slinky-oci-sim-tree.conf", "slurm-tree"),
        ("topograph_expected.slinky-dra-block.conf", "slurm-block"),
    ],
)
def test_topograph_expected_slurm_outputs_are_reproduced_from_its_model(expected, fmt):
    model = SAMPLES / "topograph_models" / "large.yaml"
    imported = import_sources("topograph", [Source("large.yaml", model.read_text())])
    ours = _ours(export_topology(fmt, imported.topology()))
    want = _expected_conf(SAMPLES / expected)
    assert ours == want


def _shared_parts():
    """(file, format, text) of every Slurm sample, the concatenated examples split at `# ===`."""
    if not SHARED.is_dir():
        return []
    out = []
    for path in sorted(SHARED.iterdir()):
        text = path.read_text()
        if path.suffix == ".yaml":
            out.append((path.name, "slurm-yaml", text))
            continue
        lines = text.splitlines(keepends=True)
        cuts = [i for i, ln in enumerate(lines) if ln.startswith("# === ")] or [0]
        for a, b in zip(cuts, [*cuts[1:], len(lines)], strict=True):
            # Blank lines keep each part's line numbers those of the file.
            part = "\n" * a + "".join(lines[a:b])
            fmt = "slurm-block" if re.search(r"^BlockName=", part, re.M) else "slurm-tree"
            out.append((f"{path.name}:{a + 1}", fmt, part))
    return out


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared Slurm samples are not here")
@pytest.mark.parametrize(
    ("name", "fmt", "text"), _shared_parts(), ids=lambda v: v if isinstance(v, str) and len(v) < 80 else ""
)
def test_every_shared_slurm_sample_imports(name, fmt, text):
    imported, topo = convert(fmt, text, name=name.split(":")[0])
    names = set()
    for members in re.findall(r"Nodes=(\S+)", text) + re.findall(r"nodes: (\S+)", text):
        names |= set(expand(members))
    assert {n.name for n in topo.nodes} <= names
    assert topo.n_gpus == 8 * len(topo.nodes)
    assert imported.notes


def test_a_tree_naming_too_many_nodes_is_refused_at_its_line():
    text = "".join(f"SwitchName=s{k} Nodes=r{k}n[1-60000]\n" for k in range(2))
    with pytest.raises(SpecError) as exc:
        convert("slurm-tree", text)
    assert exc.value.errors[0][0] == "topology.conf:2" and "more than 100000 nodes" in exc.value.errors[0][1]


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [("gpu:8", 8), ("gpu:h100:4", 4), ("gpu:8(S:0-1)", 8), ("gpu:h100", 1), ("gpu:a:2,gpu:b:3", 5)],
)
def test_node_gres_count_without_a_type_is_the_count(gres, gpus):
    # "gpu:8", as slurm.conf and slurmrestd write it, is 8 GPUs, not one GPU of type "8".
    nodes = Source("slurm.conf", f"NodeName=n[1-2] Gres={gres}\n")
    imported = import_sources(
        "slurm-tree", [Source("topology.conf", "SwitchName=s1 Nodes=n[1-2]\n"), nodes], Defaults()
    )
    topo = imported.topology()
    assert topo.n_gpus == 2 * gpus


def test_typed_gres_become_models_a_job_can_ask_for():
    # Known types become their SXM model; any other type is a model of its own name.
    nodes = Source("slurm.conf", "NodeName=a[1-2] Gres=gpu:h100:8\nNodeName=b[1-2] Gres=gpu:l40s:8\n")
    tree = Source("topology.conf", "SwitchName=s1 Nodes=a[1-2],b[1-2]\n")
    topo = import_sources("slurm-tree", [tree, nodes], Defaults()).topology()
    assert {n.name: n.gpu_model for n in topo.nodes} == {
        "a1": "H100-SXM5-80GB",
        "a2": "H100-SXM5-80GB",
        "b1": "l40s",
        "b2": "l40s",
    }
    assert topo.gpu_models["H100-SXM5-80GB"].peak_tflops == 989.0
    job = load_job(
        {
            "version": 1,
            "name": "l40s-only",
            "gpus": 8,
            "gpu_models": ["l40s"],
            "parallelism": {"dp": 8},
            "step": {"compute_ms": 10},
            "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8}],
        }
    )
    got = place(topo, np.ones(topo.n_gpus, dtype=bool), None, job)
    assert {topo.nodes[topo.gpu_node[g]].gpu_model for g in got.gids} == {"l40s"}
