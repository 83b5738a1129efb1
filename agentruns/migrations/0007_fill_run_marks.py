"""Mark the runs recorded before the marks existed, from the facts the engine kept.

Retried: a step with more than one attempt, or an operator's "retry now" (a "woken"
event). Compensated: an ended run with a succeeded undo step. Recovered cannot be told
from what was recorded (a claim did not note whose lease it took): runs from before
stay unmarked. Approvals and reconciliation mark their own (approvals 0006,
reconciliation 0002).
"""

from django.db import migrations
from django.db.models import Exists, OuterRef

ENDED = [
    "completed",
    "failed_before_effect",
    "failed_after_effect",
    "compensated",
    "cancelled_no_effect",
    "cancelled_after_irreversible_effect",
]


def mark_runs(apps, schema_editor):
    Run = apps.get_model("agentruns", "Run")
    Step = apps.get_model("agentruns", "Step")
    RunEvent = apps.get_model("agentruns", "RunEvent")
    another_attempt = Step.objects.filter(run_id=OuterRef("pk"), attempts__gt=1)
    retry_now = RunEvent.objects.filter(run_id=OuterRef("pk"), type="woken")
    Run.objects.filter(Exists(another_attempt) | Exists(retry_now)).update(retried=True)
    undone = Step.objects.filter(run_id=OuterRef("pk"), kind="compensation", status="succeeded")
    Run.objects.filter(Exists(undone), status__in=ENDED).update(compensated=True)


class Migration(migrations.Migration):
    dependencies = [("agentruns", "0006_run_marks")]

    operations = [migrations.RunPython(mark_runs, migrations.RunPython.noop)]
