"""A resource that changed since it was asked: no Approve, "ask again with the current
state" instead, and refusals in plain words."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import AuditEntry
from agentruns.models import Run, Step
from approvals.models import Approval
from approvals.services import runs_with_decided_approvals

# Asking again wakes the run through the task queue (its own database on SQLite).
from tests.harness import post_decision

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _refund_outside(world, amount=500):
    """Someone refunds part of the payment in the provider's own dashboard."""
    world.sandbox.client().v1.refunds.create(
        params={"payment_intent": world.order["payment_intent"], "amount": amount}
    )


def _ask_again(client, approval, **extra):
    return client.post(f"/approvals/{approval.pk}/ask-again", **extra)


def _reading(client, approval) -> str:
    return client.get(
        f"/approvals/{approval.pk}/resource/", HTTP_HX_REQUEST="true"
    ).content.decode()


def test_an_unchanged_reading_leaves_approve_in_place(ann, pending):
    body = _reading(ann, pending)
    assert "Unchanged since it was asked." in body
    assert "hx-swap-oob" not in body
    page = ann.get("/approvals/").content.decode()
    assert f'id="approve-{pending.pk}"' in page
    assert "{#" not in page and "swaps it by id" not in page  # the template's comments


def test_a_changed_reading_swaps_approve_for_ask_again(ann, pending, world):
    _refund_outside(world)
    body = _reading(ann, pending)
    assert body.lstrip().startswith(f'<div class="resource-now" id="resource-now-{pending.pk}"')
    assert "Changed since it was asked" in body and "amount_refunded: 0.00 EUR → 5.00 EUR" in body
    # The out-of-band part replaces the card's Approve, found by its id.
    assert f'id="approve-{pending.pk}" hx-swap-oob="true"' in body
    assert "Ask again with the current state" in body
    assert f'hx-post="/approvals/{pending.pk}/ask-again"' in body
    assert 'value="approve"' not in body


def test_without_javascript_a_changed_reading_shows_the_card_without_approve(ann, pending, world):
    _refund_outside(world)
    page = ann.get(f"/approvals/{pending.pk}/resource/").content.decode()
    assert "<html" in page and "Changed since it was asked" in page
    assert 'value="approve"' not in page
    assert 'value="reject"' in page  # Reject stays
    assert f'formaction="/approvals/{pending.pk}/ask-again"' in page
    assert "hx-swap-oob" not in page


def test_a_reading_that_fails_keeps_approve_and_says_so(ann, pending, settings):
    settings.PAYMENTS_API_BASE = "http://127.0.0.1:9"  # nothing listens there
    body = _reading(ann, pending)
    assert f"Could not read <code>{pending.resource}</code> now" in body
    assert "Approve reads it again and is refused while it cannot be read" in body
    assert "hx-swap-oob" not in body


def test_approving_a_changed_resource_is_refused_and_nothing_is_decided(ann, pending, world):
    _refund_outside(world)
    response = post_decision(ann, pending, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 409
    assert body.lstrip().startswith(f'<article id="approval-{pending.pk}"')
    assert (
        f"Not decided: {pending.resource} changed since this was asked: "
        "amount_refunded: 0.00 EUR → 5.00 EUR; ask again with the current state." in body
    )
    assert 'value="approve"' not in body and "Ask again with the current state" in body
    pending.refresh_from_db()
    assert pending.status == "pending" and pending.decided_by_name == ""
    assert Run.objects.get(pk=pending.run_id).status == "waiting_for_approval"
    assert not AuditEntry.objects.exists()


def test_approving_when_the_resource_cannot_be_read_is_refused_but_rejecting_works(
    ann, pending, settings
):
    settings.PAYMENTS_API_BASE = "http://127.0.0.1:9"  # nothing listens there
    response = post_decision(ann, pending)
    assert response.status_code == 403
    assert f"could not read {pending.resource} now" in response.content.decode()
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert not AuditEntry.objects.exists()
    # Rejecting needs no reading.
    assert post_decision(ann, pending, "reject", note="cannot check it").status_code == 302
    pending.refresh_from_db()
    assert pending.status == "rejected"


def test_asking_again_invalidates_it_and_the_run_asks_anew_with_what_changed(ann, pending, world):
    _refund_outside(world)
    response = _ask_again(ann, pending)
    assert response.status_code == 302 and response["Location"] == "/approvals/"
    pending.refresh_from_db()
    assert pending.status == "invalidated"
    assert pending.invalidated_reason == "asked again with the current state by user:ann"
    entry = AuditEntry.objects.get(action="approval.ask_again")
    assert entry.object_id == str(pending.pk) and entry.actor == "user:ann"
    run = Run.objects.get(pk=pending.run_id)
    assert run.status == "queued"  # woken

    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    fresh = world.waiting_approval(run)
    assert fresh.replaces_id == pending.pk
    assert "amount_refunded: 0.00 EUR → 5.00 EUR" in fresh.changes
    assert fresh.resource_state["amount_refunded"] == 500
    page = ann.get("/approvals/").content.decode()
    assert f"Asked again for approval {pending.pk} with the current state" in page
    assert f'id="approve-{fresh.pk}"' in page and f"approval-{pending.pk}" not in page


def test_htmx_asking_again_gets_the_card(ann, pending, world):
    _refund_outside(world)
    response = _ask_again(ann, pending, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith(f'<article id="approval-{pending.pk}"')
    assert "asked again with the current state by user:ann" in body
    assert 'name="decision"' not in body


def test_asking_again_after_someone_decided_is_409(ann, pending):
    assert post_decision(ann, pending).status_code == 302
    response = _ask_again(ann, pending, HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    assert "Not asked again: user:ann already approved it." in response.content.decode()
    pending.refresh_from_db()
    assert pending.status == "approved"
    assert not AuditEntry.objects.filter(action="approval.ask_again").exists()


def test_a_lost_wake_up_after_asking_again_is_repaired_by_the_sweeper(ann, pending):
    assert _ask_again(ann, pending).status_code == 302
    # As if the wake-up were lost: the run still waits on an invalidated approval.
    Run.objects.filter(pk=pending.run_id).update(status="waiting_for_approval")
    assert pending.run_id in runs_with_decided_approvals()


def test_get_on_ask_again_is_405(ann, pending):
    assert ann.get(f"/approvals/{pending.pk}/ask-again").status_code == 405


def test_another_tenants_approval_cannot_be_asked_again(
    client, other_tenant, make_operator, pending
):
    client.force_login(make_operator(other_tenant, "admin"))
    assert _ask_again(client, pending).status_code == 404
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert not AuditEntry.objects.exists()


def test_a_viewer_cannot_ask_again(client, tenant, make_operator, pending):
    client.force_login(make_operator(tenant, "viewer"))
    assert _ask_again(client, pending).status_code == 403
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert not AuditEntry.objects.exists()


def test_asking_again_without_csrf_token_is_refused(approver, pending):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(approver)
    assert _ask_again(strict, pending).status_code == 403
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_a_used_approval_says_which_refund_used_it(ann, pending, world):
    assert post_decision(ann, pending).status_code == 302
    run = Run.objects.get(pk=pending.run_id)
    assert world.harness.advance(run) == "finished:completed"
    reference = Step.objects.get(run=run, name="issue_refund").provider_reference
    assert reference.startswith("re_")
    response = post_decision(ann, pending, "reject", note="too late", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 409
    key = Step.objects.get(run=run, name="issue_refund").effect_key
    assert (
        f"Not decided: it was already used by refund {reference} (effect key {key}); "
        "nothing was changed." in body
    )
    assert "consumed;" not in body
    page = ann.get(f"/approvals/{pending.pk}/").content.decode()
    assert f"by refund {reference}" in page
    assert Approval.objects.get(pk=pending.pk).status == "consumed"
