"""/api/v1/approvals: the inbox's cards and its one decision, for a client system."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from accounts.models import ApiToken, AuditEntry
from agentruns.models import Run
from approvals.models import Approval, ApprovalAuthority
from tests.approvals.conftest import World
from tests.harness import ORDER, OVER_LIMIT, point_at_sandbox, refund_harness

# A decision wakes the run through the task queue (its own database on SQLite).
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def world(sandbox, settings, tenant) -> World:
    point_at_sandbox(settings, sandbox)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return World(refund_harness(tenant), sandbox, order, tenant)


@pytest.fixture
def approver(tenant, make_operator):
    """Ann, an approver who may approve up to 500.00 EUR."""
    user = make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.update_or_create(
        tenant=tenant,
        group=Group.objects.get(name="approver"),
        currency="eur",
        defaults={"max_amount": 50_000},
    )
    return user


@pytest.fixture
def pending(world) -> Approval:
    """A refund of 60.00 EUR waiting for approval, asked for by someone else."""
    run = world.start_refund(requested_by="user:requester")
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    return world.waiting_approval(run)


@pytest.fixture
def ann(api_as, approver):
    """Ann's chat integration: a token of hers."""
    return api_as(approver)


def _decide(api, approval, decision="approve", note="", args_hash=None):
    return api.post(
        f"/approvals/{approval.pk}/decision",
        {
            "decision": decision,
            "note": note,
            "args_hash": approval.args_hash if args_hash is None else args_hash,
        },
    )


# --- reading --------------------------------------------------------------------------


def test_the_list_of_pending_approvals_shows_each_card(ann, pending):
    response = ann.get("/approvals", {"status": "pending"})
    assert response.status_code == 200
    body = response.json()
    assert body["next_cursor"] is None
    [item] = body["items"]
    assert item["id"] == pending.pk
    assert item["status"] == "pending" and item["expired"] is False
    assert item["tool"] == "issue_refund"
    assert item["args_hash"] == pending.args_hash
    assert item["args"]["order_id"] == ORDER and item["args"]["amount"] == OVER_LIMIT
    assert item["money"] == {"amount": OVER_LIMIT, "currency": "eur", "display": "60.00 EUR"}
    assert item["run"]["id"] == str(pending.run_id)
    assert item["run"]["agent"] == "refund_support"
    assert item["run"]["status"] == "waiting_for_approval"
    assert item["requested_by"] == "user:requester"
    assert item["preview"].startswith("Refund 60.00 EUR of order ord_1001")
    assert item["decision"] is None
    assert item["may_decide"] is True and item["why_not"] is None


def test_the_list_filters_by_status_agent_tool_and_run(ann, pending):
    def ids(**params):
        response = ann.get("/approvals", params)
        assert response.status_code == 200, response.content
        return [item["id"] for item in response.json()["items"]]

    assert ids() == [pending.pk]
    assert ids(status="decided") == []
    assert ids(status="expired") == []
    assert ids(status=["decided", "pending"]) == [pending.pk]
    assert ids(agent="refund_support", tool="issue_refund") == [pending.pk]
    assert ids(agent="flow") == []
    assert ids(tool="send_email") == []
    assert ids(run=str(pending.run_id)) == [pending.pk]
    assert ids(run=str(uuid.uuid4())) == []
    Approval.objects.filter(pk=pending.pk).update(expires_at=timezone.now() - timedelta(1))
    assert ids(status="pending") == []
    assert ids(status="expired") == [pending.pk]


def test_a_bad_status_filter_is_400_naming_it(ann):
    response = ann.get("/approvals", {"status": "maybe"})
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["status"]


def test_the_list_is_paged_by_cursor_newest_first(ann, pending):
    made = [_copy(pending, step=f"0009.tool.extra_{n}") for n in range(3)]
    first = ann.get("/approvals", {"limit": 2}).json()
    assert [item["id"] for item in first["items"]] == [made[2].pk, made[1].pk]
    second = ann.get("/approvals", {"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [item["id"] for item in second["items"]] == [made[0].pk, pending.pk]
    assert second["next_cursor"] is None


def _copy(approval: Approval, *, step: str, **changes) -> Approval:
    """Another approval of the same run (another step), as the engine would write it."""
    values = {
        field.name: getattr(approval, field.name)
        for field in Approval._meta.concrete_fields
        if field.name not in ("id", "step_id", "created_at")
    }
    return Approval.objects.create(
        **{**values, "step_id": step, "created_at": timezone.now(), **changes}
    )


def test_reading_one_shows_everything_the_card_shows(ann, pending):
    response = ann.get(f"/approvals/{pending.pk}")
    assert response.status_code == 200
    body = response.json()
    assert body["step_id"] == pending.step_id
    assert body["effect_key"] == pending.effect_key
    assert body["canonical_args"].startswith("{") and body["args_masked"] is False
    assert body["resource"] == pending.resource
    assert body["resource_state"] == pending.resource_state
    assert body["expires_at"] and body["created_at"]
    assert body["provider_refusal"] is None


def test_arguments_are_masked_as_the_inbox_masks_them(ann, pending):
    masked = _copy(
        pending,
        step="0009.tool.charge_card",
        args={"card": "4242 4242 4242 4242", "email": "pat@example.com", "amount": 5},
        preview="Charge 4242 4242 4242 4242",
    )
    body = ann.get(f"/approvals/{masked.pk}").json()
    text = str(body)
    assert "4242 4242 4242 4242" not in text and "pat@example.com" not in text
    assert body["args_masked"] is True
    assert body["args"]["amount"] == 5
    # The hash stays the one of the arguments in full: it is what a decision carries.
    assert body["args_hash"] == masked.args_hash


def test_why_the_owner_may_not_decide_is_said(api_as, world, approver, tenant, make_operator):
    run = world.start_refund(requested_by="user:ann")
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    body = api_as(approver).get(f"/approvals/{approval.pk}").json()
    assert body["may_decide"] is False
    assert body["why_not"] == "You asked for this action; another approver must decide it."
    viewer = api_as(make_operator(tenant, "viewer", username="vic"))
    body = viewer.get(f"/approvals/{approval.pk}").json()
    assert body["may_decide"] is False
    assert "the role does not allow deciding approvals" in body["why_not"]


def test_another_tenants_approval_is_never_found(api_as, pending, other_tenant, make_operator):
    stranger = api_as(make_operator(other_tenant, "admin", username="olaf"))
    assert stranger.get("/approvals").json()["items"] == []
    assert stranger.get("/approvals", {"run": str(pending.run_id)}).json()["items"] == []
    response = stranger.get(f"/approvals/{pending.pk}")
    assert response.status_code == 404
    assert response.json() == {"error": f"no approval {pending.pk}"}
    response = _decide(stranger, pending)
    assert response.status_code == 404
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_reading_needs_the_approvals_read_scope(api_as, approver, pending):
    api = api_as(approver, scopes=[ApiToken.SCOPE_APPROVALS_DECIDE])
    response = api.get("/approvals")
    assert response.status_code == 403
    assert response.json() == {"error": "this token may not do approvals:read"}


# --- deciding -------------------------------------------------------------------------


def test_approving_decides_wakes_the_run_and_is_audited_with_the_token(ann, pending):
    response = _decide(ann, pending, note="checked with the customer")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved"
    assert body["decision"]["decision"] == "approved"
    assert body["decision"]["by"] == "user:ann"
    assert body["decision"]["note"] == "checked with the customer"
    assert body["may_decide"] is False
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.decided_by_name == "user:ann"
    assert Run.objects.get(pk=pending.run_id).status == "queued"
    entry = AuditEntry.objects.get(action="approval.approve")
    assert entry.actor == "user:ann"
    assert entry.object_type == "approval" and entry.object_id == str(pending.pk)
    token = ApiToken.objects.get(owner__username="ann")
    assert entry.after["token"] == f"token:{token.name} ({token.prefix}…)"
    assert entry.remote_addr == "127.0.0.1"


def test_rejecting_carries_the_reason_to_the_agent(ann, pending):
    response = _decide(ann, pending, "reject", note="the customer withdrew the request")
    assert response.status_code == 200
    assert response.json()["decision"]["decision"] == "rejected"
    pending.refresh_from_db()
    assert pending.status == "rejected" and pending.note == "the customer withdrew the request"
    assert AuditEntry.objects.get(action="approval.reject").actor == "user:ann"


def test_rejecting_without_a_note_is_400_and_changes_nothing(ann, pending):
    response = _decide(ann, pending, "reject", note="   ")
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["note"]
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert not AuditEntry.objects.filter(object_type="approval").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"decision": "maybe", "args_hash": "x"}, "decision"),
        ({"decision": "approve"}, "args_hash"),
        ({"decision": "approve", "args_hash": "x", "extra": 1}, "extra"),
        ({"decision": "approve", "args_hash": "x" * 65}, "args_hash"),
    ],
)
def test_a_bad_decision_body_is_400_naming_the_field(ann, pending, body, field):
    response = ann.post(f"/approvals/{pending.pk}/decision", body)
    assert response.status_code == 400
    assert field in response.json()["errors"]
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_a_stale_hash_is_409_with_the_current_one_and_changes_nothing(ann, pending):
    response = _decide(ann, pending, args_hash="0" * 64)
    assert response.status_code == 409
    body = response.json()
    assert body["error"].startswith(
        "not decided: the arguments you saw are not the ones this approval is bound to"
    )
    assert body["args_hash"] == pending.args_hash
    assert body["approval"]["id"] == pending.pk and body["approval"]["status"] == "pending"
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert Run.objects.get(pk=pending.run_id).status == "waiting_for_approval"
    assert not AuditEntry.objects.filter(object_type="approval").exists()


def test_deciding_what_is_decided_is_409_saying_by_whom(
    ann, pending, api_as, tenant, make_operator
):
    assert _decide(ann, pending).status_code == 200
    bea = make_operator(tenant, "approver", username="bea")
    response = _decide(api_as(bea), pending, "reject", note="too much")
    assert response.status_code == 409
    body = response.json()
    assert body["error"] == "not decided: user:ann already approved it"
    assert body["approval"]["decision"]["by"] == "user:ann"
    pending.refresh_from_db()
    assert pending.status == "approved"
    assert AuditEntry.objects.filter(object_type="approval").count() == 1


def test_an_expired_approval_is_409(ann, pending):
    Approval.objects.filter(pk=pending.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    pending.refresh_from_db()
    response = _decide(ann, pending)
    assert response.status_code == 409
    assert response.json()["error"] == (
        "not decided: this approval expired before your decision arrived"
    )
    assert response.json()["approval"]["expired"] is True
    pending.refresh_from_db()
    assert pending.status == "pending" and not pending.decided_by_name
    Approval.objects.filter(pk=pending.pk).update(status="expired")
    response = _decide(ann, pending)
    assert response.status_code == 409
    assert response.json()["error"] == "not decided: it expired undecided; nothing was changed"


def test_the_requester_may_not_approve_the_action_they_asked_for(ann, world):
    run = world.start_refund(requested_by="user:ann")
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    response = _decide(ann, approval)
    assert response.status_code == 403
    assert response.json() == {
        "error": "not decided: you asked for this action; another approver must decide it"
    }
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_an_amount_beyond_the_owners_authority_is_403(ann, pending, tenant):
    approvers = Group.objects.get(name="approver")
    ApprovalAuthority.objects.filter(tenant=tenant, group=approvers).update(max_amount=1000)
    response = _decide(ann, pending)
    assert response.status_code == 403
    assert "above the role's limit of 10.00 EUR" in response.json()["error"]
    # Authority is per currency: a limit in JPY says nothing about EUR.
    ApprovalAuthority.objects.filter(tenant=tenant, group=approvers).update(currency="jpy")
    ApprovalAuthority.objects.filter(tenant=tenant, group=approvers).update(max_amount=None)
    response = _decide(ann, pending)
    assert response.status_code == 403
    assert "you have no approval authority in EUR" in response.json()["error"]
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_a_changed_resource_is_409_with_what_changed(ann, pending, world):
    world.sandbox.client().v1.refunds.create(
        params={"payment_intent": world.order["payment_intent"], "amount": 500}
    )
    response = _decide(ann, pending)
    assert response.status_code == 409
    body = response.json()
    assert "changed since this was asked" in body["error"]
    assert "amount_refunded: 0.00 EUR → 5.00 EUR" in body["changes"]
    assert body["resource_now"]["amount_refunded"] == 500
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_deciding_needs_the_scope_and_the_permission(
    api_as, approver, pending, tenant, make_operator
):
    reader = api_as(approver, scopes=[ApiToken.SCOPE_APPROVALS_READ])
    response = _decide(reader, pending)
    assert response.status_code == 403
    assert response.json() == {"error": "this token may not do approvals:decide"}
    operator = api_as(make_operator(tenant, "operator", username="otto"))
    response = _decide(operator, pending)
    assert response.status_code == 403
    assert "otto" in response.json()["error"]
    pending.refresh_from_db()
    assert pending.status == "pending"
