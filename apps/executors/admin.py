"""Admin pages of the executors: which clusters Slurm runs and how TopoWeb reaches it, the Slurm
job of each TopoWeb job generation, the GPUs jobs submitted straight to Slurm hold, and the node
agents' credentials."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from apps.scheduling.api.authentication import node_tokens_forget
from apps.scheduling.models import NodeToken

from .agents.services import node_tokens_revoke
from .models import ClusterExecutor, ForeignAllocation, SlurmSubmission

SECRETS = ("slurm_token", "jwt_key")


class ClusterExecutorForm(forms.ModelForm):
    """The Slurm credentials are write-only here: shown masked, never sent to the browser; left
    empty, the stored value stays (`clear_secrets` empties them)."""

    clear_secrets = forms.BooleanField(required=False, help_text="Forget the stored token and JWT key.")

    class Meta:
        model = ClusterExecutor
        fields = [
            "cluster",
            "kind",
            "slurmrestd_url",
            "slurm_user",
            "slurm_token",
            "jwt_key",
            "submit_as_owner",
            "partition",
            "output_dir",
            "foreign_gbps_per_gpu",
            "server_id",
        ]
        widgets = {name: forms.PasswordInput(render_value=False) for name in SECRETS}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in SECRETS:
            stored = bool(self.instance.pk and getattr(self.instance, name))
            self.fields[name].widget.attrs["placeholder"] = (
                "•••••••• (stored; empty keeps it)" if stored else ""
            )

    def clean(self):
        data = super().clean()
        for name in SECRETS:
            if not data.get(name) and not data.get("clear_secrets") and self.instance.pk:
                data[name] = getattr(self.instance, name)
        return data


@admin.register(ClusterExecutor)
class ClusterExecutorAdmin(admin.ModelAdmin):
    form = ClusterExecutorForm
    list_display = [
        "cluster",
        "kind",
        "slurmrestd_url",
        "slurm_user",
        "submit_as_owner",
        "last_sync_at",
        "last_error",
    ]
    list_filter = ["kind"]
    readonly_fields = ["last_sync_at", "last_error"]


@admin.register(SlurmSubmission)
class SlurmSubmissionAdmin(admin.ModelAdmin):
    list_display = ["job", "generation", "slurm_job_id", "slurm_user", "state", "reason", "submitted_at"]
    list_filter = ["state"]
    search_fields = ["slurm_job_id", "job__name"]
    list_select_related = ["job"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ForeignAllocation)
class ForeignAllocationAdmin(admin.ModelAdmin):
    list_display = ["cluster", "node", "gpu_index", "slurm_job_id", "user", "name", "seen_at"]
    search_fields = ["slurm_job_id", "user", "node__name"]
    list_select_related = ["cluster", "node"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(NodeToken)
class NodeTokenAdmin(admin.ModelAdmin):
    """Node agent credentials: only the key's hash is stored, so none is created here (manage.py
    create_node_token prints the key once); revoke one that leaked or whose node left."""

    list_display = ["prefix", "cluster", "node", "created_at", "last_used", "revoked_at"]
    list_filter = ["node__cluster", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["node__name", "node__cluster__name", "prefix"]
    list_select_related = ["node", "node__cluster"]
    readonly_fields = ["node", "prefix", "created_at", "last_used", "revoked_at"]
    actions = ["revoke"]

    @admin.display(description="cluster", ordering="node__cluster__name")
    def cluster(self, token: NodeToken) -> str:
        # Node names repeat across clusters (two node-025 rows): the cluster tells them apart.
        return token.node.cluster.name

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected node tokens", permissions=["change"])
    def revoke(self, request, queryset) -> None:
        count = node_tokens_revoke(tokens=queryset)
        node_tokens_forget()
        self.message_user(request, f"{count} node token(s) revoked.", messages.SUCCESS)
