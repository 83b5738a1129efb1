"""POST /api/runs and GET /api/runs/<id>: admission over HTTP, never a duplicate."""

from __future__ import annotations

import json

import pytest

from accounts.models import ApiToken, AuditEntry
from agentruns.models import Run

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

BODY = {"agent": "order_status", "input": {"order_id": "A-1001"}, "request_id": "req-1"}


@pytest.fixture
def token(tenant):
    return ApiToken.issue(tenant=tenant, name="helpdesk")[1]


def _post(client, body, token=None, raw=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else json.dumps(body)
    return client.post("/api/runs", data=data, content_type="application/json", **headers)


def _get(client, run_id, token):
    return client.get(f"/api/runs/{run_id}", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_new_request_is_201_with_the_run_and_an_audit_entry(client, token):
    response = _post(client, BODY, token)
    assert response.status_code == 201
    data = response.json()
    run = Run.objects.get(pk=data["id"])
    assert data["status"] == "queued" and data["agent"] == "order_status"
    assert run.requested_by.startswith("token:helpdesk")
    entry = AuditEntry.objects.get(object_id=data["id"])
    assert entry.action == "run.start" and entry.actor.startswith("token:helpdesk")
    assert entry.remote_addr == "127.0.0.1"


def test_the_same_request_again_is_200_with_the_same_run(client, token):
    first = _post(client, BODY, token).json()
    again = _post(client, BODY, token)
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert Run.objects.count() == 1
    assert AuditEntry.objects.count() == 1


def test_the_same_request_id_with_other_input_is_409_with_an_explanation(client, token):
    first = _post(client, BODY, token).json()
    response = _post(client, {**BODY, "input": {"order_id": "A-1002"}}, token)
    assert response.status_code == 409
    assert "already used" in response.json()["error"]
    assert response.json()["run"]["id"] == first["id"]


def test_a_second_active_run_for_a_dedupe_key_is_409(client, token):
    _post(client, {**BODY, "dedupe_key": "A-1001"}, token)
    response = _post(client, {**BODY, "request_id": "req-2", "dedupe_key": "A-1001"}, token)
    assert response.status_code == 409
    assert "still active" in response.json()["error"]


@pytest.mark.parametrize(
    ("body", "raw", "field"),
    [
        (None, "{not json", "body"),
        ({"input": {}, "request_id": "r"}, None, "agent"),
        ({**BODY, "input": "A-1001"}, None, "input"),
        ({**BODY, "request_id": ""}, None, "request_id"),
        ({**BODY, "surprise": 1}, None, "surprise"),
        ({**BODY, "agent": "nope"}, None, "agent"),
        ({**BODY, "input": {"follow_up_seconds": -1}}, None, "input.follow_up_seconds"),
    ],
)
def test_bad_input_is_400_with_field_errors_and_nothing_is_created(client, token, body, raw, field):
    response = _post(client, body, token, raw=raw)
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert Run.objects.count() == 0


def test_a_missing_or_wrong_token_is_401(client, token):
    assert _post(client, BODY).status_code == 401
    response = _post(client, BODY, "hft_wrong")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_token_is_401(client, tenant):
    token, secret = ApiToken.issue(tenant=tenant, name="old")
    ApiToken.objects.filter(pk=token.pk).update(revoked_at="2026-01-01T00:00:00Z")
    assert _post(client, BODY, secret).status_code == 401


def test_a_token_without_the_start_scope_is_403(client, tenant):
    _, secret = ApiToken.issue(tenant=tenant, name="reader", scopes=[ApiToken.SCOPE_READ])
    assert _post(client, BODY, secret).status_code == 403
    assert Run.objects.count() == 0


def test_get_on_the_post_only_endpoint_is_405(client, token):
    assert client.get("/api/runs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405


def test_a_run_is_read_with_its_steps(client, token):
    from agentruns.services import build_engine

    run_id = _post(client, BODY, token).json()["id"]
    build_engine().advance(run_id)
    response = _get(client, run_id, token)
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "sleeping"
    assert [s["step_id"] for s in data["steps"]][:2] == [
        "0000.model.chat",
        "0001.tool.order_status",
    ]


def test_another_tenants_run_is_404(client, token, other_tenant):
    run_id = _post(client, BODY, token).json()["id"]
    _, theirs = ApiToken.issue(tenant=other_tenant, name="theirs")
    assert _get(client, run_id, theirs).status_code == 404


def test_reading_needs_the_read_scope(client, tenant, token):
    run_id = _post(client, BODY, token).json()["id"]
    _, starter = ApiToken.issue(tenant=tenant, name="starter", scopes=[ApiToken.SCOPE_START])
    assert _get(client, run_id, starter).status_code == 403


def test_tokens_are_stored_hashed_and_shown_once(tenant):
    token, secret = ApiToken.issue(tenant=tenant, name="x")
    assert secret.startswith("hft_") and secret not in token.token_hash
    assert ApiToken.authenticate(secret).pk == token.pk


def test_createapitoken_prints_the_secret_once(tenant, capsys):
    from django.core.management import call_command

    call_command("createapitoken", "ci", "--scope", "runs:read")
    secret = capsys.readouterr().out.strip()
    token = ApiToken.authenticate(secret)
    assert token.name == "ci" and token.scopes == ["runs:read"]
