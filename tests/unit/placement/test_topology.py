"""Topology spec v1: generator shapes, the path model, round trips and malformed files."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.placement.topology import (
    LEVEL_RANK,
    SpecError,
    generate_spec,
    load_topology,
    parse_spec_text,
    topology_to_spec,
)
from tests.unit.placement.specs import generated, hetero_spec

# --------------------------------------------------------------------------- generator shapes


def test_leaf_spine_puts_every_nic_of_a_node_under_its_one_leaf(pod256):
    assert (len(pod256.nodes), pod256.n_gpus) == (32, 256)
    assert pod256.leaf_names == ("leaf-1", "leaf-2", "leaf-3", "leaf-4")
    assert len(pod256.links) == 4 * 2
    for i, node in enumerate(pod256.nodes):
        assert node.name == f"node-{i + 1:03d}"
        assert {nic.leaf for nic in node.nics} == {f"leaf-{i // 8 + 1}"}
    assert pod256.leaf_uplink_total_bw.tolist() == [800.0] * 4


def test_rail_optimized_cables_nic_i_of_each_unit_to_the_units_leaf_i(rail):
    # 2 units x 2 nodes, 4 rails: unit 1 is node-001..002 on leaves 1-4, unit 2 on leaves 5-8.
    for n, node in enumerate(rail.nodes):
        unit = n // 2
        assert [nic.leaf for nic in node.nics] == [f"leaf-{unit * 4 + k + 1}" for k in range(4)]
    same_rail_same_unit = rail.path(rail.gid("node-001", 0), rail.gid("node-002", 0))
    cross_rail = rail.path(rail.gid("node-001", 0), rail.gid("node-002", 1))
    cross_unit = rail.path(rail.gid("node-001", 0), rail.gid("node-003", 0))
    assert same_rail_same_unit.level == "leaf"
    assert cross_rail.level == "spine"
    assert cross_unit.level == "spine"


def test_pods_meet_at_core_switches_and_leaves_link_only_to_their_pods_spines(pods):
    spines_of = {}
    for lk in pods.links:
        spines_of.setdefault(lk.a, set()).add(lk.b)
    assert spines_of["leaf-1"] == {"spine-1", "spine-2"}
    assert spines_of["leaf-3"] == {"spine-3", "spine-4"}
    assert spines_of["spine-3"] == {"core-1", "core-2"}
    g = pods.gid("node-001", 0)
    assert pods.path(g, pods.gid("node-003", 0)).level == "spine"
    far = pods.path(g, pods.gid("node-005", 0))
    # min(NIC 50, leaf->spine 80, spine->core 100); 2 NICs + 2 uplinks + 2 core links of latency.
    assert far == type(far)(50.0, 1.5 * 2 + 1.0 * 2 + 1.0 * 2, "core")


def test_nvlink_domain_nodes_makes_racks_of_consecutive_nodes_one_domain():
    topo = load_topology(generated(leaves=2, nodes_per_leaf=18, nvlink_domain_nodes=18))
    assert topo.domain_names == ("node-001", "node-019")
    assert topo.domains["node-001"].nodes == tuple(f"node-{i:03d}" for i in range(1, 19))
    assert topo.path(topo.gid("node-001", 0), topo.gid("node-018", 3)).level == "nvlink"
    assert topo.path(topo.gid("node-018", 0), topo.gid("node-019", 0)).level == "spine"


def test_node_names_widen_to_the_node_count_past_999_nodes():
    spec = generate_spec(
        "big", generated(leaves=2, nodes_per_leaf=1024, gpus_per_node=1, nics_per_node=1)["generate"]
    )
    names = [n["name"] for n in spec["nodes"]]
    assert names[0] == "node-0001" and names[-1] == "node-2048"


# --------------------------------------------------------------------------- path model


def test_case_4_4_paths_are_nvlink_inside_a_node_and_the_nic_between_nodes(case44):
    a0, a7, b0 = case44.gid("node-a", 0), case44.gid("node-a", 7), case44.gid("node-b", 0)
    assert case44.path(a0, a7) == type(case44.path(a0, a7))(450.0, 2.0, "nvlink")
    assert case44.path(a0, b0) == type(case44.path(a0, b0))(11.0, 3.0, "leaf")


def test_a_slow_uplink_is_the_cross_leaf_bottleneck():
    topo = load_topology(generated(uplink_bw_GBps=20))
    p = topo.path(topo.gid("node-001", 0), topo.gid("node-003", 0))
    assert (p.bw_GBps, p.latency_us, p.level) == (20.0, 1.5 + 1.5 + 1.0 + 1.0, "spine")


def test_parallel_cables_between_two_switches_add_up(hetero):
    leaf1 = hetero.leaf_by_name["leaf-1"]
    assert hetero.leaf_spine_bw[leaf1] == 150.0
    assert hetero.leaf_uplink_total_bw[leaf1] == 150.0


def test_gid_and_gpu_key_invert_each_other_and_free_mask_marks_busy(case44):
    assert [case44.gpu_key(case44.gid(n, i)) for n, i in [("node-a", 3), ("node-b", 7)]] == [
        ("node-a", 3),
        ("node-b", 7),
    ]
    mask = case44.free_mask([("node-b", 0)])
    assert mask.sum() == 15 and not mask[8]
    with pytest.raises(KeyError):
        case44.gid("node-a", 8)


def _brute(topo, gids):
    pairs = [topo.path(g, h) for g, h in itertools.combinations(gids, 2)]
    return (
        min(p.bw_GBps for p in pairs),
        max(p.latency_us for p in pairs),
        max((p.level for p in pairs), key=LEVEL_RANK.__getitem__),
    )


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_group_path_bandwidth_and_level_equal_the_slowest_pair(hetero, data):
    gids = data.draw(st.lists(st.integers(0, hetero.n_gpus - 1), min_size=2, max_size=12, unique=True))
    bw, lat, level = _brute(hetero, gids)
    p = hetero.group_path(gids)
    assert (p.bw_GBps, p.level) == (bw, level)
    # Latency sums the slowest components, so it never undercuts the slowest pair.
    assert p.latency_us >= lat


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_group_path_latency_equals_the_slowest_pair_when_tiers_are_uniform(pods, data):
    gids = data.draw(st.lists(st.integers(0, pods.n_gpus - 1), min_size=2, max_size=10, unique=True))
    bw, lat, level = _brute(pods, gids)
    p = pods.group_path(gids)
    assert (p.bw_GBps, p.level) == (bw, level)
    assert p.latency_us == pytest.approx(lat)


def test_group_with_a_standalone_gpu_and_another_domain_cannot_communicate(hetero):
    p = hetero.group_path([hetero.gid("n6", 0), hetero.gid("n5", 0)])
    assert (p.bw_GBps, p.latency_us, p.level) == (0.0, math.inf, "core")


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize(
    "make", [lambda: generated(), lambda: generated("rail-optimized", leaves=4), hetero_spec]
)
def test_topology_to_spec_round_trips_through_load_topology(make):
    topo = load_topology(make())
    spec = topology_to_spec(topo)
    again = load_topology(spec)
    assert topology_to_spec(again) == spec
    for name in (
        "gpu_domain",
        "gpu_leaf",
        "gpu_nic_bw",
        "leaf_spine_bw",
        "leaf_uplink_total_bw",
        "pod_core_bw",
    ):
        assert np.array_equal(getattr(again, name), getattr(topo, name)), name


def test_yaml_exponent_numbers_are_read_as_floats():
    assert parse_spec_text("bytes: 1.2e9\nflops: 2.6E+14\nn: 12\nname: 1e") == {
        "bytes": 1.2e9,
        "flops": 2.6e14,
        "n": 12,
        "name": "1e",
    }


# --------------------------------------------------------------------------- malformed files


def _case():
    return {
        "version": 1,
        "name": "c",
        "gpu_models": {"A100": {"peak_tflops": 312}},
        "switches": [{"name": "leaf-1", "tier": "leaf"}, {"name": "spine-1", "tier": "spine"}],
        "links": [{"a": "leaf-1", "b": "spine-1", "bw_GBps": 50, "latency_us": 1.0}],
        "nodes": [
            {
                "name": f"node-{x}",
                "gpu_model": "A100",
                "gpus": 2,
                "nvlink": {"domain": f"node-{x}", "bw_GBps": 450, "latency_us": 2.0},
                "nics": [
                    {"name": "mlx5_0", "gpus": [0, 1], "leaf": "leaf-1", "bw_GBps": 11, "latency_us": 1.5}
                ],
            }
            for x in "ab"
        ],
    }


def _set(path, value):
    def mutate(spec):
        *head, last = path
        obj = spec
        for k in head:
            obj = obj[k]
        if value is KeyError:
            del obj[last]
        else:
            obj[last] = value
        return spec

    return mutate


MALFORMED = [
    (_set(["colour"], "red"), "colour", "unknown field"),
    (_set(["version"], 2), "version", "must be 1"),
    (_set(["name"], KeyError), "name", "required field is missing"),
    (_set(["switches", 1, "name"], "leaf-1"), "switches[1].name", "duplicate switch name"),
    (_set(["switches", 0, "tier"], "tor"), "switches[0].tier", "must be one of leaf, spine, core"),
    (_set(["links", 0, "b"], "spine-9"), "links[0].b", "unknown switch 'spine-9'"),
    (_set(["links", 0, "bw_GBps"], -5), "links[0].bw_GBps", "must be positive"),
    (_set(["links", 0, "latency_us"], "fast"), "links[0].latency_us", "must be a number"),
    (_set(["nodes", 0, "gpu_model"], "V100"), "nodes[0].gpu_model", "unknown GPU model 'V100'"),
    (_set(["nodes", 0, "nics", 0, "gpus"], [0]), "nodes[0].nics", "have no NIC"),
    (
        _set(["nodes", 0, "nics", 0, "gpus"], [0, 1, 2]),
        "nodes[0].nics[0].gpus",
        "GPU index 2 is not on this node",
    ),
    (_set(["nodes", 0, "nics", 0, "leaf"], "spine-1"), "nodes[0].nics[0].leaf", "unknown leaf switch"),
    (_set(["nodes", 1, "name"], "node-a"), "nodes[1].name", "duplicate node name"),
    (
        _set(["nodes", 1, "nvlink"], {"domain": "node-a", "bw_GBps": 300, "latency_us": 2.0}),
        "nodes[1].nvlink",
        "share one value",
    ),
    (_set(["nodes", 0, "dcgm_url"], "node-a:9400"), "nodes[0].dcgm_url", "must be an http(s) URL"),
    (_set(["nodes", 0, "standalone"], True), "nodes[0].standalone", "a standalone node has no NICs"),
    (_set(["nodes", 0, "gpus"], 0), "nodes[0].gpus", "must be at least 1"),
    (_set(["nodes", 0, "nvlink", "bw_GBps"], 0), "nodes[0].nvlink.bw_GBps", "must be positive"),
]


@pytest.mark.parametrize(("mutate", "field", "fragment"), MALFORMED, ids=[m[1] for m in MALFORMED])
def test_malformed_topology_is_rejected_naming_entry_and_field(mutate, field, fragment):
    spec = mutate(_case())
    with pytest.raises(SpecError) as exc:
        load_topology(spec)
    messages = exc.value.as_dict().get(field, [])
    assert any(fragment in m for m in messages), exc.value.as_dict()


def test_a_gpu_served_by_two_nics_is_rejected():
    spec = _case()
    spec["nodes"][0]["nics"].append(
        {"name": "mlx5_1", "gpus": [1], "leaf": "leaf-1", "bw_GBps": 11, "latency_us": 1.5}
    )
    with pytest.raises(SpecError) as exc:
        load_topology(spec)
    assert "already served by NIC 'mlx5_0'" in exc.value.as_dict()["nodes[0].nics[1].gpus"][0]


def test_a_leaf_with_no_path_to_the_others_is_rejected():
    spec = _case()
    spec["switches"].append({"name": "leaf-2", "tier": "leaf"})
    spec["nodes"][1]["nics"][0]["leaf"] = "leaf-2"
    with pytest.raises(SpecError) as exc:
        load_topology(spec)
    assert "no path to leaf 'leaf-1'" in exc.value.as_dict()["links"][0]


def test_a_link_between_two_leaves_is_rejected():
    spec = _case()
    spec["switches"].append({"name": "leaf-2", "tier": "leaf"})
    spec["links"].append({"a": "leaf-1", "b": "leaf-2", "bw_GBps": 10, "latency_us": 1.0})
    with pytest.raises(SpecError) as exc:
        load_topology(spec)
    assert "adjacent tiers" in exc.value.as_dict()["links[1]"][0]


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"shape": "torus"}, "generate.shape", "must be one of"),
        ({"nics_per_node": 3}, "generate.nics_per_node", "must divide gpus_per_node"),
        ({"shape": "rail-optimized", "leaves": 6}, "generate.leaves", "multiple of nics_per_node"),
        ({"pods": 2}, "generate.cores", "at least 1 when pods > 1"),
        ({"nvlink_domain_nodes": 3}, "generate.nvlink_domain_nodes", "must divide the node count"),
        ({"racks": 2}, "generate.racks", "unknown field"),
    ],
)
def test_malformed_generate_block_is_rejected_naming_the_field(overrides, field, fragment):
    with pytest.raises(SpecError) as exc:
        load_topology(generated(**overrides))
    assert any(fragment in m for m in exc.value.as_dict()[field]), exc.value.as_dict()


def test_unparseable_text_is_a_spec_error():
    with pytest.raises(SpecError, match="not valid YAML or JSON"):
        parse_spec_text("nodes: [unclosed")


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


JUNK = [None, -1, 0, 2.5, "x", "", True, [], {}, [1, "a"], {"a": 1}, float("nan")]


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_any_single_bad_value_is_a_spec_error_never_a_crash(data):
    spec = _case()
    path = data.draw(st.sampled_from([p for p in _paths(spec) if p]))
    junk = data.draw(st.sampled_from(JUNK))
    _set(list(path), junk)(spec)
    try:
        load_topology(spec)
    except SpecError as exc:
        assert exc.errors and all(isinstance(f, str) and m for f, m in exc.errors)


def test_nvls_defaults_from_the_gpu_model_and_the_spec_may_set_it():
    def nvls(**gen):
        return load_topology(generated(**gen)).domain_nvls.tolist()

    # H100 boards of 8 (NVSwitch gen 3) and GB200 racks run NVLS; A100 boards, 4-GPU boards
    # (no switch) and PCIe cards do not.
    assert set(nvls(gpus_per_node=8, nics_per_node=8, gpu_model="H100-SXM5-80GB")) == {0.85}
    assert set(nvls(gpus_per_node=4, nvlink_domain_nodes=2, gpu_model="GB200")) == {0.74}
    assert set(nvls(gpus_per_node=8, nics_per_node=8, gpu_model="A100-SXM4-80GB")) == {0.0}
    assert set(nvls(gpus_per_node=4, gpu_model="H100-SXM5-80GB")) == {0.0}
    assert set(nvls(gpus_per_node=8, nics_per_node=8, gpu_model="H100-PCIe")) == {0.0}
    # The spec overrides the default either way, and survives the round trip.
    assert set(nvls(gpus_per_node=8, nics_per_node=8, gpu_model="H100-SXM5-80GB", nvls=False)) == {0.0}
    assert set(nvls(gpus_per_node=4, gpu_model="A100", nvls=True)) == {0.85}
    topo = load_topology(generated(gpus_per_node=8, nics_per_node=8, gpu_model="H100", nvls=False))
    again = load_topology(topology_to_spec(topo))
    assert again.domain_nvls.tolist() == topo.domain_nvls.tolist() == [0.0] * 4


def test_nvls_must_be_a_boolean_and_agree_across_a_domain():
    with pytest.raises(SpecError, match=r"generate.nvls: must be true or false"):
        load_topology(generated(nvls="yes"))
    spec = topology_to_spec(load_topology(generated(nvlink_domain_nodes=2)))
    spec["nodes"][0]["nvlink"]["nvls"] = 1
    with pytest.raises(SpecError, match=r"nodes\[0\].nvlink.nvls: must be true or false"):
        load_topology(spec)
    spec["nodes"][0]["nvlink"]["nvls"] = True
    spec["nodes"][1]["nvlink"]["nvls"] = False
    with pytest.raises(SpecError, match=r"nodes\[1\].nvlink.nvls: domain 'node-001' already has nvls True"):
        load_topology(spec)
