"""Cancel and retry now: POST only, tenant-scoped, permission-checked, audited."""

from __future__ import annotations

import pytest

from accounts.models import AuditEntry
from agentruns.models import Run

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def operator(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "operator"))
    return client


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_get_is_405(operator, harness, action):
    run = harness.start("flow")
    assert operator.get(f"/runs/{run.id}/{action}").status_code == 405


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_another_tenant_gets_404(client, harness, other_tenant, make_operator, action):
    run = harness.start("flow", {"sleep": 600})
    client.force_login(make_operator(other_tenant, "operator"))
    assert client.post(f"/runs/{run.id}/{action}").status_code == 404
    assert Run.objects.get(pk=run.id).cancel_requested_at is None


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_a_viewer_gets_403(client, harness, tenant, make_operator, action):
    run = harness.start("flow", {"sleep": 600})
    client.force_login(make_operator(tenant, "viewer"))
    response = client.post(f"/runs/{run.id}/{action}")
    assert response.status_code == 403
    assert b"does not allow you to" in response.content
    assert not AuditEntry.objects.exists()


def test_cancel_ends_an_idle_run_and_is_audited(operator, harness, provider):
    run = harness.start("flow", {"sleep": 600})
    harness.advance(run)
    response = operator.post(f"/runs/{run.id}/cancel")
    assert response.status_code == 302
    assert Run.objects.get(pk=run.id).status == "cancelled_no_effect"
    entry = AuditEntry.objects.get(action="run.cancel")
    assert entry.object_id == str(run.id)
    assert entry.before == {"status": "sleeping"}
    assert entry.after == {"status": "cancelled_no_effect"}
    assert entry.actor.startswith("user:operator")


def test_cancel_by_htmx_returns_the_summary_fragment(operator, harness):
    run = harness.start("flow", {"sleep": 600})
    harness.advance(run)
    response = operator.post(f"/runs/{run.id}/cancel", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="run-summary"')
    assert "the run is now cancelled with no effect." in body
    assert 'class="state state-cancelled_no_effect"' in body
    assert ">Cancelled with no effect<" in body


def test_cancel_is_refused_while_an_effect_is_unknown(operator, harness, provider):
    provider.script["send_email"] = ["fail_after"]
    run = harness.start("mailer")
    harness.advance(run)
    response = operator.post(f"/runs/{run.id}/cancel", HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    assert "settle it before cancelling" in response.content.decode()
    assert not AuditEntry.objects.exists()


def test_retry_now_wakes_a_waiting_run_and_is_audited(operator, harness, provider):
    provider.script["lookup_order"] = ["fail_before"]
    run = harness.start("flow")
    harness.advance(run)
    response = operator.post(f"/runs/{run.id}/retry")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.next_attempt_at <= run.updated_at
    entry = AuditEntry.objects.get(action="run.retry_now")
    assert entry.before["status"] == "waiting_for_retry"


def test_retry_now_on_a_run_that_is_not_waiting_is_409(operator, harness):
    run = harness.start("flow")
    harness.advance(run)
    response = operator.post(f"/runs/{run.id}/retry", HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    assert not AuditEntry.objects.exists()


def test_cancel_without_csrf_token_is_refused(harness, tenant, make_operator):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(make_operator(tenant, "operator"))
    run = harness.start("flow", {"sleep": 600})
    assert strict.post(f"/runs/{run.id}/cancel").status_code == 403
    assert Run.objects.get(pk=run.id).cancel_requested_at is None
