from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Tenant
from agentruns.runtime import AdmissionError
from agentruns.services import run_start


class Command(BaseCommand):
    help = "Start a run of AGENT and print its id (the same id again for a repeated request id)."

    def add_arguments(self, parser):
        parser.add_argument("agent", help="the agent's registered name")
        parser.add_argument("--input", default="{}", help="the run's input as a JSON object")
        parser.add_argument("--request-id", default=None, help="admission idempotency key")
        parser.add_argument("--dedupe-key", default=None, help="one active run per key")
        parser.add_argument("--tenant", default="default", help="tenant slug")

    def handle(self, *args, agent, input, request_id, dedupe_key, tenant, **options):
        try:
            payload = json.loads(input)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--input is not valid JSON: {exc}") from None
        try:
            tenant_obj = Tenant.objects.get(slug=tenant)
        except Tenant.DoesNotExist:
            raise CommandError(f"no tenant with slug {tenant!r}") from None
        try:
            run, _created = run_start(
                tenant=tenant_obj,
                agent_name=agent,
                input=payload,
                request_id=request_id,
                dedupe_key=dedupe_key,
                requested_by="cli",
            )
        except AdmissionError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(run.id))
