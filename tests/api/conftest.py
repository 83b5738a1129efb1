from __future__ import annotations

import json

import pytest

from accounts.models import ApiToken
from tests.agentruns.runtime import agents
from tests.harness import Harness


class Api:
    """A client system calling /api/v1/ with one bearer token."""

    def __init__(self, client, secret: str | None):
        self.client = client
        self.secret = secret

    def _headers(self) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.secret}"} if self.secret else {}

    def get(self, path: str, params=None):
        return self.client.get(f"/api/v1{path}", params or {}, **self._headers())

    def post(self, path: str, body=None, raw: bytes | None = None):
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(
            f"/api/v1{path}", data=data, content_type="application/json", **self._headers()
        )

    def call(self, method: str, path: str):
        return self.client.generic(method, f"/api/v1{path}", b"", **self._headers())


@pytest.fixture
def owner(tenant, make_operator):
    """An operator (may see, start, cancel and retry runs) who holds the tokens."""
    return make_operator(tenant, "operator", username="olga")


@pytest.fixture
def api(client, owner) -> Api:
    return Api(client, ApiToken.issue(owner=owner, name="helpdesk")[1])


@pytest.fixture
def api_as(client):
    """``api_as(user, scopes=None)``: a client with a new token of ``user``."""

    def make(user, scopes: list[str] | None = None) -> Api:
        return Api(client, ApiToken.issue(owner=user, name="t", scopes=scopes)[1])

    return make


@pytest.fixture(autouse=True)
def reset_provider():
    agents.PROVIDER.reset()
    yield
    agents.PROVIDER.reset()


@pytest.fixture
def harness(tenant) -> Harness:
    return Harness(tenant)


@pytest.fixture
def provider():
    return agents.PROVIDER
