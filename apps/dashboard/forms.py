"""Forms of the dashboard: queue filters and the topology import."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.utils import timezone

from apps.api import roles
from apps.placement.convert import IMPORTERS
from apps.placement.topology import TOPOLOGY_LIMITS
from apps.scheduling.choices import ACTIVE_STATUSES, FINISHED_STATUSES, WAITING_STATUSES, JobStatus
from apps.topology.models import Cluster

DEFAULT_QUEUE_STATUSES = tuple(str(s) for s in (*WAITING_STATUSES, *ACTIVE_STATUSES))
HISTORY_STATUSES = tuple(str(s) for s in FINISHED_STATUSES)
# The queue's sortable columns: ?sort=KEY ascending, ?sort=-KEY descending; nothing else is accepted.
QUEUE_SORTS = {
    "job": ("id",),
    "cluster": ("cluster__name", "id"),
    "status": ("status", "id"),
    "priority": ("priority", "-submitted_at", "-id"),
    "gpus": ("gpus", "id"),
    "age": ("-submitted_at", "-id"),
    "finished": ("finished_at", "id"),
}
HISTORY_PRESETS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
HISTORY_MAX_SPAN = timedelta(days=366)
HISTORY_FIRST_YEAR = 2000
MAX_SPEC_BYTES = TOPOLOGY_LIMITS.max_bytes


class QueueFilterForm(forms.Form):
    """Queue filters: statuses (default: waiting and active), owner username, cluster name; the
    sort column; and a time range of finished jobs (`range` preset, or `since` and/or `until`),
    which shows finished jobs by default."""

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
    sort = forms.ChoiceField(
        required=False,
        choices=[(f"{d}{k}", f"{d}{k}") for k in QUEUE_SORTS for d in ("", "-")],
        widget=forms.HiddenInput,
    )
    range = forms.ChoiceField(
        required=False, choices=[("", "any time"), *((k, f"last {k}") for k in HISTORY_PRESETS)]
    )
    since = forms.DateTimeField(
        required=False,
        label="finished since",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    until = forms.DateTimeField(
        required=False,
        label="finished until",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        if not roles.sees_all_jobs(user):
            # Other users' jobs stay anonymous: a user filters to their own jobs or sees everyone's.
            self.fields["owner"] = forms.ChoiceField(
                required=False, choices=[("", "everyone"), (user.get_username(), "my jobs")]
            )

    def clean(self):
        data = super().clean()
        since, until, preset = data.get("since"), data.get("until"), data.get("range")
        for name, value in (("since", since), ("until", until)):
            if value is not None and value.year < HISTORY_FIRST_YEAR:
                self.add_error(name, f"must be in {HISTORY_FIRST_YEAR} or later")
                return data
        if preset and (since or until):
            self.add_error("range", "give a preset range or since/until, not both")
        elif since and until and since >= until:
            self.add_error("until", "must be after since")
        elif since and (until or timezone.now()) - since > HISTORY_MAX_SPAN:
            self.add_error("since", f"the range may span at most {HISTORY_MAX_SPAN.days} days")
        return data

    def statuses(self) -> tuple[str, ...]:
        """The statuses to show: the chosen ones, else finished jobs when a time range is given,
        else waiting and active jobs."""
        chosen = self.cleaned_data.get("status") if self.is_valid() else None
        if chosen:
            return tuple(chosen)
        return HISTORY_STATUSES if self.finished_between() else DEFAULT_QUEUE_STATUSES

    def finished_between(self) -> tuple | None:
        """The (since, until) bounds on finished jobs' finish time (either may be None), or None
        when no range is asked for. An open `since` is bounded to HISTORY_MAX_SPAN before `until`."""
        if not self.is_valid():
            return None
        data = self.cleaned_data
        if data.get("range"):
            now = timezone.now()
            return (now - HISTORY_PRESETS[data["range"]], None)
        since, until = data.get("since"), data.get("until")
        if since is None and until is None:
            return None
        return (since or (until - HISTORY_MAX_SPAN), until)

    def order(self) -> tuple[str, ...] | None:
        """ORM ordering of the chosen sort column, or None for the default (priority, then age)."""
        key = self.cleaned_data.get("sort") if self.is_valid() else ""
        if not key:
            return None
        fields = QUEUE_SORTS[key.lstrip("-")]
        if not key.startswith("-"):
            return fields
        return tuple(f[1:] if f.startswith("-") else f"-{f}" for f in fields)


class TopologyImportForm(forms.Form):
    """A topology spec v1 (or another tool's file, by `format`) as an upload or pasted text."""

    file = forms.FileField(required=False, help_text="A topology spec v1 file (YAML or JSON).")
    text = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false"}),
        help_text="Or paste it here (an nvidia-smi matrix may be pasted as copied from a terminal or an issue).",
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
        help_text=(
            "Values the file lacks, as YAML (e.g. name: lab, gpus_per_node: 4, nic_bw_GBps: 50, "
            "nics: mlx5_*, gpus[gpu[001-064]]: 8)."
        ),
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
