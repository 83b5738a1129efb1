"""The approvals and cases operations in the OpenAPI document: every one documented."""

from __future__ import annotations

import json

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse
from openapi_spec_validator import validate

from accounts.models import ApiToken
from api.v1 import api

# Each operation: its scope and every status it may answer.
OPERATIONS = {
    ("get", "/api/v1/approvals"): ("approvals:read", {200, 400, 401, 403}),
    ("get", "/api/v1/approvals/{approval_id}"): ("approvals:read", {200, 401, 403, 404}),
    ("post", "/api/v1/approvals/{approval_id}/decision"): (
        "approvals:decide",
        {200, 400, 401, 403, 404, 409, 413},
    ),
    ("get", "/api/v1/cases"): ("cases:read", {200, 400, 401, 403}),
    ("get", "/api/v1/cases/{case_id}"): ("cases:read", {200, 401, 403, 404}),
    ("post", "/api/v1/cases/{case_id}/lookup"): (
        "cases:settle",
        {201, 400, 401, 403, 404, 409, 413},
    ),
    ("post", "/api/v1/cases/{case_id}/observations"): (
        "cases:settle",
        {201, 400, 401, 403, 404, 409, 413},
    ),
    ("post", "/api/v1/cases/{case_id}/resolution"): (
        "cases:settle",
        {200, 400, 401, 403, 404, 409, 413},
    ),
}


@pytest.fixture(scope="module")
def schema() -> dict:
    # As served: JSON, whose object keys (the statuses) are strings.
    return json.loads(json.dumps(api.get_openapi_schema(), cls=DjangoJSONEncoder))


def test_the_document_is_valid_openapi(schema):
    validate(schema)


@pytest.mark.parametrize(("method", "path"), list(OPERATIONS))
def test_each_operation_is_documented_with_its_scope_and_answers(schema, method, path):
    scope, statuses = OPERATIONS[method, path]
    operation = schema["paths"][path][method]
    permission = ApiToken.SCOPE_RIGHTS[scope][0]
    assert operation["summary"]
    assert f"**Scope:** `{scope}`" in operation["description"]
    assert f"`{permission}`" in operation["description"]
    assert operation["x-holdfast-scope"] == scope
    assert operation["x-holdfast-permission"] == permission
    assert {int(status) for status in operation["responses"]} == statuses
    for answer in operation["responses"].values():
        assert answer["content"]["application/json"]["schema"]["$ref"].startswith(
            "#/components/schemas/"
        )


def test_every_address_of_the_two_areas_is_in_the_document(schema):
    # An id no test uses, replaced by the parameter's name: the path as documented.
    marker = 987654321
    names = {
        "api-v1:approvals": None,
        "api-v1:approval": "approval_id",
        "api-v1:approval-decision": "approval_id",
        "api-v1:cases": None,
        "api-v1:case": "case_id",
        "api-v1:case-lookup": "case_id",
        "api-v1:case-observations": "case_id",
        "api-v1:case-resolution": "case_id",
    }
    documented = {path for _, path in OPERATIONS}
    for name, parameter in names.items():
        path = reverse(name, kwargs={parameter: marker} if parameter else {})
        assert path.replace(str(marker), f"{{{parameter}}}") in documented, path
    assert documented <= set(schema["paths"])


def test_the_decision_and_the_actions_document_what_they_take(schema):
    bodies = schema["components"]["schemas"]
    assert set(bodies["DecideIn"]["required"]) == {"decision", "args_hash"}
    assert {"seen_version", "seen_observation_id"} <= set(bodies["ResolveIn"]["required"])
    assert {"seen_version", "seen_observation_id", "outcome", "note"} <= set(
        bodies["RecordIn"]["required"]
    )
    conflict = bodies["CaseConflictOut"]["properties"]
    assert {"version", "newest_observation_id", "case"} <= set(conflict)
    assert "args_hash" in bodies["DecisionConflictOut"]["properties"]
