"""manage.py archive_runs: a tenant's retention applied now, said per tenant, audited."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounts.models import AuditEntry
from agentruns.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def _archive_runs(*args: str) -> str:
    out = StringIO()
    call_command("archive_runs", *args, stdout=out)
    return out.getvalue()


def test_it_archives_every_batch_and_says_what_it_did_per_tenant(tenant, other_tenant, make_run):
    runs = [make_run(tenant) for _ in range(3)]
    make_run(tenant, status=RunStatus.BLOCKED)
    make_run(other_tenant, ended_days_ago=2)

    output = _archive_runs("--batch", "2")

    assert Run.objects.filter(pk__in=[r.pk for r in runs], archived_at=None).count() == 0
    assert (
        "default (runs kept 30 days after they end): redacted 0, archived 3, kept 1 "
        "(not ended, an open case or an unconsumed approval)"
    ) in output
    assert "other (runs kept 30 days after they end): redacted 0, archived 0, kept 0" in output
    [entry] = AuditEntry.objects.filter(action="runs.archived")
    assert entry.tenant == tenant and entry.actor == "manage.py archive_runs"
    assert entry.after["archived"] == 3


def test_a_dry_run_counts_and_changes_nothing(tenant, make_run):
    tenant.personal_data_days = 10
    tenant.save()
    run = make_run(tenant)

    output = _archive_runs("--dry-run")

    assert (
        "default (runs kept 30 days after they end, personal data 10): would redact 1, "
        "would archive 1" in output
    )
    assert "dry run: nothing was changed" in output
    run.refresh_from_db()
    assert run.archived_at is None and run.personal_data_redacted_at is None
    assert not AuditEntry.objects.filter(action="runs.archived").exists()


def test_it_keeps_to_the_tenant_it_is_given(tenant, other_tenant, make_run):
    mine = make_run(tenant)
    theirs = make_run(other_tenant)

    output = _archive_runs("--tenant", "other")

    assert "other (" in output and "default (" not in output
    assert Run.objects.get(pk=theirs.pk).archived_at is not None
    assert Run.objects.get(pk=mine.pk).archived_at is None


def test_it_refuses_an_unknown_tenant_and_a_batch_of_none(tenant):
    with pytest.raises(CommandError, match="no tenant 'nope'"):
        _archive_runs("--tenant", "nope")
    with pytest.raises(CommandError, match="at least 1"):
        _archive_runs("--batch", "0")
