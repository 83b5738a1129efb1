"""The admin shows the records of truth and changes none of them, alone or in bulk."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.utils import timezone

from accounts.models import AuditEntry
from accounts.services import audit_record
from agentruns.models import Blob, Run, RunEvent, Step
from approvals.models import Approval
from reconciliation.models import ProviderLookup, ReconciliationCase
from tests.agentruns.runtime import agents
from tests.harness import Harness

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def records(tenant):
    """One of each record of truth, as the engine and the dashboard leave them."""
    agents.PROVIDER.reset()
    harness = Harness(tenant)
    run = harness.start("flow")
    harness.advance(run)
    step = Step.objects.filter(run=run).order_by("seq").first()
    approval = Approval.objects.create(
        tenant=tenant,
        run=run,
        step_id=step.step_id,
        tool="issue_refund",
        args={"amount": 6000},
        args_hash="a" * 64,
        effect_key="ek-1",
        requested_by="user:requester",
        resource="order:ord_1001",
        resource_fingerprint="f" * 64,
        preview="Refund 60.00 EUR",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    case = ReconciliationCase.objects.create(
        tenant=tenant,
        run=run,
        step=step,
        step_id_label=step.step_id,
        tool="issue_refund",
        effect_key="ek-1",
    )
    ProviderLookup.objects.create(case=case, method="operator", actor="user:ann", outcome="absent")
    entry = audit_record(
        tenant=tenant, actor="user:ann", action="run.cancel", object_type="run", object_id=run.id
    )
    rows = {
        "agentruns/run": run,
        "agentruns/step": step,
        "agentruns/runevent": RunEvent.objects.filter(run=run).first(),
        "approvals/approval": approval,
        "reconciliation/reconciliationcase": case,
        "accounts/auditentry": entry,
    }
    yield rows
    agents.PROVIDER.reset()


RECORDS = [
    "agentruns/run",
    "agentruns/step",
    "agentruns/runevent",
    "approvals/approval",
    "reconciliation/reconciliationcase",
    "accounts/auditentry",
]
MODELS = {
    "agentruns/run": Run,
    "agentruns/step": Step,
    "agentruns/runevent": RunEvent,
    "approvals/approval": Approval,
    "reconciliation/reconciliationcase": ReconciliationCase,
    "accounts/auditentry": AuditEntry,
}


@pytest.mark.parametrize("record", RECORDS)
def test_a_record_of_truth_is_shown_but_not_deleted_or_changed(admin_client, records, record):
    obj = records[record]
    base = f"/admin/{record}/"
    assert admin_client.get(f"{base}{obj.pk}/change/").status_code == 200
    assert admin_client.get(f"{base}{obj.pk}/delete/").status_code == 403
    assert admin_client.post(f"{base}{obj.pk}/delete/", {"post": "yes"}).status_code == 403
    assert admin_client.post(f"{base}{obj.pk}/change/", {}).status_code == 403
    assert admin_client.get(f"{base}add/").status_code == 403
    assert MODELS[record].objects.filter(pk=obj.pk).exists()


@pytest.mark.parametrize("record", RECORDS)
def test_a_record_of_truth_has_no_bulk_delete_action(admin_client, records, record):
    obj = records[record]
    page = admin_client.get(f"/admin/{record}/").content.decode()
    assert str(obj.pk) in page
    assert "delete_selected" not in page
    count = MODELS[record].objects.count()
    response = admin_client.post(
        f"/admin/{record}/",
        {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"},
    )
    # An action the admin does not offer is refused with a message, nothing deleted.
    assert response.status_code in (200, 302)
    assert MODELS[record].objects.count() == count


def test_a_succeeded_effect_step_cannot_be_deleted_to_make_replay_send_it_again(
    admin_client, records
):
    run = records["agentruns/run"]
    effect = Step.objects.filter(run=run, kind="tool", status="succeeded").first()
    assert effect is not None
    assert admin_client.get(f"/admin/agentruns/step/{effect.pk}/delete/").status_code == 403
    assert (
        admin_client.post(f"/admin/agentruns/step/{effect.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    assert Step.objects.filter(pk=effect.pk, status="succeeded").exists()


def test_the_inlines_of_a_run_and_a_case_offer_no_add_or_delete(admin_client, records):
    run_page = admin_client.get(f"/admin/agentruns/run/{records['agentruns/run'].pk}/change/")
    case = records["reconciliation/reconciliationcase"]
    case_page = admin_client.get(f"/admin/reconciliation/reconciliationcase/{case.pk}/change/")
    for page in [run_page.content.decode(), case_page.content.decode()]:
        assert "-DELETE" not in page
        assert "add-row" not in page


def test_every_record_of_truth_admin_refuses_add_change_and_delete(rf, admin_user):
    request = rf.get("/admin/")
    request.user = admin_user
    for model in [*MODELS.values(), Blob]:
        model_admin = admin.site._registry[model]
        assert not model_admin.has_add_permission(request), model
        assert not model_admin.has_change_permission(request), model
        assert not model_admin.has_delete_permission(request), model
        assert "delete_selected" not in model_admin.get_actions(request), model


def test_django_q_models_are_not_in_the_admin(admin_client):
    assert not [m for m in admin.site._registry if m._meta.app_label == "django_q"]
    for url in [
        "/admin/django_q/schedule/",
        "/admin/django_q/schedule/add/",
        "/admin/django_q/failure/",
        "/admin/django_q/success/",
        "/admin/django_q/ormq/",
    ]:
        assert admin_client.get(url).status_code == 404, url
    index = admin_client.get("/admin/").content.decode()
    assert "/admin/django_q/" not in index
