"""Runs recorded before runs could be archived: after the migration that adds the
archive columns (and the tenants' retention settings), a run a worker died in replays
to its end, and an ended run reads, is archived, and reads the same from its archive."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from agentruns.models import Run
from agentruns.runtime import faults
from evidence.bundle import run_bundle
from retention.services import run_archive_and_prune

pytestmark = pytest.mark.django_db(transaction=True)


def recorded_before_archives() -> None:
    """As if every run so far had been recorded before the archive columns existed."""
    try:
        call_command("migrate", "agentruns", "0008", verbosity=0)
        call_command("migrate", "accounts", "0009", verbosity=0)
    finally:
        call_command("migrate", verbosity=0)


def test_runs_recorded_before_archives_replay_and_archive(harness, provider, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    ended = harness.drive(harness.start("flow", {"order_id": "a"}))
    halfway = harness.start("flow", {"order_id": "c"})
    harness.interrupt(halfway, faults.AFTER_RESULT_RECORDED, "lookup_order")
    calls = provider.calls["lookup_order"]
    bundle = run_bundle(ended, provider_error_detail=True)

    recorded_before_archives()

    ended = Run.objects.get(pk=ended.pk)
    assert ended.archived_at is None and ended.personal_data_redacted_at is None
    assert ended.tenant.retention_days == 30 and ended.tenant.personal_data_days is None
    assert run_bundle(ended, provider_error_detail=True) == bundle
    # The run a worker died in goes on from its last recorded step.
    assert harness.advance(halfway) == "finished:completed"
    assert provider.calls["lookup_order"] == calls

    assert run_archive_and_prune(ended.pk, personal_data_days=None) is True
    ended.refresh_from_db()
    assert not ended.events.exists()
    assert run_bundle(ended, provider_error_detail=True) == bundle
