"""Retention: a tenant's ended runs are redacted, then archived and pruned, one run per
transaction; runs that still matter are never touched, and one tenant's policy never
reaches another's runs."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta

import pytest
from django.core.files.storage import default_storage
from django.utils import timezone

from agentruns.archives import REDACTED_KEY, is_redacted, run_archive
from agentruns.models import Blob, Run, RunEvent, RunStatus, Step
from agentruns.runtime.effects import content_hash
from agentruns.services import get_registry
from approvals.models import Approval, ApprovalStatus
from reconciliation.models import CaseStatus, ReconciliationCase
from retention import services
from retention.services import retention_pass, run_archive_and_prune
from tests.retention.conftest import CUSTOMER

pytestmark = pytest.mark.django_db


def _payloads(run: Run) -> list[tuple]:
    return list(run.steps.order_by("seq").values_list("input", "request", "result"))


def test_it_archives_an_ended_run_past_its_tenants_period_and_prunes_it(tenant, make_run):
    run = make_run(tenant, ended_days_ago=31)
    steps_before = list(run.steps.order_by("seq").values())
    events_before = list(run.events.order_by("id").values())

    report = retention_pass()

    assert report.archived == {tenant.slug: 1}
    run.refresh_from_db()
    assert run.archived_at is not None and run.status == RunStatus.COMPLETED
    assert run.output == {"reply": "Refunded 25.00 EUR"}
    assert not RunEvent.objects.filter(run=run).exists()
    # The step rows stay, with everything but their payloads.
    after = list(run.steps.order_by("seq").values())
    assert [s["step_id"] for s in after] == [s["step_id"] for s in steps_before]
    assert all(s["input"] is None and s["request"] is None and s["result"] is None for s in after)
    kept = ("status", "effect_key", "input_hash", "result_hash", "attempts", "completed_at")
    for old, new in zip(steps_before, after, strict=True):
        assert {k: new[k] for k in kept} == {k: old[k] for k in kept}
    # The archive holds them as they were recorded, under the hash the run names.
    with default_storage.open(run.archive_name) as stored:
        document = json.loads(gzip.decompress(stored.read()))
    assert [e["id"] for e in document["events"]] == [e["id"] for e in events_before]
    assert [s["input"] for s in document["steps"]] == [s["input"] for s in steps_before]
    archive = run_archive(run)
    assert [e.type for e in archive.events] == ["run_started", "effect_sent", "run_ended"]
    assert archive.payloads[3]["request"]["metadata"] == {"order_id": "ord_1"}


def test_it_leaves_a_run_that_ended_within_the_period(tenant, make_run):
    run = make_run(tenant, ended_days_ago=29)
    assert retention_pass().total == 0
    run.refresh_from_db()
    assert run.archived_at is None and RunEvent.objects.filter(run=run).count() == 3


def test_a_second_pass_finds_nothing_and_changes_nothing(tenant, make_run):
    run = make_run(tenant)
    retention_pass()
    run.refresh_from_db()
    archived = (run.archived_at, run.archive_name, run.archive_sha256)

    assert retention_pass().total == 0
    assert run_archive_and_prune(run.pk, personal_data_days=None) is False
    run.refresh_from_db()
    assert (run.archived_at, run.archive_name, run.archive_sha256) == archived


def test_a_crash_between_writing_the_archive_and_pruning_keeps_the_run_whole(
    tenant, make_run, monkeypatch
):
    run = make_run(tenant, large_result=True)
    payloads = _payloads(run)
    [blob_id] = run.steps.exclude(result_blob=None).values_list("result_blob_id", flat=True)

    def crash(*args, **kwargs):
        raise RuntimeError("the process died here")

    with monkeypatch.context() as patched:
        patched.setattr(services, "archive_prune", crash)
        with pytest.raises(RuntimeError):
            run_archive_and_prune(run.pk, personal_data_days=None)

    run.refresh_from_db()
    assert run.archived_at is None and run.archive_sha256 == ""
    assert _payloads(run) == payloads and RunEvent.objects.filter(run=run).count() == 3
    assert Blob.objects.filter(pk=blob_id).exists()
    left = f"archives/runs/{tenant.pk}/{run.id}.json.gz"
    assert default_storage.exists(left)  # written, not yet pointed at

    # The next pass writes it again, under the same name, and prunes.
    assert retention_pass().archived == {tenant.slug: 1}
    run.refresh_from_db()
    assert run.archive_name == left
    assert run_archive(run).payloads[1]["result"]["notes"] == "x" * 2048
    assert not Blob.objects.filter(pk=blob_id).exists()


def test_it_writes_the_same_document_again_for_the_same_run(tenant, make_run):
    run = make_run(tenant)
    steps = list(run.steps.order_by("seq"))
    events = list(run.events.order_by("id"))
    from agentruns.archives import archive_document, archive_write

    first = archive_write(run, archive_document(run, steps, events))
    second = archive_write(run, archive_document(run, steps, events))
    assert first == second


def test_a_blob_another_step_still_uses_is_kept(tenant, make_run):
    archived = make_run(tenant, large_result=True)
    recent = make_run(tenant, ended_days_ago=1, large_result=True)
    [blob_id] = recent.steps.exclude(result_blob=None).values_list("result_blob_id", flat=True)

    assert retention_pass().archived == {tenant.slug: 1}
    assert Blob.objects.filter(pk=blob_id).exists()
    assert archived.steps.exclude(result_blob=None).count() == 0
    storage_name = Blob.objects.get(pk=blob_id).storage_name
    assert default_storage.exists(storage_name)


# --- never touched -----------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [RunStatus.WAITING_FOR_APPROVAL, RunStatus.BLOCKED, RunStatus.EFFECT_UNKNOWN]
)
def test_it_never_touches_a_run_that_has_not_ended(tenant, make_run, status):
    tenant.personal_data_days = 0
    tenant.save()
    run = make_run(tenant, status=status)
    payloads = _payloads(run)
    assert retention_pass().total == 0
    assert run_archive_and_prune(run.pk, personal_data_days=0) is False
    run.refresh_from_db()
    assert run.archived_at is None and run.personal_data_redacted_at is None
    assert _payloads(run) == payloads


def _case(run: Run, status: str) -> ReconciliationCase:
    step = run.steps.get(name="issue_refund")
    return ReconciliationCase.objects.create(
        tenant=run.tenant,
        run=run,
        step=step,
        step_id_label=step.step_id,
        tool="issue_refund",
        effect_key=step.effect_key,
        status=status,
    )


def _approval(run: Run, status: str) -> Approval:
    step = run.steps.get(name="issue_refund")
    return Approval.objects.create(
        tenant=run.tenant,
        run=run,
        step_id=step.step_id,
        tool="issue_refund",
        args=step.input,
        args_hash=step.input_hash,
        effect_key=step.effect_key,
        resource="order ord_1",
        resource_fingerprint="f" * 64,
        preview="Refund 25.00 EUR",
        status=status,
        expires_at=timezone.now() + timedelta(hours=1),
    )


def test_it_never_touches_an_ended_run_with_an_open_case(tenant, make_run):
    tenant.personal_data_days = 0
    tenant.save()
    run = make_run(tenant, status=RunStatus.FAILED_AFTER_EFFECT)
    case = _case(run, CaseStatus.OPEN)
    payloads = _payloads(run)

    assert retention_pass().total == 0
    assert services.held_counts([tenant]) == {tenant.slug: 1}
    run.refresh_from_db()
    assert run.archived_at is None and _payloads(run) == payloads

    case.status = CaseStatus.RESOLVED
    case.save()
    assert retention_pass().archived == {tenant.slug: 1}


@pytest.mark.parametrize("status", [ApprovalStatus.PENDING, ApprovalStatus.APPROVED])
def test_it_never_touches_an_ended_run_with_an_unconsumed_approval(tenant, make_run, status):
    tenant.personal_data_days = 0
    tenant.save()
    run = make_run(tenant, status=RunStatus.CANCELLED_NO_EFFECT)
    approval = _approval(run, status)
    payloads = _payloads(run)

    assert retention_pass().total == 0
    assert run_archive_and_prune(run.pk, personal_data_days=0) is False
    run.refresh_from_db()
    assert run.archived_at is None and _payloads(run) == payloads

    approval.status = ApprovalStatus.EXPIRED
    approval.save()
    assert retention_pass().archived == {tenant.slug: 1}


def test_a_case_opened_after_the_candidates_were_read_still_holds_the_run(tenant, make_run):
    run = make_run(tenant, status=RunStatus.FAILED_AFTER_EFFECT)
    _case(run, CaseStatus.OPEN)
    # The row lock's second look, not the candidates' query, is what decides.
    assert run_archive_and_prune(run.pk, personal_data_days=None) is False
    assert RunEvent.objects.filter(run=run).count() == 3


# --- redaction -----------------------------------------------------------------------


def test_personal_data_is_redacted_after_its_own_period_keeping_its_hashes(tenant, make_run):
    tenant.personal_data_days = 7
    tenant.save()
    run = make_run(tenant, ended_days_ago=8, large_result=True)
    lookup_before = run.steps.get(name="lookup_order")
    refund_before = run.steps.get(name="issue_refund")

    report = retention_pass()

    assert report.redacted == {tenant.slug: 1} and report.archived == {}
    run.refresh_from_db()
    assert run.personal_data_redacted_at is not None and run.archived_at is None
    lookup = run.steps.get(name="lookup_order")
    assert lookup.input == {REDACTED_KEY: "personal data", "sha256": lookup_before.input_hash}
    assert lookup.result == {REDACTED_KEY: "personal data", "sha256": lookup_before.result_hash}
    assert lookup.result_blob_id is None and lookup.result_hash == lookup_before.result_hash
    assert not Blob.objects.filter(pk=lookup_before.result_blob_id).exists()
    chat = run.steps.get(name="chat")
    assert chat.input[REDACTED_KEY] == "personal data"
    assert chat.input["sha256"] == content_hash(
        {"messages": [{"role": "tool", "content": CUSTOMER["email"]}]}
    )
    # The refund's tool declares no personal data: its payloads stay.
    refund = run.steps.get(name="issue_refund")
    assert (refund.input, refund.result) == (refund_before.input, refund_before.result)
    assert RunEvent.objects.filter(run=run).count() == 3

    assert retention_pass().total == 0  # looked at once


def test_an_archive_written_after_the_redaction_period_holds_the_markers(tenant, make_run):
    tenant.personal_data_days = 7
    tenant.save()
    run = make_run(tenant, ended_days_ago=40)
    # Archived in one go (say the sweeper was stopped): redacted first, then archived.
    services.run_archive_and_prune(run.pk, personal_data_days=7)
    run.refresh_from_db()
    archive = run_archive(run)
    assert archive.payloads[1]["input"][REDACTED_KEY] == "personal data"
    assert CUSTOMER["email"] not in json.dumps(archive.payloads)


def test_a_run_with_no_personal_data_is_marked_looked_at(tenant, make_run):
    tenant.personal_data_days = 1
    tenant.save()
    run = make_run(tenant, ended_days_ago=2)
    run.steps.filter(name="lookup_order").delete()
    payloads = _payloads(run)
    assert retention_pass().redacted == {tenant.slug: 1}
    run.refresh_from_db()
    assert run.personal_data_redacted_at is not None and _payloads(run) == payloads


# --- tenants -----------------------------------------------------------------------


def test_one_tenants_policy_never_touches_another_tenants_runs(tenant, other_tenant, make_run):
    tenant.retention_days = 1
    tenant.personal_data_days = 1
    tenant.save()
    mine = make_run(tenant, ended_days_ago=5)
    theirs = make_run(other_tenant, ended_days_ago=5)
    theirs_payloads = _payloads(theirs)

    report = retention_pass()

    assert report.archived == {tenant.slug: 1} and report.redacted == {tenant.slug: 1}
    theirs.refresh_from_db()
    assert theirs.archived_at is None and theirs.personal_data_redacted_at is None
    assert _payloads(theirs) == theirs_payloads
    mine.refresh_from_db()
    assert mine.archived_at is not None
    assert mine.archive_name.startswith(f"archives/runs/{tenant.pk}/")

    # A pass given only the other tenant touches none of this one's.
    fresh = make_run(tenant, ended_days_ago=5)
    assert retention_pass(tenants=[other_tenant]).total == 0
    assert Run.objects.get(pk=fresh.pk).archived_at is None


def test_a_pass_does_at_most_its_batch(tenant, make_run):
    runs = [make_run(tenant) for _ in range(3)]
    assert retention_pass(limit=2).archived == {tenant.slug: 2}
    assert retention_pass(limit=2).archived == {tenant.slug: 1}
    assert Run.objects.filter(pk__in=[r.pk for r in runs], archived_at=None).count() == 0


def test_a_dry_pass_counts_and_changes_nothing(tenant, make_run):
    run = make_run(tenant)
    payloads = _payloads(run)
    assert retention_pass(dry_run=True).archived == {tenant.slug: 1}
    run.refresh_from_db()
    assert run.archived_at is None and _payloads(run) == payloads


def test_a_pass_stops_when_the_sweeper_loses_its_lease(tenant, make_run):
    make_run(tenant)
    assert retention_pass(keep_going=lambda: False).total == 0
    assert Step.objects.filter(input__isnull=True).count() == 0
    assert RunEvent.objects.count() == 3


def test_the_refund_agents_declare_which_tools_carry_personal_data():
    for name in ("refund_support", "refund_support_pydantic_ai"):
        tools = get_registry().latest(name).snapshot()["tools"]
        declared = {tool for tool, spec in tools.items() if spec["personal_data"]}
        assert declared == {"lookup_order", "send_customer_email"}, name


def test_a_run_pinned_before_tools_declared_personal_data_reads_its_agent_version(tenant, make_run):
    tenant.personal_data_days = 1
    tenant.save()
    run = make_run(tenant, ended_days_ago=2)
    snapshot = run.agent_snapshot
    for spec in snapshot["tools"].values():
        del spec["personal_data"]
    Run.objects.filter(pk=run.pk).update(agent_snapshot=snapshot)

    assert retention_pass().redacted == {tenant.slug: 1}
    assert is_redacted(run.steps.get(name="lookup_order").input)
    assert not is_redacted(run.steps.get(name="issue_refund").input)


def test_a_run_that_fails_is_logged_and_the_pass_goes_on(tenant, make_run, caplog):
    broken = make_run(tenant, ended_days_ago=50, large_result=True)
    fine = make_run(tenant, ended_days_ago=40)
    blob = Blob.objects.get(pk=broken.steps.exclude(result_blob=None).get().result_blob_id)
    default_storage.delete(blob.storage_name)  # the blob's file is gone

    report = retention_pass()

    assert report.failed == {tenant.slug: 1} and report.archived == {tenant.slug: 1}
    assert f"run {broken.pk} of {tenant.slug} failed" in caplog.text
    broken.refresh_from_db()
    fine.refresh_from_db()
    assert broken.archived_at is None and RunEvent.objects.filter(run=broken).count() == 3
    assert fine.archived_at is not None
