"""Every file of the converter corpus (tests/data/converters and the Apache-2.0 samples), one row
each: node count, GPUs per node, NVLink domain sizes, NICs per node with every GPU on exactly one
NIC, and whether a placed TP8 job stays inside one NVLink domain (where the machine has one)."""

from __future__ import annotations

from collections import Counter

import pytest

from .realfiles import DATA, SAMPLES, convert, domain_sizes, tp8_domains

MODELS = SAMPLES / "topograph_models"

# (format, files, values, nodes, {GPUs per node: nodes}, {domain GPUs: domains}, NICs per node)
CORPUS = [
    ("nvidia-smi", ["nvsmi-h100-spaces-legend.txt"], {}, 1, {8: 1}, {8: 1}, 8),
    ("nvidia-smi", ["nvsmi-h20-quoted-roce-frontend.txt"], {}, 1, {8: 1}, {8: 1}, 4),
    ("nvidia-smi", ["nvsmi-a100-old-driver-crlf.txt"], {}, 1, {8: 1}, {8: 1}, 4),
    ("nvidia-smi", ["nvsmi-gpus-only.txt"], {"nics_per_node": 4}, 1, {4: 1}, {4: 1}, 4),
    ("nccl-xml", ["nccl-p4d-efa-no-nvlink.xml"], {}, 1, {8: 1}, {8: 1}, 4),
    ("slurm-yaml", ["slurm-multi-topology.yaml"], {}, 36, {4: 36}, {72: 2}, 1),
    ("slurm-yaml", ["slurm-multi-topology.yaml", "slurm-gb200.slurm.conf"], {}, 36, {4: 36}, {72: 2}, 1),
    (
        "slurm-tree",
        ["slurm-tree-mixed.conf", "slurm-tree-mixed.gres.conf"],
        {},
        13,
        {4: 8, 2: 5},
        {4: 8, 2: 5},
        1,
    ),
    ("slurm-block", ["slurm-block-ultraservers.conf"], {}, 36, {4: 36}, {72: 2}, 1),
    ("topograph", ["topograph-capacity-blocks.yaml"], {}, 37, {4: 36, 8: 1}, {72: 2, 8: 1}, 1),
    ("topograph", ["topograph-annotated-nodes.yaml"], {}, 3, {8: 3}, {16: 1, 8: 1}, 1),
    ("kueue", ["k8s-gke-block-labels-only.json"], {}, 8, {8: 8}, {8: 8}, 1),
    ("kueue", ["k8s-rack-labels-only.yaml"], {}, 8, {4: 8}, {16: 2}, 1),
]
SAMPLE_CORPUS = [
    ("nccl-xml", ["nccl_topo_8xA100_4xCX6_aliyun_SimAI.xml"], SAMPLES, 1, {8: 1}, {8: 1}, 4),
    ("topograph", ["nvl72.yaml"], MODELS, 72, {4: 72}, {72: 4}, 1),
    ("topograph", ["large.yaml"], MODELS, 96, {8: 96}, {64: 12}, 1),
    ("slurm-block", ["topograph_expected.slinky-dra-block.conf"], SAMPLES, 96, {8: 96}, {64: 12}, 1),
    ("slurm-tree", ["topograph_expected.slinky-oci-sim-tree.conf"], SAMPLES, 96, {8: 96}, {8: 96}, 1),
]


def _check(topo, nodes, per_node, domains, nics):
    assert len(topo.nodes) == nodes
    assert dict(Counter(n.gpus for n in topo.nodes)) == per_node
    assert dict(Counter(domain_sizes(topo))) == domains
    for node in topo.nodes:
        assert len(node.nics) == nics
        assert sorted(g for nic in node.nics for g in nic.gpus) == list(range(node.gpus))
    if max(domain_sizes(topo)) >= 8:
        assert tp8_domains(topo) == 1
    elif topo.n_gpus >= 8:
        assert tp8_domains(topo) > 1


@pytest.mark.parametrize(("fmt", "files", "values", "nodes", "per_node", "domains", "nics"), CORPUS)
def test_corpus_file_converts_to_its_machine(fmt, files, values, nodes, per_node, domains, nics):
    _, topo = convert(fmt, *files, **values)
    _check(topo, nodes, per_node, domains, nics)


@pytest.mark.parametrize(("fmt", "files", "data", "nodes", "per_node", "domains", "nics"), SAMPLE_CORPUS)
def test_copied_sample_converts_to_its_machine(fmt, files, data, nodes, per_node, domains, nics):
    _, topo = convert(fmt, *files, data=data)
    _check(topo, nodes, per_node, domains, nics)


def test_every_corpus_file_has_a_row():
    listed = {f for _, files, *_ in CORPUS for f in files}
    present = {p.name for p in DATA.iterdir() if p.name != "README.md"}
    assert present == listed
