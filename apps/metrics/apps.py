from django.apps import AppConfig


class MetricsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "apps.metrics"
    label = "metrics"
    verbose_name = "Metrics"

    def ready(self) -> None:
        from apps.topology.signals import nic_counters_received

        from .store import agent_nics_store

        def store(sender, *, node_id, counters, at, **kwargs):
            agent_nics_store(node_id=node_id, counters=counters, now=at)

        nic_counters_received.connect(store, dispatch_uid="metrics-agent-nics", weak=False)
