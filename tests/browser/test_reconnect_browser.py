"""A live page says when it is offline and comes back by itself soon after the web
process does, showing what changed while it was away."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from agentruns.services import run_start
from tests.harness import SCREENSHOTS

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]


def test_a_page_says_it_is_offline_and_is_live_again_soon_after_the_server(
    web, browser, tenant, make_operator
):
    make_operator(tenant, "operator", username="olga")
    page = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
    page.goto(f"{web.url}/runs/")
    page.fill("input[name=username]", "olga")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    live = page.locator("#live")
    expect(live).to_have_class("live on")
    expect(live).to_have_text("live")

    web.stop()
    expect(live).to_have_text("offline — reconnecting", timeout=5_000)
    expect(live).to_have_class("live off")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "live-offline.png"))
    # Something happens while the page cannot hear of it.
    run, _ = run_start(
        tenant=tenant, agent_name="order_status", input={"order_id": "A-7"}, request_id="away-1"
    )
    time.sleep(3)  # long enough for the page's tries to back off to their longest

    web.start()
    returned = time.monotonic()
    expect(live).to_have_class("live on", timeout=3_000)
    print(f"live again {time.monotonic() - returned:.2f} s after the server returned")
    # The snapshot on reconnecting brings what happened meanwhile.
    expect(page.locator(f"#run-{run.id}")).to_be_visible()
    page.context.close()
