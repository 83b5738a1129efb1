"""Who reads an archived run: the evidence bundle (the same as before archiving), the run
page (its outcome, the archive's date, its timeline from the archive), the API (says
archived, still lists the steps), the effect-key search."""

from __future__ import annotations

import pytest
from django.core.files.storage import default_storage
from django.utils import timezone

from accounts.models import ApiToken, AuditEntry
from accounts.services import audit_record
from approvals.models import Approval, ApprovalStatus
from evidence.bundle import run_bundle
from reconciliation.models import CaseStatus, ReconciliationCase, Resolution
from retention.services import retention_pass
from tests.api.conftest import Api
from tests.retention.conftest import CUSTOMER

pytestmark = pytest.mark.django_db


@pytest.fixture
def settled_run(tenant, make_run):
    """An ended run with a consumed approval, a resolved case and an audit entry."""
    run = make_run(tenant, large_result=True)
    refund = run.steps.get(name="issue_refund")
    Approval.objects.create(
        tenant=tenant,
        run=run,
        step_id=refund.step_id,
        tool="issue_refund",
        args=refund.input,
        args_hash=refund.input_hash,
        effect_key=refund.effect_key,
        resource="order ord_1",
        resource_fingerprint="f" * 64,
        preview="Refund 25.00 EUR",
        amount=2500,
        currency="eur",
        status=ApprovalStatus.CONSUMED,
        decided_by_name="user:ann",
        decided_at=timezone.now(),
        consumed_at=timezone.now(),
        consumed_by_effect_key=refund.effect_key,
        expires_at=timezone.now(),
    )
    ReconciliationCase.objects.create(
        tenant=tenant,
        run=run,
        step=refund,
        step_id_label=refund.step_id,
        tool="issue_refund",
        effect_key=refund.effect_key,
        request=refund.request,
        status=CaseStatus.RESOLVED,
        resolution=Resolution.HAPPENED,
        resolved_by="user:rita",
        resolved_at=timezone.now(),
    )
    audit_record(
        tenant=tenant,
        actor="user:ann",
        action="run.cancel",
        object_type="run",
        object_id=str(run.id),
    )
    return run


@pytest.mark.parametrize("detail", [False, True])
def test_an_archived_runs_evidence_is_the_bundle_it_had_before(settled_run, detail):
    before = run_bundle(settled_run, provider_error_detail=detail)

    assert retention_pass().archived == {"default": 1}
    settled_run.refresh_from_db()
    after = run_bundle(settled_run, provider_error_detail=detail)

    assert after == before
    assert [e["type"] for e in after["events"]] == ["run_started", "effect_sent", "run_ended"]
    assert after["steps"][0]["result"]["notes"] == "x" * 2048  # was a blob
    assert [a["action"] for a in after["audit"]] == ["run.cancel"]  # audit is never pruned


def test_the_run_page_says_the_run_is_archived_and_shows_its_timeline(
    client, tenant, make_operator, settled_run
):
    client.force_login(make_operator(tenant, "viewer"))
    retention_pass()
    settled_run.refresh_from_db()

    page = client.get(f"/runs/{settled_run.id}/").content.decode()

    assert "Archived" in page and f"{settled_run.archived_at:%Y-%m-%d}" in page
    assert "read from the run's archive" in page
    assert "0003.tool.issue_refund" in page and "effect_sent" in page
    # Payloads read back from the archive, a blob's among them.
    assert "1 High Street" in page and "Refund for Ann Example" in page
    assert CUSTOMER["email"] not in page  # masked, as before archiving


def test_the_run_page_says_so_when_the_archive_is_gone(client, tenant, make_operator, make_run):
    client.force_login(make_operator(tenant, "viewer"))
    run = make_run(tenant)
    retention_pass()
    run.refresh_from_db()
    default_storage.delete(run.archive_name)

    response = client.get(f"/runs/{run.id}/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "which cannot be read" in page and "0003.tool.issue_refund" in page


def test_an_archived_runs_evidence_downloads_and_is_refused_when_its_archive_is_gone(
    client, tenant, make_operator, settled_run
):
    client.force_login(make_operator(tenant, "viewer"))
    retention_pass()
    settled_run.refresh_from_db()
    response = client.get(f"/runs/{settled_run.id}/evidence.json")
    assert response.status_code == 200
    assert [e["type"] for e in response.json()["bundle"]["events"]][-1] == "run_ended"

    default_storage.delete(settled_run.archive_name)
    exports = AuditEntry.objects.filter(action="run.evidence_exported").count()
    for url in [f"/runs/{settled_run.id}/evidence.json", f"/runs/{settled_run.id}/evidence/"]:
        response = client.get(url)
        assert response.status_code == 503
        assert "cannot be exported" in response.content.decode()
    assert AuditEntry.objects.filter(action="run.evidence_exported").count() == exports


def test_another_tenants_operator_cannot_read_an_archived_run(
    client, other_tenant, make_operator, settled_run
):
    client.force_login(make_operator(other_tenant, "viewer"))
    retention_pass()
    assert client.get(f"/runs/{settled_run.id}/").status_code == 404


def test_the_api_says_archived_and_lists_the_steps_and_finds_the_effect_key(
    client, tenant, make_operator, settled_run
):
    owner = make_operator(tenant, "operator", username="olga")
    api = Api(client, ApiToken.issue(owner=owner, name="helpdesk")[1])
    effect_key = settled_run.steps.get(name="issue_refund").effect_key
    retention_pass()
    settled_run.refresh_from_db()

    answer = api.get(f"/runs/{settled_run.id}")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["archived_at"] is not None and body["status"] == "completed"
    assert [s["step_id"] for s in body["steps"]] == [
        "0001.tool.lookup_order",
        "0002.model.chat",
        "0003.tool.issue_refund",
    ]
    assert body["steps"][2]["effect_key"] == effect_key
    found = api.get("/runs", {"effect_key": effect_key}).json()
    assert [r["id"] for r in found["items"]] == [str(settled_run.id)]


def test_a_case_of_an_archived_run_still_shows_its_attempts(
    client, tenant, make_operator, settled_run
):
    case = ReconciliationCase.objects.get(run=settled_run)
    client.force_login(make_operator(tenant, "reconciler"))
    owner = make_operator(tenant, "operator", username="olga")
    api = Api(client, ApiToken.issue(owner=owner, name="helpdesk")[1])
    before = api.get(f"/cases/{case.pk}").json()["events"]
    assert [e["type"] for e in before] == ["effect_sent"]

    retention_pass()

    assert api.get(f"/cases/{case.pk}").json()["events"] == before
    page = client.get(f"/reconciliation/{case.pk}/").content.decode()
    assert '<table class="events">' in page and "<td>effect_sent</td>" in page
