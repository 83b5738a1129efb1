from django.urls import path

from evidence import views

urlpatterns = [
    path("runs/<uuid:run_id>/evidence.json", views.run_evidence_json, name="run-evidence-json"),
    path("runs/<uuid:run_id>/evidence/", views.run_evidence_page, name="run-evidence"),
]
