"""The frame under every /api/v1/ operation: tokens, scopes, errors, bodies, cursors."""

from __future__ import annotations

import uuid

import pytest

from accounts.models import ApiToken

pytestmark = pytest.mark.django_db(databases="__all__")


def test_no_token_is_401_with_the_scheme_to_use(client):
    response = client.get("/api/v1/runs")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="holdfast"'
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": "a valid bearer token is required"}


@pytest.mark.parametrize("header", ["Bearer hft_wrong", "Basic b2xnYTp4", "Bearer ", "hft_x"])
def test_a_wrong_token_or_scheme_is_401(client, header):
    assert client.get("/api/v1/runs", HTTP_AUTHORIZATION=header).status_code == 401


def test_a_token_without_the_scope_is_403_naming_it(owner, api_as):
    api = api_as(owner, scopes=[ApiToken.SCOPE_START])
    response = api.get("/runs")
    assert response.status_code == 403
    assert response.json() == {"error": "this token may not do runs:read"}


def test_an_owner_without_the_permission_is_403_naming_it(tenant, make_operator, api_as):
    api = api_as(make_operator(tenant, "viewer", username="vic"))
    response = api.get("/audit")
    assert response.status_code == 403
    assert response.json() == {"error": "this token's owner, vic, may not read the audit log"}


def test_a_refused_caller_learns_nothing_from_validation(owner, api_as):
    # The scope is checked before the query is read: a 403, not the 400 it would get.
    api = api_as(owner, scopes=[ApiToken.SCOPE_START])
    assert api.get("/runs", {"limit": "many"}).status_code == 403


def test_a_token_in_use_is_stamped(api, owner):
    assert api.get("/runs").status_code == 200
    assert ApiToken.objects.get(owner=owner).last_used_at is not None


def test_a_token_with_the_scopes_issued_before_v1_keeps_exactly_its_rights(
    tenant, make_operator, api_as
):
    # Tokens issued before v1 hold runs:start and runs:read: what they did, they still
    # do, and no more, even for an owner who may do everything.
    api = api_as(make_operator(tenant, "admin", username="ada"), scopes=["runs:start", "runs:read"])
    assert api.get("/runs").status_code == 200
    for scope, path in [("audit:read", "/audit")]:
        response = api.get(path)
        assert response.status_code == 403
        assert response.json()["error"] == f"this token may not do {scope}"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"status": "nope"}, "status"),
        ({"mark": "famous"}, "mark"),
        ({"created_after": "yesterday"}, "created_after"),
    ],
)
def test_bad_query_values_are_400_with_the_field(api, params, field):
    response = api.get("/runs", params)
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "the request has invalid fields"
    assert list(body["errors"]) == [field]


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/runs", {"state": "completed"}, "state"),
        ("/runs", {"agnet": "refund_support"}, "agnet"),
        ("/approvals", {"state": "pending"}, "state"),
        ("/cases", {"open": "1"}, "open"),
    ],
)
def test_a_query_parameter_no_filter_names_is_refused_not_ignored(api, path, params, field):
    # Ignored, a misspelt filter would answer every row as if each had matched.
    response = api.get(path, params)
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "the request has invalid fields"
    assert list(body["errors"]) == [field]
    assert body["errors"][field][0].startswith("not a filter of this list (it takes: cursor, limit")


@pytest.mark.parametrize(
    ("raw", "message", "field"),
    [
        (b"{not json", "the body is not valid JSON", "body"),
        (b"\xff\xfe", "the body is not valid JSON", "body"),
        (b"[" * 100_000, "the body is nested deeper than 32 levels", "body"),
        (b'{"agent": 5, "input": [], "request_id": 7}', "the request has invalid fields", "agent"),
        (b'{"agent": "a", "input": {}, "request_id": "r", "x": 1}', None, "x"),
        (b'{"agent": "a", "input": {"o": "A"}, "request_id": ""}', None, "request_id"),
    ],
)
def test_bad_bodies_are_400_in_the_error_shape(api, raw, message, field):
    response = api.post("/runs", raw=raw)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"] == (message or "the request has invalid fields")
    assert field in body["errors"]


def test_a_body_over_the_limit_is_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("/runs", raw=b'{"pad": "' + b"x" * 2000 + b'"}')
    assert response.status_code == 413
    assert response.json() == {
        "error": "the body is larger than 1000 bytes",
        "errors": {"body": ["too large"]},
    }


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("DELETE", "/runs", "GET, POST"), ("PUT", "/audit", "GET"), ("POST", "/audit", "GET")],
)
def test_a_wrong_method_is_a_json_405_naming_the_right_ones(api, method, path, allowed):
    response = api.call(method, path)
    assert response.status_code == 405
    assert response["Content-Type"] == "application/json"
    assert sorted(response["Allow"].split(", ")) == sorted(allowed.split(", "))
    assert response.json()["error"].startswith(f"{method} is not allowed here")


@pytest.mark.parametrize("path", ["/", "/nothing", "/runs/not-a-uuid", "/runs/x/y"])
def test_an_address_that_names_nothing_is_a_json_404(api, path):
    response = api.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert "error" in response.json()


def test_a_run_that_is_not_there_is_404(api):
    run_id = uuid.uuid4()
    response = api.get(f"/runs/{run_id}")
    assert response.status_code == 404
    assert response.json() == {"error": f"no run {run_id}"}


@pytest.mark.parametrize("cursor", ["garbage", "eyJ4IjoxfQ:1abc:def"])
def test_a_cursor_the_api_did_not_give_is_400(api, cursor):
    response = api.get("/runs", {"cursor": cursor})
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["cursor"]


def test_the_scopes_are_documented_with_their_permissions():
    for scope in ApiToken.SCOPES:
        permission, meaning = ApiToken.SCOPE_RIGHTS[scope]
        assert permission and meaning
