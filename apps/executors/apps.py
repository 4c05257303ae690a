from django.apps import AppConfig


class ExecutorsConfig(AppConfig):
    name = "apps.executors"
    label = "executors"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Scheduling reaches its executors through its port only (apps.scheduling.executor).
        from .ports import register

        register()
