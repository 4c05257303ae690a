"""Rollups fold raw samples into 1-minute means; retention drops raw after an hour and rollups
after a day; per-job samples stay with their job."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.metrics.models import GpuRollup, GpuSample
from apps.metrics.services import metrics_retain, metrics_rollup
from apps.topology.models import Gpu


def test_rollup_means_per_minute_and_retention_by_age(case44):
    gpu = Gpu.objects.filter(node__cluster=case44).first()
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    for second, util in ((0, 0.2), (15, 0.4), (30, None), (45, 0.6)):
        GpuSample.objects.create(gpu=gpu, at=minute + timedelta(seconds=second), gpu_util=util, power_W=300.0)
    assert metrics_rollup() == 1
    rollup = GpuRollup.objects.get()
    assert rollup.minute == minute and rollup.samples == 4
    assert rollup.gpu_util == pytest.approx(0.4)  # absent values do not count as zero
    assert rollup.tensor_active is None
    assert metrics_rollup() == 0  # minutes already rolled up are not written twice

    deleted = metrics_retain(now=minute + timedelta(hours=1, minutes=1))
    assert deleted == {"raw": 4, "rollup": 0, "uplink": 0}
    assert metrics_retain(now=minute + timedelta(days=1, minutes=1))["rollup"] == 1
