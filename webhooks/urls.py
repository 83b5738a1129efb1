from django.urls import path

from webhooks import views

urlpatterns = [
    path("webhooks/", views.webhook_list, name="webhook-list"),
    path("webhooks/new/", views.webhook_create, name="webhook-create"),
    path("webhooks/<int:endpoint_id>/", views.webhook_detail, name="webhook-detail"),
    path("webhooks/<int:endpoint_id>/edit/", views.webhook_edit, name="webhook-edit"),
    path("webhooks/<int:endpoint_id>/rotate/", views.webhook_rotate, name="webhook-rotate"),
    path("webhooks/<int:endpoint_id>/disable/", views.webhook_disable, name="webhook-disable"),
    path("webhooks/<int:endpoint_id>/enable/", views.webhook_enable, name="webhook-enable"),
]
