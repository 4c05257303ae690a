"""`apps/scheduling/lifecycle.py` is the only code that writes a Job's status or generation, a
rank's state or an allocation: a scan of every module's syntax tree finds no other writer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LIFECYCLE = ROOT / "apps" / "scheduling" / "lifecycle.py"
HELD = ("Job", "Allocation", "RankRun")
READS = {"filter", "exclude", "get", "Q", "count", "first", "exists", "When"}
WRITES = {"create", "bulk_create", "update", "delete", "get_or_create", "update_or_create", "bulk_update"}


def _names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def writers(source: str) -> list[tuple[int, str]]:
    """(line, what) of every write of lifecycle-owned state in `source`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            receiver = _names(f.value) if isinstance(f, ast.Attribute) else set()
            if "lifecycle" in receiver or name in READS:
                continue
            for kw in node.keywords:
                value = _names(kw.value)
                if kw.arg == "status" and "JobStatus" in value:
                    found.append((node.lineno, f"{name}(status=JobStatus...)"))
                elif kw.arg == "state" and "RankState" in value:
                    found.append((node.lineno, f"{name}(state=RankState...)"))
                elif kw.arg in ("live", "generation", "released_at", "master_port") and (
                    name in HELD or (name in WRITES and receiver & set(HELD))
                ):
                    found.append((node.lineno, f"{name}({kw.arg}=...)"))
            if name in WRITES and "Allocation" in receiver:
                found.append((node.lineno, f"Allocation.objects...{name}()"))
            if name == "Allocation":
                found.append((node.lineno, "Allocation(...)"))
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if not isinstance(t, ast.Attribute):
                    continue
                value = _names(node.value)
                if (
                    (t.attr == "status" and "JobStatus" in value)
                    or (t.attr == "state" and "RankState" in value)
                    or t.attr in ("generation", "live", "master_port")
                ):
                    found.append((node.lineno, f".{t.attr} = ..."))
    return found


def test_the_scan_finds_each_kind_of_write():
    source = """
Job.objects.filter(pk=1).update(status=JobStatus.FAILED)
job.status = JobStatus.RUNNING
Allocation.objects.filter(job=job).update(live=False)
Allocation(job=job, rank=0)
RankRun.objects.filter(pk=1).update(state=RankState.EXITED)
job.generation = 3
Job.objects.filter(pk=1).update(generation=F("generation") + 1)
"""
    assert sorted({line for line, _ in writers(source)}) == [2, 3, 4, 5, 6, 7, 8]
    reads = """
Job.objects.filter(status=JobStatus.RUNNING, generation=2)
lifecycle.finish(job=job, status=JobStatus.FAILED)
proposal.status = ProposalStatus.STALE
SlurmSubmission.objects.update_or_create(job=job, generation=job.generation)
"""
    assert writers(reads) == []


def test_no_module_but_the_lifecycle_writes_job_or_rank_state_or_allocations():
    offenders = []
    for path in sorted((ROOT / "apps").rglob("*.py")):
        if "migrations" in path.parts or path == LIFECYCLE:
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in writers(path.read_text())]
    assert offenders == []
    # The lifecycle itself does write them (the scan is not blind to its own code).
    assert writers(LIFECYCLE.read_text())
