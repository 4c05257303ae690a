"""Forms of the dashboard: queue filters and the topology import."""

from __future__ import annotations

from django import forms

from apps.api import roles
from apps.placement.convert import IMPORTERS
from apps.placement.topology import TOPOLOGY_LIMITS
from apps.scheduling.choices import ACTIVE_STATUSES, WAITING_STATUSES, JobStatus
from apps.topology.models import Cluster

DEFAULT_QUEUE_STATUSES = tuple(str(s) for s in (*WAITING_STATUSES, *ACTIVE_STATUSES))
MAX_SPEC_BYTES = TOPOLOGY_LIMITS.max_bytes


class QueueFilterForm(forms.Form):
    """Queue filters: statuses (default: waiting and active), owner username, cluster name."""

    status = forms.MultipleChoiceField(
        choices=JobStatus.choices, required=False, widget=forms.CheckboxSelectMultiple
    )
    owner = forms.CharField(required=False, max_length=150)
    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.order_by("name"),
        to_field_name="name",
        required=False,
        empty_label="all clusters",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        if not roles.sees_all_jobs(user):
            # Other users' jobs stay anonymous: a user filters to their own jobs or sees everyone's.
            self.fields["owner"] = forms.ChoiceField(
                required=False, choices=[("", "everyone"), (user.get_username(), "my jobs")]
            )

    def statuses(self) -> tuple[str, ...]:
        """The statuses to show: the chosen ones, or waiting and active jobs by default."""
        chosen = self.cleaned_data.get("status") if self.is_valid() else None
        return tuple(chosen) if chosen else DEFAULT_QUEUE_STATUSES


class TopologyImportForm(forms.Form):
    """A topology spec v1 (or another tool's file, by `format`) as an upload or pasted text."""

    file = forms.FileField(required=False, help_text="A topology spec v1 file (YAML or JSON).")
    text = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false"}),
        help_text="Or paste the spec here.",
    )
    replace = forms.BooleanField(
        required=False, help_text="Replace the topology of an existing cluster of the same name."
    )
    format = forms.ChoiceField(
        required=False,
        choices=[(f, f) for f in IMPORTERS],
        initial="topology-v1",
        help_text="The file's format: topology spec v1, or another tool's (converted to spec v1).",
    )
    defaults = forms.CharField(
        required=False,
        max_length=4096,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="Values the file lacks, as YAML (e.g. name: lab, gpus_per_node: 4, nic_bw_GBps: 50).",
    )
    # The uploaded file's name, kept between preview and import: per-node formats name the node after it.
    source_name = forms.CharField(required=False, max_length=255, widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        upload = data.get("file")
        if upload is not None:
            if upload.size > MAX_SPEC_BYTES:
                self.add_error("file", f"is {upload.size} bytes; the limit is {MAX_SPEC_BYTES} bytes")
                return data
            data["source_name"] = upload.name
            try:
                data["text"] = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                self.add_error("file", "is not UTF-8 text (a topology spec is YAML or JSON)")
                return data
        if not (data.get("text") or "").strip():
            self.add_error("text", "upload a file or paste a topology spec")
        return data
