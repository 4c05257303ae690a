from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save


class ApiConfig(AppConfig):
    """API plumbing; creates the role groups after every migrate (as Django creates permissions)."""

    name = "apps.api"
    label = "api"

    def ready(self):
        from .roles import roles_ensure_after_migrate

        post_migrate.connect(roles_ensure_after_migrate, dispatch_uid="apps.api.roles")
        self._forget_user_tokens_on_change()

    @staticmethod
    def _forget_user_tokens_on_change() -> None:
        """Remembered user tokens (authentication.py) are dropped when a token, user, membership
        or account is saved or deleted in this process."""
        from django.contrib.auth import get_user_model
        from rest_framework.authtoken.models import Token

        from apps.scheduling.account_models import Account, AccountMembership

        from .authentication import user_tokens_forget

        for model in (Token, get_user_model(), AccountMembership, Account):
            for signal in (post_save, post_delete):
                signal.connect(user_tokens_forget, sender=model, dispatch_uid=f"api.tokens.{model.__name__}")
