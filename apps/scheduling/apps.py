from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class SchedulingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "apps.scheduling"

    def ready(self):
        # A remembered user token carries its user's membership and account
        # (apps.api.authentication.TokenAuthentication): forget them when either changes, as the
        # API app does for tokens, users, groups and permissions.
        from apps.api.authentication import user_tokens_forget

        from .account_models import Account, AccountMembership

        for model in (AccountMembership, Account):
            for signal in (post_save, post_delete):
                signal.connect(user_tokens_forget, sender=model, dispatch_uid=f"api.tokens.{model.__name__}")
        # Every cluster has its `normal` QOS from its creation on.
        post_save.connect(_normal_qos, sender="topology.Cluster", dispatch_uid="scheduling.normal_qos")


def _normal_qos(sender, instance, created, raw=False, **kwargs):
    if created and not raw:
        from .account_models import DEFAULT_QOS, Qos

        Qos.objects.get_or_create(cluster=instance, name=DEFAULT_QOS)
