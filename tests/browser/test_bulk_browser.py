"""An operator cancels every run a filter shows, confirms what will happen, and watches
a worker carry it out."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from accounts.models import AuditEntry
from agentruns.models import Run, RunStatus
from tests.harness import SCREENSHOTS, Harness

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]


def test_a_bulk_cancel_of_a_filtered_set_with_its_progress(
    page, live_server_url, tenant, make_operator, workers, screenshot
):
    harness = Harness(tenant)
    sleeping = []
    for _ in range(3):
        run = harness.start("flow", {"sleep": 600})
        harness.advance(run)
        sleeping.append(run)
    ended = harness.start("flow", {})
    Run.objects.filter(pk=ended.pk).update(status=RunStatus.COMPLETED)
    make_operator(tenant, "operator", username="olga")
    page.goto(f"{live_server_url}/runs/?state=sleeping")
    page.fill("input[name=username]", "olga")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page.locator("#run-rows tr")).to_have_count(3)

    page.locator("#bulk input[name=all]").check()
    page.locator("#bulk button[value=cancel]").click()
    expect(page.locator("h1")).to_have_text("Cancel 3 runs?")
    expect(page.locator("main code").first).to_have_text("state=sleeping")
    expect(page.locator("main")).to_contain_text("3 will be asked to stop")
    screenshot("bulk-confirm")
    page.get_by_role("button", name="Confirm: cancel 3 runs").click()

    progress = page.locator("#bulk-progress")
    expect(progress).to_contain_text("3 of 3 done — finished", timeout=30_000)
    expect(progress).to_contain_text("3 asked to stop; 0 skipped")
    screenshot("bulk-progress")
    page.set_viewport_size({"width": 390, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(SCREENSHOTS / "bulk-progress-narrow.png"), full_page=True)

    statuses = set(
        Run.objects.filter(pk__in=[r.pk for r in sleeping]).values_list("status", flat=True)
    )
    assert statuses == {RunStatus.CANCELLED_NO_EFFECT}
    assert Run.objects.get(pk=ended.pk).status == RunStatus.COMPLETED
    assert AuditEntry.objects.filter(action="run.cancel").count() == 3
    assert AuditEntry.objects.filter(action="runs.bulk_cancel").count() == 1
