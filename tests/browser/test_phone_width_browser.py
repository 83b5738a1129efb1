"""Every page at a phone's width (390 px) fits without scrolling sideways, with the long
effect keys, ids and audit values real runs have; the case page's record form keeps
what was typed when it is refused; the operator's time zone comes from the browser."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounts.models import AuditEntry, Operator
from accounts.services import audit_record
from agentruns.models import Run, Step
from approvals.models import Approval, ApprovalAuthority
from reconciliation.models import ReconciliationCase
from tests.harness import ORDER, OVER_LIMIT, SCREENSHOTS, ReconciliationWorld, refund_harness

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
LONG_KEY = "refund_support:issue_refund:" + "0d6f3a527a3f4a479ab92f0a7a0f6d11" * 2
OVERFLOW = """() => {
  const wide = [];
  for (const element of document.querySelectorAll("body *")) {
    const box = element.getBoundingClientRect();
    if (box.right > window.innerWidth + 0.5 && !element.closest(".scroll-x")) {
      wide.push(`${element.tagName.toLowerCase()}.${element.className} ${Math.round(box.right)}px`);
    }
  }
  return {width: document.documentElement.scrollWidth, wide: wide.slice(0, 8)};
}"""


@pytest.fixture(scope="module")
def live_server_url(sandbox_provider, live_server_url):
    return live_server_url


@pytest.fixture
def world(sandbox, tenant) -> ReconciliationWorld:
    harness = refund_harness(tenant)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return ReconciliationWorld(harness, sandbox, order, settings=None)


@pytest.fixture
def pages(world, tenant, make_operator):
    """A refund whose outcome is unknown (its case open), one waiting for approval, long
    effect keys and request ids, and audit entries with long and nested values."""
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    world.clear_faults()
    case = world.case_of(run)
    ReconciliationCase.objects.filter(pk=case.pk).update(
        effect_key=LONG_KEY, next_lookup_at=timezone.now() + timedelta(hours=1)
    )
    Step.objects.filter(pk=case.step_id).update(effect_key=LONG_KEY)
    Run.objects.filter(pk=run.pk).update(request_id="support-ticket-" + "8" * 80)
    waiting = world.harness.start(
        "refund_support", {"order_id": ORDER, "amount": OVER_LIMIT}, requested_by="user:requester"
    )
    assert world.harness.advance(waiting) == "suspended:waiting_for_approval"
    approval = Approval.objects.get(run=waiting, status="pending")
    make_operator(tenant, "admin", username="rita")
    ApprovalAuthority.objects.filter(tenant=tenant).update(max_amount=50_000)
    audit_record(
        tenant=tenant,
        actor="user:rita",
        action="run.cancel",
        object_type="run",
        object_id=str(run.pk),
        before={"status": "effect_unknown_reconciliation_required", "effect_key": LONG_KEY},
        after={"status": "cancelled_no_effect", "limits": {"eur": 50_000, "usd": [1, 2, 3]}},
    )
    # A case's audit names actions in one long word.
    audit_record(
        tenant=tenant,
        actor="system",
        action="case.lookup.automatic",
        object_type="case",
        object_id=str(case.pk),
        after={"outcome": "inconclusive"},
    )
    return {
        "run list": "/runs/",
        "run page": f"/runs/{run.pk}/",
        "inbox": "/approvals/",
        "approval page": f"/approvals/{approval.pk}/",
        "queue": "/reconciliation/",
        "case page": f"/reconciliation/{case.pk}/",
        "audit": "/audit/",
        "preferences": "/accounts/preferences/",
    }, case


def _log_in(page, live_server_url, username):
    page.goto(f"{live_server_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page.locator("header .logout")).to_contain_text(username)


def _overflow(page, name: str) -> str:
    """Empty when the page fits its window, else how wide it is and what sticks out."""
    page.wait_for_load_state("networkidle")
    measured = page.evaluate(OVERFLOW)
    page.screenshot(path=str(SCREENSHOTS / f"phone-{name.replace(' ', '-')}.png"), full_page=True)
    inner = page.evaluate("window.innerWidth")
    if measured["width"] <= inner:
        return ""
    return f"{name}: {measured['width']}px wide in {inner}px ({', '.join(measured['wide'])})"


def _fits(page, name: str) -> None:
    too_wide = _overflow(page, name)
    assert not too_wide, too_wide


def test_every_page_fits_a_phone_without_scrolling_sideways(browser, live_server_url, pages):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    urls, _ = pages
    context = browser.new_context(viewport=PHONE, timezone_id="UTC")
    page = context.new_page()
    page.goto(f"{live_server_url}/accounts/login/")
    too_wide = [_overflow(page, "login")]
    _log_in(page, live_server_url, "rita")
    for name, url in urls.items():
        page.goto(live_server_url + url)
        too_wide.append(_overflow(page, name))
    context.close()
    too_wide = [line for line in too_wide if line]
    assert not too_wide, "\n".join(too_wide)
    # The same pages at a desktop's width, for the eye (screenshots only).
    context = browser.new_context(viewport=DESKTOP, timezone_id="UTC")
    page = context.new_page()
    _log_in(page, live_server_url, "rita")
    for name, url in urls.items():
        page.goto(live_server_url + url)
        page.wait_for_load_state("networkidle")
        path = SCREENSHOTS / f"desktop-{name.replace(' ', '-')}.png"
        page.screenshot(path=str(path), full_page=True)
    context.close()


def test_a_refused_record_keeps_what_was_typed_with_the_reason_beside_the_field(
    browser, live_server_url, pages
):
    _, case = pages
    context = browser.new_context(viewport=PHONE, timezone_id="UTC")
    page = context.new_page()
    _log_in(page, live_server_url, "rita")
    page.goto(f"{live_server_url}/reconciliation/{case.pk}/")
    form = page.locator("details.record form")
    form.locator("input[name=outcome][value=differently]").check()
    # Choosing "it happened differently" makes the reference and the amount required.
    expect(form.locator("input[name=provider_reference]")).to_have_attribute("required", "")
    form.locator("input[name=provider_reference]").fill("re_partial_1")
    form.locator("input[name=observed_amount]").fill("seven euros")
    form.locator("textarea[name=note]").fill("Stripe dashboard: a partial refund")
    form.locator("button[type=submit]").click()

    amount = page.locator("details.record input[name=observed_amount]")
    expect(amount).to_have_attribute("aria-invalid", "true")
    error = page.locator("#record-observed_amount-error")
    expect(error).to_contain_text("is not a number (write 7.00)")
    assert amount.get_attribute("aria-describedby") == "record-observed_amount-error"
    form = page.locator("details.record")
    expect(form).to_have_attribute("open", "")
    expect(amount).to_have_value("seven euros")
    expect(form.locator("input[name=provider_reference]")).to_have_value("re_partial_1")
    expect(form.locator("textarea[name=note]")).to_have_value("Stripe dashboard: a partial refund")
    expect(form.locator("input[name=outcome][value=differently]")).to_be_checked()
    _fits(page, "case page refused record")
    assert not case.lookups.exists()
    context.close()


def test_an_operator_who_never_chose_gets_the_browsers_time_zone(
    browser, live_server_url, tenant, make_operator
):
    operator = make_operator(tenant, "viewer", username="tom").operator
    context = browser.new_context(viewport=PHONE, timezone_id="America/New_York")
    page = context.new_page()
    _log_in(page, live_server_url, "tom")
    expect(page.locator("header .logout a")).to_have_attribute(
        "title", "Your preferences: time zone America/New_York", timeout=5000
    )
    operator.refresh_from_db()
    assert operator.time_zone == "America/New_York"
    entry = AuditEntry.objects.get(action="operator.time_zone")
    assert entry.after == {"time_zone": "America/New_York", "source": "browser"}
    page.goto(f"{live_server_url}/accounts/preferences/")
    expect(page.locator("#time-zone")).to_have_value("America/New_York")
    page.select_option("#time-zone", "Europe/Berlin")
    page.click("main form button[type=submit]")
    expect(page.locator(".flash")).to_have_text("Times are now shown in Europe/Berlin.")
    assert Operator.objects.get(pk=operator.pk).time_zone == "Europe/Berlin"
    context.close()
