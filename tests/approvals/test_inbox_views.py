"""The approvals inbox: login, tenant scope, permissions, the one decision, escaping."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from accounts.models import AuditEntry
from agentruns.models import Run
from approvals.models import Approval, ApprovalAuthority

# A decision wakes the run through the task queue (its own database on SQLite).
from tests.harness import API_KEY, post_decision

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def test_the_pages_require_login(client, pending):
    for url in [
        "/approvals/",
        f"/approvals/{pending.pk}/",
        f"/approvals/{pending.pk}/resource/",
    ]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/"), url


def test_the_inbox_shows_the_exact_call_and_what_the_viewer_may_do(ann, pending):
    page = ann.get("/approvals/").content.decode()
    assert f'id="approval-{pending.pk}"' in page
    assert "issue_refund" in page and "60.00 EUR" in page
    assert "Refund 60.00 EUR of order ord_1001" in page  # the preview
    assert pending.args["payment_intent"] in page  # the arguments table
    assert pending.args_hash in page  # in the collapsed canonical JSON
    assert f"/runs/{pending.run_id}/" in page
    assert "user:requester" in page
    assert "amount_received" in page  # the resource's state when asked
    assert f'hx-get="/approvals/{pending.pk}/resource/"' in page  # and now, loaded lazily
    assert "Your limit: 500.00 EUR." in page
    assert 'name="decision" value="approve"' in page
    assert "expires in" in page


def test_a_viewer_sees_the_inbox_but_no_decision_buttons(client, tenant, make_operator, pending):
    client.force_login(make_operator(tenant, "viewer"))
    page = client.get("/approvals/").content.decode()
    assert f'id="approval-{pending.pk}"' in page
    assert 'name="decision"' not in page
    assert "the role does not allow deciding approvals" in page


def test_the_inbox_explains_an_empty_list(ann):
    assert b"No approvals are waiting." in ann.get("/approvals/").content
    assert b"Nothing decided yet." in ann.get("/approvals/?show=decided").content
    assert b"No approval waiting matches these filters" in ann.get("/approvals/?tool=x").content


def test_the_inbox_filters_by_tool_and_agent(ann, pending):
    assert f"approval-{pending.pk}" in ann.get("/approvals/?tool=issue_refund").content.decode()
    assert f"approval-{pending.pk}" not in ann.get("/approvals/?tool=other").content.decode()
    by_agent = ann.get("/approvals/?agent=refund_support").content.decode()
    assert f"approval-{pending.pk}" in by_agent
    assert f"approval-{pending.pk}" not in ann.get("/approvals/?agent=other").content.decode()


def test_the_decided_tab_says_who_decided_what_and_why(ann, pending, world):
    assert (
        post_decision(ann, pending, "reject", note="the customer got a voucher").status_code == 302
    )
    waiting = ann.get("/approvals/").content.decode()
    assert f"approval-{pending.pk}" not in waiting
    decided = ann.get("/approvals/?show=decided").content.decode()
    assert f"/approvals/{pending.pk}/" in decided
    assert "rejected" in decided and "by user:ann" in decided
    assert "the customer got a voucher" in decided


def test_an_approval_past_its_expiry_says_so_and_offers_no_buttons(ann, pending):
    Approval.objects.filter(pk=pending.pk).update(expires_at=timezone.now() - timedelta(minutes=5))
    page = ann.get("/approvals/").content.decode()
    assert "expired" in page and "ago" in page
    assert 'name="decision"' not in page


def test_times_are_shown_in_the_operators_time_zone(client, tenant, make_operator, pending):
    client.force_login(make_operator(tenant, "viewer", time_zone="Asia/Tokyo"))
    page = client.get(f"/approvals/{pending.pk}/").content.decode()
    assert "JST" in page


def test_the_navigation_counts_pending_approvals(ann, pending):
    page = ann.get("/runs/").content.decode()
    assert 'href="/approvals/">Approvals <span class="badge hot">1</span>' in page


def test_another_tenants_approval_is_404(client, other_tenant, make_operator, pending):
    client.force_login(make_operator(other_tenant, "admin"))
    assert f"approval-{pending.pk}" not in client.get("/approvals/").content.decode()
    assert client.get(f"/approvals/{pending.pk}/").status_code == 404
    assert client.get(f"/approvals/{pending.pk}/resource/").status_code == 404
    assert post_decision(client, pending).status_code == 404
    assert client.post(f"/approvals/{pending.pk}/rerequest").status_code == 404
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("action", ["decide", "rerequest"])
def test_get_on_an_action_is_405(ann, pending, action):
    assert ann.get(f"/approvals/{pending.pk}/{action}").status_code == 405


def test_the_pages_refuse_post(ann, pending):
    assert ann.post("/approvals/").status_code == 405
    assert ann.post(f"/approvals/{pending.pk}/").status_code == 405


def test_a_viewer_posting_a_decision_gets_403(client, tenant, make_operator, pending):
    client.force_login(make_operator(tenant, "viewer"))
    response = post_decision(client, pending)
    assert response.status_code == 403
    assert b"does not allow you to decide approvals" in response.content
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert not AuditEntry.objects.exists()


def test_a_decision_without_csrf_token_is_refused(approver, pending):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(approver)
    assert post_decision(strict, pending).status_code == 403
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_approving_wakes_the_run_and_is_audited(ann, pending):
    response = post_decision(ann, pending, note="checked with the customer")
    assert response.status_code == 302 and response["Location"] == "/approvals/"
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.decided_by_name == "user:ann"
    assert Run.objects.get(pk=pending.run_id).status == "queued"
    entry = AuditEntry.objects.get(action="approval.approve")
    assert entry.object_type == "approval" and entry.object_id == str(pending.pk)
    assert entry.actor == "user:ann"
    page = ann.get("/approvals/").content.decode()  # the flash, once
    assert f"Approval {pending.pk} approved" in page


def test_htmx_gets_the_card_fragment(ann, pending):
    response = post_decision(ann, pending, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith(f'<article id="approval-{pending.pk}"')
    assert "<html" not in body
    assert "approved" in body and "user:ann" in body
    assert 'name="decision"' not in body


def test_an_unknown_decision_is_400(ann, pending):
    response = post_decision(ann, pending, "maybe", HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "Choose Approve or Reject" in response.content.decode()
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_rejecting_without_a_note_is_refused_and_changes_nothing(ann, pending):
    response = post_decision(ann, pending, "reject", note="  ")
    assert response.status_code == 403
    assert "say why the action is rejected" in response.content.decode()
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert Run.objects.get(pk=pending.run_id).status == "waiting_for_approval"
    assert not AuditEntry.objects.exists()


def test_a_tampered_hash_is_409_and_shows_the_current_version(ann, pending):
    response = post_decision(ann, pending, args_hash="0" * 64, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 409
    assert "the arguments you saw are not the ones this approval is bound to" in body
    assert pending.args_hash in body  # the version that is there, to read again
    assert 'name="decision"' in body
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert not AuditEntry.objects.exists()


def test_deciding_twice_is_409_naming_who_decided(ann, pending):
    assert post_decision(ann, pending).status_code == 302
    response = post_decision(ann, pending, "reject", note="changed my mind")
    body = response.content.decode()
    assert response.status_code == 409
    assert "user:ann already approved it" in body
    pending.refresh_from_db()
    assert pending.status == "approved"
    assert AuditEntry.objects.filter(object_type="approval").count() == 1


def test_the_requester_cannot_decide_his_own_request(ann, world):
    run = world.start_refund(requested_by="user:ann")
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    page = ann.get("/approvals/").content.decode()
    assert "You asked for this action; another approver must decide it." in page
    assert 'name="decision"' not in page
    response = post_decision(ann, approval)
    assert response.status_code == 403
    assert "you asked for this action" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_an_approver_above_his_limit_is_refused(ann, pending, tenant):
    approvers = Group.objects.get(name="approver")
    ApprovalAuthority.objects.filter(tenant=tenant, group=approvers).update(max_amount=1000)
    page = ann.get("/approvals/").content.decode()
    assert "Your limit: 10.00 EUR." in page
    assert "above the role&#x27;s limit of 10.00 EUR" in page
    assert 'name="decision"' not in page
    response = post_decision(ann, pending)
    assert response.status_code == 403
    assert "above the role&#x27;s limit" in response.content.decode()
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_an_inactive_user_is_logged_out(client, approver, pending):
    client.force_login(approver)
    approver.is_active = False
    approver.save()
    # The session no longer authenticates (ModelBackend refuses inactive users).
    response = client.get("/approvals/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert post_decision(client, pending).status_code == 302
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_model_and_tool_output_is_escaped(ann, pending):
    script = "<script>alert(1)</script>"
    Approval.objects.filter(pk=pending.pk).update(
        preview=script,
        args={**pending.args, "reason": script},
        resource_state={script: script},
        changes=[script],
    )
    for url in ["/approvals/", f"/approvals/{pending.pk}/"]:
        page = ann.get(url).content.decode()
        assert script not in page, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, url


def test_the_resource_now_fragment_shows_the_state_and_what_changed(ann, pending, world):
    fragment = ann.get(f"/approvals/{pending.pk}/resource/", HTTP_HX_REQUEST="true")
    body = fragment.content.decode()
    assert fragment.status_code == 200
    assert body.lstrip().startswith(f'<div class="resource-now" id="resource-now-{pending.pk}"')
    assert "amount_refunded" in body and "Unchanged since it was asked." in body
    assert "<strong>89.00 EUR of 89.00 EUR still refundable</strong>" in body
    world.sandbox.client().v1.refunds.create(
        params={"payment_intent": world.order["payment_intent"], "amount": 500}
    )
    # A reading is shared for a few seconds: several approvers on one inbox ask once.
    body = ann.get(f"/approvals/{pending.pk}/resource/", HTTP_HX_REQUEST="true").content.decode()
    assert "Unchanged since it was asked." in body
    cache.clear()  # as RESOURCE_READ_CACHE_SECONDS later
    body = ann.get(f"/approvals/{pending.pk}/resource/", HTTP_HX_REQUEST="true").content.decode()
    assert "Changed since it was asked" in body
    assert "amount_refunded: 0.00 EUR → 5.00 EUR" in body
    assert "84.00 EUR of 89.00 EUR still refundable" in body


def test_the_resource_now_fragment_says_when_the_provider_cannot_be_read(
    ann, pending, settings, make_operator, tenant, caplog
):
    settings.PAYMENTS_API_BASE = "http://127.0.0.1:9"  # nothing listens there
    body = ann.get(f"/approvals/{pending.pk}/resource/", HTTP_HX_REQUEST="true").content.decode()
    assert f"Could not read <code>{pending.resource}</code> now" in body
    # An approver reads what kind of failure it was and a reference, not the
    # provider client's own words (hosts, ports, connection pools).
    assert "the provider could not be reached (reference E-" in body
    assert "127.0.0.1" not in body and "Connection" not in body
    reference = body.split("(reference ")[1].split(")")[0]
    # ... which finds the detail in the log, and on the page of someone who may read it.
    logged = [r.getMessage() for r in caplog.records]
    assert any(reference in line and "127.0.0.1" in line for line in logged)
    reconciler = Client()
    reconciler.force_login(make_operator(tenant, "reconciler"))
    body = reconciler.get(f"/approvals/{pending.pk}/resource/", HTTP_HX_REQUEST="true")
    assert "127.0.0.1" in body.content.decode() and reference in body.content.decode()


def test_without_javascript_the_resource_link_shows_the_approval_page(ann, pending):
    page = ann.get(f"/approvals/{pending.pk}/resource/").content.decode()
    assert "<html" in page and "Unchanged since it was asked." in page


def test_the_detail_page_lists_the_approvals_audit_entries(ann, pending):
    post_decision(ann, pending, note="fine by me")
    page = ann.get(f"/approvals/{pending.pk}/").content.decode()
    assert "user:ann approval.approve" in page
    assert "fine by me" in page


def test_the_run_page_lists_its_approvals_and_the_step_waiting(ann, pending):
    page = ann.get(f"/runs/{pending.run_id}/").content.decode()
    assert f'href="/approvals/{pending.pk}/">#{pending.pk}</a>' in page
    assert "60.00 EUR" in page
    assert f'Waiting for approval: <a href="/approvals/{pending.pk}/">' in page


@pytest.fixture
def operator(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "operator"))
    return client


def test_asking_again_for_an_expired_approval_queues_the_run(operator, pending):
    Approval.objects.filter(pk=pending.pk).update(status="expired")
    page = operator.get("/approvals/?show=decided").content.decode()
    assert f"/approvals/{pending.pk}/" in page
    assert "Ask again" in operator.get(f"/approvals/{pending.pk}/").content.decode()
    response = operator.post(f"/approvals/{pending.pk}/rerequest")
    assert response.status_code == 302 and response["Location"] == "/approvals/"
    assert Run.objects.get(pk=pending.run_id).status == "queued"
    pending.refresh_from_db()
    assert pending.rerequested_by == "user:operator-default"
    assert AuditEntry.objects.filter(
        action="approval.rerequest", object_id=str(pending.pk)
    ).exists()


def test_asking_again_for_a_pending_approval_is_409(operator, pending):
    response = operator.post(f"/approvals/{pending.pk}/rerequest", HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    body = response.content.decode()
    assert "only an expired approval of a run still waiting can be requested again" in body
    assert body.lstrip().startswith(f'<article id="approval-{pending.pk}"')
    assert Run.objects.get(pk=pending.run_id).status == "waiting_for_approval"
    assert not AuditEntry.objects.exists()


def test_an_approver_cannot_ask_again(ann, pending):
    Approval.objects.filter(pk=pending.pk).update(status="expired")
    assert ann.post(f"/approvals/{pending.pk}/rerequest").status_code == 403


def test_an_inbox_page_asks_the_provider_a_bounded_number_of_times(ann, pending, world):
    from approvals.selectors import RESOURCE_READS_PER_PAGE

    # More pending approvals than read on load, all on the same payment intent.
    fields = {f.name: getattr(pending, f.name) for f in Approval._meta.concrete_fields}
    for index in range(RESOURCE_READS_PER_PAGE + 5):
        Approval.objects.create(**{**fields, "id": None, "step_id": f"{pending.step_id}-{index}"})
    page = ann.get("/approvals/").content.decode()
    assert page.count('hx-trigger="load"') == RESOURCE_READS_PER_PAGE
    assert page.count("Only the first cards read it as the page loads.") == 6

    def reads() -> int:
        # The provider's own log of what our account asked it.
        rows = world.sandbox.requests_of(API_KEY)
        return sum(1 for row in rows if row["path"].startswith("/v1/payment_intents/"))

    before = reads()
    for approval in Approval.objects.filter(status="pending"):
        body = ann.get(f"/approvals/{approval.pk}/resource/", HTTP_HX_REQUEST="true")
        assert "Unchanged since it was asked." in body.content.decode()
    # One reading, shared by every card on the same resource for a few seconds.
    assert reads() - before == 1


def test_a_reading_older_than_the_approval_is_never_shown_for_it(ann, pending, world):
    # A reading of the payment is shared by the cards on it for a few seconds; an
    # approval asked after it (another refund since) must not be compared with it.
    body = ann.get(f"/approvals/{pending.pk}/resource/", HTTP_HX_REQUEST="true").content.decode()
    assert "Unchanged since it was asked." in body
    world.sandbox.client().v1.refunds.create(
        params={"payment_intent": world.order["payment_intent"], "amount": 500}
    )
    newer = world.start_refund(requested_by="user:requester")
    assert world.harness.advance(newer) == "suspended:waiting_for_approval"
    asked = world.waiting_approval(newer)
    assert asked.resource == pending.resource and asked.resource_state["amount_refunded"] == 500
    body = ann.get(f"/approvals/{asked.pk}/resource/", HTTP_HX_REQUEST="true").content.decode()
    assert "Unchanged since it was asked." in body
    assert "5.00 EUR → 0.00 EUR" not in body
