"""The refund agent's Pydantic AI twin as the crash tests run it in real worker processes.

Loaded by the workers through ``HOLDFAST_AGENT_MODULES`` in place of
``support.pydantic_agent``: the same agent under the same name, whose model also
writes each request it answers into the crash ledger (``HOLDFAST_CRASH_LEDGER``), so
the tests count model calls in the model's own records, never in the engine's.
"""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentruns.integrations.pydantic_ai import holdfast_agent
from support.pydantic_agent import OPTIONS, refund_agent, refund_conversation
from tests.crash.agents import _record_execution, connect_ledger

MODEL = "model"


def counted_conversation(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The twin's model, which writes down each request (by order and position) it answers."""
    answer = refund_conversation(messages, info)
    prompt = messages[0].parts[-1].content
    conn = connect_ledger()
    try:
        _record_execution(
            conn, MODEL, {"prompt": prompt, "position": len(messages)}, None, "answered"
        )
    finally:
        conn.close()
    return answer


AGENTS = [
    holdfast_agent(
        refund_agent,
        name="refund_support_pydantic_ai",
        model=FunctionModel(counted_conversation),
        **OPTIONS,
    )
]
