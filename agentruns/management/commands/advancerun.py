from __future__ import annotations

from django.core.management.base import BaseCommand

from agentruns.services import build_engine


class Command(BaseCommand):
    help = (
        "Advance one run in this process, as a worker would, and print what happened. "
        "For operators debugging a run and for tests that need a worker they can pause."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id")

    def handle(self, *args, run_id, **options):
        self.stdout.write(build_engine().advance(run_id))
