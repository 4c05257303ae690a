"""Renderers of the cluster export in other tools' formats (`?format=slurm-tree`, ...): the
converter's text as it is; error responses (dicts) as JSON text."""

from __future__ import annotations

from apps.api.renderers import _TextRenderer
from apps.placement.convert import EXPORTERS, MEDIA_TYPES

CONVERTED_FORMATS = tuple(f for f in EXPORTERS if f != "topology-v1")
CONVERTED_RENDERERS = [
    type(
        f"{fmt.title().replace('-', '')}Renderer",
        (_TextRenderer,),
        {"format": fmt, "media_type": MEDIA_TYPES[fmt][0], "__doc__": f"`?format={fmt}`"},
    )
    for fmt in CONVERTED_FORMATS
]
