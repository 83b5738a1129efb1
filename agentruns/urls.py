from django.urls import path

from agentruns import api, views

urlpatterns = [
    path("api/runs", api.start_run, name="api-start-run"),
    path("api/runs/<uuid:run_id>", api.get_run, name="api-get-run"),
    path("runs/", views.run_list, name="run-list"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/cancel", views.run_cancel_view, name="run-cancel"),
    path("runs/<uuid:run_id>/retry", views.run_retry_view, name="run-retry"),
]
