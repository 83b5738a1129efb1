"""Runs worth exporting, made as operators make them; the evidence tests and the
browser's evidence test both use them (a module, since no test imports a conftest)."""

from __future__ import annotations

from agentruns.models import Run
from approvals.models import Approval
from approvals.services import approval_decide
from tests.harness import ORDER, OVER_LIMIT, Harness


def approved_refund(harness: Harness, approver, *, note: str) -> Run:
    """A refund of 60.00 EUR asked for by user:requester, approved by ``approver`` with
    ``note``, sent and completed."""
    run = harness.start(
        "refund_support", {"order_id": ORDER, "amount": OVER_LIMIT}, requested_by="user:requester"
    )
    assert harness.advance(run) == "suspended:waiting_for_approval"
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(
        approval=approval,
        user=approver,
        decision="approve",
        seen_args_hash=approval.args_hash,
        note=note,
    )
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    return run
