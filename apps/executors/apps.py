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
