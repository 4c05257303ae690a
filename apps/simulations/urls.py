"""Simulation pages, mounted at /simulations/."""

from django.urls import path

from . import views

app_name = "simulations"

urlpatterns = [
    path("", views.simulation_list, name="list"),
    path("<int:pk>/", views.simulation_detail, name="detail"),
    path("<int:pk>/progress/", views.simulation_progress, name="progress"),
]
