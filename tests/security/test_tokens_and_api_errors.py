"""Strict tokens, and an API that answers every bad request in JSON of one shape."""

from __future__ import annotations

import json

import pytest

from accounts.models import ApiToken, AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owner(tenant, make_operator):
    return make_operator(tenant, "viewer", "operator", username="olga")


def test_no_scopes_means_none_not_both(owner):
    token, _ = ApiToken.issue(owner=owner, name="nothing", scopes=[])
    assert token.scopes == []
    assert not token.allows(ApiToken.SCOPE_READ) and not token.allows(ApiToken.SCOPE_START)
    assert ApiToken.issue(owner=owner, name="default")[0].scopes == list(ApiToken.SCOPES)


@pytest.mark.parametrize(
    "scopes", ["runs:read, runs:start", ["runs:write"], [["runs:read"]], {"runs:read": 1}]
)
def test_scopes_are_a_list_of_known_names(owner, scopes):
    with pytest.raises(ValueError, match="scope"):
        ApiToken.issue(owner=owner, name="bad", scopes=scopes)
    assert not ApiToken.objects.exists()


def test_scopes_stored_as_a_string_grant_nothing(owner):
    token, _ = ApiToken.issue(owner=owner, name="read", scopes=[ApiToken.SCOPE_READ])
    ApiToken.objects.filter(pk=token.pk).update(scopes="runs:read, runs:start")
    token.refresh_from_db()
    assert not token.allows(ApiToken.SCOPE_START)


def test_the_admin_shows_a_new_tokens_secret_once_in_its_answer_never_in_a_cookie(
    admin_client, owner, tenant
):
    answer = admin_client.post(
        "/admin/accounts/apitoken/add/",
        {"owner": owner.pk, "name": "helpdesk", "scopes": [ApiToken.SCOPE_READ]},
    )
    assert answer.status_code == 200
    page = answer.content.decode()
    token = ApiToken.objects.get(name="helpdesk")
    assert token.scopes == [ApiToken.SCOPE_READ]
    secret = page.split('id="issued-secret"', 1)[1].split(">", 1)[1].split("<", 1)[0]
    assert secret.startswith("hft_") and ApiToken.authenticate(secret) == token
    assert "no-store" in answer["Cache-Control"]
    cookies = " ".join(morsel.value for morsel in admin_client.cookies.values())
    assert secret not in cookies and "hft_" not in cookies
    assert secret not in json.dumps(list(AuditEntry.objects.values("before", "after")))


@pytest.fixture
def secret(owner):
    return ApiToken.issue(owner=owner, name="helpdesk")[1]


def _post(client, secret, body: bytes, **extra):
    return client.post(
        "/api/runs",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
        **extra,
    )


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"[" * 100_000, 400, "the body is nested deeper than 32 levels"),
        (b'{"a": ' * 40 + b"1" + b"}" * 40, 400, "the body is nested deeper than 32 levels"),
        (b"{not json", 400, "the body is not valid JSON"),
        (b"\xff\xfe", 400, "the body is not valid JSON"),
        (b'{"agent": 5, "input": [], "request_id": 7}', 400, "the request has invalid fields"),
    ],
)
def test_malformed_bodies_get_json_errors(client, secret, body, status, message):
    answer = _post(client, secret, body)
    assert answer.status_code == status
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["error"] == message


def test_an_over_size_body_is_a_json_413(client, secret, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    answer = _post(client, secret, b'{"pad": "' + b"x" * 2000 + b'"}')
    assert answer.status_code == 413
    assert answer.json()["error"] == "the body is larger than 1000 bytes"


def test_a_string_that_looks_nested_is_not(client, secret):
    body = json.dumps({"agent": "nope", "input": {"t": "[" * 100}, "request_id": "r1"})
    answer = _post(client, secret, body.encode())
    assert answer.status_code == 400 and "nested" not in answer.json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("get", "/api/runs", 405), ("delete", "/api/runs", 405), ("get", "/api/nothing", 404)],
)
def test_wrong_methods_and_addresses_are_json_too(client, secret, method, path, status):
    answer = getattr(client, method)(path, HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert answer.status_code == status
    assert answer["Content-Type"] == "application/json"
    assert "error" in answer.json()
