"""Mark the runs recorded before ``Run.reconciled`` existed whose effect of unknown
outcome was settled: a resolved case."""

from django.db import migrations
from django.db.models import Exists, OuterRef


def mark_reconciled_runs(apps, schema_editor):
    Run = apps.get_model("agentruns", "Run")
    ReconciliationCase = apps.get_model("reconciliation", "ReconciliationCase")
    resolved = ReconciliationCase.objects.filter(run_id=OuterRef("pk"), status="resolved")
    Run.objects.filter(Exists(resolved)).update(reconciled=True)


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0006_run_marks"),
        ("reconciliation", "0001_initial"),
    ]

    operations = [migrations.RunPython(mark_reconciled_runs, migrations.RunPython.noop)]
