"""Renderers chosen by `?format=`: the rank-map text formats and YAML for spec exports."""

from __future__ import annotations

import json

import yaml
from rest_framework.renderers import BaseRenderer


class _TextRenderer(BaseRenderer):
    """Text bodies; error responses (dicts) come out as JSON text."""

    media_type = "text/plain"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        if isinstance(data, str):
            return data.encode(self.charset)
        return (json.dumps(data, indent=2, default=str) + "\n").encode(self.charset)


class OpenMpiRankfileRenderer(_TextRenderer):
    format = "openmpi"


class SlurmHostfileRenderer(_TextRenderer):
    format = "slurm-hostfile"


class SlurmScriptRenderer(_TextRenderer):
    media_type = "text/x-shellscript"
    format = "slurm"


class TorchrunRenderer(_TextRenderer):
    media_type = "text/x-shellscript"
    format = "torchrun"


class YAMLRenderer(BaseRenderer):
    """YAML output (`?format=yaml`), keys in their given order."""

    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        return yaml.safe_dump(plain(data), sort_keys=False, default_flow_style=None).encode(self.charset)


def plain(data):
    """`data` with str, int, float subclasses (DRF's ErrorDetail, enum members) as the base types,
    which the safe YAML dumper refuses."""
    if isinstance(data, dict):
        return {plain(k): plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [plain(v) for v in data]
    for kind in (bool, str, int, float):
        if isinstance(data, kind):
            return kind(data)
    return data
