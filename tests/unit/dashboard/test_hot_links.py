"""Hot links: the busiest links with their jobs, uplink history, oversubscription on switch pages."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from apps.dashboard.hotlinks import hot_links, oversubscription
from apps.metrics.models import UplinkSample
from apps.metrics.services import metrics_retain
from apps.topology.models import Switch


def test_links_are_sorted_by_load_with_the_jobs_on_them(people, naive_case44):
    out = hot_links(cluster=naive_case44.cluster, user=people["alice"], limit=500)
    rows = out["rows"]
    assert rows, "a placed job with inter-node traffic loads links"
    shares = [max(r["predicted_share"] or 0, r["measured_share"] or 0) for r in rows]
    assert shares == sorted(shares, reverse=True)
    top = rows[0]
    assert top["predicted"] > 0 and top["jobs"][0]["label"].startswith(f"job {naive_case44.pk} ")
    assert top["measured"] is None and top["diff"] is None  # no NIC counters in this test
    kinds = {r["kind"] for r in rows}
    assert "NIC cable" in kinds
    bob = hot_links(cluster=naive_case44.cluster, user=people["bob"], limit=1)["rows"][0]
    assert bob["jobs"][0]["label"] == f"job {naive_case44.pk} (other user)" and bob["jobs"][0]["url"] is None


def test_links_page_renders_and_names_bad_parameters(client, people, naive_case44):
    client.force_login(people["alice"])
    response = client.get("/clusters/case-4-4/links/?n=5&sort=predicted")
    html = response.content.decode()
    assert response.status_code == 200 and 'id="hot-links"' in html
    assert f'href="/jobs/{naive_case44.pk}/"' in html and "no fresh counters" in html
    bad = client.get("/clusters/case-4-4/links/?n=0&sort=hot&hours=99")
    text = bad.content.decode()
    assert bad.status_code == 400
    assert "sort: one of load" in text and "n: a number from 1 to 500" in text and "hours: a number" in text


def test_uplink_history_is_drawn_and_retained_a_day(client, people, case44_db):
    leaf = Switch.objects.filter(cluster=case44_db, tier="leaf").first()
    now = timezone.now()
    for k, share in enumerate((0.2, 0.5, 0.95)):
        UplinkSample.objects.create(
            cluster=case44_db, leaf=leaf.name, at=now - timedelta(minutes=30 - k), share=share
        )
    client.force_login(people["alice"])
    html = client.get("/clusters/case-4-4/links/").content.decode()
    assert 'id="uplink-history"' in html and '<svg class="spark"' in html and "95.0%" in html
    switch = client.get(f"/clusters/case-4-4/switches/{leaf.name}/").content.decode()
    assert 'id="switch-history"' in switch and "peak 95.0%" in switch
    UplinkSample.objects.create(cluster=case44_db, leaf=leaf.name, at=now - timedelta(days=2), share=0.1)
    assert metrics_retain(now=now)["uplink"] == 1


def test_switch_page_says_oversubscription_and_load(client, people):
    from apps.topology.services import cluster_import

    from .conftest import generated

    # Two nodes of 8 NICs at 50 GB/s under each leaf (800 GB/s), two uplinks of 100 GB/s: 4:1.
    cluster = cluster_import(data=generated("leaf-spine", uplink_bw_GBps=100))
    leaf = Switch.objects.filter(cluster=cluster, tier="leaf").first()
    spine = Switch.objects.filter(cluster=cluster, tier="spine").first()
    figure = oversubscription(switch=leaf)
    assert figure == {"below_GBps": 800.0, "above_GBps": 200.0, "ratio": 4.0}
    assert oversubscription(switch=spine) is None  # the top tier
    client.force_login(people["alice"])
    html = client.get(f"/clusters/{cluster.name}/switches/{leaf.name}/").content.decode()
    assert "4:1 oversubscribed" in html and "Load on its links" in html
