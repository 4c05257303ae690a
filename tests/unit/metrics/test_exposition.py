"""Parsing real dcgm-exporter scrapes with prometheus-client's parser: fields, units, MIG, ranges."""

import pytest

from apps.metrics.exposition import parse_scrape

from .conftest import A100_MIG, H100_EKS


def test_a100_under_load_keeps_tensor_active_and_the_mig_instance_apart():
    scrape = parse_scrape(A100_MIG.read_text(), n_gpus=8)
    assert set(scrape.gpus) == {(0, ""), (0, "13")}
    whole = scrape.gpus[(0, "")].values
    assert whole["tensor_active"] == pytest.approx(0.92926)
    assert whole["power_W"] == pytest.approx(409.692)
    assert whole["pcie_rx_Bps"] == pytest.approx(97863601)
    assert scrape.gpus[(0, "13")].values["tensor_active"] == pytest.approx(0.930433)


def test_an_absent_field_is_absent_not_zero():
    values = parse_scrape(A100_MIG.read_text(), n_gpus=8).gpus[(0, "")].values
    assert "gpu_util" not in values  # this exporter was not configured to send GPU_UTIL
    assert "nvlink_tx_Bps" not in values


def test_eight_h100s_map_to_eight_gpus_with_utilisation_as_a_fraction():
    scrape = parse_scrape(H100_EKS.read_text(), n_gpus=8)
    assert sorted(g for g, _ in scrape.gpus) == list(range(8))
    assert all(0.0 <= r.values["gpu_util"] <= 1.0 for r in scrape.gpus.values())
    assert scrape.gpus[(0, "")].values["temp_C"] == 30


def test_values_outside_physical_ranges_and_unknown_gpus_are_rejected_not_stored():
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 900\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0"} NaN\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="9"} 0.5\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="x"} 0.5\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1"} 1.0004\n'
    )
    scrape = parse_scrape(text, n_gpus=8)
    assert scrape.rejected_count == 4
    assert scrape.gpus[(1, "")].values == {"tensor_active": 1.0}
    assert (0, "") not in scrape.gpus


def test_garbage_is_an_error():
    with pytest.raises(ValueError):
        parse_scrape("<html>502 Bad Gateway</html>\n{{{", n_gpus=8)


def test_infiniband_counters_are_read_per_port():
    text = (
        'node_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1"} 1.5e12\n'
        'node_infiniband_port_data_received_bytes_total{device="mlx5_0",port="1"} 2.5e12\n'
    )
    nic = parse_scrape(text).nics[("mlx5_0", "1")]
    assert (nic.tx_bytes_total, nic.rx_bytes_total) == (1.5e12, 2.5e12)
