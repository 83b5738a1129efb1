"""A tenant admin adds a webhook endpoint, copies its secret from the one page that
shows it, and watches a delivery fail and then arrive in the live delivery log."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.harness import AMOUNT, ORDER, refund_harness
from webhooks.agents import webhook_deliver
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services import run_ended_hook

# A push waits for the socket's next poll (0.5 s), longer on a busy machine.
LIVE = 30_000

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]


@pytest.fixture(scope="module")
def private_addresses():
    """The sandbox's receiver listens on 127.0.0.1: allowed, in the live server (set
    before it forks) and in the test's own process."""
    from django.conf import settings

    saved = settings.HOLDFAST_WEBHOOK_ALLOW_PRIVATE
    settings.HOLDFAST_WEBHOOK_ALLOW_PRIVATE = True
    yield
    settings.HOLDFAST_WEBHOOK_ALLOW_PRIVATE = saved


@pytest.fixture(scope="module")
def live_server_url(sandbox_provider, private_addresses, live_server_url):
    return live_server_url


def _log_in(page, live_server_url, username):
    page.goto(f"{live_server_url}/webhooks/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server_url}/webhooks/")


def test_an_admin_adds_an_endpoint_and_follows_its_deliveries_live(
    page, live_server_url, sandbox, tenant, make_operator, screenshot
):
    make_operator(tenant, "admin", username="ada")
    _log_in(page, live_server_url, "ada")
    expect(page.locator("nav#attention")).to_contain_text("Webhooks")
    page.click("text=New endpoint")
    page.fill("input[name=url]", f"{sandbox.url}/hooks/crm")
    page.fill("input[name=description]", "CRM")
    page.check("input[name=events][value='run.ended']")
    page.click("text=Create and show its secret")
    expect(page.locator("h1")).to_have_text("Endpoint created", timeout=LIVE)
    endpoint = WebhookEndpoint.objects.get()
    expect(page.locator("#webhook-secret")).to_have_text(endpoint.secret)
    screenshot("webhooks-secret-once")
    page.click("text=Go to the endpoint and its deliveries")
    expect(page).to_have_url(f"{live_server_url}/webhooks/{endpoint.pk}/")
    assert endpoint.secret not in page.content()
    log = page.locator("#webhook-log")
    expect(log.locator(".empty-state")).to_contain_text("Nothing sent yet")
    expect(page.locator("#live")).to_have_class("live on", timeout=LIVE)

    # From outside the page: a refund run ends in-process, its event is raised and the
    # receiver answers its first attempt with a 500.
    harness = refund_harness(tenant, webhook_deliver)
    harness.engine = harness.build(ended=run_ended_hook)
    harness.drive(harness.start("refund_support", {"order_id": ORDER, "amount": AMOUNT}))
    delivery = WebhookDelivery.objects.get()
    expect(log.locator(f"#delivery-{delivery.pk}")).to_contain_text(
        delivery.message_id, timeout=LIVE
    )
    expect(log.locator(".delivery-state")).to_have_text("Waiting to be sent")
    sandbox.arm("error_before", path="/hooks/crm")
    harness.advance(delivery.run)
    expect(log.locator(".delivery-state")).to_have_text("Failed, will be sent again", timeout=LIVE)
    expect(log.locator(".delivery-attempts")).to_have_text("1")
    expect(log).to_contain_text("HTTP 500")
    screenshot("webhooks-delivery-retrying")

    # The retry, made due and run while the page stays open: delivered.
    harness.drive(delivery.run)
    expect(log.locator(".delivery-state")).to_have_text("Delivered", timeout=LIVE)
    expect(log.locator(".delivery-attempts")).to_have_text("2")
    expect(log).to_contain_text("HTTP 200")
    expect(log.locator(".delivery-delivered")).not_to_have_text("—")
    screenshot("webhooks-delivery-delivered")
    # It fits a phone's width, as every page does.
    page.set_viewport_size({"width": 390, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    expect(log.locator(".delivery-attempts")).to_be_visible()
    screenshot("webhooks-delivery-narrow")
    [received] = sandbox.get("/_sandbox/webhooks").json()["deliveries"]
    assert received["idempotency_key"] == delivery.message_id
