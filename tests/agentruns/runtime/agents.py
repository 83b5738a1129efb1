"""Agents and tools used by the engine tests.

Every tool counts its executions in ``PROVIDER`` — a stand-in for the outside
world's own records that the engine never writes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal  # noqa: F401  (used by tests)
from typing import Any

from pydantic import BaseModel, Field

from agentruns.llm.scripted import ScriptedCall, ScriptedReply
from agentruns.runtime import (
    READ_ONLY,
    Budget,
    LookupResult,
    ModelSpec,
    ProviderBusy,
    Registry,
    ToolRefused,
    Undo,
    agent,
    idempotent,
    lookup,
    run_tool_loop,
    tool,
)
from agentruns.runtime.tools import MANUAL


@dataclass
class FakeProvider:
    """The outside world: what it executed, keyed by effect key, and scripted failures."""

    calls: Counter = field(default_factory=Counter)
    effects: dict[str, dict] = field(default_factory=dict)
    # name -> list of behaviours for successive calls: "ok", "refuse", "busy",
    # "fail_before" (5xx, not executed), "fail_after" (executed, then 5xx/lost reply)
    script: dict[str, list[str]] = field(default_factory=dict)
    lookups: Counter = field(default_factory=Counter)
    lookup_script: list[str] = field(default_factory=list)
    hooks: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.calls.clear()
        self.effects.clear()
        self.script.clear()
        self.lookups.clear()
        self.lookup_script.clear()
        self.hooks.clear()

    def behaviour(self, name: str) -> str:
        queue = self.script.get(name)
        return queue.pop(0) if queue else "ok"

    def execute(self, name: str, key: str, request: dict) -> dict:
        self.calls[name] += 1
        hook = self.hooks.get(name)
        if hook:
            hook()
        mode = self.behaviour(name)
        if mode == "refuse":
            raise ToolRefused("amount exceeds the remaining balance", error_class="invalid_request")
        if mode == "auth":
            raise ToolRefused("bad api key", error_class="authentication")
        if mode == "busy":
            raise ProviderBusy("rate limited", retry_after=2.0)
        if mode == "fail_before":
            raise ConnectionError("connection reset before the request was read")
        if key in self.effects:  # the provider's idempotency: replay the saved answer
            return self.effects[key]
        answer = {"id": f"ch_{len(self.effects) + 1}", "amount": request.get("amount"), "key": key}
        self.effects[key] = answer
        if mode == "fail_after":
            raise TimeoutError("read timed out after the provider executed")
        return answer

    def effect_count(self, name: str | None = None) -> int:
        return len(self.effects)


PROVIDER = FakeProvider()


class OrderArgs(BaseModel):
    order_id: str = Field(min_length=1)


class ChargeArgs(BaseModel):
    order_id: str
    amount: int = Field(gt=0)


@tool(name="lookup_order", args=OrderArgs, description="Read an order.", recovery=READ_ONLY)
def lookup_order(request: dict, call) -> dict:
    PROVIDER.calls["lookup_order"] += 1
    mode = PROVIDER.behaviour("lookup_order")
    if mode == "fail_before":
        raise ConnectionError("shop unreachable")
    if mode == "busy":
        raise ProviderBusy("slow down", retry_after=3.0)
    if mode == "refuse":
        raise ToolRefused(f"no order {request['order_id']}", error_class="not_found")
    if mode == "auth":
        raise ToolRefused("bad credentials", error_class="authentication")
    return {"order_id": request["order_id"], "amount": 1200, "currency": "eur"}


def _find_charge(request: dict, call) -> LookupResult:
    PROVIDER.lookups["charge"] += 1
    mode = PROVIDER.lookup_script.pop(0) if PROVIDER.lookup_script else "normal"
    if mode == "unreachable":
        raise ConnectionError("payments API unreachable")
    if call.effect_key in PROVIDER.effects:
        return LookupResult("found", PROVIDER.effects[call.effect_key], conclusive=True)
    return LookupResult("absent", conclusive=True, detail="no charge carries this key")


@tool(
    name="charge",
    args=ChargeArgs,
    description="Charge an order.",
    recovery=idempotent(timedelta(hours=24), lookup=True),
    lookup=_find_charge,
    undo=Undo(tool="refund_charge", args=lambda args, result: {"charge_id": result["id"]}),
)
def charge(request: dict, call) -> dict:
    return PROVIDER.execute("charge", call.effect_key, request)


@tool(
    name="charge_lookup_only",
    args=ChargeArgs,
    description="A charge whose provider has no idempotency keys, only a lookup.",
    recovery=lookup(),
    lookup=_find_charge,
)
def charge_lookup_only(request: dict, call) -> dict:
    return PROVIDER.execute("charge", call.effect_key, request)


class RefundChargeArgs(BaseModel):
    charge_id: str


@tool(
    name="refund_charge",
    args=RefundChargeArgs,
    description="Undo a charge.",
    recovery=idempotent(timedelta(hours=24)),
)
def refund_charge(request: dict, call) -> dict:
    PROVIDER.calls["refund_charge"] += 1
    mode = PROVIDER.behaviour("refund_charge")
    if mode == "refuse":
        raise ToolRefused("already refunded")
    return {"id": f"re_{request['charge_id']}"}


class EmailArgs(BaseModel):
    to: str
    body: str


@tool(name="send_email", args=EmailArgs, description="Send an email.", recovery=MANUAL)
def send_email(request: dict, call) -> dict:
    return PROVIDER.execute("send_email", call.effect_key, request)


TOOLS = [lookup_order, charge, charge_lookup_only, refund_charge, send_email]


class FlowInput(BaseModel):
    order_id: str = "o-1"
    amount: int = 500
    fail_after_charge: bool = False
    tool: str = "charge"
    sleep: float = 0


@agent(name="flow", version=1, tools=TOOLS, input_model=FlowInput, budget=Budget(max_steps=20))
def flow(ctx, input):
    """lookup_order → charge → (optional failure) — no model, fully deterministic."""
    order = ctx.tool("lookup_order", {"order_id": input["order_id"]})
    if not order.ok:
        return {"refused": order.error}
    if input["sleep"]:
        ctx.sleep(input["sleep"])
    charged = ctx.tool(input["tool"], {"order_id": input["order_id"], "amount": input["amount"]})
    if input["fail_after_charge"]:
        raise RuntimeError("the agent gave up after charging")
    return {"charged": charged.ok, "charge": charged.value, "error": charged.error}


@agent(name="mailer", version=1, tools=TOOLS)
def mailer(ctx, input):
    sent = ctx.tool("send_email", {"to": "a@example.com", "body": "hello"})
    return {"sent": sent.ok}


SUPPORT_SCENARIO = [
    ScriptedReply(tool_calls=[ScriptedCall("lookup_order", {"order_id": "o-1"})]),
    ScriptedReply(tool_calls=[ScriptedCall("charge", {"order_id": "o-1", "amount": 300})]),
    ScriptedReply(content="Charged 3.00 EUR."),
]
BAD_ARGS_SCENARIO = [
    ScriptedReply(tool_calls=[ScriptedCall("charge", '{"order_id": "o-1", "amount": -5')]),
    ScriptedReply(tool_calls=[ScriptedCall("charge", {"order_id": "o-1", "amount": -5})]),
    ScriptedReply(tool_calls=[ScriptedCall("charge", {"order_id": "o-1", "amount": 5})]),
    ScriptedReply(content="done"),
]
LOOPING_SCENARIO = lambda request: ScriptedReply(  # noqa: E731
    tool_calls=[ScriptedCall("lookup_order", {"order_id": "o-1"})],
    input_tokens=1000,
    output_tokens=1000,
)


@agent(
    name="support",
    version=1,
    tools=TOOLS,
    model=ModelSpec(provider="scripted", model="scripted-1"),
    scenarios={
        "refund": SUPPORT_SCENARIO,
        "bad_args": BAD_ARGS_SCENARIO,
        "looping": LOOPING_SCENARIO,
    },
    budget=Budget(max_steps=100, max_model_calls=8, max_tokens=10_000),
)
def support(ctx, input):
    messages = [
        {"role": "system", "content": "You help customers."},
        {"role": "user", "content": input.get("message", "refund my order")},
    ]
    final, conversation = run_tool_loop(ctx, messages, max_turns=input.get("max_turns", 10))
    return {"reply": final.content, "turns": len(conversation)}


@agent(name="values", version=1)
def values(ctx, input):
    return {"now": ctx.now().isoformat(), "random": ctx.random()}


def registry(*extra) -> Registry:
    return Registry([flow, mailer, support, values, *extra])
