from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from agentruns.models import Run


class Command(BaseCommand):
    help = "Print a run's state and steps as JSON."

    def add_arguments(self, parser):
        parser.add_argument("run_id")

    def handle(self, *args, run_id, **options):
        try:
            run = Run.objects.get(pk=run_id)
        except (Run.DoesNotExist, ValueError, ValidationError):
            raise CommandError(f"no run {run_id!r}") from None
        steps = [
            {
                "step_id": s.step_id,
                "kind": s.kind,
                "status": s.status,
                "attempts": s.attempts,
                "ambiguous_attempts": s.ambiguous_attempts,
                "effect_key": s.effect_key,
                "provider_reference": s.provider_reference,
                "last_error_class": s.last_error_class,
                "last_error": s.last_error,
            }
            for s in run.steps.order_by("seq")
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
