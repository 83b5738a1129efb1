from django.urls import path

from agentruns import api

urlpatterns = [
    path("api/runs", api.start_run, name="api-start-run"),
    path("api/runs/<uuid:run_id>", api.get_run, name="api-get-run"),
]
