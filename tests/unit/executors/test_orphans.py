"""Which Slurm jobs are TopoWeb's and which of those it must stop, on plain data (no Django)."""

from __future__ import annotations

import pytest

from apps.executors.slurm.orphans import CANCEL, RECORD, claims, judge, owner, stoppable
from apps.executors.slurm.rest import SlurmJob
from apps.executors.slurm.script import comment

ACTIVE = ("placing", "running", "migrating")


def rec(job_id: int, state: str, tag: str = "", *, leader: int | None = None, restarts: int = 0) -> SlurmJob:
    return SlurmJob(job_id, leader or 0, "", "slurm", state, "", None, None, (), {}, tag, restarts)


def het(leader: int, states: list[str], tag: str) -> list[SlurmJob]:
    return [rec(leader + i, s, tag, leader=leader) for i, s in enumerate(states)]


MINE = comment("pod", 5, 2, "s1")


@pytest.mark.parametrize(
    ("tag", "known", "mine"),
    [
        (MINE, {}, True),
        (comment("pod", 5, 2, "s2"), {}, False),  # another TopoWeb server's
        (comment("other", 5, 2, "s1"), {}, False),  # another cluster's
        ("", {}, False),  # someone's sbatch
        ("", {40: (5, 2)}, False),  # an untagged job on a recorded id: ids get reused
        (comment("pod", 5, 2), {}, False),  # a tag without server, its id not recorded here
        (comment("pod", 5, 2), {40: (5, 2)}, True),  # ... recorded for the job it names
        (comment("pod", 5, 2), {40: (5, 1)}, False),  # ... recorded for another generation
    ],
)
def test_owner(tag, known, mine):
    comps = het(40, ["RUNNING", "RUNNING"], tag)
    assert (owner(comps, cluster="pod", server="s1", known=known) == (5, 2)) is mine


def test_a_tag_on_any_component_counts():
    comps = [rec(40, "PENDING", "", leader=40), rec(41, "PENDING", MINE, leader=40)]
    assert owner(comps, cluster="pod", server="s1", known={}) == (5, 2)


@pytest.mark.parametrize(
    ("states", "live"),
    [
        (["PENDING"], True),
        (["REQUEUE_HOLD"], True),
        (["SUSPENDED"], True),
        (["RESIZING"], True),
        (["COMPLETING", "COMPLETING"], False),  # on its way out
        (["COMPLETING", "PENDING"], True),
        (["NODE_FAIL", "PENDING", "PENDING"], True),  # bug 1: Slurm kept three components
        (["COMPLETED", "CANCELLED", "FAILED"], False),
    ],
)
def test_stoppable(states, live):
    assert stoppable(het(40, states, MINE)) is live


def claim_of(tag: str, states=("PENDING",), sid=40):
    groups = {sid: het(sid, list(states), tag)}
    return claims(groups, cluster="pod", server="s1", known={})


@pytest.mark.parametrize(
    ("jobs", "subs", "action", "why"),
    [
        ({5: ("running", 2)}, {(5, 2): 40}, None, ""),  # TopoWeb runs it
        ({}, {}, CANCEL, "TopoWeb job 5 no longer exists"),
        ({5: ("failed", 2)}, {(5, 2): 40}, CANCEL, "TopoWeb job 5 is failed"),
        ({5: ("cancelled", 2)}, {}, CANCEL, "TopoWeb job 5 is cancelled"),
        ({5: ("queued", 2)}, {(5, 2): 40}, CANCEL, "TopoWeb job 5 is queued"),  # requeued by TopoWeb
        ({5: ("placing", 3)}, {(5, 2): 40, (5, 3): 50}, CANCEL, "runs generation 3, not 2"),
        ({5: ("placing", 2)}, {(5, 2): 39}, CANCEL, "generation 2 runs as Slurm job 39"),  # a duplicate
        ({5: ("placing", 2)}, {}, RECORD, "never recorded it"),  # crash before the save
        ({5: ("placing", 2)}, {(5, 2): None}, RECORD, "never recorded it"),  # a row without the id
    ],
)
def test_judge(jobs, subs, action, why):
    verdicts = judge(claim_of(MINE), jobs=jobs, subs=subs, active=ACTIVE)
    if action is None:
        assert verdicts == []
        return
    (v,) = verdicts
    assert (v.slurm_id, v.job_id, v.generation, v.action) == (40, 5, 2, action)
    assert why in v.why
    assert v.as_dict()["state"] == "PENDING"


def test_completing_skipped_and_foreign_jobs_never_claimed():
    groups = {
        40: het(40, ["COMPLETING"], MINE),
        50: het(50, ["PENDING"], ""),
        60: het(60, ["RUNNING"], comment("pod", 5, 2, "s2")),
        70: het(70, ["NODE_FAIL", "PENDING"], MINE),
        80: het(80, ["PENDING"], MINE),
    }
    got = claims(groups, cluster="pod", server="s1", known={}, skip={80})
    assert [(c.slurm_id, c.state) for c in got] == [(70, "NODE_FAIL,PENDING")]
    assert judge(got, jobs={}, subs={}, active=ACTIVE)[0].action == CANCEL
