"""Model steps: evidence recorded, bad tool arguments fed back, retries that reuse answers."""

from __future__ import annotations

import json

import pytest

from agentruns.llm import ModelRateLimited, ModelReply, ModelRequestRejected, RawToolCall
from agentruns.models import Step
from agentruns.runtime import Registry

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_model_step_records_its_evidence(harness):
    run = harness.start("support", {"scenario": "refund"})
    harness.advance(run)
    step = Step.objects.filter(run=run, kind="model").order_by("seq").first()
    assert step.step_id == "0000.model.chat"
    assert step.model_provider == "scripted"
    assert step.model_id == "scripted-1"
    assert step.prompt_version == "1"
    assert step.tool_schema_version == run.agent_snapshot["tool_schema_version"]
    assert step.input_tokens == 100 and step.output_tokens == 20
    # pricing: 0.15 USD and 0.60 USD per million tokens -> micro-dollars per token
    assert step.cost_micros == int(100 * 0.15 + 20 * 0.60)
    assert step.validation == [
        {"id": "call_0_0", "name": "lookup_order", "valid": True, "error": None}
    ]
    assert step.input_hash and step.input["messages"][0]["role"] == "system"
    run.refresh_from_db()
    assert run.tokens_used == 3 * 120
    assert run.cost_micros == 3 * step.cost_micros


def test_invalid_tool_arguments_are_fed_back_to_the_model_not_raised(harness, provider):
    run = harness.start("support", {"scenario": "bad_args"})
    assert harness.advance(run) == "finished:completed"
    steps = list(Step.objects.filter(run=run, kind="model").order_by("seq"))
    first, second, third = (s.validation[0] for s in steps[:3])
    assert not first["valid"] and first["error"].startswith("arguments are not valid JSON")
    assert not second["valid"] and second["error"] == (
        "invalid arguments: amount: Input should be greater than 0"
    )
    assert third["valid"]
    # The model saw each rejection as a tool message.
    feedback = [m for m in steps[1].input["messages"] if m["role"] == "tool"]
    assert json.loads(feedback[0]["content"]) == {
        "ok": False,
        "error": first["error"],
        "error_class": "invalid_arguments",
    }
    # Only the valid call reached the provider.
    assert provider.calls["charge"] == 1
    assert provider.effect_count() == 1


class FlakyModel:
    name = "flaky"

    def __init__(self, failures):
        self.failures = list(failures)
        self.calls = 0

    def complete(self, request, *, timeout):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return ModelReply(
            content="fine",
            tool_calls=[],
            finish_reason="stop",
            input_tokens=5,
            output_tokens=5,
            model="flaky-2",
        )


def _with_model(harness, model):
    return harness.build(providers=lambda spec, agent: model)


def test_a_rate_limited_model_call_waits_retry_after_and_then_succeeds(harness):
    model = FlakyModel([ModelRateLimited("slow down", retry_after=12.0)])
    engine = _with_model(harness, model)
    run = harness.start("support", {"scenario": "refund"})
    assert harness.advance(run, engine) == "suspended:waiting_for_retry"
    run.refresh_from_db()
    step = Step.objects.get(run=run, kind="model")
    assert step.status == "planned"
    assert step.provider_retry_after == 12.0
    assert (run.next_attempt_at - run.updated_at).total_seconds() >= 11.9
    harness.make_due(run)
    assert harness.advance(run, engine) == "finished:completed"
    step.refresh_from_db()
    assert step.attempts == 2 and step.model_id == "flaky-2"
    assert model.calls == 2


def test_a_rejected_model_request_fails_the_run_at_once(harness):
    model = FlakyModel([ModelRequestRejected("invalid api key", error_class="authentication")])
    run = harness.start("support", {"scenario": "refund"})
    assert harness.advance(run, _with_model(harness, model)) == "finished:failed_before_effect"
    run.refresh_from_db()
    assert "invalid api key" in run.outcome_detail
    assert Step.objects.get(run=run, kind="model").status == "failed"
    assert model.calls == 1


def test_a_model_that_keeps_failing_ends_the_run_after_its_attempts(harness):
    from agentruns.llm import ModelUnavailable

    model = FlakyModel([ModelUnavailable("502")] * 10)
    engine = _with_model(harness, model)
    run = harness.start("support", {"scenario": "refund"})
    for _ in range(10):
        outcome = harness.advance(run, engine)
        if outcome.startswith("finished"):
            break
        harness.make_due(run)
    assert outcome == "finished:failed_before_effect"
    assert model.calls == 5


def test_a_model_call_for_an_undeclared_tool_is_a_validation_failure(harness):
    class Hallucinating:
        name = "h"

        def __init__(self):
            self.turn = 0

        def complete(self, request, *, timeout):
            self.turn += 1
            calls = [RawToolCall("c1", "delete_everything", "{}")] if self.turn == 1 else []
            return ModelReply("ok", calls, "stop", 1, 1, "h-1")

    run = harness.start("support", {"scenario": "refund"})
    assert harness.advance(run, _with_model(harness, Hallucinating())) == "finished:completed"
    step = Step.objects.filter(run=run, kind="model").order_by("seq").first()
    assert step.validation[0]["valid"] is False
    assert step.validation[0]["error"].startswith("unknown tool 'delete_everything'")


def test_a_scripted_run_must_name_a_scenario_the_agent_has(harness):
    from agentruns.runtime import InvalidRunInput

    with pytest.raises(InvalidRunInput, match="has no scripted scenario 'nope'"):
        harness.start("support", {"scenario": "nope"})


def test_a_model_that_cannot_be_configured_fails_the_run_with_the_reason(harness):
    from agentruns.llm.providers import ModelConfigurationError

    def unconfigured(spec, agent):
        raise ModelConfigurationError("OPENAI_API_KEY is not set")

    run = harness.start("support", {"scenario": "refund"})
    engine = harness.build(providers=unconfigured)
    assert harness.advance(run, engine) == "finished:failed_before_effect"
    run.refresh_from_db()
    assert run.outcome_detail == "model configuration: OPENAI_API_KEY is not set"


def test_registries_can_hold_the_support_agent_alone():
    from tests.agentruns.runtime import agents

    assert Registry([agents.support]).names() == ["support"]
