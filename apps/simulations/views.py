"""Simulation pages: start a run on a stored cluster, watch its progress, compare past runs."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from apps.dashboard.views.common import script_json
from apps.dashboard.views.vendor import plotly_js_url
from apps.placement.sim.report import column_names, figures, metric_rows

from .choices import LIVE_STATUSES
from .forms import SimulationForm
from .models import SimulationRun
from .selectors import comparison_rows, simulation_runs
from .services import simulation_start

POLL_MS = 1000


@login_required
@require_http_methods(["GET", "POST"])
def simulation_list(request):
    """GET: past runs side by side and the start form (staff). POST: start a run (staff)."""
    form = SimulationForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if not request.user.is_staff:
            raise PermissionDenied("starting a simulation is for staff")
        if form.is_valid():
            data = form.cleaned_data
            try:
                run = simulation_start(
                    cluster=data["cluster"],
                    trace=data["trace"],
                    policies=data["policies"],
                    job_limit=data["job_limit"],
                    seed=data["seed"],
                    load=data["load"],
                    user=request.user,
                )
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, errors)
            else:
                messages.success(request, f"Simulation {run.pk} started.")
                return redirect("simulations:detail", pk=run.pk)
        status = 400
    runs = list(simulation_runs())
    done = [r for r in runs if r.status == "done"]
    # The comparison table needs the results of the finished runs shown.
    results = dict(SimulationRun.objects.filter(pk__in=[r.pk for r in done]).values_list("pk", "result"))
    for r in done:
        r.result = results.get(r.pk)
    context = {"form": form, "runs": runs, "rows": comparison_rows(done)}
    return render(request, "simulations/list.html", context, status=status)


@login_required
@require_GET
def simulation_detail(request, pk: int):
    """One run: its progress bar while it runs, then its metrics and charts."""
    run = get_object_or_404(SimulationRun, pk=pk)
    context = {"run": run, "live": run.status in LIVE_STATUSES, "poll_ms": POLL_MS}
    if run.result:
        figs = {name: fig.to_plotly_json() for name, fig in figures(run.result).items()}
        context.update(
            columns=column_names(),
            metrics=metric_rows(run.result),
            trace=run.result.get("trace", {}),
            payload=script_json(figs),
            plotly_js_url=plotly_js_url(),
        )
    return render(request, "simulations/detail.html", context)


@login_required
@require_GET
def simulation_progress(request, pk: int):
    """A run's status and progress as JSON, for the progress bar."""
    run = get_object_or_404(SimulationRun.objects.defer("result"), pk=pk)
    return JsonResponse(
        {
            "status": run.status,
            "progress": run.progress,
            "jobs_done": run.jobs_done,
            "jobs_total": run.jobs_total,
            "error": run.error,
        }
    )
