"""The form that starts a simulation run from the dashboard."""

from __future__ import annotations

from django import forms

from apps.placement.solvers import POLICIES
from apps.topology.models import Cluster

from .models import MAX_JOBS, MAX_LOAD
from .services import available_traces

DEFAULT_POLICIES = ["topo", "tree_best_fit", "first_fit", "naive"]
DEFAULT_JOBS = 500


class SimulationForm(forms.Form):
    """Cluster, trace (one of the trace folders' files, never a path), policies, job limit, seed,
    optional offered load."""

    cluster = forms.ModelChoiceField(queryset=Cluster.objects.order_by("name"), to_field_name="name")
    trace = forms.ChoiceField(choices=())
    policies = forms.MultipleChoiceField(
        choices=[(p, p) for p in POLICIES], initial=DEFAULT_POLICIES, widget=forms.CheckboxSelectMultiple
    )
    job_limit = forms.IntegerField(
        min_value=1, max_value=MAX_JOBS, initial=DEFAULT_JOBS, help_text="Replay the first N jobs by arrival."
    )
    seed = forms.IntegerField(
        min_value=0, max_value=2**31 - 1, initial=0, help_text="Seed of the workload mix."
    )
    load = forms.FloatField(
        required=False,
        min_value=0.01,
        max_value=MAX_LOAD,
        help_text="Scale arrivals to this offered load (fraction of the cluster); empty keeps the trace's times.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["trace"].choices = [(name, name) for name in available_traces()]
