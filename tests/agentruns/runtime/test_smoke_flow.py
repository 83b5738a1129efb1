import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_flow_runs_to_completion(harness, provider):
    run = harness.start("flow", {"order_id": "o-1", "amount": 700})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.status == "completed"
    assert run.output["charged"] is True
    assert provider.calls["lookup_order"] == 1
    assert provider.effect_count() == 1
    steps = list(run.steps.order_by("seq"))
    assert [s.step_id for s in steps] == ["0000.tool.lookup_order", "0001.tool.charge"]
    assert steps[1].effect_key and steps[1].provider_reference == "ch_1"


def test_a_support_run_uses_the_model_loop(harness, provider):
    run = harness.start("support", {"scenario": "refund"})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.output["reply"] == "Charged 3.00 EUR."
    assert run.model_calls_used == 3
