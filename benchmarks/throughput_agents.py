"""The agent of ``benchmarks/throughput.py``: a run of no-op read-only tool steps.

The tool answers at once, so what a step costs is the engine's, the worker's and
the database's work around it, nothing of the tool's own.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agentruns.runtime import READ_ONLY, Budget, CallInfo, RunContext, agent, tool

AGENT_NAME = "throughput_noop"


class NoopArgs(BaseModel):
    index: int = Field(ge=0)


@tool(name="noop", args=NoopArgs, description="Return its argument.", recovery=READ_ONLY)
def noop(request: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    return {"index": request["index"]}


class NoopInput(BaseModel):
    steps: int = Field(default=10, ge=1, le=100)
    n: int = 0


@agent(
    name=AGENT_NAME,
    version=1,
    tools=[noop],
    input_model=NoopInput,
    budget=Budget(max_steps=200),
)
def throughput_noop(ctx: RunContext, input: dict[str, Any]) -> dict[str, Any]:
    for index in range(input["steps"]):
        result = ctx.tool("noop", {"index": index})
        if not result.ok:
            return {"ok": False, "steps": index, "error": result.error}
    return {"ok": True, "steps": input["steps"]}


AGENTS = [throughput_noop]
