"""The job page shows every rank's output, a page at a time, with a rank picker."""

import re

import pytest

from apps.scheduling.models import RankRun
from apps.scheduling.selectors import job_rank_logs
from apps.topology.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def ranks64(naive_case44):
    """64 rank processes of the job's current generation, rank 37 failed; one failure of an older
    generation."""
    job = naive_case44
    nodes = list(Node.objects.filter(cluster=job.cluster).order_by("name"))
    runs = [
        RankRun(
            job=job,
            generation=job.generation,
            rank=r,
            node=nodes[r % len(nodes)],
            state="exited" if r == 37 else "running",
            exit_code=1 if r == 37 else None,
            log_tail=f"rank {r} step 10\n" if r != 5 else "",
        )
        for r in range(64)
    ]
    if job.generation > 1:
        raise AssertionError("the fixture expects a first generation")
    RankRun.objects.bulk_create(runs)
    job.generation = 2
    job.save(update_fields=["generation"])
    RankRun.objects.bulk_create(
        RankRun(job=job, generation=2, rank=r, node=nodes[0], state="running", log_tail=f"gen2 rank {r}\n")
        for r in range(64)
    )
    return job


def test_pages_cover_every_rank_failures_first(ranks64):
    first = job_rank_logs(job=ranks64)
    # The old generation's failure, then generation 2's 64 ranks.
    assert first.total == 65 and first.pages == 5
    assert (first.runs[0].generation, first.runs[0].rank, first.runs[0].exit_code) == (1, 37, 1)
    assert [r.rank for r in first.runs[1:]] == list(range(15))
    seen = []
    for page in range(1, 6):
        seen += [(r.generation, r.rank) for r in job_rank_logs(job=ranks64, page=page).runs]
    assert len(seen) == len(set(seen)) == 65
    assert job_rank_logs(job=ranks64, page=99).page == 5
    one = job_rank_logs(job=ranks64, rank=37)
    assert [(r.generation, r.rank) for r in one.runs] == [(1, 37), (2, 37)]
    assert one.ranks == list(range(64))


def test_the_job_page_says_which_ranks_it_shows_and_links_the_next_page(client, people, ranks64):
    client.force_login(people["alice"])
    html = client.get(f"/jobs/{ranks64.pk}/").content.decode()
    assert "Output of 1–16 of 65 rank processes" in html
    assert html.count('class="log-tail"') == 16
    assert 'href="?log_page=2#logs"' in html and "page 1 of 5" in html
    assert len(re.findall(r'<option value="\d+"', html.split('id="log-rank"')[1].split("</select>")[0])) == 64
    last = client.get(f"/jobs/{ranks64.pk}/?log_page=5").content.decode()
    assert "Output of 65–65 of 65" in last and "gen2 rank 63" in last and 'rel="prev"' in last
    picked = client.get(f"/jobs/{ranks64.pk}/?log_rank=63").content.decode()
    assert "of rank 63" in picked and "gen2 rank 63" in picked and "gen2 rank 62" not in picked


@pytest.mark.parametrize("query", ["log_page=x", "log_rank=-1", "log_page=1e3"])
def test_bad_paging_is_a_400_naming_the_field(client, people, ranks64, query):
    client.force_login(people["alice"])
    response = client.get(f"/jobs/{ranks64.pk}/?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] in response.content.decode()
