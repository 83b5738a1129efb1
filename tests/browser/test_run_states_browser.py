"""An operator reads the run list's states in words, grouped as they think of them, with
what happened to each run on its way; a run that changes state elsewhere moves between
the counts while the page stays open; on a phone no state is broken mid-word."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from agentruns.models import Run
from agentruns.runtime import faults
from agentruns.states import STATES
from tests.agentruns.runtime import agents
from tests.harness import SCREENSHOTS, Harness

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]

# The words of every matching element that a line break splits: a word on two lines
# has boxes at two heights. Text read only by screen readers is left out.
BROKEN_WORDS = """(selector) => {
  const broken = [];
  for (const element of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.parentElement.closest('.visually-hidden')) continue;
      for (const word of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const tops = new Set([...range.getClientRects()].map((box) => Math.round(box.top)));
        if (tops.size > 1) broken.push(word[0]);
      }
    }
  }
  return broken;
}"""


@pytest.fixture
def runs(tenant):
    """Runs in each group, driven by the engine in this process (the page's server only
    reads the database): one retried and recovered, one compensated, one whose email's
    fate is unknown, one asleep."""
    agents.PROVIDER.reset()
    harness = Harness(tenant)
    agents.PROVIDER.script["charge"] = ["fail_after"]
    bumpy = harness.start("flow", {"order_id": "bumpy"})
    harness.interrupt(bumpy, faults.AFTER_STEP_RUNNING, "charge")
    bumpy = harness.drive(bumpy)
    undone = harness.start("flow", {"order_id": "undone", "fail_after_charge": True})
    harness.advance(undone)
    agents.PROVIDER.script["send_email"] = ["fail_after"]
    unknown = harness.start("mailer")
    harness.advance(unknown)
    asleep = harness.start("flow", {"order_id": "asleep", "sleep": 600})
    harness.advance(asleep)
    found = {"bumpy": bumpy, "undone": undone, "unknown": unknown, "asleep": asleep}
    for run in found.values():
        run.refresh_from_db()
    assert [run.status for run in found.values()] == [
        "completed",
        "compensated",
        "effect_unknown_reconciliation_required",
        "sleeping",
    ]
    assert Run.objects.count() == 4
    yield harness, found
    agents.PROVIDER.reset()


def _log_in(page, live_server_url, username):
    page.goto(f"{live_server_url}/runs/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server_url}/runs/")


def test_states_in_words_grouped_with_marks_and_live_counts(
    page, browser, live_server_url, tenant, make_operator, runs, screenshot
):
    harness, run = runs
    make_operator(tenant, "viewer", username="val")
    _log_in(page, live_server_url, "val")
    expect(page.locator("#live")).to_have_class("live on")

    groups = page.locator("#state-tabs .tab-group")
    expect(groups).to_have_count(3)
    expect(page.locator("#state-tabs .group-tab")).to_have_text(
        ["Needs a person 1", "Working 1", "Ended 2"]
    )
    unknown_tab = page.locator("#state-tabs [data-state=effect_unknown_reconciliation_required]")
    expect(unknown_tab).to_have_text("Outcome unknown — needs reconciliation 1")
    expect(unknown_tab).to_have_attribute(
        "title", STATES["effect_unknown_reconciliation_required"].explanation
    )
    expect(unknown_tab).to_have_attribute(
        "href", "/runs/?state=effect_unknown_reconciliation_required"
    )
    bumpy = page.locator(f"#run-{run['bumpy'].id}")
    expect(bumpy.locator(".state")).to_contain_text("Completed")
    expect(bumpy.locator(".mark")).to_have_text(["retried", "recovered"])
    expect(page.locator(f"#run-{run['undone'].id} .mark")).to_have_text(["compensated"])
    expect(page.locator(f"#run-{run['asleep'].id} .mark")).to_have_count(0)
    screenshot("runs-states")

    # Someone cancels the sleeping run elsewhere: the page follows without a reload.
    harness.engine.request_cancel(run["asleep"].id, by="user:someone")
    expect(page.locator("#state-tabs .group-tab")).to_have_text(
        ["Needs a person 1", "Working 0", "Ended 3"], timeout=15_000
    )
    expect(page.locator("#state-tabs [data-state=cancelled_no_effect]")).to_have_text(
        "Cancelled with no effect 1"
    )
    expect(page.locator(f"#run-{run['asleep'].id} .state")).to_contain_text(
        "Cancelled with no effect"
    )
    screenshot("runs-states-after-cancel")

    # A mark is a link to the runs marked so; the tabs count under it.
    bumpy.locator(".mark-recovered").click()
    expect(page).to_have_url(f"{live_server_url}/runs/?mark=recovered")
    expect(page.locator("#run-rows tr")).to_have_count(1)
    expect(page.locator("#state-tabs .group-tab")).to_have_text(
        ["Needs a person 0", "Working 0", "Ended 1"]
    )
    expect(page.locator("select[name=mark]")).to_have_value("recovered")

    context = browser.new_context(viewport={"width": 390, "height": 800})
    phone = context.new_page()
    _log_in(phone, live_server_url, "val")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    assert phone.evaluate(BROKEN_WORDS, "#state-tabs a, .state, .mark") == []
    phone.screenshot(path=str(SCREENSHOTS / "runs-states-narrow.png"), full_page=True)
    phone.goto(f"{live_server_url}/runs/{run['bumpy'].id}/")
    expect(phone.locator("#run-summary .mark")).to_have_text(["retried", "recovered"])
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    assert phone.evaluate(BROKEN_WORDS, ".state, .mark") == []
    phone.screenshot(path=str(SCREENSHOTS / "run-detail-marks-narrow.png"), full_page=True)
    context.close()
