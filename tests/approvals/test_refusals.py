"""A call the provider will refuse is never approved, and is refused before it is sent.

Judged on the resource's state: a refund larger than what remains refundable, of a
fully refunded payment, or in another currency than the payment's.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from pydantic import BaseModel

from agentruns.models import Step, StepStatus
from agentruns.runtime import Registry, agent
from approvals.models import Approval, ApprovalAuthority, ApprovalStatus
from support.agents import refund_support
from support.tools import _refund_refusal, issue_refund
from tests.harness import ORDER, post_decision

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

SMALL_ORDER = "ord_1004"  # a desk lamp: 45.00 EUR received


def _refunds(world, order: dict) -> dict:
    return world.sandbox.stats()["refunds"]["by_payment_intent"].get(
        order["payment_intent"], {"count": 0, "amount": 0}
    )


def test_an_over_refund_is_not_offered_for_approval_and_the_card_says_why(client, approver, world):
    order = world.sandbox.get(f"/shop/orders/{SMALL_ORDER}").json()
    run = world.harness.start(
        "refund_support", {"order_id": SMALL_ORDER, "amount": 8000}, requested_by="user:bob"
    )
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = world.waiting_approval(run)
    client.force_login(approver)

    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "The provider will refuse this: 80.00 EUR is more than the 45.00 EUR" in page
    assert 'value="approve"' not in page and 'value="reject"' in page

    response = post_decision(client, approval)
    assert response.status_code == 403
    assert "the provider will refuse this action" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING

    assert post_decision(
        client, approval, "reject", note="only 45.00 EUR was paid"
    ).status_code in (
        200,
        302,
    )
    assert world.harness.advance(run).startswith("finished:")
    assert _refunds(world, order)["count"] == 0


def test_an_approved_refund_the_payment_no_longer_covers_is_refused_before_it_is_sent(
    client, approver, world
):
    run = world.start_refund(requested_by="user:bob")
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = world.waiting_approval(run)
    client.force_login(approver)
    assert post_decision(client, approval).status_code in (200, 302)
    # Meanwhile someone refunds most of the payment in the provider's own dashboard.
    remaining = world.order["amount"] - approval.args["amount"] + 100
    world.sandbox.client().v1.refunds.create(
        params={"payment_intent": world.order["payment_intent"], "amount": remaining}
    )

    world.harness.advance(run)

    step = Step.objects.get(run=run, name="issue_refund")
    assert step.status == StepStatus.FAILED
    assert step.last_error_class == "refused_before_send"
    assert "still refundable" in step.last_error
    assert step.first_sent_at is None  # never sent
    assert _refunds(world, world.order) == {"count": 1, "amount": remaining}
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.INVALIDATED


class _ForeignCurrency(BaseModel):
    payment_intent: str
    currency: str


@agent(name="refund_in_yen", version=1, tools=[issue_refund], input_model=_ForeignCurrency)
def refund_in_yen(ctx, input):
    """A model that asks for the right amount in the wrong currency."""
    arguments = {
        "order_id": ORDER,
        "payment_intent": input["payment_intent"],
        "amount": 6000,
        "currency": input["currency"],
    }
    result = ctx.tool("issue_refund", arguments)
    return {"status": result.status, "error": result.error}


def test_a_refund_in_another_currency_is_never_sent_even_with_an_approval(client, approver, world):
    # Authority in yen too: only the provider's refusal may stop this one.
    ApprovalAuthority.objects.create(
        tenant=world.tenant, group=Group.objects.get(name="approver"), currency="jpy"
    )
    world.harness.registry = Registry([refund_support, refund_in_yen])
    world.harness.engine = world.harness.build()
    run = world.harness.start(
        "refund_in_yen",
        {"currency": "jpy", "payment_intent": world.order["payment_intent"]},
        requested_by="user:bob",
    )
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = world.waiting_approval(run)
    client.force_login(approver)
    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "the payment is in EUR, not JPY" in page
    assert 'value="approve"' not in page
    # An approval recorded before this check existed (or by hand) still sends nothing.
    Approval.objects.filter(pk=approval.pk).update(
        status=ApprovalStatus.APPROVED, decided_by=approver, decided_by_name="user:ann"
    )
    world.harness.engine.resume_after_approval(run.id, by="test")

    assert world.harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.output["status"] == "failed"
    assert "not sent: the payment is in EUR, not JPY" in run.output["error"]
    assert _refunds(world, world.order)["count"] == 0


@pytest.mark.parametrize(
    ("args", "state", "reason"),
    [
        ({"amount": 100, "currency": "eur"}, {"currency": "eur", "amount_received": 4500}, None),
        (
            {"amount": 100, "currency": "eur"},
            {"currency": "eur", "amount_received": 4500, "amount_refunded": 4500},
            "the payment is already fully refunded",
        ),
        (
            {"amount": 4501, "currency": "eur"},
            {"currency": "eur", "amount_received": 4500, "amount_refunded": 0},
            "45.01 EUR is more than the 45.00 EUR still refundable",
        ),
        (
            {"amount": 8000, "currency": "jpy"},
            {"currency": "eur", "amount_received": 8000, "amount_refunded": 0},
            "the payment is in EUR, not JPY: the provider refunds in the payment's own currency",
        ),
    ],
)
def test_the_refund_policy_names_what_the_provider_will_refuse(args, state, reason):
    assert _refund_refusal(args, state) == reason


def test_the_card_says_what_the_provider_will_refuse_even_to_someone_who_cannotpost_decision(
    client, tenant, make_operator, world
):
    order = world.sandbox.get(f"/shop/orders/{SMALL_ORDER}").json()
    run = world.harness.start(
        "refund_support", {"order_id": SMALL_ORDER, "amount": 8000}, requested_by="user:bob"
    )
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = world.waiting_approval(run)
    client.force_login(make_operator(tenant, "viewer", username="vic"))
    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "The provider will refuse this: 80.00 EUR is more than the 45.00 EUR" in page
    assert "No decision buttons" in page
    assert 'value="reject"' not in page
    assert _refunds(world, order)["count"] == 0
