"""1F1B pipelines (`step.microbatches`): the bubble in the compute part and pipeline sends hidden
behind the next microbatch's compute except on the fill and the drain, as closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from apps.placement.bounds import lower_bound
from apps.placement.costmodel import evaluate, p2p_ms
from apps.placement.jobs import job_to_spec, load_job
from apps.placement.topology import SpecError
from tests.unit.placement.test_link_aware import cluster, node


def pipeline(microbatches=None, pp=4, count=16, nbytes=1e8, compute_ms=100.0, overlap=None):
    step = {"compute_ms": compute_ms} | ({} if microbatches is None else {"microbatches": microbatches})
    entry = {"group": "pp", "collective": "p2p", "bytes": nbytes, "count": count}
    return load_job(
        {
            "version": 1,
            "name": "pipe",
            "gpus": pp,
            "parallelism": {"tp": 1, "pp": pp, "dp": 1},
            "step": step,
            "comm": [entry | ({} if overlap is None else {"overlap": overlap})],
        }
    )


@pytest.fixture(scope="module")
def four_nodes():
    return cluster([node(f"n{i}", 8) for i in range(4)])


def _one_per_node(topo):
    return np.array([topo.gid(f"n{i}", 0) for i in range(4)])


def test_without_microbatches_every_send_is_exposed(four_nodes):
    p = evaluate(four_nodes, pipeline(), _one_per_node(four_nodes))
    hop = p2p_ms(1e8, 50, 3.0)
    assert p.comm_ms == pytest.approx(16 * hop)
    assert p.step_ms == pytest.approx(100 + 16 * hop)


def test_1f1b_adds_the_bubble_and_hides_sends_shorter_than_a_microbatch(four_nodes):
    # m = 8 microbatches of 12.5 ms compute; a 2 ms send hides behind the next one, except the
    # 2(pp-1) = 6 on the fill and the drain.
    p = evaluate(four_nodes, pipeline(microbatches=8), _one_per_node(four_nodes))
    hop = p2p_ms(1e8, 50, 3.0)
    assert hop < 100 / 8
    assert p.comm_ms == pytest.approx(16 * hop)
    assert p.step_ms == pytest.approx(100 * (8 + 3) / 8 + 6 * hop)


def test_1f1b_sends_longer_than_a_microbatch_expose_their_excess(four_nodes):
    # 1 GB sends take 20 ms against 100/16 = 6.25 ms of compute per microbatch.
    p = evaluate(four_nodes, pipeline(microbatches=16, nbytes=1e9), _one_per_node(four_nodes))
    hop = p2p_ms(1e9, 50, 3.0)
    exposed = 6 * hop + (hop - 100 / 16) * (16 - 6)
    assert p.step_ms == pytest.approx(100 * (16 + 3) / 16 + exposed)


def test_the_bound_step_stays_below_1f1b_placements(four_nodes):
    j = pipeline(microbatches=8, overlap=0.2)
    bound = lower_bound(four_nodes, j)
    rng = np.random.default_rng(2)
    for _ in range(20):
        gids = rng.permutation(four_nodes.n_gpus)[:4]
        assert evaluate(four_nodes, j, gids).step_ms >= bound.step_ms * (1 - 1e-9)


def test_microbatches_round_trip_and_are_checked_by_field():
    j = pipeline(microbatches=8)
    assert load_job(job_to_spec(j)) == j
    spec = job_to_spec(j)
    spec["step"]["microbatches"] = 0
    with pytest.raises(SpecError) as err:
        load_job(spec)
    assert "step.microbatches" in err.value.as_dict()
