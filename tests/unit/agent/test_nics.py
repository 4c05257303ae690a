"""The agent's NIC byte counters from a sysfs tree of the test's own: InfiniBand counters are
4-byte words, network interfaces bytes; the loopback and unreadable counters are left out."""

from __future__ import annotations

from apps.agent.__main__ import parse_args
from apps.agent.nics import MAX_NICS, nic_counters
from apps.agent.runner import Agent


def fake_sysfs(root, ib=None, net=None):
    for (device, port), (tx, rx) in (ib or {}).items():
        counters = root / "class" / "infiniband" / device / "ports" / port / "counters"
        counters.mkdir(parents=True)
        (counters / "port_xmit_data").write_text(f"{tx}\n")
        (counters / "port_rcv_data").write_text(f"{rx}\n")
    for name, (tx, rx) in (net or {}).items():
        stats = root / "class" / "net" / name / "statistics"
        stats.mkdir(parents=True)
        (stats / "tx_bytes").write_text(f"{tx}\n")
        (stats / "rx_bytes").write_text(f"{rx}\n")
    return root


def test_infiniband_words_become_bytes_and_interfaces_are_read_as_bytes(tmp_path):
    root = fake_sysfs(
        tmp_path,
        ib={("mlx5_1", "1"): (250, 10), ("mlx5_0", "1"): (1000, 2000), ("mlx5_0", "2"): (0, 1)},
        net={"eth0": (5000, 6000), "lo": (9, 9)},
    )
    assert nic_counters(root) == [
        {"device": "mlx5_0", "port": "1", "tx_bytes": 4000, "rx_bytes": 8000},
        {"device": "mlx5_0", "port": "2", "tx_bytes": 0, "rx_bytes": 4},
        {"device": "mlx5_1", "port": "1", "tx_bytes": 1000, "rx_bytes": 40},
        {"device": "eth0", "port": "0", "tx_bytes": 5000, "rx_bytes": 6000},
    ]


def test_unreadable_or_garbage_counters_are_left_out_and_the_rest_still_go(tmp_path):
    root = fake_sysfs(tmp_path, ib={("mlx5_0", "1"): ("garbage", 7)}, net={"eth0": (-5, "x"), "eth1": (3, 4)})
    (tmp_path / "class" / "net" / "bad name!").mkdir()
    assert nic_counters(root) == [
        {"device": "mlx5_0", "port": "1", "tx_bytes": None, "rx_bytes": 28},
        {"device": "eth1", "port": "0", "tx_bytes": 3, "rx_bytes": 4},
    ]
    assert nic_counters(tmp_path / "nowhere") == []


def test_at_most_max_nics_ports_go_in_one_sync(tmp_path):
    root = fake_sysfs(tmp_path, net={f"eth{i:03d}": (i, i) for i in range(MAX_NICS + 10)})
    assert len(nic_counters(root)) == MAX_NICS


def test_the_sync_body_carries_the_counters_from_the_configured_root(tmp_path):
    root = fake_sysfs(tmp_path / "sys", ib={("mlx5_0", "1"): (10, 20)})
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path / "logs", sysfs_root=root)
    assert agent._body([], 0.0)["nics"] == [{"device": "mlx5_0", "port": "1", "tx_bytes": 40, "rx_bytes": 80}]
    quiet = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path / "logs2")
    assert quiet._body([], 0.0)["nics"] == []
    assert parse_args(["--server", "s", "--token-file", "t"]).sysfs_root == "/sys"
    assert parse_args(["--server", "s", "--token-file", "t", "--sysfs-root", str(root)]).sysfs_root == str(
        root
    )
