"""The reconciliation queue and the case page: login, tenant, permissions, CSRF, audit."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import AuditEntry
from reconciliation.models import ReconciliationCase

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def case(world):
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    assert run.status == "effect_unknown_reconciliation_required"
    world.clear_faults()
    return world.case_of(run)


@pytest.fixture
def rita(client, reconciler):
    client.force_login(reconciler)
    return client


def _post(client, url, data=None, **extra):
    return client.post(url, data or {}, **extra)


def test_the_pages_require_login(client, case):
    for url in ["/reconciliation/", f"/reconciliation/{case.pk}/"]:
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_queue_lists_open_cases_oldest_first_with_what_they_are(rita, case):
    page = rita.get("/reconciliation/").content.decode()
    assert f"/reconciliation/{case.pk}/" in page
    assert "issue_refund" in page and "7.00 EUR" in page and "payments (Stripe API)" in page
    resolved = rita.get("/reconciliation/?show=resolved").content.decode()
    assert f"/reconciliation/{case.pk}/" not in resolved
    assert "No case has been resolved yet" in resolved


def test_an_empty_queue_says_why_it_is_empty(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    page = client.get("/reconciliation/").content.decode()
    assert "No effect is waiting to be settled" in page


def test_the_case_page_shows_the_intended_action_and_the_forms(rita, case):
    page = rita.get(f"/reconciliation/{case.pk}/").content.decode()
    assert case.effect_key in page
    assert "Record what you found" in page and "Look up now" in page
    assert "It did not happen: cancel the run" in page
    assert "record a lookup showing it did not happen first" in page


def test_a_viewer_sees_the_case_but_not_the_forms_and_cannot_post(client, case, make_operator):
    client.force_login(make_operator(case.tenant, "viewer"))
    page = client.get(f"/reconciliation/{case.pk}/").content.decode()
    assert "Record what you found" not in page and "cannot settle effects" in page
    for action in ["lookup", "record", "resolve"]:
        assert _post(client, f"/reconciliation/{case.pk}/{action}").status_code == 403


def test_another_tenants_case_is_not_found(client, case, other_tenant, make_operator):
    client.force_login(make_operator(other_tenant, "reconciler"))
    assert client.get(f"/reconciliation/{case.pk}/").status_code == 404
    for action in ["record", "lookup", "resolve"]:
        assert _post(client, f"/reconciliation/{case.pk}/{action}").status_code == 404
    queue = client.get("/reconciliation/").content.decode()
    assert f"/reconciliation/{case.pk}/" not in queue and case.effect_key not in queue


def test_get_on_a_post_only_view_is_405(rita, case):
    for action in ["lookup", "record", "resolve"]:
        assert rita.get(f"/reconciliation/{case.pk}/{action}").status_code == 405


def test_posts_need_the_csrf_token(reconciler, case):
    client = Client(enforce_csrf_checks=True)
    client.force_login(reconciler)
    for action, data in [
        ("record", {"outcome": "not_found", "note": "n"}),
        ("lookup", {}),
        ("resolve", {"resolution": "cancel", "seen_version": case.version}),
    ]:
        assert client.post(f"/reconciliation/{case.pk}/{action}", data).status_code == 403
    assert not case.lookups.exists()
    case.refresh_from_db()
    assert case.is_open


def test_recording_then_resolving_settles_the_run_and_audits_both(rita, case, world):
    response = _post(
        rita,
        f"/reconciliation/{case.pk}/record",
        {"outcome": "not_found", "note": "nothing in the dashboard", "observed_amount": ""},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert 'id="case-body"' in body and "<html" not in body
    assert "Your observation is recorded" in body
    case.refresh_from_db()
    lookup = case.lookups.get()
    response = _post(
        rita,
        f"/reconciliation/{case.pk}/resolve",
        {
            "resolution": "retry",
            "seen_version": case.version,
            "seen_lookup_id": lookup.pk,
            "note": "send it",
        },
    )
    assert response.status_code == 302
    case.refresh_from_db()
    assert case.resolution == "retry" and case.resolved_by == "user:rita"
    actions = set(
        AuditEntry.objects.filter(object_type="case", object_id=str(case.pk)).values_list(
            "action", flat=True
        )
    )
    assert actions == {"case.lookup.operator", "case.resolve.retry"}
    assert world.harness.advance(case.run) == "finished:completed"
    assert world.refunds()["count"] == 1


def test_a_resolution_on_stale_evidence_is_409_and_shows_the_newest(rita, case):
    _post(rita, f"/reconciliation/{case.pk}/record", {"outcome": "not_found", "note": "first"})
    case.refresh_from_db()
    stale_version, stale_lookup = case.version, case.lookups.get().pk
    _post(
        rita,
        f"/reconciliation/{case.pk}/record",
        {"outcome": "succeeded", "provider_reference": "re_x", "note": "second look"},
    )
    response = _post(
        rita,
        f"/reconciliation/{case.pk}/resolve",
        {"resolution": "cancel", "seen_version": stale_version, "seen_lookup_id": stale_lookup},
    )
    assert response.status_code == 409
    page = response.content.decode()
    assert "newer evidence arrived" in page and "second look" in page
    assert ReconciliationCase.objects.get(pk=case.pk).is_open


def test_a_record_without_evidence_is_400_and_keeps_nothing(rita, case):
    response = _post(rita, f"/reconciliation/{case.pk}/record", {"outcome": "not_found"})
    assert response.status_code == 400
    assert "Describe your evidence" in response.content.decode()
    assert not case.lookups.exists()


@pytest.mark.parametrize("htmx", [True, False])
def test_a_refused_record_comes_back_open_with_what_was_typed_and_the_reason_beside_the_field(
    rita, case, htmx
):
    typed = {
        "outcome": "succeeded",
        "provider_reference": "",
        "observed_amount": "7.00",
        "observed_currency": "eur",
        "note": "Stripe dashboard, <refunds> tab",
    }
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = _post(rita, f"/reconciliation/{case.pk}/record", typed, **extra)
    assert response.status_code == 400
    page = response.content.decode()
    assert '<details class="record" open>' in page
    assert 'value="succeeded" required checked' in page
    assert 'value="7.00"' in page and 'value="eur"' in page
    assert "Stripe dashboard, &lt;refunds&gt; tab</textarea>" in page
    assert 'aria-describedby="record-provider_reference-error" aria-invalid="true"' in page
    assert (
        '<p class="field-error" id="record-provider_reference-error" role="alert">'
        "Give the provider&#x27;s reference of what happened (a refund id, say).</p>"
    ) in page
    assert "(required when it happened, or happened differently)" in page
    assert not case.lookups.exists()


def test_a_refused_resolution_keeps_its_note_and_stays_open(rita, case):
    _post(rita, f"/reconciliation/{case.pk}/record", {"outcome": "not_found", "note": "first"})
    case.refresh_from_db()
    response = _post(
        rita,
        f"/reconciliation/{case.pk}/resolve",
        {"resolution": "cancel", "seen_version": case.version - 1, "note": "checked twice"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 409
    page = response.content.decode()
    assert "newer evidence arrived" in page and "what you typed is kept below" in page
    assert '<details class="choice" open>' in page and 'value="checked twice"' in page


def test_an_amount_that_is_not_a_number_is_400(rita, case):
    response = _post(
        rita,
        f"/reconciliation/{case.pk}/record",
        {
            "outcome": "differently",
            "provider_reference": "re_1",
            "observed_amount": "seven",
            "note": "n",
        },
    )
    assert response.status_code == 400 and "is not a number" in response.content.decode()


def test_operator_text_is_escaped(rita, case):
    _post(
        rita,
        f"/reconciliation/{case.pk}/record",
        {"outcome": "not_found", "note": "<script>alert(1)</script>"},
    )
    page = rita.get(f"/reconciliation/{case.pk}/").content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_look_up_now_records_the_answer_and_settles_a_conclusive_one(rita, case, world):
    response = _post(rita, f"/reconciliation/{case.pk}/lookup")
    assert response.status_code == 302
    case.refresh_from_db()
    # error_before: nothing happened, and the complete listing shows it.
    assert case.lookups.get().outcome == "not_found"
    assert case.resolution == "retry" and case.resolved_by == "system"
    assert AuditEntry.objects.filter(action="case.lookup.automatic", actor="user:rita").exists()
    assert AuditEntry.objects.filter(action="case.resolve.retry", actor="system").exists()
    assert world.harness.advance(case.run) == "finished:completed"
    assert world.refunds()["count"] == 1


def test_cases_can_be_read_but_not_edited_in_the_admin(admin_client, case):
    page = admin_client.get(f"/admin/reconciliation/reconciliationcase/{case.pk}/change/")
    assert page.status_code == 200 and case.effect_key in page.content.decode()
    assert admin_client.get("/admin/reconciliation/reconciliationcase/add/").status_code == 403
    response = admin_client.post(
        f"/admin/reconciliation/reconciliationcase/{case.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 403
    assert ReconciliationCase.objects.filter(pk=case.pk).exists()
