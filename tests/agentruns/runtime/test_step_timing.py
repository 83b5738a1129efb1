"""A step's recorded start and end span the call it made, by the database's clock."""

from __future__ import annotations

import time

import pytest
from pydantic import BaseModel

from agentruns.models import Step
from agentruns.runtime import READ_ONLY, agent, tool
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)

CALL_SECONDS = 0.3


class Nothing(BaseModel):
    pass


@tool(name="slow_read", args=Nothing, description="Takes a while.", recovery=READ_ONLY)
def slow_read(request: dict, call) -> dict:
    time.sleep(CALL_SECONDS)
    return {"read": True}


@agent(name="slow", version=1, tools=[slow_read])
def slow(ctx, input):
    return ctx.tool("slow_read", {}).value


def test_a_read_only_step_records_how_long_its_call_took(harness):
    harness.registry = agents.registry(slow)
    harness.engine = harness.build()
    run = harness.start("slow")
    assert harness.advance(run) == "finished:completed"
    step = Step.objects.get(run=run, name="slow_read")
    took = (step.completed_at - step.started_at).total_seconds()
    assert CALL_SECONDS * 0.9 <= took < CALL_SECONDS + 5
