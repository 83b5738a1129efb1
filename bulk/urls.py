from django.urls import path

from bulk import views

urlpatterns = [
    path("runs/bulk/", views.bulk_confirm, name="bulk-confirm"),
    path("runs/bulk/start", views.bulk_start_view, name="bulk-start"),
    path("runs/bulk/<int:action_id>/", views.bulk_progress, name="bulk-progress"),
]
