from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ApiConfig(AppConfig):
    """API plumbing; creates the role groups after every migrate (as Django creates permissions)."""

    name = "apps.api"
    label = "api"

    def ready(self):
        from .roles import roles_ensure_after_migrate

        post_migrate.connect(roles_ensure_after_migrate, dispatch_uid="apps.api.roles")
