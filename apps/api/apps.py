from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save


class ApiConfig(AppConfig):
    """API plumbing; creates the role groups after every migrate (as Django creates permissions)."""

    name = "apps.api"
    label = "api"

    def ready(self):
        from django.core import checks

        from .logins import check_num_proxies
        from .roles import roles_ensure_after_migrate

        checks.register(check_num_proxies, checks.Tags.security, deploy=True)
        post_migrate.connect(roles_ensure_after_migrate, dispatch_uid="apps.api.roles")
        self._forget_user_tokens_on_change()

    @staticmethod
    def _forget_user_tokens_on_change() -> None:
        """Remembered user tokens (authentication.py) are dropped when a token, user, group or
        permission is saved or deleted in this process, or a user's groups or permissions or a
        group's permissions change (the scheduling app adds its accounts and memberships, which
        a remembered user carries: apps/scheduling/apps.py)."""
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group, Permission
        from rest_framework.authtoken.models import Token

        from .authentication import user_tokens_forget

        user = get_user_model()
        for model in (Token, user, Group, Permission):
            for signal in (post_save, post_delete):
                signal.connect(user_tokens_forget, sender=model, dispatch_uid=f"api.tokens.{model.__name__}")
        for through in (user.groups.through, user.user_permissions.through, Group.permissions.through):
            m2m_changed.connect(
                user_tokens_forget, sender=through, dispatch_uid=f"api.tokens.{through.__name__}"
            )
