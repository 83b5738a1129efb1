"""POST /api/runs and GET /api/runs/<id>: admission over HTTP, never a duplicate."""

from __future__ import annotations

import json

import pytest

from accounts.models import ApiToken, AuditEntry
from agentruns.models import Run

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

BODY = {"agent": "order_status", "input": {"order_id": "A-1001"}, "request_id": "req-1"}


@pytest.fixture
def owner(tenant, make_operator):
    """The operator the helpdesk's token is issued to: may start and see runs."""
    return make_operator(tenant, "operator", username="olga")


@pytest.fixture
def token(owner):
    return ApiToken.issue(owner=owner, name="helpdesk")[1]


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
    assert run.requested_by == "user:olga"
    entry = AuditEntry.objects.get(object_id=data["id"])
    assert entry.action == "run.start" and entry.actor == "user:olga"
    assert entry.after["token"].startswith("token:helpdesk (hft_")
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


def test_a_revoked_token_is_401(client, owner):
    token, secret = ApiToken.issue(owner=owner, name="old")
    ApiToken.objects.filter(pk=token.pk).update(revoked_at="2026-01-01T00:00:00Z")
    assert _post(client, BODY, secret).status_code == 401


def test_a_token_without_the_start_scope_is_403(client, owner):
    _, secret = ApiToken.issue(owner=owner, name="reader", scopes=[ApiToken.SCOPE_READ])
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


def test_another_tenants_run_is_404(client, token, other_tenant, make_operator):
    run_id = _post(client, BODY, token).json()["id"]
    _, theirs = ApiToken.issue(owner=make_operator(other_tenant, "operator"), name="theirs")
    assert _get(client, run_id, theirs).status_code == 404


def test_reading_needs_the_read_scope(client, owner, token):
    run_id = _post(client, BODY, token).json()["id"]
    _, starter = ApiToken.issue(owner=owner, name="starter", scopes=[ApiToken.SCOPE_START])
    assert _get(client, run_id, starter).status_code == 403


def test_tokens_are_stored_hashed_and_shown_once(owner):
    token, secret = ApiToken.issue(owner=owner, name="x")
    assert secret.startswith("hft_") and secret not in token.token_hash
    assert ApiToken.authenticate(secret).pk == token.pk


def test_a_token_acts_in_its_owners_tenant(owner, tenant):
    token, _ = ApiToken.issue(owner=owner, name="x")
    assert token.tenant == tenant and token.owner == owner


def test_a_deactivated_owners_token_is_refused_with_a_reason(client, token, owner):
    run_id = _post(client, BODY, token).json()["id"]
    owner.is_active = False
    owner.save()
    response = _post(client, {**BODY, "request_id": "req-2"}, token)
    assert response.status_code == 403
    assert response.json()["error"] == "this token's owner, olga, is deactivated"
    assert _get(client, run_id, token).status_code == 403
    assert Run.objects.count() == 1


def test_an_owner_who_may_not_start_runs_cannot_start_them_with_a_token(
    client, tenant, make_operator
):
    _, secret = ApiToken.issue(owner=make_operator(tenant, "viewer", username="vic"), name="v")
    response = _post(client, BODY, secret)
    assert response.status_code == 403
    assert response.json()["error"] == "this token's owner, vic, may not start runs"
    assert Run.objects.count() == 0


def test_an_owner_who_may_not_see_runs_cannot_read_them_with_a_token(
    client, token, tenant, make_operator
):
    run_id = _post(client, BODY, token).json()["id"]
    _, secret = ApiToken.issue(owner=make_operator(tenant, username="nobody"), name="n")
    response = _get(client, run_id, secret)
    assert response.status_code == 403
    assert response.json()["error"] == "this token's owner, nobody, may not see runs"


def test_a_token_issued_before_tokens_had_owners_is_refused(client, token):
    ApiToken.objects.update(owner=None)
    response = _post(client, BODY, token)
    assert response.status_code == 403
    assert "no owner; issue a new one with createapitoken --owner" in response.json()["error"]
    assert Run.objects.count() == 0


def test_a_token_whose_owner_moved_to_another_tenant_is_refused(client, token, owner, other_tenant):
    owner.operator.tenant = other_tenant
    owner.operator.save()
    response = _post(client, BODY, token)
    assert response.status_code == 403
    assert "no longer works for the token's tenant" in response.json()["error"]
    assert Run.objects.count() == 0
