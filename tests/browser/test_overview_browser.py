"""The overview's charts drawn in Chromium: bars and legends with data, a phone's width
without sideways scrolling, a run that ends meanwhile counted without a reload, and a
re-read after the session ended taking the page to the login page."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from agentruns.models import RunStatus
from overview import views as overview_views
from tests.overview.test_overview import make_run, make_step

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]

PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def quick_refresh():
    # The page re-reads its charts every 30 s; the server forked for this module does
    # so every 2 s, so that the test waits for a re-read, not for the clock.
    saved = overview_views.REFRESH_SECONDS
    overview_views.REFRESH_SECONDS = 2
    yield
    overview_views.REFRESH_SECONDS = saved


@pytest.fixture(scope="module")
def live_server_url(quick_refresh, live_server_url):
    return live_server_url


def finished_run(tenant, *, agent, status=RunStatus.COMPLETED, minutes_ago=5, cost=120_000):
    at = timezone.now() - timedelta(minutes=minutes_ago)
    run = make_run(
        tenant, at=at, status=status, agent=agent, cost=cost, ended=at + timedelta(seconds=40)
    )
    make_step(run, 1, seconds=3)
    return run


def _log_in(page, live_server_url, username):
    page.goto(f"{live_server_url}/overview/?range=24h")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server_url}/overview/?range=24h")


def test_the_charts_draw_and_follow_a_run_that_ends_meanwhile(
    browser, live_server_url, tenant, make_operator, screenshot, page
):
    make_operator(tenant, "viewer", username="olga")
    finished_run(tenant, agent="order_support")
    finished_run(tenant, agent="order_support", status=RunStatus.FAILED_AFTER_EFFECT)
    finished_run(tenant, agent="refund_agent", minutes_ago=90, cost=2_400_000)
    _log_in(page, live_server_url, "olga")

    charts = page.locator("#overview-charts")
    expect(charts.locator(".started-total")).to_have_text("3")
    assert charts.locator("#chart-runs svg rect.bar").count() >= 3
    expect(charts.locator("#chart-runs .legend")).to_contain_text("completed")
    expect(charts.locator("#chart-cost .legend")).to_contain_text("refund_agent")
    expect(charts.locator("#chart-cost .cost-total")).to_have_text("2.64 USD")
    expect(charts.locator("#chart-tools")).to_contain_text("issue_refund")
    assert charts.locator("#chart-agents figure").count() == 2
    screenshot("overview-1200")

    # A run ends while the page is open: the charts re-read themselves, the page stays.
    page.evaluate("window.overviewNotReloaded = true")
    finished_run(tenant, agent="order_support", minutes_ago=1)
    expect(charts.locator(".started-total")).to_have_text("4", timeout=15_000)
    expect(page.locator("#overview-charts .ended-total")).to_have_text("4")
    assert page.evaluate("window.overviewNotReloaded") is True

    # The session ends: the next re-read takes the page to the login page, not into it.
    page.context.clear_cookies()
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/overview/"), timeout=15_000)


def test_the_charts_fit_a_phone(browser, live_server_url, tenant, make_operator, screenshot):
    make_operator(tenant, "viewer", username="pia")
    for n in range(3):
        finished_run(tenant, agent=f"agent_with_a_rather_long_name_{n}", minutes_ago=10 + 50 * n)
    context = browser.new_context(viewport=PHONE)
    phone = context.new_page()
    try:
        _log_in(phone, live_server_url, "pia")
        for key in ("24h", "7d", "90d"):
            phone.goto(f"{live_server_url}/overview/?range={key}")
            expect(phone.locator("#chart-runs svg rect.bar").first).to_be_visible()
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], (key, width)
        phone.locator("#chart-runs details summary").click()
        assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        phone.goto(f"{live_server_url}/overview/?range=24h")
        from tests.harness import SCREENSHOTS

        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        phone.screenshot(path=str(SCREENSHOTS / "overview-390.png"), full_page=True)
    finally:
        context.close()
