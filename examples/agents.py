"""A small agent that ships with Holdfast so `make run` has something to show.

It is written the way a user's own agent would be: tools declared with their
recovery, orchestration through the run context only.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from agentruns.llm.scripted import ScriptedCall, ScriptedReply
from agentruns.runtime import READ_ONLY, Budget, ModelSpec, ToolRefused, agent, run_tool_loop, tool

ORDERS = {
    "A-1001": {"order_id": "A-1001", "status": "shipped", "carrier": "DHL", "eta_days": 2},
    "A-1002": {"order_id": "A-1002", "status": "processing", "carrier": None, "eta_days": 5},
}


class OrderStatusArgs(BaseModel):
    order_id: str = Field(min_length=1, max_length=40, description="The order number")


@tool(
    name="order_status",
    args=OrderStatusArgs,
    description="Look up where an order is.",
    recovery=READ_ONLY,
)
def order_status(request: dict, call) -> dict:
    order = ORDERS.get(request["order_id"])
    if order is None:
        raise ToolRefused(f"no order {request['order_id']}", error_class="not_found")
    return order


class StatusInput(BaseModel):
    order_id: str = "A-1001"
    follow_up_seconds: float = Field(default=5, ge=0, le=86_400)
    scenario: str = "status"


def _status_scenario(request):
    turn = sum(1 for m in request.messages if m.get("role") == "assistant")
    order_id = request.messages[1]["content"].rsplit(" ", 1)[-1]
    if turn == 0:
        return ScriptedReply(tool_calls=[ScriptedCall("order_status", {"order_id": order_id})])
    last = request.messages[-1]["content"]
    return ScriptedReply(content=f"Here is what I found: {last}")


@agent(
    name="order_status",
    version=1,
    tools=[order_status],
    input_model=StatusInput,
    model=ModelSpec(provider="scripted", model="scripted-1", prompt_version="status-1"),
    scenarios={"status": _status_scenario},
    budget=Budget(max_steps=20, max_model_calls=6),
)
def order_status_agent(ctx, input):
    """Answer a status question, wait a little, and check again (a durable timer)."""
    messages = [
        {"role": "system", "content": "You answer questions about orders."},
        {"role": "user", "content": f"Where is order {input['order_id']}"},
    ]
    first, _ = run_tool_loop(ctx, messages, tools=["order_status"])
    if input["follow_up_seconds"]:
        ctx.sleep(input["follow_up_seconds"])
    again = ctx.tool("order_status", {"order_id": input["order_id"]})
    return {"answer": first.content, "checked_again": again.for_model()}


AGENTS = [order_status_agent]
