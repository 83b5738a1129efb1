from django.urls import path

from agentruns.consumers import RunsConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunsConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", RunsConsumer.as_asgi()),
    # Pages that show no run (approvals, reconciliation): only the navigation's counts.
    path("ws/nav/", RunsConsumer.as_asgi(), {"navigation_only": True}),
]
