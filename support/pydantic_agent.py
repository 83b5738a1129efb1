"""The refund-support agent written with Pydantic AI: the same tools, the same approval rules.

A Pydantic AI agent as its own documentation writes one, plus a recovery declaration
(``@durable``) under each tool, registered as the Holdfast agent
``refund_support_pydantic_ai``. Each tool performs its attempt exactly as the native
agent's tool does (``support.tools``), with the ``CallInfo`` Holdfast hands it
(``current_call()``): the effect key becomes the refund's idempotency key, the
tenant's accounts its credentials.

Its model here is Pydantic AI's ``FunctionModel`` answering as the native agent's
scripted scenario does, so the demo runs offline; a deployment gives the agent a
real model instead (README, "Pydantic AI agents").
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentruns.integrations.pydantic_ai import current_call, durable, holdfast_agent
from agentruns.money import format_amount
from agentruns.runtime import Budget
from support import tools
from support.agents import SYSTEM_PROMPT, RefundAsk

# The native agent's words and input: the twin differs only in how it is written.
INSTRUCTIONS = SYSTEM_PROMPT


def refund_conversation(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model's side, offline: look the order up, refund it, optionally email, answer."""
    asked = _asked(messages)
    answers = _tool_returns(messages)
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn == 0:
        return _call("lookup_order", {"order_id": asked["order_id"]})
    last = answers[-1]
    if turn == 1:
        if last.outcome != "success":
            return _say(f"I could not find that order: {last.content}")
        order = last.content
        remaining = order["amount"] - order.get("amount_refunded", 0)
        return _call(
            "issue_refund",
            {
                "order_id": order["id"],
                "payment_intent": order["payment_intent"],
                "amount": asked.get("amount") or remaining,
                "currency": order["currency"],
            },
        )
    if turn == 2 and asked.get("email_customer") and last.outcome == "success":
        refund, order = last.content, answers[0].content
        return _call(
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
    if last.outcome != "success":
        return _say(f"I could not complete the refund: {last.content}")
    if last.tool_name == "issue_refund":
        refund = last.content
        amount = format_amount(refund["amount"], refund["currency"])
        return _say(f"Refunded {amount} as {refund['id']}.")
    return _say("Done: the refund is issued and the customer was told.")


def _asked(messages: list[ModelMessage]) -> dict[str, Any]:
    for message in messages:
        for part in getattr(message, "parts", ()):
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                return json.loads(part.content.split("\n", 1)[1])
    raise ValueError("the conversation has no refund request")


def _tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def _call(tool_name: str, args: dict[str, Any]) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool_name, args, f"call_{tool_name}")])


def _say(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


refund_agent = Agent(FunctionModel(refund_conversation), instructions=INSTRUCTIONS)


@refund_agent.tool_plain
@durable(
    recovery=tools.lookup_order.recovery,
    timeout=5.0,
    provider="shop",
    personal_data=tools.lookup_order.personal_data,
)
def lookup_order(order_id: Annotated[str, Field(min_length=1, max_length=64)]) -> dict:
    """Read an order: customer, items, amount, payment intent and refund state."""
    return tools.lookup_order.call({"order_id": order_id}, current_call())


@refund_agent.tool_plain
@durable(
    recovery=tools.issue_refund.recovery,
    # The refund's lookup reads the payment's refunds for the one carrying the effect key.
    lookup=tools.issue_refund.find,
    approval=tools.REFUND_APPROVAL,
    timeout=10.0,
    provider="payments (Stripe API)",
)
def issue_refund(
    order_id: Annotated[str, Field(min_length=1, max_length=64)],
    payment_intent: Annotated[str, Field(pattern=r"^pi_[A-Za-z0-9_]+$")],
    amount: Annotated[int, Field(gt=0, description="Amount in minor units (cents)")],
    currency: Annotated[str, Field(pattern=r"^[a-z]{3}$", description="ISO code, lower case")],
    reason: Literal["duplicate", "fraudulent", "requested_by_customer"] = "requested_by_customer",
) -> dict:
    """Refund (part of) an order's payment. Amount in minor units."""
    call = current_call()
    args = {
        "order_id": order_id,
        "payment_intent": payment_intent,
        "amount": amount,
        "currency": currency,
        "reason": reason,
    }
    return tools.issue_refund.call(tools.issue_refund.request_for(args, call.config), call)


@refund_agent.tool_plain
@durable(
    recovery=tools.send_customer_email.recovery,
    timeout=10.0,
    provider="mail (SMTP)",
    personal_data=tools.send_customer_email.personal_data,
)
def send_customer_email(
    to: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$")],
    subject: Annotated[str, Field(min_length=1, max_length=200)],
    body: Annotated[str, Field(min_length=1, max_length=10_000)],
) -> dict:
    """Email the customer. Cannot be undone or checked afterwards."""
    return tools.send_customer_email.call(
        {"to": to, "subject": subject, "body": body}, current_call()
    )


def refund_prompt(input: dict[str, Any]) -> str:
    request = {
        "order_id": input["order_id"],
        "amount": input["amount"],
        "email_customer": input["email_customer"],
    }
    return f"{input['message']}\n{json.dumps(request)}"


def refund_outcome(output: str, messages: list[ModelMessage]) -> tuple[str, str]:
    """What the run's end means, from what the refund tool answered (as the model was told)."""
    refunds = [part for part in _tool_returns(messages) if part.tool_name == "issue_refund"]
    if not refunds:
        return "nothing_to_refund", output
    if refunds[-1].outcome == "success":
        return "refunded", f"refund {refunds[-1].content.get('id', '')}"
    return "refund_refused", str(refunds[-1].content)


# Everything but the name and the model, for a deployment (or a test) that registers the
# same agent with another model.
OPTIONS: dict[str, Any] = {
    "version": 1,
    "prompt": refund_prompt,
    "outcome": refund_outcome,
    "input_model": RefundAsk,
    "budget": Budget(max_steps=30, max_model_calls=10),
    "config": {
        # As the native agent's: refunds above these amounts (minor units, per currency)
        # wait for an approver, in any other currency every refund does; a tenant sets its
        # own on its settings page, pinned into each run at start.
        "approvals": {"enabled": True, "auto_approve_up_to": {"eur": 5000}},
    },
}

refund_support_pydantic_ai = holdfast_agent(
    refund_agent, name="refund_support_pydantic_ai", **OPTIONS
)

AGENTS = [refund_support_pydantic_ai]
