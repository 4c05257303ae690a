"""Clusters in other tools' formats: import through the placement core's converters, export a
cluster's snapshot in any export format. The spec v1 rules apply as for `cluster_import`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apps.placement.convert import Defaults, Source, export_topology, import_sources
from apps.placement.convert.base import yaml_documents
from apps.placement.topology import SpecError

from .models import Cluster
from .services import cluster_import, cluster_topology


def cluster_import_format(
    *,
    fmt: str,
    sources: Sequence[Source],
    defaults: Defaults | Mapping[str, Any] | None = None,
    replace: bool = False,
) -> tuple[Cluster, list[str]]:
    """Convert `sources` from format `fmt` and import the result as one cluster, atomically.

    `defaults` are the values the input lacks (a Defaults, or a mapping of its keys). Returns
    the cluster and the converter's notes (which defaults it used, what it left out).
    Raises SpecError naming the input's file and line, or the default's key; nothing is written then.
    """
    spec, notes = spec_from_format(fmt=fmt, sources=sources, defaults=defaults)
    return cluster_import(data=spec, replace=replace), notes


def spec_from_format(
    *, fmt: str, sources: Sequence[Source], defaults: Defaults | Mapping[str, Any] | None = None
) -> tuple[dict, list[str]]:
    """The spec v1 (full form) of `sources` in format `fmt`, checked against the spec v1 rules,
    and the converter's notes; SpecError naming the input's file and line."""
    if not isinstance(defaults, Defaults):
        defaults = Defaults.from_mapping(defaults or {})
    imported = import_sources(fmt, list(sources), defaults)
    imported.topology()  # the spec v1 rules, with errors pointing into the input
    return imported.spec, imported.notes


def defaults_from_text(text: str) -> Defaults:
    """Import defaults from a YAML or JSON mapping (a side file or a form field)."""
    if not text.strip():
        return Defaults()
    docs = yaml_documents(Source("defaults", text))
    if len(docs) != 1 or not isinstance(docs[0][0], dict):
        raise SpecError([("defaults", "must be one YAML or JSON mapping of default values")])
    return Defaults.from_mapping(docs[0][0])


def cluster_export_format(*, cluster: Cluster, fmt: str) -> str:
    """The cluster written in export format `fmt` (text)."""
    return export_topology(fmt, cluster_topology(cluster=cluster))
