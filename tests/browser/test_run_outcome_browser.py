"""An operator watching a refund's run sees, without reloading, that it completed with
the refund refused — not a plain "completed"."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from agentruns.services import build_engine, run_start

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]


@pytest.fixture(scope="module")
def live_server_url(sandbox_provider, live_server_url):
    return live_server_url


def test_a_refused_refund_shows_as_completed_refund_refused_while_the_page_is_open(
    page, live_server_url, tenant, make_operator, screenshot
):
    make_operator(tenant, "viewer", username="vic")
    # No approval in the way: the provider itself refuses more than was paid.
    tenant.agent_config = {"refund_support": {"approvals": {"enabled": False}}}
    tenant.save()
    run, _ = run_start(
        tenant=tenant,
        agent_name="refund_support",
        input={"order_id": "ord_1001", "amount": 9_999_999},
        request_id="browser-outcome-1",
    )
    page.goto(f"{live_server_url}/runs/{run.id}/")
    page.fill("input[name=username]", "vic")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    summary = page.locator("#run-summary")
    expect(summary.locator(".state")).to_contain_text("Queued")
    expect(page.locator("#live")).to_have_class("live on")
    expect(summary.locator(".outcome")).to_have_count(0)

    # A worker elsewhere advances the run while the page stays open.
    assert build_engine().advance(run.id) == "finished:completed"

    expect(summary.locator(".outcome")).to_have_text("· refund refused", timeout=15_000)
    expect(summary.locator(".state")).to_contain_text("Completed")
    screenshot("run-completed-refund-refused")

    page.goto(f"{live_server_url}/runs/")
    expect(page.locator(f"#run-{run.id} .outcome")).to_have_text("· refund refused")
    page.locator(f"#run-{run.id} .outcome").click()
    expect(page).to_have_url(f"{live_server_url}/runs/?outcome=refund_refused")
    expect(page.locator(f"#run-{run.id}")).to_be_visible()
