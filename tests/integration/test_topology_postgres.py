"""Topology import, export and replace on the real Postgres."""

import io
import threading
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import connection, connections

from apps.placement.topology import load_topology, read_spec_file, topology_to_spec
from apps.topology import services
from apps.topology.models import Cluster, Gpu, Link, Nic, Node, Switch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = {"case-4-4": "case-4-4.yaml", "pod-256": "pod-256.yaml", "su-h100": "su-h100-rail.yaml"}


def export(name: str) -> dict:
    out = io.StringIO()
    call_command("export_topology", name, stdout=out)
    return yaml.safe_load(out.getvalue())


def counts() -> dict[str, int]:
    return {m.__name__: m.objects.count() for m in (Cluster, Switch, Link, Node, Nic, Gpu)}


@pytest.mark.django_db
def test_the_database_is_postgres():
    assert connection.vendor == "postgresql"


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(FILES))
def test_examples_import_export_and_reimport_identically(name, tmp_path):
    path = EXAMPLES / FILES[name]
    call_command("import_topology", str(path), stdout=io.StringIO())
    first = export(name)
    assert first == topology_to_spec(load_topology(read_spec_file(path)))
    before = counts()
    copy = tmp_path / "exported.yaml"
    copy.write_text(yaml.safe_dump(first))
    call_command("import_topology", str(copy), "--replace", stdout=io.StringIO())
    assert export(name) == first
    assert counts() == before


@pytest.mark.django_db
def test_a_rejected_file_changes_nothing_on_postgres(tmp_path):
    call_command("import_topology", str(EXAMPLES / "case-4-4.yaml"), stdout=io.StringIO())
    spec = read_spec_file(EXAMPLES / "case-4-4.yaml")
    spec["nodes"][1]["nics"][0]["leaf"] = "leaf-9"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    before = counts()
    with pytest.raises(CommandError, match=r"nodes\[1\]\.nics\[0\]\.leaf: unknown leaf switch 'leaf-9'"):
        call_command("import_topology", str(bad), "--replace")
    assert counts() == before


@pytest.mark.django_db(transaction=True)
def test_concurrent_imports_of_one_name_create_one_cluster():
    data = read_spec_file(EXAMPLES / "pod-256.yaml")
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def run():
        try:
            barrier.wait()
            services.cluster_import(data=data)
            outcomes.append("imported")
        except services.ClusterExistsError:
            outcomes.append("exists")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["exists", "imported"]
    assert Cluster.objects.filter(name="pod-256").count() == 1
    assert Gpu.objects.filter(node__cluster__name="pod-256").count() == 256


@pytest.mark.django_db(transaction=True)
def test_replace_while_another_session_reads_shows_old_or_new_never_half(tmp_path):
    services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    spec = read_spec_file(EXAMPLES / "case-4-4.yaml")
    spec["nodes"][1]["nics"][0]["bw_GBps"] = 25
    seen: list[int] = []
    stop = threading.Event()

    def read():
        try:
            while not stop.is_set():
                seen.append(Gpu.objects.filter(node__cluster__name="case-4-4").count())
        finally:
            connections.close_all()

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(5):
        services.cluster_import(data=spec, replace=True)
    stop.set()
    reader.join()
    assert seen and set(seen) == {16}
    assert list(Nic.objects.filter(node__cluster__name="case-4-4").values_list("bw_GBps", flat=True)) == [
        11.0,
        25.0,
    ]
