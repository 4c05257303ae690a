"""The beat task: one pass per cluster, never two at once over the same cluster."""

from django.core.cache import cache

from apps.metrics.models import NodeScrape
from apps.metrics.tasks import collect_all_clusters_task, collect_cluster_task, pass_lock_key


def test_beat_collects_every_cluster_and_skips_one_still_being_collected(case44):
    assert collect_all_clusters_task.delay().get() == 1
    assert NodeScrape.objects.filter(node__cluster=case44).count() == 2  # no dcgm_url: error states
    NodeScrape.objects.all().delete()
    cache.add(pass_lock_key(case44.pk), 1)
    try:
        assert collect_cluster_task.delay(case44.pk).get() == 0
        assert not NodeScrape.objects.exists()
    finally:
        cache.delete(pass_lock_key(case44.pk))
    collect_cluster_task.delay(case44.pk).get()
    assert NodeScrape.objects.count() == 2
