from django.apps import AppConfig


class SimulationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "apps.simulations"
