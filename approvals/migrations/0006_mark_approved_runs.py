"""Mark who approved each run recorded before ``Run.approved_by`` existed: the latest
person whose decision was to approve (the approval may since have been consumed,
invalidated or withdrawn; a rejection names no approver)."""

from django.db import migrations
from django.db.models import Exists, OuterRef, Subquery


def mark_approved_runs(apps, schema_editor):
    Run = apps.get_model("agentruns", "Run")
    Approval = apps.get_model("approvals", "Approval")
    approved = (
        Approval.objects.filter(run_id=OuterRef("pk"), decided_at__isnull=False)
        .exclude(status="rejected")
        .exclude(decided_by_name="")
    )
    latest = approved.order_by("-decided_at", "-id").values("decided_by_name")[:1]
    Run.objects.filter(Exists(approved)).update(approved_by=Subquery(latest))


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0006_run_marks"),
        ("approvals", "0005_authority_one_per_role_currency"),
    ]

    operations = [migrations.RunPython(mark_approved_runs, migrations.RunPython.noop)]
