from django.urls import path

from agentruns import views

urlpatterns = [
    path("runs/", views.run_list, name="run-list"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/cancel", views.run_cancel_view, name="run-cancel"),
    path("runs/<uuid:run_id>/retry", views.run_retry_view, name="run-retry"),
]
