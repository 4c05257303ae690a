from django.apps import AppConfig


class TopologyConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "apps.topology"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from .models import Cluster
        from .selectors import forget_recent_clusters

        post_save.connect(forget_recent_clusters, sender=Cluster, dispatch_uid="forget_recent_clusters_save")
        post_delete.connect(
            forget_recent_clusters, sender=Cluster, dispatch_uid="forget_recent_clusters_delete"
        )
