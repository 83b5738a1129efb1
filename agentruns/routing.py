from django.urls import path

from agentruns.consumers import RunsConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunsConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", RunsConsumer.as_asgi()),
    # Pages that only show the navigation's counts (the audit log).
    path("ws/nav/", RunsConsumer.as_asgi(), {"navigation_only": True}),
    # The approvals and reconciliation pages, by the name config/wiring.py gives them
    # (agentruns.live); an unknown name is refused (4404).
    path("ws/live/<slug:page>/", RunsConsumer.as_asgi()),
    path("ws/live/<slug:page>/<int:object_id>/", RunsConsumer.as_asgi()),
]
