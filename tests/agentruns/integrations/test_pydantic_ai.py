"""A Pydantic AI agent on Holdfast: steps, replay, approvals, divergence, output validation."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError, ModelRetry
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import ExternalToolset
from pydantic_ai.usage import RequestUsage

from agentruns.integrations.pydantic_ai import (
    PydanticAIAgentError,
    current_call,
    durable,
    holdfast_agent,
)
from agentruns.models import Run, Step
from agentruns.runtime import READ_ONLY, Registry, faults
from agentruns.services import get_registry
from approvals.models import Approval, ApprovalAuthority
from approvals.services import approval_decide
from tests.agentruns.integrations import agents
from tests.agentruns.integrations.agents import WORLD

# A decision wakes the run through the task queue (its own database on SQLite).
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture(autouse=True)
def world():
    WORLD.reset()
    yield WORLD
    WORLD.reset()


def _with(harness, *registered):
    harness.registry = Registry(list(registered))
    harness.engine = harness.build()
    return harness


@pytest.fixture
def refunder(harness):
    return _with(harness, agents.refunder_agent())


@pytest.fixture
def deployed(settings):
    """This module's agents among the deployment's own, through which deciding reads an
    approval's resource (the registry is read once per process, so it is read again)."""
    settings.HOLDFAST = {
        **settings.HOLDFAST,
        "AGENT_MODULES": [*settings.HOLDFAST["AGENT_MODULES"], agents.__name__],
    }
    get_registry.cache_clear()
    yield
    get_registry.cache_clear()


@pytest.fixture
def approver(tenant, make_operator, deployed):
    user = make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.update_or_create(
        tenant=tenant,
        group=Group.objects.get(name="approver"),
        currency="eur",
        defaults={"max_amount": None},
    )
    return user


def _decide(run, user, decision, note=""):
    approval = Approval.objects.get(run_id=run.id, status="pending")
    return approval_decide(
        approval=approval,
        user=user,
        decision=decision,
        seen_args_hash=approval.args_hash,
        note=note,
    )


def test_a_run_completes_with_each_model_request_and_tool_call_a_step(refunder):
    run = refunder.start("pai_refunder", {"amount": 700})
    assert refunder.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.output == {"refund_id": "re_1", "amount": 700}
    steps = list(run.steps.order_by("seq"))
    assert [s.step_id for s in steps] == [
        "0000.model.chat",
        "0001.tool.lookup_order",
        "0002.model.chat",
        "0003.tool.issue_refund",
        "0004.model.chat",
    ]
    assert all(s.status == "succeeded" for s in steps)
    model = steps[0]
    assert model.model_provider == "function"
    assert model.model_id == "function:refund_model:"
    assert model.input_tokens > 0 and model.output_tokens > 0
    refund = steps[3]
    assert refund.request == {"payment_intent": "pi_1", "amount": 700, "currency": "eur"}
    assert refund.effect_key.startswith("hf_")
    # The tool read its effect key from current_call() and gave it to the provider.
    assert WORLD.effects[refund.effect_key]["effect_key"] == refund.effect_key
    assert refund.provider_reference == "re_1"
    assert refund.recovery["describe"] == "idempotent(86400s)+lookup"
    assert run.model_calls_used == 3


@pytest.mark.parametrize(
    ("point", "step_name"),
    [
        (faults.BEFORE_STEP_RECORDED, "chat"),
        (faults.AFTER_CALL_RETURNED, "chat"),
        (faults.AFTER_RESULT_RECORDED, "chat"),
        (faults.BEFORE_STEP_RECORDED, "issue_refund"),
        (faults.AFTER_STEP_RUNNING, "issue_refund"),
        (faults.AFTER_CALL_RETURNED, "issue_refund"),
        (faults.AFTER_RESULT_RECORDED, "issue_refund"),
    ],
)
def test_a_worker_killed_at_any_point_leaves_one_refund_and_asks_no_recorded_step_again(
    refunder, point, step_name
):
    run = refunder.start("pai_refunder", {"amount": 700})
    refunder.interrupt(run, point, step_name)
    asked_before = dict(WORLD.model_calls)
    recorded_models = Step.objects.filter(run=run, kind="model", status="succeeded").count()
    assert refunder.drive(run).status == "completed"
    assert len(WORLD.effects) == 1
    (refund,) = WORLD.effects.values()
    assert refund["amount"] == 700
    assert Step.objects.get(run=run, name="issue_refund").provider_reference == refund["id"]
    # Each recorded model step was answered from the record: the model was asked again
    # only at the position whose answer was lost with the worker.
    positions = sorted(WORLD.model_calls)
    for recorded_position in positions[:recorded_models]:
        assert WORLD.model_calls[recorded_position] == asked_before[recorded_position]
    assert all(count <= 2 for count in WORLD.model_calls.values())
    assert sum(WORLD.model_calls.values()) <= 4
    assert Run.objects.get(pk=run.id).model_calls_used == 3


def test_replay_hands_back_recorded_model_responses_and_tool_results(refunder, approver):
    """A run suspended mid-conversation replays from the top without asking anyone again."""
    harness = _with(refunder, agents.refunder_agent(approve_always=True))
    run = harness.start("pai_refunder", {"amount": 700})
    assert harness.advance(run) == "suspended:waiting_for_approval"
    assert dict(WORLD.model_calls) == {1: 1, 3: 1}
    assert WORLD.calls == {"lookup_order": 1}
    _decide(run, approver, "approve")
    assert harness.drive(run).status == "completed"
    assert dict(WORLD.model_calls) == {1: 1, 3: 1, 5: 1}
    assert WORLD.calls == {"lookup_order": 1, "issue_refund": 1}


def test_a_tool_requiring_approval_waits_and_runs_with_exactly_the_approved_arguments(
    harness, approver
):
    harness = _with(harness, agents.refunder_agent(approve_always=True))
    run = harness.start("pai_refunder", {"amount": 6000})
    assert harness.advance(run) == "suspended:waiting_for_approval"
    step = Step.objects.get(run=run, name="issue_refund")
    assert step.status == "planned" and step.first_sent_at is None
    approval = Approval.objects.get(run_id=run.id, status="pending")
    assert approval.args == {"payment_intent": "pi_1", "amount": 6000, "currency": "eur"}
    assert approval.effect_key == step.effect_key
    assert approval.preview.startswith("issue_refund(")
    assert WORLD.calls["issue_refund"] == 0
    _decide(run, approver, "approve")
    run = harness.drive(run)
    assert run.status == "completed"
    assert WORLD.arguments == [("issue_refund", {"payment_intent": "pi_1", "amount": 6000})]
    assert Approval.objects.get(pk=approval.pk).status == "consumed"
    assert run.output == {"refund_id": "re_1", "amount": 6000}


def test_a_rejected_approval_reaches_the_model_as_the_tools_refusal(harness, approver):
    harness = _with(harness, agents.refunder_agent(approve_always=True))
    run = harness.start("pai_refunder", {"amount": 6000})
    assert harness.advance(run) == "suspended:waiting_for_approval"
    _decide(run, approver, "reject", note="the customer already has a voucher")
    run = harness.drive(run)
    assert run.status == "completed"
    assert WORLD.calls["issue_refund"] == 0 and WORLD.effects == {}
    step = Step.objects.get(run=run, name="issue_refund")
    assert step.status == "failed" and step.last_error_class == "approval_rejected"
    told = WORLD.conversations[-1][-1]
    assert isinstance(told, ModelRequest)
    (returned,) = [p for p in told.parts if isinstance(p, ToolReturnPart)]
    assert returned.tool_name == "issue_refund"
    assert "approval_rejected" in str(returned.content)
    assert "the customer already has a voucher" in str(returned.content)
    assert run.output.startswith("no refund: ")


def test_a_changed_agent_at_a_recorded_position_blocks_the_run_showing_both_sides(
    harness, approver
):
    harness = _with(harness, agents.refunder_agent(approve_always=True))
    run = harness.start("pai_refunder", {"amount": 6000})
    assert harness.advance(run) == "suspended:waiting_for_approval"
    recorded = Step.objects.get(run=run, seq=0)
    # The same agent version deployed again with other instructions.
    harness = _with(
        harness,
        agents.refunder_agent(instructions="You refund orders, politely.", approve_always=True),
    )
    _decide(run, approver, "approve")
    assert harness.drive(run).status == "blocked"
    run.refresh_from_db()
    assert run.outcome_detail == (
        "replay diverged at step 0: recorded 0000.model.chat, "
        "code now asks for 0000.model.chat with other input"
    )
    sides = run.events.get(type="blocked").payload["detail"]
    assert sides["recorded"]["step_id"] == "0000.model.chat"
    assert sides["recorded"]["input_hash"] == recorded.input_hash
    assert sides["requested"]["kind"] == "model"
    assert sides["requested"]["input_hash"] != recorded.input_hash
    # Both conversations, side by side: the instructions are what changed.
    instructions = [
        side["input"]["request"]["messages"][0]["instructions"]
        for side in (sides["recorded"], sides["requested"])
    ]
    assert instructions == ["You refund orders.", "You refund orders, politely."]
    assert WORLD.calls["issue_refund"] == 0
    assert sum(WORLD.model_calls.values()) == 2


def test_a_structured_output_that_fails_validation_is_recorded_as_such(refunder):
    WORLD.outputs.extend([{"refund_id": "re_1"}, {"refund_id": "re_1", "amount": "lots"}])
    run = refunder.start("pai_refunder", {"amount": 700})
    run = refunder.drive(run)
    assert run.status == "failed_after_effect"
    ended = run.events.get(type="finished")
    assert "output never passed validation" in str(ended.payload)
    model_steps = list(run.steps.filter(kind="model").order_by("seq"))
    assert len(model_steps) == 4
    assert model_steps[2].validation == []
    (refused,) = model_steps[3].validation
    assert refused["valid"] is False
    assert refused["name"].startswith("final_result")
    assert "amount: Field required" in refused["error"]
    # What the model was told is what was recorded.
    retry = WORLD.conversations[-1][-1]
    assert [p.outcome for p in retry.parts if isinstance(p, ToolReturnPart)] == ["retried"]


def test_a_rate_limited_model_request_waits_and_is_asked_again(refunder):
    WORLD.model_errors.append(ModelHTTPError(429, "refund_model", headers={"Retry-After": "7"}))
    run = refunder.start("pai_refunder", {"amount": 700})
    assert refunder.advance(run) == "suspended:waiting_for_retry"
    step = Step.objects.get(run=run, seq=0)
    assert step.status == "planned"
    assert step.last_error_class == "rate_limited"
    assert step.provider_retry_after == 7
    assert refunder.drive(run).status == "completed"
    step.refresh_from_db()
    assert step.status == "succeeded" and step.attempts == 2
    assert WORLD.model_calls[1] == 2


def test_a_model_request_refused_for_its_key_fails_the_run_without_asking_again(refunder):
    WORLD.model_errors.append(ModelHTTPError(401, "refund_model", body={"error": "bad key"}))
    run = refunder.drive(refunder.start("pai_refunder", {"amount": 700}))
    assert run.status == "failed_before_effect"
    step = Step.objects.get(run=run, seq=0)
    assert step.status == "failed" and step.last_error_class == "authentication"
    assert WORLD.model_calls[1] == 1 and WORLD.calls == {}


def test_a_failed_run_undoes_its_refund_with_the_holdfast_tool_its_declaration_names(harness):
    harness = _with(harness, agents.refunder_agent(undo=agents.UNDO_REFUND))
    WORLD.outputs.extend([{"refund_id": "re_1"}, {"refund_id": "re_1", "amount": "lots"}])
    run = harness.drive(harness.start("pai_refunder", {"amount": 700}))
    assert run.status == "compensated"
    (refund,) = WORLD.effects.values()
    assert refund["cancelled"] is True
    undo = Step.objects.get(run=run, kind="compensation")
    assert undo.name == "cancel_refund" and undo.status == "succeeded"
    assert undo.input == {"refund_id": "re_1"}
    assert WORLD.calls["cancel_refund"] == 1


def test_a_known_models_cost_comes_from_pydantic_ais_prices_and_the_page_shows_it(
    harness, client, tenant, make_operator
):
    priced = holdfast_agent(
        agents.make_refunder(),
        name="pai_refunder",
        version=1,
        model=FunctionModel(agents.refund_model, model_name="gpt-4o"),
        prompt=lambda input: f"Refund order o-1 by {input['amount']}",
    )
    harness = _with(harness, priced)
    run = harness.drive(harness.start("pai_refunder", {"amount": 700}))
    assert run.status == "completed"
    steps = list(run.steps.filter(kind="model").order_by("seq"))
    for step in steps:
        usage = RequestUsage(input_tokens=step.input_tokens, output_tokens=step.output_tokens)
        price = ModelResponse(parts=[], model_name="gpt-4o", usage=usage).cost().total_price
        assert step.cost_micros == int(Decimal(price) * 1_000_000) > 0
        assert (step.model_provider, step.model_id) == ("function", "gpt-4o")
    assert run.cost_micros == sum(step.cost_micros for step in steps)
    client.force_login(make_operator(tenant, "viewer"))
    page = client.get(f"/runs/{run.id}/").content.decode()
    first = steps[0]
    assert (
        f"function gpt-4o · prompt pydantic-ai:pai_refunder:1 · tools "
        f"{first.tool_schema_version[:12]} · {first.input_tokens}+{first.output_tokens} "
        f"tokens · {first.cost_micros} µ$"
    ) in page


def test_a_tool_without_a_recovery_declaration_is_refused_at_registration():
    undeclared = Agent(FunctionModel(agents.refund_model))

    @undeclared.tool_plain
    def charge(amount: int) -> dict:
        return {"charged": amount}

    with pytest.raises(PydanticAIAgentError, match=r"tool 'charge' has no recovery declaration"):
        holdfast_agent(undeclared, name="undeclared", version=1)


def test_tools_holdfast_cannot_declare_at_registration_are_refused():
    deferred = Agent(FunctionModel(agents.refund_model), toolsets=[ExternalToolset([])])
    with pytest.raises(PydanticAIAgentError, match="is not a function toolset"):
        holdfast_agent(deferred, name="deferred", version=1)


def test_an_agent_without_a_model_is_refused_at_registration():
    with pytest.raises(PydanticAIAgentError, match="names no model"):
        holdfast_agent(Agent(), name="modelless", version=1)


def test_the_call_is_known_only_inside_a_tool_call_holdfast_runs():
    with pytest.raises(RuntimeError, match="only known inside a tool call"):
        current_call()


def test_a_tool_asking_the_model_to_retry_is_recorded_as_its_refusal(harness):
    def finder_model(messages, info):
        returns = [
            part
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if not returns:
            return ModelResponse(parts=[ToolCallPart("find_order", {"order_id": "1001"}, "a")])
        if returns[-1].outcome == "retried":
            return ModelResponse(parts=[ToolCallPart("find_order", {"order_id": "o-1"}, "b")])
        return ModelResponse(parts=[TextPart(f"found {returns[-1].content['id']}")])

    finder = Agent(FunctionModel(finder_model))

    @finder.tool_plain
    @durable(recovery=READ_ONLY)
    def find_order(order_id: str) -> dict:
        """Find an order by its id."""
        if not order_id.startswith("o-"):
            raise ModelRetry(f"no order {order_id}: order ids look like o-1")
        return {"id": order_id}

    harness = _with(harness, holdfast_agent(finder, name="finder", version=1))
    run = harness.drive(harness.start("finder", {"prompt": "Find order 1001"}))
    assert run.status == "completed" and run.output == "found o-1"
    steps = list(run.steps.order_by("seq"))
    assert [(s.step_id, s.status) for s in steps] == [
        ("0000.model.chat", "succeeded"),
        ("0001.tool.find_order", "failed"),
        ("0002.model.chat", "succeeded"),
        ("0003.tool.find_order", "succeeded"),
        ("0004.model.chat", "succeeded"),
    ]
    assert steps[1].last_error_class == "model_retry"
    assert steps[1].last_error == "no order 1001: order ids look like o-1"
    assert steps[2].validation == [
        {
            "name": "find_order (previous answer)",
            "valid": False,
            "error": "no order 1001: order ids look like o-1",
        }
    ]


def test_a_streamed_model_request_is_refused_saying_why():
    # A streamed response arrives in pieces and is never recorded as one step, so the
    # durable model refuses to stream rather than stream what replay cannot give back.
    import asyncio

    from agentruns.integrations.pydantic_ai import _HoldfastModel

    model = _HoldfastModel(FunctionModel(lambda messages, info: None), bridge=None)

    async def stream():
        async with model.request_stream([], None, None):
            pass

    with pytest.raises(NotImplementedError, match="a streamed response is not recorded"):
        asyncio.run(stream())
