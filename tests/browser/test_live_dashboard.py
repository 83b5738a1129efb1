"""An operator logs in, watches a run finish without reloading, and reads its timeline."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from accounts.models import AuditEntry
from agentruns.services import build_engine, run_start
from tests.harness import SCREENSHOTS

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]


def _log_in(page, live_server_url, username):
    page.goto(f"{live_server_url}/runs/")
    expect(page).to_have_url(f"{live_server_url}/accounts/login/?next=/runs/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server_url}/runs/")


def test_an_operator_watches_a_run_complete_and_reads_its_timeline(
    page, live_server_url, tenant, make_operator, workers, screenshot
):
    make_operator(tenant, "operator", username="ann")
    _log_in(page, live_server_url, "ann")
    expect(page.locator(".empty-state")).to_contain_text("No runs yet")
    expect(page.locator("#live")).to_have_class("live on")  # the socket is open
    screenshot("runs-empty")

    # A client starts a run while the page is open; a real worker advances it, and
    # the sweeper wakes it from its two-second timer.
    run, _ = run_start(
        tenant=tenant,
        agent_name="order_status",
        input={"order_id": "A-1001", "follow_up_seconds": 2},
        request_id="browser-1",
    )
    row = page.locator(f"#run-{run.id}")
    expect(row).to_be_visible(timeout=15_000)
    expect(row.locator(".state")).not_to_contain_text("Completed")
    screenshot("runs-working")
    expect(row.locator(".state")).to_contain_text("Completed", timeout=30_000)
    expect(page.locator("#state-tabs")).to_contain_text("Completed 1")
    screenshot("runs-completed")

    row.locator("a").first.click()
    expect(page.locator("#run-summary .state")).to_contain_text("Completed")
    expect(page.locator("#timeline")).to_contain_text("0001.tool.order_status")
    expect(page.locator("#timeline")).to_contain_text("0003.wait.sleep")
    expect(page.locator("#events")).to_contain_text("finished")
    screenshot("run-detail")


def test_cancel_from_the_detail_page_updates_it_in_place(
    page, live_server_url, tenant, make_operator, screenshot
):
    make_operator(tenant, "operator", username="bob")
    run, _ = run_start(
        tenant=tenant,
        agent_name="order_status",
        input={"order_id": "A-1002"},
        request_id="browser-2",
    )
    _log_in(page, live_server_url, "bob")
    page.goto(f"{live_server_url}/runs/{run.id}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("text=Cancel run")
    expect(page.locator("#run-summary .state")).to_contain_text("Cancelled with no effect")
    # In place: the same page, no navigation; the live push may replace the flash.
    assert page.url == f"{live_server_url}/runs/{run.id}/"
    assert AuditEntry.objects.filter(action="run.cancel", object_id=str(run.id)).exists()
    screenshot("run-cancelled")


def test_the_pages_work_at_a_narrow_width(browser, live_server_url, tenant, make_operator):
    make_operator(tenant, "viewer", username="cy")
    run, _ = run_start(
        tenant=tenant,
        agent_name="order_status",
        input={"order_id": "A-1003", "follow_up_seconds": 600},
        request_id="browser-narrow",
    )
    build_engine().advance(run.id)  # a few steps on the timeline, effect keys included
    context = browser.new_context(viewport={"width": 390, "height": 800})
    page = context.new_page()
    _log_in(page, live_server_url, "cy")
    for url, name in [("/runs/", "runs-narrow"), (f"/runs/{run.id}/", "run-detail-narrow")]:
        page.goto(f"{live_server_url}{url}")
        assert page.evaluate("document.documentElement.scrollWidth") <= 400, url
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    context.close()
