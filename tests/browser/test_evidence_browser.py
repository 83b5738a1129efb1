"""The printable evidence of a run reads on a phone and prints on A4: nothing wider
than the screen, and Chromium makes a PDF of it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from approvals.models import ApprovalAuthority
from tests.evidence.scenarios import approved_refund
from tests.harness import SCREENSHOTS, point_at_sandbox, refund_harness

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]


@pytest.fixture
def approved_run(sandbox, settings, tenant, make_operator):
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant)
    approver = make_operator(tenant, "admin", username="ann")
    ApprovalAuthority.objects.create(
        tenant=tenant, group=Group.objects.get(name="admin"), currency="eur", max_amount=None
    )
    return approved_refund(harness, approver, note="receipt checked with the customer")


def _log_in(page, live_server_url, path):
    page.goto(f"{live_server_url}{path}")
    page.fill("input[name=username]", "ann")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")


def test_the_evidence_page_fits_a_phone_and_prints_on_a4(browser, live_server_url, approved_run):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        _log_in(page, live_server_url, f"/runs/{approved_run.id}/evidence/")
        expect(page.locator("h1")).to_contain_text("refund_support@")
        expect(page.locator(".seal").first).to_contain_text("SHA-256")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the page is {width} px wide on a 390 px screen"
        page.screenshot(path=str(SCREENSHOTS / "evidence-narrow.png"), full_page=True)
        page.set_viewport_size({"width": 1200, "height": 900})
        page.screenshot(path=str(SCREENSHOTS / "evidence.png"), full_page=True)
        pdf = page.pdf(format="A4", print_background=False)
        (SCREENSHOTS / "evidence.pdf").write_bytes(pdf)
        assert pdf.startswith(b"%PDF")
        pages = len(re.findall(rb"/Type\s*/Page\b", pdf))
        assert pages >= 2, f"{pages} page: the steps alone fill more than one"
    finally:
        context.close()
