from django.apps import AppConfig
from django.core.signals import setting_changed
from django.db.models.signals import m2m_changed, post_delete, post_save


class SchedulingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "apps.scheduling"

    def ready(self):
        # A remembered user token carries its user's membership and account
        # (apps.api.authentication.TokenAuthentication): forget them when either changes, as the
        # API app does for tokens, users, groups and permissions.
        from apps.api.authentication import REMEMBERED_WITH_USER, user_tokens_forget

        from .account_models import Account, AccountMembership
        from .selectors import coordinated_ids

        for model in (AccountMembership, Account):
            for signal in (post_save, post_delete):
                signal.connect(user_tokens_forget, sender=model, dispatch_uid=f"api.tokens.{model.__name__}")
        # ... and the accounts the user coordinates (the jobs they see: selectors.own_or_coordinated).
        if coordinated_ids not in REMEMBERED_WITH_USER:
            REMEMBERED_WITH_USER.append(coordinated_ids)
        self._forget_recent_reads_on_change()
        # Every cluster has its `normal` QOS from its creation on.
        post_save.connect(_normal_qos, sender="topology.Cluster", dispatch_uid="scheduling.normal_qos")

    @staticmethod
    def _forget_recent_reads_on_change() -> None:
        """The answers a submission keeps (recent.py: a submitter's account, QOS and owner check)
        are dropped when a row they came from is saved or deleted in this process, or a setting
        changes (the executors app adds its ClusterExecutor)."""
        from django.contrib.auth import get_user_model

        from . import recent
        from .account_models import Account, AccountMembership, Qos
        from .node_models import UnixAccount

        for model in (Account, AccountMembership, Qos, UnixAccount, get_user_model(), "topology.Cluster"):
            for signal in (post_save, post_delete):
                name = model if isinstance(model, str) else model.__name__
                signal.connect(recent.forget, sender=model, dispatch_uid=f"scheduling.recent.{name}")
        for through in (Account.qos.through, AccountMembership.qos.through):
            m2m_changed.connect(
                recent.forget, sender=through, dispatch_uid=f"scheduling.recent.{through.__name__}"
            )
        setting_changed.connect(recent.forget, dispatch_uid="scheduling.recent.settings")


def _normal_qos(sender, instance, created, raw=False, **kwargs):
    if created and not raw:
        from .account_models import DEFAULT_QOS, Qos

        Qos.objects.get_or_create(cluster=instance, name=DEFAULT_QOS)
