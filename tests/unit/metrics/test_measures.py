"""Per-job measures in closed form: MFU from a report or from tensor activity, comm share by source."""

import pytest

from apps.metrics.measures import ESTIMATE, REPORT, Report, exposed_share, job_measure

CASE = {"gpus": 16, "peak_tflops": 312.0, "flops_per_step": 2.6e14, "compute_ms": 100.0}


def test_without_a_report_mfu_is_the_mean_tensor_activity_and_comm_share_follows_from_it():
    m = job_measure(gpu_util=[0.97] * 16, tensor_active=[0.2] * 8 + [0.3] * 8, report=None, **CASE)
    assert (m.mfu, m.mfu_source) == (pytest.approx(0.25), ESTIMATE)
    step_ms = 2.6e14 / (0.25 * 16 * 312e12) * 1e3
    assert m.step_ms == pytest.approx(step_ms)
    assert (m.comm_share, m.comm_source) == (pytest.approx((step_ms - 100) / step_ms), ESTIMATE)
    assert m.gpu_util == pytest.approx(0.97) and m.gpus_measured == 16


def test_a_report_wins_over_counters_and_its_comm_time_gives_the_share():
    report = Report(step_ms=200.0, comm_ms=90.0)
    m = job_measure(gpu_util=[0.97], tensor_active=[0.9], report=report, **CASE)
    assert (m.mfu, m.mfu_source) == (pytest.approx(2.6e14 / (0.2 * 16 * 312e12)), REPORT)
    assert (m.comm_share, m.comm_source) == (pytest.approx(0.45), REPORT)


def test_reported_flops_replace_the_spec_and_a_report_without_comm_uses_compute():
    m = job_measure(
        gpu_util=[], tensor_active=[], report=Report(step_ms=250.0, flops_per_step=1.0e14), **CASE
    )
    assert m.mfu == pytest.approx(1.0e14 / (0.25 * 16 * 312e12))
    assert (m.comm_share, m.comm_source) == (pytest.approx(0.6), REPORT)
    assert m.gpu_util is None


def test_absent_fields_stay_absent():
    m = job_measure(gpu_util=[None, None], tensor_active=[None, None], report=None, **CASE)
    assert (m.mfu, m.comm_share, m.gpu_util, m.mfu_source) == (None, None, None, "")


def test_exposed_share_is_clamped():
    assert exposed_share(50.0, 100.0) == 0.0 and exposed_share(None, 1.0) is None
