"""The refund-support agent's worker cluster SIGKILLed around its refund and its email.

Each scenario starts a real ``qcluster`` armed with ``HOLDFAST_FAULTS=<point>@<tool>=killgroup``
and pointed at the real sandbox process (payments, shop and SMTP sink), starts a
refund run, and waits for the whole group to die. Then a clean cluster and the
sweeper take over. What happened is judged by the sandbox's own records: its
effect counts, its refunds as the Stripe SDK lists them, and its mail sink.

A worker killed after clearing a refund leaves a lease of the refund's send budget
(its 10 s timeout plus a margin) plus the lease: about 13 s before anyone may take
the run over. So the scenarios of one test are killed one after another, each on
its own order, and their leases run out together after one restart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.crash.harness import (
    AMOUNT,
    TERMINAL,
    RefundWorld,
)

pytestmark = pytest.mark.crash

EFFECT_KEY_METADATA = "holdfast_effect_key"


def _json(value: Any) -> Any:
    """A JSON column: text on SQLite, already decoded on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Kill:
    fault: str  # "<point>@<tool>"
    order_id: str
    # The issue_refund step's status when the cluster died (None: not on record yet).
    step_at_kill: str | None
    # Refunds of the order's payment at the provider when the cluster died.
    refunds_at_kill: int
    # A sandbox fault armed on POST /v1/refunds just before this scenario's run.
    sandbox_fault: str | None = None
    # After the restart the refund was sent again under the same key.
    resent: bool = False

    def __str__(self) -> str:
        fault = f"{self.fault} with {self.sandbox_fault}" if self.sandbox_fault else self.fault
        return f"{fault} on {self.order_id}"


@dataclass
class Killed:
    kill: Kill
    run_id: str
    order: dict[str, Any]


def _kill_each(refunds: RefundWorld, kills: list[Kill]) -> list[Killed]:
    """Kill one armed cluster per scenario and check where each died, then restart."""
    killed = []
    for kill in kills:
        order = refunds.order(kill.order_id)
        assert order["amount"] > AMOUNT, order
        if kill.sandbox_fault:
            refunds.sandbox.arm(kill.sandbox_fault, count=1)
        run_id = refunds.kill_cluster_at(kill.fault, kill.order_id)
        # Where it died, by the engine's record and by the provider's.
        explain = f"{kill}\n{refunds.explain()}"
        assert refunds.world.db.run(run_id)["status"] not in TERMINAL, explain
        step = refunds.tool_steps(run_id).get("issue_refund")
        assert (step["status"] if step else None) == kill.step_at_kill, explain
        assert refunds.refunds_of(order["payment_intent"])["count"] == kill.refunds_at_kill, explain
        assert refunds.stats()["faults_armed"] == 0, explain
        killed.append(Killed(kill, run_id, order))
    refunds.restart()
    return killed


def _assert_exactly_one_refund_recorded_on_the_step(
    refunds: RefundWorld, run_id: str, order: dict[str, Any], label: object = ""
) -> dict[str, Any]:
    """One refund of the order's payment at the provider, under the step's effect key,
    and it is the one the step recorded."""
    step = refunds.tool_steps(run_id)["issue_refund"]
    explain = f"{label}\n{refunds.explain()}"
    assert step["status"] == "succeeded", explain
    assert step["effect_key"], explain
    stats = refunds.stats()["refunds"]
    assert stats["by_payment_intent"][order["payment_intent"]] == {
        "count": 1,
        "amount": AMOUNT,
    }, explain
    assert stats["by_idempotency_key"].get(step["effect_key"]) == 1, explain
    listed = refunds.listed_refunds(order["payment_intent"])
    assert [refund.id for refund in listed] == [step["provider_reference"]], explain
    refund = listed[0]
    assert refund.amount == AMOUNT, explain
    assert refund.metadata[EFFECT_KEY_METADATA] == step["effect_key"], explain
    assert refund.metadata["holdfast_run_id"] == run_id, explain
    assert refund.metadata["order_id"] == order["id"], explain
    return step


def _assert_each_completed_with_exactly_one_refund(
    refunds: RefundWorld, killed: list[Killed]
) -> None:
    keys = []
    for each in killed:
        run = refunds.wait_for_status(each.run_id, "completed")
        step = _assert_exactly_one_refund_recorded_on_the_step(
            refunds, each.run_id, each.order, each.kill
        )
        keys.append(step["effect_key"])
        explain = f"{each.kill}\n{refunds.explain()}"
        # Sent once, and sent again under the same key only when the first send's
        # answer was never recorded.
        sends = [e["action"] for e in _json(step["recovery_log"]) if e["action"] != "answer"]
        assert sends == (["send", "resend"] if each.kill.resent else ["send"]), explain
        currency = each.order["currency"].upper()
        assert _json(run["output"])["reply"] == (
            f"Refunded {AMOUNT / 100:.2f} {currency} as {step['provider_reference']}."
        ), explain
    # Nothing else reached the provider: no refund without a key, no key twice, no email.
    stats = refunds.stats()
    explain = refunds.explain()
    assert stats["refunds"]["total"] == len(killed), explain
    assert stats["refunds"]["by_idempotency_key"] == dict.fromkeys(keys, 1), explain
    assert stats["messages"]["total"] == 0, explain


def test_refunds_killed_before_they_reached_the_provider_are_made_exactly_once(
    refunds: RefundWorld,
) -> None:
    killed = _kill_each(
        refunds,
        [
            # Nothing about the refund is on record: after the restart it is sent once.
            Kill("before_step_recorded@issue_refund", "ord_1001", None, refunds_at_kill=0),
            # Cleared to send (the effect key is committed) but never sent: the
            # send after the restart, under that key, is the only one.
            Kill(
                "after_step_running@issue_refund",
                "ord_1002",
                "running",
                refunds_at_kill=0,
                resent=True,
            ),
        ],
    )
    _assert_each_completed_with_exactly_one_refund(refunds, killed)


def test_refunds_killed_after_the_provider_made_them_are_never_made_twice(
    refunds: RefundWorld,
) -> None:
    killed = _kill_each(
        refunds,
        [
            # The provider committed the refund and dropped the connection; the worker
            # saw a connection error and died before recording anything. The resend
            # under the same key gets the saved refund back.
            Kill(
                "after_call_returned@issue_refund",
                "ord_1001",
                "running",
                refunds_at_kill=1,
                sandbox_fault="drop_after_commit",
                resent=True,
            ),
            # The reply arrived and was lost with the worker: same key, the saved refund.
            Kill(
                "after_call_returned@issue_refund",
                "ord_1002",
                "running",
                refunds_at_kill=1,
                resent=True,
            ),
            # The refund is on record: replay returns it without calling the provider.
            Kill(
                "after_result_recorded@issue_refund",
                "ord_1003",
                "succeeded",
                refunds_at_kill=1,
            ),
        ],
    )
    _assert_each_completed_with_exactly_one_refund(refunds, killed)


def test_an_email_whose_answer_was_lost_waits_for_an_operator_and_is_never_sent_twice(
    refunds: RefundWorld,
) -> None:
    order = refunds.order("ord_1001")
    run_id = refunds.kill_cluster_at(
        "after_call_returned@send_customer_email", order["id"], email_customer=True
    )
    assert refunds.world.db.run(run_id)["status"] not in TERMINAL, refunds.explain()
    email = refunds.tool_steps(run_id)["send_customer_email"]
    assert email["status"] == "running", refunds.explain()
    assert refunds.stats()["messages"]["total"] == 1, refunds.explain()

    refunds.restart()
    # SMTP has neither an idempotency key nor a lookup: only a person can tell.
    refunds.wait_for_status(run_id, "effect_unknown_reconciliation_required")

    email = refunds.tool_steps(run_id)["send_customer_email"]
    assert email["status"] == "unknown", refunds.explain()
    assert _json(email["recovery_log"])[-1]["action"] == "needs_operator", refunds.explain()
    messages = refunds.stats()["messages"]
    customer = order["customer"]["email"].lower()
    assert messages == {"total": 1, "by_recipient": {customer: 1}}, refunds.explain()
    refund = _assert_exactly_one_refund_recorded_on_the_step(refunds, run_id, order)
    assert refunds.stats()["refunds"]["by_idempotency_key"] == {refund["effect_key"]: 1}


# --- approved refunds ------------------------------------------------------------------

# Above the refund agent's auto-approval amount (5000): the refund waits for a person.
APPROVED_AMOUNT = 6000

CREATE_APPROVER = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from accounts.models import Operator, Tenant
from approvals.models import ApprovalAuthority
tenant = Tenant.objects.get(slug="default")
user = get_user_model().objects.create_user("ann", password="crash-test")
Operator.objects.create(user=user, tenant=tenant)
group = Group.objects.get(name="approver")
user.groups.add(group)
ApprovalAuthority.objects.create(tenant=tenant, group=group, currency="eur", max_amount=None)
"""

APPROVE = """
from django.contrib.auth import get_user_model
from approvals.models import Approval
from approvals.services import approval_decide
approval = Approval.objects.get(run_id="{run_id}", status="pending")
approval_decide(
    approval=approval,
    user=get_user_model().objects.get(username="ann"),
    decision="approve",
    seen_args_hash=approval.args_hash,
    note="crash test",
)
"""


def _shell(refunds: RefundWorld, name: str, code: str) -> None:
    proc = refunds.world.start(name, "shell", "-c", code)
    if refunds.world.wait_exit(proc) != 0:
        pytest.fail(f"{name} failed\n{proc.tail()}\n{refunds.explain()}")


def _approvals(refunds: RefundWorld, run_id: str) -> list[dict[str, Any]]:
    return refunds.world.db.query(
        "SELECT id, status, effect_key, consumed_by_effect_key FROM approvals_approval "
        "WHERE run_id = %s ORDER BY id",
        (refunds.world.db._run_key(run_id),),
    )


def test_an_approved_refund_killed_around_its_send_is_made_once_under_its_approval(
    refunds: RefundWorld,
) -> None:
    _shell(refunds, "create-approver", CREATE_APPROVER)
    scenarios = [
        # The approval is consumed and the step cleared in one commit; the worker
        # dies before sending. The send after the restart is not gated again.
        ("after_step_running@issue_refund", "ord_1001", 0),
        # The provider refunded (our own refund changed the payment's fingerprint);
        # the worker died before recording it. Recovery settles it, never re-gates.
        ("after_call_returned@issue_refund", "ord_1003", 1),
    ]
    # One scenario at a time, each recovered before the next begins: a worker also
    # recovers runs whose lease expired, so an armed cluster would otherwise take up
    # the earlier scenario's run and die at its fault point on that run instead.
    for fault, order_id, refunds_at_kill in scenarios:
        order = refunds.order(order_id)
        cluster = refunds.world.start_cluster("qcluster-armed", faults=f"{fault}=killgroup")
        run_id = refunds.start_run(order_id, amount=APPROVED_AMOUNT)
        refunds.world.wait_for_status(run_id, "waiting_for_approval")
        [pending] = _approvals(refunds, run_id)
        assert pending["status"] == "pending", refunds.explain()
        assert refunds.refunds_of(order["payment_intent"])["count"] == 0, refunds.explain()
        _shell(refunds, "approve", APPROVE.format(run_id=run_id))
        refunds.world.wait_group_gone(cluster)
        explain = f"{fault}\n{refunds.explain()}"
        [consumed] = _approvals(refunds, run_id)
        step = refunds.tool_steps(run_id)["issue_refund"]
        assert consumed["status"] == "consumed", explain
        assert consumed["consumed_by_effect_key"] == step["effect_key"], explain
        assert step["status"] == "running", explain
        paid = refunds.refunds_of(order["payment_intent"])
        assert paid["count"] == refunds_at_kill, explain

        clean = refunds.world.start_cluster("qcluster-clean")
        sweeper = refunds.world.start_sweeper()
        refunds.wait_for_status(run_id, "completed")
        explain = f"{fault}\n{refunds.explain()}"
        step = refunds.tool_steps(run_id)["issue_refund"]
        assert refunds.refunds_of(order["payment_intent"]) == {
            "count": 1,
            "amount": APPROVED_AMOUNT,
        }, explain
        listed = refunds.listed_refunds(order["payment_intent"])
        assert [refund.id for refund in listed] == [step["provider_reference"]], explain
        # Executed under the original approval, named in the provider's own record.
        assert listed[0].metadata["holdfast_approval_id"] == str(consumed["id"]), explain
        assert listed[0].metadata[EFFECT_KEY_METADATA] == step["effect_key"], explain
        assert [a["status"] for a in _approvals(refunds, run_id)] == ["consumed"], explain
        refunds.world.kill_group(clean)
        refunds.world.kill_group(sweeper)
    assert refunds.stats()["refunds"]["total"] == len(scenarios), refunds.explain()
