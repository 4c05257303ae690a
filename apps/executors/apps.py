from django.apps import AppConfig


class ExecutorsConfig(AppConfig):
    name = "apps.executors"
    label = "executors"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Scheduling reaches its executors through its port only (apps.scheduling.executor):
        # Slurm for the clusters a ClusterExecutor of kind slurm names, the node agents otherwise.
        from apps.scheduling import executor

        from .agents.port import AgentsExecutor
        from .slurm.port import SlurmExecutor

        executor.register(AgentsExecutor(), default=True)
        executor.register(SlurmExecutor())
        # Which executor runs a cluster is one of the answers a submission keeps a moment.
        from django.db.models.signals import post_delete, post_save

        from apps.scheduling import recent

        from .models import ClusterExecutor

        for signal in (post_save, post_delete):
            signal.connect(
                recent.forget, sender=ClusterExecutor, dispatch_uid="executors.recent.ClusterExecutor"
            )
