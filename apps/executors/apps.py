from django.apps import AppConfig


class ExecutorsConfig(AppConfig):
    name = "apps.executors"
    label = "executors"
    default_auto_field = "django.db.models.BigAutoField"
