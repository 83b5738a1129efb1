"""A reconciler settles a refund nobody could tell happened, and the run finishes."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounts.models import AuditEntry
from reconciliation.models import ReconciliationCase
from reconciliation.services import case_lookup_now
from tests.harness import ORDER, SCREENSHOTS, ReconciliationWorld, refund_harness

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]


@pytest.fixture(scope="module")
def live_server_url(sandbox_provider, live_server_url):
    return live_server_url


@pytest.fixture
def world(sandbox, tenant) -> ReconciliationWorld:
    """tests/reconciliation's world: the engine in-process, talking to the sandbox
    (sandbox_provider already points the settings at it)."""
    harness = refund_harness(tenant)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return ReconciliationWorld(harness, sandbox, order, settings=None)


@pytest.fixture
def unknown_refund(world):
    """A refund of 7.00 EUR whose outcome nobody knows, made in-process (no real timers).

    The provider answers 500 before doing anything, to every send and to every
    lookup, until the engine gives up and opens a case; then the outage ends.
    """
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    assert run.status == "effect_unknown_reconciliation_required"
    world.clear_faults()
    case = world.case_of(run)
    # The sweeper's own lookup (due 30 s after the case opened) would find the
    # absence and settle the case by itself; here the reconciler does it.
    ReconciliationCase.objects.filter(pk=case.pk).update(
        next_lookup_at=timezone.now() + timedelta(hours=1)
    )
    return run, case


def _wait_for_status(run, status: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        run.refresh_from_db()
        if run.status == status:
            return
        assert time.monotonic() < deadline, f"run {run.id} is {run.status} after {timeout}s"
        time.sleep(0.2)


def _log_in(page, live_server_url, username):
    page.goto(f"{live_server_url}/reconciliation/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server_url}/reconciliation/")


def _narrow(page, name):
    """A screenshot at a phone's width; the page must fit it."""
    page.set_viewport_size({"width": 390, "height": 800})
    width = page.evaluate("document.documentElement.scrollWidth")
    page.screenshot(path=str(SCREENSHOTS / f"{name}-narrow.png"), full_page=True)
    page.set_viewport_size({"width": 1200, "height": 800})
    assert width <= 400, f"{name} is {width}px wide at 390px"


class Walk:
    """The reconciler's clicks and keystrokes from the queue to a settled case, counted
    as they happen, with the time it took (printed: a walk-through, not a target)."""

    def __init__(self):
        self.started = time.monotonic()
        self.clicks = 0
        self.fields = 0

    def click(self, locator) -> None:
        self.clicks += 1
        locator.click()

    def check(self, locator) -> None:
        self.clicks += 1
        locator.check()

    def fill(self, locator, text: str) -> None:
        self.fields += 1
        locator.fill(text)

    @contextlib.contextmanager
    def aside(self):
        """What the test does besides the reconciler (screenshots): not counted."""
        paused = time.monotonic()
        yield
        self.started += time.monotonic() - paused

    def report(self, what: str) -> str:
        seconds = time.monotonic() - self.started
        return f"{what}: {seconds:.1f} s, {self.clicks} clicks, {self.fields} fields typed in"


def test_a_reconciler_finds_a_refund_did_not_happen_and_it_is_sent_again_once(
    page, live_server_url, tenant, make_operator, world, unknown_refund, request, screenshot
):
    run, case = unknown_refund
    make_operator(tenant, "reconciler", username="rita")
    _log_in(page, live_server_url, "rita")

    badge = page.locator("#attention a[href='/reconciliation/'] .badge")
    expect(badge).to_have_text("1")
    row = page.locator("table.cases tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("issue_refund")
    expect(row.locator(".amount")).to_have_text("7.00 EUR")
    expect(row).to_contain_text("payments (Stripe API)")
    screenshot("reconciliation-queue")
    _narrow(page, "reconciliation-queue")

    # From the queue on screen to the case settled, as a reconciler does it.
    walk = Walk()
    walk.click(row.locator(f"a[href='/reconciliation/{case.pk}/']"))
    body = page.locator("#case-body")
    expect(body.locator("h1")).to_contain_text("did issue_refund happen?")
    expect(body.locator("h1 .state")).to_have_text("open")
    expect(body).to_contain_text(case.effect_key)
    expect(body.locator(".empty-state")).to_contain_text("Nothing is on record yet.")
    with walk.aside():
        screenshot("reconciliation-case-before")
        _narrow(page, "reconciliation-case-before")

    # The provider's own dashboard shows no refund (error_before: nothing happened).
    record = body.locator("details.record")
    walk.check(record.locator("input[name=outcome][value=not_found]"))
    walk.fill(
        record.locator("textarea[name=note]"),
        "Payments dashboard: no refund on this payment intent, none under the key.",
    )
    walk.click(record.locator("button[type=submit]"))
    expect(body.locator(".flash")).to_have_text("Your observation is recorded.")
    expect(body.locator("ol.lookups")).to_contain_text("it did not happen")
    expect(body.locator("ol.lookups")).to_contain_text("user:rita")

    retry = body.locator("details.choice", has_text="It did not happen: send it again")
    expect(retry.locator(".why-not")).to_have_count(0)  # allowed now
    walk.click(retry.locator("summary"))
    expect(retry.locator(":scope > p")).to_contain_text(
        f"The same stored request is sent once more under effect key {case.effect_key}"
    )
    walk.fill(retry.locator("input[name=note]"), "Nothing reached the provider; send it.")
    walk.click(retry.locator("button[type=submit]"))
    # In place: the case body comes back resolved; no navigation.
    expect(body.locator("h1 .state")).to_have_text("resolved")
    print(walk.report("an ambiguous refund settled from the queue"))
    assert (walk.clicks, walk.fields) == (5, 2)
    expect(body.locator(".resolution")).to_contain_text("by user:rita")
    expect(body.locator(".resolution")).to_contain_text("the request was sent again")
    expect(body.locator("details.choice")).to_have_count(0)
    assert page.url == f"{live_server_url}/reconciliation/{case.pk}/"
    expect(badge).to_have_text("0")  # the live navigation
    screenshot("reconciliation-case-after")

    # The run page, open before any worker exists, follows the run live once one does.
    body.locator(f"a[href='/runs/{run.id}/']").click()
    summary = page.locator("#run-summary")
    expect(summary.locator("h1 .state")).to_contain_text("Queued")
    request.getfixturevalue("workers")
    # The worker first (its log is printed if it never gets there), then the page.
    _wait_for_status(run, "completed", timeout=45)
    expect(summary.locator("h1 .state")).to_contain_text("Completed", timeout=10_000)
    expect(summary.locator(".run-cases")).to_contain_text("resolved")
    screenshot("reconciliation-run-completed")

    # The provider's own records: exactly one refund, sent under the same key.
    refunds = world.sandbox.stats()["refunds"]["by_payment_intent"]
    assert refunds[world.order["payment_intent"]]["count"] == 1
    [refund] = world.listed_refunds()
    assert refund.amount == 700
    assert refund.metadata["holdfast_effect_key"] == case.effect_key
    expect(page.locator("#timeline")).to_contain_text(f"{case.effect_key} → {refund.id}")
    actions = set(
        AuditEntry.objects.filter(object_type="case", object_id=str(case.pk)).values_list(
            "action", flat=True
        )
    )
    assert actions == {"case.lookup.operator", "case.resolve.retry"}


def test_a_case_page_shows_an_automatic_lookup_and_its_settling_live(
    page, live_server_url, tenant, make_operator, unknown_refund
):
    _, case = unknown_refund
    make_operator(tenant, "reconciler", username="rita")
    _log_in(page, live_server_url, "rita")
    page.goto(f"{live_server_url}/reconciliation/{case.pk}/")
    body = page.locator("#case-body")
    expect(body.locator(".empty-state")).to_contain_text("Nothing is on record yet.")
    expect(page.locator("#live")).to_have_class("live on")
    # The sweeper's automatic lookup, while the page is open: the provider now answers
    # that nothing was made under the key, conclusively, and the case settles itself.
    case_lookup_now(case=case, actor="system")
    expect(body.locator("ol.lookups")).to_contain_text("automatic lookup by system")
    expect(body.locator("h1 .state")).to_have_text("resolved")
    expect(body.locator("#case-audit")).to_contain_text("case.")
