"""The OpenAPI document: valid OpenAPI 3, complete (every address and method under
/api/v1/ is in it), and every operation documented: summary, description, scope,
permission and a response model for success and each error it may answer. And the
documentation page: for operators, with nothing from another host and no inline script."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from django.contrib.staticfiles import finders
from django.urls import URLPattern, URLResolver, get_resolver
from openapi_spec_validator import validate

from accounts.models import ApiToken

pytestmark = pytest.mark.django_db(databases="__all__")

PREFIX = "/api/v1/"
# ninja's own addresses under the prefix: the document, its page, the root (a 404).
NOT_OPERATIONS = {"openapi-json", "openapi-view", "api-root"}
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
def schema(client, tenant, make_operator) -> dict:
    client.force_login(make_operator(tenant, "viewer", username="vic"))
    response = client.get(f"{PREFIX}openapi.json")
    assert response.status_code == 200
    return response.json()


def _v1_routes() -> list[str]:
    """Every URL pattern the URL conf serves under /api/v1/, as an OpenAPI path."""
    found = []

    def walk(patterns, prefix):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif (
                isinstance(pattern, URLPattern)
                and ("/" + route).startswith(PREFIX)
                and pattern.name not in NOT_OPERATIONS
            ):
                found.append("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))

    walk(get_resolver().url_patterns, "")
    return found


def test_the_document_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate(schema)


def test_every_address_under_v1_is_in_the_document(schema):
    routes = _v1_routes()
    assert routes, "no URL found under /api/v1/"
    missing = sorted(set(routes) - set(schema["paths"]))
    assert not missing, f"addresses under /api/v1/ missing from the OpenAPI document: {missing}"
    assert not [p for p in schema["paths"] if not p.startswith(PREFIX)]


def test_every_method_an_address_takes_is_in_the_document(schema, client):
    # What the address answers a method it does not take names those it does (Allow).
    for route in _v1_routes():
        path = route.replace("{run_id}", "00000000-0000-0000-0000-000000000000")
        path = re.sub(r"\{\w+\}", "1", path)
        allowed = client.generic("TRACE", path)["Allow"]
        served = {method.strip().lower() for method in allowed.split(",")}
        documented = {m for m in schema["paths"][route] if m in METHODS}
        assert served == documented, route


def _operations(schema):
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def test_every_operation_says_what_it_does_and_which_scope_it_needs(schema):
    for path, method, op in _operations(schema):
        where = f"{method.upper()} {path}"
        assert op.get("summary"), where
        assert len(op.get("description", "")) > 40, where
        scope = op["x-holdfast-scope"]
        assert scope in ApiToken.SCOPES, where
        assert op["x-holdfast-permission"] == ApiToken.SCOPE_RIGHTS[scope][0], where
        assert f"`{scope}`" in op["description"], where
        assert op["security"] == [{"TokenAuth": []}], where


def _schema_of(response) -> str:
    return response["content"]["application/json"]["schema"]["$ref"]


def test_every_status_an_operation_answers_has_its_model(schema):
    components = schema["components"]["schemas"]
    for path, method, op in _operations(schema):
        where = f"{method.upper()} {path}"
        responses = op["responses"]
        assert {"401", "403"} <= set(responses), where
        assert any(status.startswith("2") for status in responses), where
        if "{" in path:
            assert "404" in responses, f"{where} names an object: it may answer 404"
        query = [p for p in op.get("parameters", []) if p["in"] == "query"]
        if op.get("requestBody") or query:
            assert "400" in responses, f"{where} takes input: it may answer 400"
        if op.get("requestBody"):
            assert "413" in responses, f"{where} takes a body: it may answer 413"
        for status, response in responses.items():
            name = _schema_of(response).rsplit("/", 1)[-1]
            assert name in components, f"{where} {status}"
            if not status.startswith("2"):
                # Every error is the one shape: error, and errors per field.
                assert "error" in components[name]["properties"], f"{where} {status}"


def test_the_addresses_from_before_v1_are_not_in_the_document(schema):
    assert not [path for path in schema["paths"] if not path.startswith(PREFIX)]


# --- the documentation page -------------------------------------------------------------


class _Assets(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self.inline_scripts: list[str] = []
        self._script_type: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            if attrs.get("src"):
                self.urls.append(attrs["src"])
            else:
                self._script_type = attrs.get("type", "")
        elif tag == "link" and attrs.get("href"):
            self.urls.append(attrs["href"])
        elif tag in ("img", "iframe") and attrs.get("src"):
            self.urls.append(attrs["src"])

    def handle_endtag(self, tag):
        if tag == "script" and self._script_type is not None:
            if self._script_type != "application/json":
                self.inline_scripts.append(self._script_type)
            self._script_type = None


def test_the_page_loads_everything_from_this_site_and_runs_no_inline_script(
    client, tenant, make_operator
):
    client.force_login(make_operator(tenant, "viewer", username="vic"))
    response = client.get(f"{PREFIX}docs")
    assert response.status_code == 200
    assets = _Assets()
    assets.feed(response.content.decode())
    assert assets.urls, "the page loads Swagger UI's files"
    for url in assets.urls:
        assert url.startswith("/static/"), f"{url} is not served by this site"
        assert finders.find(url.removeprefix("/static/")), f"{url} is not a static file here"
    assert assets.inline_scripts == []


def test_the_documentation_is_for_the_tenants_operators(client, tenant, make_operator):
    for path in (f"{PREFIX}docs", f"{PREFIX}openapi.json"):
        anonymous = client.get(path)
        assert anonymous.status_code == 302
        assert anonymous["Location"].startswith("/accounts/login/?next=")
        wrong = client.post(path)
        assert wrong.status_code == 405 and wrong["Allow"] == "GET, HEAD"
        assert wrong.json()["error"] == "POST is not allowed here; use GET"


def test_a_token_is_no_way_into_the_documentation(client, tenant, make_operator):
    # A page of the console: a session, as every page; a token is for the operations.
    secret = ApiToken.issue(owner=make_operator(tenant, "admin"), name="t")[1]
    response = client.get(f"{PREFIX}openapi.json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 302
