"""NIC byte counters in an agent's sync become the node's NIC rates, as an exporter's would; a bad
counter is a 400 naming the field and nothing of the sync is recorded."""

from __future__ import annotations

from datetime import timedelta

from apps.metrics.models import NicLatest

from .test_agents_api import NodeClients, sync


def test_two_syncs_give_a_nic_rate_and_bad_counters_are_refused(case44):
    nodes = NodeClients(case44)
    first = [{"device": "mlx5_0", "port": "1", "tx_bytes": 1_000_000, "rx_bytes": 2_000_000}]
    assert sync(nodes, "node-a", nics=first).status_code == 200
    row = NicLatest.objects.get(node__name="node-a", device="mlx5_0", port="1")
    assert (row.tx_bytes_total, row.tx_Bps) == (1_000_000, None)  # one reading: no rate yet
    earlier = row.at - timedelta(seconds=10)
    NicLatest.objects.filter(pk=row.pk).update(at=earlier)
    later = [{"device": "mlx5_0", "port": "1", "tx_bytes": 51_000_000, "rx_bytes": 2_000_000}]
    assert sync(nodes, "node-a", nics=later).status_code == 200
    row.refresh_from_db()
    # 50 MB over the time between the two readings' timestamps: 10 s and however long this test
    # took between its syncs (a tenth of a second on a busy machine), not over 10 s exactly.
    elapsed_s = (row.at - earlier).total_seconds()
    assert 10 <= elapsed_s < 70
    assert abs(row.tx_Bps - 50_000_000 / elapsed_s) < 1 and abs(row.rx_Bps) < 1

    for bad in (
        {"device": "mlx5_0; rm", "port": "1", "tx_bytes": 1},
        {"device": "mlx5_0", "port": "x", "tx_bytes": 1},
        {"device": "mlx5_0", "port": "1", "tx_bytes": -1},
        {"device": "mlx5_0", "port": "1", "tx_bytes": 2**63},
    ):
        answer = sync(nodes, "node-b", nics=[bad])
        assert answer.status_code == 400 and all(k.startswith("nics") for k in answer.json()), answer.json()
    assert not NicLatest.objects.filter(node__name="node-b").exists()
