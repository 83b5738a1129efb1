"""The API's documentation page in Chromium: Swagger UI draws every operation of the
OpenAPI document from this site's own files, with no request to another host, no
inline script and no error."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]

OPERATIONS = ["List runs", "Start a run", "Read a run", "Cancel a run", "Make a run retry now"]


def test_the_documentation_draws_every_operation_from_this_site_alone(
    live_server_url, page, tenant, make_operator, screenshot
):
    make_operator(tenant, "viewer", username="olga")
    requested: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{live_server_url}/api/v1/docs")
    # Not logged in: the login page, which comes back to the documentation.
    page.fill("input[name=username]", "olga")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server_url}/api/v1/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Holdfast API")
    for summary in [*OPERATIONS, "List audit entries"]:
        expect(page.get_by_text(summary, exact=True)).to_be_visible()
    # The scope an operation needs is on it, opened.
    page.get_by_text("Cancel a run", exact=True).click()
    expect(page.locator(".opblock.is-open")).to_contain_text("runs:cancel")
    screenshot("api-docs")
    site = urlsplit(live_server_url).netloc
    elsewhere = [url for url in requested if urlsplit(url).netloc not in (site, "")]
    assert elsewhere == []
    assert any(url.endswith("/static/ninja/swagger-ui-bundle.js") for url in requested)
    assert any(url.endswith("/api/v1/openapi.json") for url in requested)
    inline = page.evaluate(
        """() => [...document.querySelectorAll("script:not([src])")]
            .filter(s => s.type !== "application/json").length"""
    )
    assert inline == 0
    assert errors == []
