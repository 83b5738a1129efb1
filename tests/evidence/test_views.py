"""/runs/<id>/evidence.json and /runs/<id>/evidence/: who may export, what they get, and
the audit row each export writes."""

from __future__ import annotations

import json
import re
from datetime import UTC

import pytest

from accounts.models import AuditEntry
from agentruns.models import Run, Step
from approvals.models import Approval

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _urls(run) -> list[str]:
    return [f"/runs/{run.id}/evidence.json", f"/runs/{run.id}/evidence/"]


@pytest.fixture
def finished(harness):
    run = harness.start("flow", {"order_id": "o-9"})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    return run


@pytest.fixture
def viewer(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer", username="vic"))
    return client


def test_anonymous_readers_are_sent_to_log_in(client, finished):
    for url in _urls(finished):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert not AuditEntry.objects.exists()


def test_another_tenants_run_is_not_found(client, finished, other_tenant, make_operator):
    client.force_login(make_operator(other_tenant, "admin"))
    for url in _urls(finished):
        assert client.get(url).status_code == 404
    assert not AuditEntry.objects.exists()


def test_a_login_without_view_runs_is_refused(client, finished, tenant, make_operator):
    client.force_login(make_operator(tenant))
    for url in _urls(finished):
        assert client.get(url).status_code == 403


def test_only_get_is_answered(viewer, finished):
    for url in _urls(finished):
        assert viewer.post(url).status_code == 405
    assert not AuditEntry.objects.exists()


def test_the_json_is_an_attachment_named_for_the_run_and_day_and_audited(viewer, finished):
    response = viewer.get(f"/runs/{finished.id}/evidence.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    entry = AuditEntry.objects.get(action="run.evidence_exported")
    # The day of the export, as the audit log has it (a test run at midnight included).
    day = entry.created_at.astimezone(UTC).strftime("%Y-%m-%d")
    assert response["Content-Disposition"] == (
        f'attachment; filename="holdfast-evidence-{finished.id}-{day}.json"'
    )
    assert "no-store" in response["Cache-Control"]
    document = json.loads(response.content)
    assert document["sha256"] == response["X-Evidence-SHA256"]
    assert document["bundle"]["run"]["id"] == str(finished.id)
    assert document["exported_by"] == "user:vic"
    assert (entry.object_type, entry.object_id, entry.actor) == (
        "run",
        str(finished.id),
        "user:vic",
    )
    assert entry.after == {
        "format": "json",
        "sha256": document["sha256"],
        "provider_errors": "category and reference",
    }


def test_the_page_and_the_json_of_the_same_facts_carry_the_same_hash(viewer, finished):
    page = viewer.get(f"/runs/{finished.id}/evidence/")
    assert page.status_code == 200
    document = json.loads(viewer.get(f"/runs/{finished.id}/evidence.json").content)
    html = page.content.decode()
    # At the top and at the bottom.
    assert html.count(document["sha256"]) == 2 and html.count(document["hmac_sha256"]) == 2
    assert page["X-Evidence-SHA256"] == document["sha256"]
    formats = AuditEntry.objects.filter(action="run.evidence_exported").values_list(
        "after__format", flat=True
    )
    assert sorted(formats) == ["html", "json"]


def test_the_page_escapes_what_the_model_wrote(viewer, finished):
    Run.objects.filter(pk=finished.pk).update(
        output={"reply": "<script>alert('x')</script>"}, outcome_detail="<img src=x onerror=1>"
    )
    html = viewer.get(f"/runs/{finished.id}/evidence/").content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=1&gt;" in html


def test_an_address_in_a_step_error_is_masked_in_the_json_and_on_the_page(
    client, finished, tenant, make_operator
):
    Step.objects.filter(run=finished, name="charge").update(
        last_error_class="validation", last_error="the receipt went to erin@example.com"
    )
    client.force_login(make_operator(tenant, "operator"))
    for url in _urls(finished):
        body = client.get(url).content.decode()
        assert "erin@" not in body and "••••@example.com" in body, url


def test_the_run_page_links_to_its_evidence(viewer, finished):
    page = viewer.get(f"/runs/{finished.id}/").content.decode()
    assert f'href="/runs/{finished.id}/evidence/"' in page
    assert f'href="/runs/{finished.id}/evidence.json"' in page


def test_a_refund_page_shows_the_approval_and_the_refund(client, approved_run, make_operator):
    client.force_login(make_operator(approved_run.tenant, "viewer", username="vic"))
    html = client.get(f"/runs/{approved_run.id}/evidence/").content.decode()
    approval = Approval.objects.get(run=approved_run)
    refund = Step.objects.get(run=approved_run, name="issue_refund")
    for fact in [
        approval.args_hash,
        refund.effect_key,
        refund.provider_reference,
        "60.00 EUR",
        "user:ann",
        "the customer ••••@example.com sent the receipt",
        "approval.approve",
    ]:
        assert fact in html, fact
    assert "bob@example.com" not in html
    # The step list is in the run's order.
    shown = re.findall(r"<h3><code>(\d{4}\.[a-z]+\.[a-z_]+)</code>", html)
    assert shown == [s.step_id for s in approved_run.steps.order_by("seq")]


def test_a_case_page_shows_the_lookups_and_the_resolution(client, reconciled_run, make_operator):
    client.force_login(make_operator(reconciled_run.tenant, "viewer", username="vic"))
    html = client.get(f"/runs/{reconciled_run.id}/evidence/").content.decode()
    for fact in [
        "Case #",
        "It did not happen: send it again under the same key — by user:rita",
        "not in the dashboard; asked ••••@example.com",
        "recorded by user:rita",
        "7.00 EUR",
        "case.resolve.retry",
    ]:
        assert fact in html, fact
    assert "carol@" not in html
