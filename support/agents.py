"""The refund-support agent, written the way a user of Holdfast writes their own."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from agentruns.llm.scripted import ScriptedCall, ScriptedReply
from agentruns.money import format_amount
from agentruns.runtime import Budget, ModelSpec, agent, run_tool_loop
from support.tools import issue_refund, lookup_order, send_customer_email

SYSTEM_PROMPT = (
    "You are a support agent for an online shop. Look the order up before acting. "
    "Refund amounts are integers in minor units with a currency. Never refund more "
    "than was paid and not yet refunded. Tell the customer what you did."
)


class RefundAsk(BaseModel):
    """What a customer asks for: the input of both refund agents (this one and its
    Pydantic AI twin, support/pydantic_agent.py)."""

    order_id: str = Field(min_length=1, max_length=64)
    # Minor units; None means the whole remaining amount.
    amount: int | None = Field(default=None, gt=0)
    message: str = Field(default="Please refund my order.", max_length=2000)
    email_customer: bool = False


class RefundRequest(RefundAsk):
    # Which scripted conversation answers: this agent's model is the scripted one.
    scenario: str = "refund"


def _last_tool_result(request) -> dict[str, Any]:
    for message in reversed(request.messages):
        if message.get("role") == "tool":
            return json.loads(message["content"])
    return {}


def _asked(request) -> dict[str, Any]:
    return json.loads(request.messages[1]["content"].split("\n", 1)[1])


def refund_scenario(request) -> ScriptedReply:
    """Look the order up, refund it, optionally email the customer, then answer."""
    turn = sum(1 for m in request.messages if m.get("role") == "assistant")
    asked = _asked(request)
    last = _last_tool_result(request)
    if turn == 0:
        return ScriptedReply(
            tool_calls=[ScriptedCall("lookup_order", {"order_id": asked["order_id"]})]
        )
    if turn == 1:
        if not last.get("ok"):
            return ScriptedReply(content=f"I could not find that order: {last.get('error')}")
        order = last["result"]
        remaining = order["amount"] - order.get("amount_refunded", 0)
        amount = asked.get("amount") or remaining
        return ScriptedReply(
            tool_calls=[
                ScriptedCall(
                    "issue_refund",
                    {
                        "order_id": order["id"],
                        "payment_intent": order["payment_intent"],
                        "amount": amount,
                        "currency": order["currency"],
                    },
                )
            ]
        )
    if turn == 2 and asked.get("email_customer") and last.get("ok"):
        refund = last["result"]
        order = _order_from(request)
        return ScriptedReply(
            tool_calls=[
                ScriptedCall(
                    "send_customer_email",
                    {
                        "to": order["customer"]["email"],
                        "subject": f"Your refund for order {order['id']}",
                        "body": (
                            f"Hello {order['customer']['name']},\n\nWe refunded "
                            f"{format_amount(refund['amount'], refund['currency'])} "
                            f"(refund {refund['id']}).\n"
                        ),
                    },
                )
            ]
        )
    if last.get("ok") and str((last.get("result") or {}).get("id", "")).startswith("re_"):
        refund = last["result"]
        return ScriptedReply(
            content=f"Refunded {format_amount(refund['amount'], refund['currency'])} "
            f"as {refund['id']}."
        )
    if last.get("ok"):
        return ScriptedReply(content="Done: the refund is issued and the customer was told.")
    return ScriptedReply(content=f"I could not complete the refund: {last.get('error')}")


def _order_from(request) -> dict[str, Any]:
    for message in request.messages:
        if message.get("role") == "tool":
            content = json.loads(message["content"])
            result = content.get("result") or {}
            if content.get("ok") and "payment_intent" in result and "customer" in result:
                return result
    return {}


@agent(
    name="refund_support",
    version=1,
    tools=[lookup_order, issue_refund, send_customer_email],
    input_model=RefundRequest,
    model=ModelSpec(provider="scripted", model="scripted-1", prompt_version="refund-support-1"),
    scenarios={"refund": refund_scenario},
    budget=Budget(max_steps=30, max_model_calls=10),
    config={
        # Refunds above these amounts (minor units, per lower-case currency) wait for an
        # approver; in a currency not named here, every refund does. A tenant sets its
        # own in its settings (Tenant.agent_config); the run pins what applied at start.
        "approvals": {"enabled": True, "auto_approve_up_to": {"eur": 5000}},
    },
)
def refund_support(ctx, input):
    request = {
        "order_id": input["order_id"],
        "amount": input["amount"],
        "email_customer": input["email_customer"],
    }
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{input['message']}\n{json.dumps(request)}"},
    ]
    final, conversation = run_tool_loop(ctx, messages, max_turns=6)
    refund = _refund_answer(conversation)
    if refund is None:
        ctx.outcome("nothing_to_refund", final.content or "")
    elif refund.get("ok"):
        ctx.outcome("refunded", f"refund {(refund.get('result') or {}).get('id', '')}")
    else:
        ctx.outcome("refund_refused", refund.get("error") or "")
    return {"reply": final.content, "turns": sum(m["role"] == "assistant" for m in conversation)}


def _refund_answer(conversation: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the last issue_refund call answered (as the model was told), or None."""
    refund_calls = {
        call["id"]
        for message in conversation
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
        if call["function"]["name"] == "issue_refund"
    }
    answers = [
        json.loads(message["content"])
        for message in conversation
        if message.get("role") == "tool" and message.get("tool_call_id") in refund_calls
    ]
    return answers[-1] if answers else None


AGENTS = [refund_support]
