from django.urls import path

from reconciliation import views

urlpatterns = [
    path("reconciliation/", views.case_queue, name="case-queue"),
    path("reconciliation/<int:case_id>/", views.case_detail, name="case-detail"),
    path("reconciliation/<int:case_id>/lookup", views.case_lookup_view, name="case-lookup"),
    path("reconciliation/<int:case_id>/record", views.case_record_view, name="case-record"),
    path("reconciliation/<int:case_id>/resolve", views.case_resolve_view, name="case-resolve"),
]
