from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from agentruns.models import Run
from agentruns.selectors import run_step_rows


class Command(BaseCommand):
    help = "Print a run's state and steps as JSON."

    def add_arguments(self, parser):
        parser.add_argument("run_id")

    def handle(self, *args, run_id, **options):
        try:
            run = Run.objects.get(pk=run_id)
        except (Run.DoesNotExist, ValueError, ValidationError):
            raise CommandError(f"no run {run_id!r}") from None
        # The steps as the run page and the API read them (run_step_rows): with the
        # send in flight, its deadline, the step's approval and its case.
        steps = [
            {
                "step_id": row.step.step_id,
                "kind": row.step.kind,
                "status": row.step.status,
                "attempts": row.step.attempts,
                "ambiguous_attempts": row.step.ambiguous_attempts,
                "effect_key": row.step.effect_key,
                "provider_reference": row.step.provider_reference,
                "last_error_class": row.step.last_error_class,
                "last_error": row.step.last_error,
                "in_flight": row.may_land_until is not None,
                "may_land_until": _iso(row.may_land_until),
                "approval_id": row.approval.pk if row.approval else None,
                "case_id": row.case.pk if row.case else None,
            }
            for row in run_step_rows(run)
        ]
        self.stdout.write(
            json.dumps(
                {
                    "id": str(run.id),
                    "agent": run.agent_name,
                    "version": run.agent_version,
                    "status": run.status,
                    "outcome_detail": run.outcome_detail,
                    "output": run.output,
                    "state_version": run.state_version,
                    "steps": steps,
                },
                indent=2,
            )
        )


def _iso(value) -> str | None:
    return value.isoformat() if value else None
