"""Pydantic AI agents the integration tests run, scripted with Pydantic AI's FunctionModel.

``WORLD`` stands for the outside world and for the model's provider: what each tool
executed (keyed by effect key, as a provider with idempotency keys keeps it), and
how many times the model was asked at each position of the conversation. The
engine never writes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentruns.integrations.pydantic_ai import current_call, durable, holdfast_agent
from agentruns.runtime import READ_ONLY, CallInfo, LookupResult, Undo, idempotent, tool

ORDER = {"id": "o-1", "amount": 8000, "currency": "eur", "payment_intent": "pi_1"}


@dataclass
class World:
    effects: dict[str, dict] = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)
    # What each tool was called with, in order.
    arguments: list[tuple[str, dict]] = field(default_factory=list)
    # Model requests by the number of messages they carried (the conversation's position).
    model_calls: Counter = field(default_factory=Counter)
    # The messages of each model request, newest last.
    conversations: list[list[ModelMessage]] = field(default_factory=list)
    # Outputs the model gives when asked for the final answer, in turn.
    outputs: list[dict] = field(default_factory=list)
    # Errors the model's provider answers with before answering, in turn.
    model_errors: list[Exception] = field(default_factory=list)

    def reset(self) -> None:
        self.effects.clear()
        self.calls.clear()
        self.arguments.clear()
        self.model_calls.clear()
        self.conversations.clear()
        self.outputs.clear()
        self.model_errors.clear()


WORLD = World()


class Refunded(BaseModel):
    refund_id: str
    amount: int


def _tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def refund_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look the order up, refund the amount the prompt asks for, answer with the refund."""
    WORLD.model_calls[len(messages)] += 1
    WORLD.conversations.append(list(messages))
    if WORLD.model_errors:
        raise WORLD.model_errors.pop(0)
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    prompt = messages[0].parts[-1].content
    amount = int(prompt.rsplit(" ", 1)[-1])
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "o-1"}, "c0")])
    returns = _tool_returns(messages)
    if turn == 1:
        order = returns[-1].content
        return ModelResponse(
            parts=[
                ToolCallPart(
                    "issue_refund",
                    {
                        "payment_intent": order["payment_intent"],
                        "amount": amount,
                        "currency": order["currency"],
                    },
                    "c1",
                )
            ]
        )
    if WORLD.outputs:
        # A scripted final answer, valid or not.
        return ModelResponse(
            parts=[ToolCallPart(info.output_tools[0].name, WORLD.outputs.pop(0), f"c{turn}")]
        )
    last = returns[-1]
    if isinstance(last.content, dict) and "id" in last.content:
        output = {"refund_id": last.content["id"], "amount": last.content["amount"]}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, output, f"c{turn}")])
    return ModelResponse(parts=[TextPart(f"no refund: {last.content}")])


class CancelRefundArgs(BaseModel):
    refund_id: str


@tool(
    name="cancel_refund",
    args=CancelRefundArgs,
    description="Cancel a refund that was issued.",
    recovery=idempotent(timedelta(hours=24)),
)
def cancel_refund(request: dict, call: CallInfo) -> dict:
    """The undo of issue_refund: a Holdfast tool, since a compensation runs after the loop."""
    WORLD.calls["cancel_refund"] += 1
    for refund in WORLD.effects.values():
        if refund["id"] == request["refund_id"]:
            refund["cancelled"] = True
    return {"id": request["refund_id"], "cancelled": True}


UNDO_REFUND = Undo(tool="cancel_refund", args=lambda args, result: {"refund_id": result["id"]})


def make_refunder(
    instructions: str = "You refund orders.",
    *,
    approve_always: bool = False,
    undo: Undo | None = None,
):
    refunder = Agent(
        FunctionModel(refund_model),
        instructions=instructions,
        output_type=[Refunded, str],
        retries={"output": 1},
    )

    @refunder.tool_plain
    @durable(recovery=READ_ONLY, provider="shop")
    def lookup_order(order_id: str) -> dict:
        """Read an order."""
        WORLD.calls["lookup_order"] += 1
        return dict(ORDER, id=order_id)

    def find_refund(request: dict, call) -> LookupResult:
        found = WORLD.effects.get(call.effect_key)
        if found is None:
            return LookupResult("absent", conclusive=True)
        return LookupResult("found", found, conclusive=True)

    @refunder.tool_plain(requires_approval=approve_always)
    @durable(recovery=idempotent(timedelta(hours=24), lookup=True), lookup=find_refund, undo=undo)
    async def issue_refund(payment_intent: str, amount: int, currency: str) -> dict:
        """Refund part of a payment, in minor units."""
        call = current_call()
        WORLD.calls["issue_refund"] += 1
        WORLD.arguments.append(
            ("issue_refund", {"payment_intent": payment_intent, "amount": amount})
        )
        if call.effect_key in WORLD.effects:  # the provider's idempotency
            return WORLD.effects[call.effect_key]
        refund = {
            "id": f"re_{len(WORLD.effects) + 1}",
            "amount": amount,
            "currency": currency,
            "effect_key": call.effect_key,
        }
        WORLD.effects[call.effect_key] = refund
        return refund

    return refunder


def _prompt(input: dict[str, Any]) -> str:
    return f"Refund order o-1 by {input['amount']}"


def refunder_agent(*, name: str = "pai_refunder", **options) -> Any:
    undoes = [cancel_refund] if options.get("undo") else []
    return holdfast_agent(
        make_refunder(**options), name=name, version=1, prompt=_prompt, tools=undoes
    )


# The deployment's registry (HOLDFAST["AGENT_MODULES"]) reads an approval's resource
# through the tool its run's agent declares: the approval tests name this module there.
AGENTS = [refunder_agent(approve_always=True)]
