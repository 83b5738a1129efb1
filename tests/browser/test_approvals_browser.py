"""An approver sees a refund waiting, approves it in place, and the run finishes; a
payment changed from outside takes Approve away and is asked again."""

from __future__ import annotations

import re
import time

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from accounts.models import AuditEntry
from agentruns.models import Run
from agentruns.services import run_start
from approvals.models import Approval, ApprovalAuthority
from tests.harness import SCREENSHOTS

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]


@pytest.fixture(scope="module")
def live_server_url(sandbox_provider, live_server_url):
    return live_server_url


def _log_in(page, live_server_url, username):
    page.goto(f"{live_server_url}/approvals/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server_url}/approvals/")


def _approver_logged_in(page, live_server_url, tenant, make_operator) -> None:
    """ann, an approver of up to 500.00 EUR, on the inbox."""
    make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.create(
        tenant=tenant, group=Group.objects.get(name="approver"), currency="eur", max_amount=50_000
    )
    _log_in(page, live_server_url, "ann")


def _refund_asked(page, tenant, order_id: str, amount: int, request_id: str):
    """A client asks for a refund above the auto-approval amount while the page is
    open: a real worker runs the agent up to the refund and suspends the run. The
    live navigation counts it; the reloaded inbox shows its card."""
    run, _ = run_start(
        tenant=tenant,
        agent_name="refund_support",
        input={"order_id": order_id, "amount": amount},
        request_id=request_id,
        requested_by="user:requester",
    )
    badge = page.locator("#attention a[href='/approvals/'] .badge")
    expect(badge).to_have_text("1", timeout=20_000)
    page.reload()
    return run, page.locator("article.approval"), badge


def _right(page, selector):
    return page.locator(selector).evaluate("element => element.getBoundingClientRect().right")


def _narrow(page, name, whole_page=True):
    """A screenshot at a phone's width; by default the page must fit it."""
    page.set_viewport_size({"width": 390, "height": 800})
    if whole_page:
        assert page.evaluate("document.documentElement.scrollWidth") <= 400, name
    page.screenshot(path=str(SCREENSHOTS / f"{name}-narrow.png"), full_page=True)
    page.set_viewport_size({"width": 1200, "height": 800})


def test_an_approver_approves_a_refund_and_watches_the_run_finish(
    page, live_server_url, sandbox, tenant, make_operator, workers, screenshot
):
    _approver_logged_in(page, live_server_url, tenant, make_operator)
    expect(page.locator(".empty-state")).to_contain_text("No approvals are waiting.")
    run, card, badge = _refund_asked(page, tenant, "ord_1001", 6000, "browser-approval-1")
    expect(card).to_have_count(1)
    expect(card).to_contain_text("Refund 60.00 EUR of order ord_1001")
    expect(page.locator(".viewer-limit")).to_contain_text("Your limit: 500.00 EUR.")
    # The payment's state now, read from the provider after the page loaded.
    expect(card.locator(".resource-now")).to_contain_text("Unchanged since it was asked.")
    screenshot("approvals-inbox-before")
    _narrow(page, "approvals-inbox-before")

    # A refusal comes back in place too (a 403 the page swaps in), changing nothing.
    card.locator("button[value=reject]").click()
    expect(card.locator(".problem")).to_contain_text("say why the action is rejected")
    expect(card.locator(".approval-head .state")).to_have_text("pending")

    card.locator("textarea[name=note]").fill("Checked: the parcel came back damaged.")
    card.locator("button[value=approve]").click()
    # In place: the card comes back decided; no navigation.
    # The worker may take the run at once and use the approval before the assertions look.
    expect(card.locator(".approval-head .state")).to_have_text(re.compile("approved|consumed"))
    expect(card).to_contain_text(
        # Used…: the card's "Used" term and its time run together in the text.
        re.compile(
            "approved: the run goes on with exactly these arguments"
            "|Used.* by (refund re_|its refund)"
        )
    )
    expect(card).to_contain_text("user:ann")
    assert page.url == f"{live_server_url}/approvals/"
    expect(badge).to_have_text("0")  # the live navigation again
    assert AuditEntry.objects.filter(action="approval.approve").count() == 1
    screenshot("approvals-inbox-after")

    # The run page follows the run live until the refund is sent and it completes.
    card.locator(f"a[href='/runs/{run.id}/']").click()
    summary = page.locator("#run-summary")
    expect(summary.locator("h1 .state")).to_contain_text("Completed", timeout=30_000)
    expect(summary.locator(".run-approvals")).to_contain_text("consumed")
    expect(page.locator("#timeline")).to_contain_text("issue_refund")
    screenshot("approvals-run-completed")
    # The run page as a whole is wider than a phone (the timeline's effect keys and
    # the event table); its approvals table at least stays inside its card.
    _narrow(page, "approvals-run-completed", whole_page=False)
    assert _right(page, ".run-approvals") <= _right(page, "#run-summary")

    summary.locator(".run-approvals a").first.click()
    expect(page.locator("h1")).to_contain_text("Approval")
    expect(page.locator("ul.audit")).to_contain_text("user:ann approval.approve")
    screenshot("approvals-detail")
    _narrow(page, "approvals-detail")


def test_a_payment_changed_from_outside_takes_approve_away_and_is_asked_again(
    page, live_server_url, sandbox, tenant, make_operator, workers, screenshot
):
    _approver_logged_in(page, live_server_url, tenant, make_operator)
    run, card, _ = _refund_asked(page, tenant, "ord_1001", 6000, "browser-approval-stale")
    expect(card.locator(".resource-now")).to_contain_text("Unchanged since it was asked.")
    expect(card.locator("button[value=approve]")).to_be_visible()

    # Someone refunds 5.00 EUR of the payment in the provider's own dashboard.
    payment_intent = sandbox.order("ord_1001")["payment_intent"]
    sandbox.client().v1.refunds.create(params={"payment_intent": payment_intent, "amount": 500})
    # The card shows when it read the payment; "Read again" asks the provider now.
    expect(card.locator(".read-at")).to_contain_text("Read at")
    card.get_by_role("button", name="Read again").click()
    # Once the reading loads, Approve is gone; Reject stays; ask again is offered.
    expect(card.locator(".resource-now")).to_contain_text("amount_refunded: 0.00 EUR → 5.00 EUR")
    expect(card.locator("button[value=approve]")).to_have_count(0)
    expect(card.locator("button[value=reject]")).to_be_visible()
    ask_again = card.get_by_role("button", name="Ask again with the current state")
    expect(ask_again).to_be_visible()
    screenshot("approvals-resource-changed")
    _narrow(page, "approvals-resource-changed")

    # The card of this approval: the new request's card may arrive beside it at once.
    asked = page.locator(f"#approval-{Approval.objects.get(run=run).pk}")
    ask_again.click()
    expect(asked.locator(".approval-head .state")).to_have_text("invalidated")
    expect(asked).to_contain_text("asked again with the current state by user:ann")
    assert AuditEntry.objects.filter(action="approval.ask_again").count() == 1
    # The worker reads the payment afresh and asks for a new approval.
    deadline = time.monotonic() + 20
    while not Approval.objects.filter(run=run, status="pending").exists():
        assert time.monotonic() < deadline, "no new approval was asked for"
        time.sleep(0.2)
    page.reload()
    fresh = page.locator(f"#approval-{Approval.objects.get(run=run, status='pending').pk}")
    expect(fresh.locator(".replaces")).to_contain_text(
        "amount_refunded: 0.00 EUR → 5.00 EUR", timeout=20_000
    )
    expect(fresh.locator(".resource-now")).to_contain_text("Unchanged since it was asked.")
    expect(fresh.locator("button[value=approve]")).to_be_visible()
    screenshot("approvals-asked-again")


def test_the_card_says_what_the_provider_will_refuse_and_offers_no_approve(
    page, live_server_url, sandbox, tenant, make_operator, workers, screenshot
):
    _approver_logged_in(page, live_server_url, tenant, make_operator)
    # The order's payment received 45.00 EUR; the refund asks for 80.00 EUR.
    run, card, _ = _refund_asked(page, tenant, "ord_1004", 8000, "browser-approval-over-refund")
    expect(card.locator(".problem")).to_contain_text(
        "The provider will refuse this: 80.00 EUR is more than the 45.00 EUR still refundable."
    )
    expect(card.locator(".resource-now .summary")).to_have_text(
        "45.00 EUR of 45.00 EUR still refundable"
    )
    expect(card.locator("button[value=approve]")).to_have_count(0)
    expect(card.locator("button[value=reject]")).to_be_visible()
    screenshot("approvals-provider-will-refuse")
    _narrow(page, "approvals-provider-will-refuse")

    card.locator("textarea[name=note]").fill("Only 45.00 EUR was paid.")
    card.locator("button[value=reject]").click()
    expect(card.locator(".approval-head .state")).to_have_text("rejected")
    # The run's ending says the refund did not happen, in the list and on its page.
    page.goto(f"{live_server_url}/runs/{run.id}/")
    summary = page.locator("#run-summary")
    expect(summary.locator("h1")).to_contain_text("Completed", timeout=30_000)
    expect(summary.locator("h1 .outcome")).to_have_text("· refund refused")
    # Never sent: no call time, only the wait for a person.
    refund_step = page.locator(".step-failed")
    expect(refund_step.locator(".waited")).to_contain_text("for approval")
    assert sandbox.stats()["refunds"]["total"] == 0
    screenshot("approvals-refused-run")


def test_a_new_request_arrives_and_another_approvers_decision_shows_without_reload(
    page, browser, live_server_url, sandbox, tenant, make_operator, workers, screenshot
):
    """The inbox open, as an approver leaves it: a request arrives as a card, counts
    and badge agree, and when another approver decides it the card says so in place."""
    _approver_logged_in(page, live_server_url, tenant, make_operator)
    expect(page.locator(".empty-state")).to_contain_text("No approvals are waiting")
    run, _ = run_start(
        tenant=tenant,
        agent_name="refund_support",
        input={"order_id": "ord_1001", "amount": 6000},
        request_id="browser-live-inbox",
        requested_by="user:requester",
    )
    card = page.locator("article.approval")
    expect(card).to_have_count(1, timeout=20_000)  # pushed: no reload
    expect(page.locator("#approval-tabs .count")).to_have_text("1")
    expect(page.locator("#attention a[href='/approvals/'] .badge")).to_have_text("1")
    expect(page.locator(".empty-state")).to_have_count(0)
    expect(card.locator(".resource-now")).to_contain_text("Unchanged since it was asked.")

    # Another approver, in another browser, approves it.
    make_operator(tenant, "approver", username="bob")
    other = browser.new_context().new_page()
    other.goto(f"{live_server_url}/approvals/")
    other.fill("input[name=username]", "bob")
    other.fill("input[name=password]", "correct horse battery")
    other.click("button[type=submit]")
    other.locator("article.approval button[value=approve]").click()
    # A worker may take the run at once and use the approval before this looks.
    expect(other.locator("article.approval .approval-head .state")).to_have_text(
        re.compile("approved|consumed")
    )
    expect(other.locator("article.approval")).to_contain_text("user:bob")
    other.context.close()

    # Approved, and soon used by the refund it was for (consumed): in place either way.
    state = card.locator(".approval-head .state")
    expect(state).to_have_text(re.compile("approved|consumed"), timeout=10_000)
    expect(card).to_contain_text("user:bob")
    expect(page.locator("#approval-tabs .count")).to_have_text("0")
    # The worker finishes the run: the card's run state follows.
    expect(card.locator("dl.facts")).to_contain_text("Completed", timeout=30_000)
    screenshot("approvals-decided-elsewhere")
    assert Run.objects.get(pk=run.pk).status == "completed"
