from django.urls import path

from approvals import views

urlpatterns = [
    path("approvals/", views.approval_inbox, name="approval-inbox"),
    path("approvals/<int:approval_id>/", views.approval_detail, name="approval-detail"),
    path(
        "approvals/<int:approval_id>/resource/",
        views.approval_resource,
        name="approval-resource",
    ),
    path("approvals/<int:approval_id>/decide", views.approval_decide_view, name="approval-decide"),
    path(
        "approvals/<int:approval_id>/rerequest",
        views.approval_rerequest_view,
        name="approval-rerequest",
    ),
    path(
        "approvals/<int:approval_id>/ask-again",
        views.approval_ask_again_view,
        name="approval-ask-again",
    ),
]
