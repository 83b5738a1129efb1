"""Two approvers decide one approval at the same moment: exactly one decision counts."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from accounts.models import AuditEntry
from approvals.models import Approval
from approvals.services import DecisionConflict, approval_decide

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def test_two_approvers_at_once_yield_one_decision(world, approver, tenant, make_operator):
    bea = make_operator(tenant, "approver", username="bea")
    run = world.start_refund(requested_by="user:requester")
    world.harness.advance(run)
    approval_id = world.waiting_approval(run).pk
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def decide(user, decision: str) -> None:
        try:
            # Each thread reads the approval as its own page did, then both post.
            approval = Approval.objects.select_related("tenant").get(pk=approval_id)
            barrier.wait(timeout=10)
            approval_decide(
                approval=approval,
                user=user,
                decision=decision,
                seen_args_hash=approval.args_hash,
                note=f"{user.username} says {decision}",
            )
            outcomes[user.username] = "decided"
        except DecisionConflict as exc:
            outcomes[user.username] = f"conflict: {exc}"
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=(approver, "approve")),
        threading.Thread(target=decide, args=(bea, "reject")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(outcomes) == ["ann", "bea"], outcomes
    winners = [name for name, outcome in outcomes.items() if outcome == "decided"]
    assert len(winners) == 1, outcomes
    loser = "bea" if winners == ["ann"] else "ann"
    approval = Approval.objects.get(pk=approval_id)
    assert approval.decided_by_name == f"user:{winners[0]}"
    assert f"user:{winners[0]} already {approval.status} it" in outcomes[loser]
    decisions = AuditEntry.objects.filter(action__in=["approval.approve", "approval.reject"])
    assert decisions.count() == 1
    assert decisions.get().actor == f"user:{winners[0]}"
