"""The run page separates an approved refund's call from its wait for approval."""

from __future__ import annotations

import re

import pytest

from approvals.services import approval_decide

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def test_the_run_page_shows_the_refunds_call_and_its_wait_for_approval_apart(
    client, approver, world
):
    run = world.start_refund(requested_by="user:bob")
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = world.waiting_approval(run)
    approval_decide(
        approval=approval, user=approver, decision="approve", seen_args_hash=approval.args_hash
    )
    assert world.harness.advance(run) == "finished:completed"

    client.force_login(approver)
    page = client.get(f"/runs/{run.id}/").content.decode()
    refund = page[page.index("tool.issue_refund") :]
    refund = refund[: refund.index("</li>")]
    assert re.search(r'title="the call, from [^"]+">\d+ ms</span>', refund)
    assert re.search(r"waited [\d.]+ (ms|s) for approval", refund)
