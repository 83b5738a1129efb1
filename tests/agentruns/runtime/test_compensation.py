"""Compensation: undo steps run newest first, durably, with their own effect keys."""

from __future__ import annotations

import pytest

from agentruns.models import Step
from agentruns.runtime import Registry, agent, faults
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)


@agent(name="double_charge", version=1, tools=agents.TOOLS)
def double_charge(ctx, input):
    ctx.tool("charge", {"order_id": "o-1", "amount": 100})
    ctx.tool("send_email", {"to": "a@example.com", "body": "charged"})
    ctx.tool("charge", {"order_id": "o-2", "amount": 200})
    raise RuntimeError("the agent could not finish")


@pytest.fixture
def compensating(harness):
    harness.registry = Registry([double_charge, *harness.registry._agents.values()])
    harness.engine = harness.build()
    return harness


def test_a_failed_run_undoes_its_effects_newest_first(compensating, provider):
    run = compensating.start("double_charge")
    assert compensating.advance(run) == "finished:failed_after_effect"
    run.refresh_from_db()
    undo = list(Step.objects.filter(run=run, kind="compensation").order_by("seq"))
    charges = list(Step.objects.filter(run=run, name="charge").order_by("seq"))
    assert [u.compensates_id for u in undo] == [charges[1].pk, charges[0].pk]
    assert [u.input for u in undo] == [
        {"charge_id": charges[1].provider_reference},
        {"charge_id": charges[0].provider_reference},
    ]
    assert all(u.effect_key and u.effect_key not in {c.effect_key for c in charges} for u in undo)
    # The email has no undo: something remains true, so not "compensated".
    assert run.status == "failed_after_effect"
    assert run.outcome_detail.startswith("agent code raised RuntimeError")


def test_compensation_resumes_after_a_crash_without_undoing_twice(compensating, provider):
    run = compensating.start("double_charge")
    compensating.interrupt(run, faults.AFTER_RESULT_RECORDED, "refund_charge")
    run.refresh_from_db()
    assert run.status == "partially_completed_compensation_running"
    assert compensating.advance(run) == "finished:failed_after_effect"
    assert provider.calls["refund_charge"] == 2
    assert Step.objects.filter(run=run, kind="compensation").count() == 2


def test_a_run_whose_every_effect_was_undone_is_compensated(harness, provider):
    run = harness.start("flow", {"fail_after_charge": True})
    assert harness.advance(run) == "finished:compensated"
    assert provider.calls["refund_charge"] == 1


def test_an_undo_refused_for_good_leaves_the_run_failed_after_effect(harness, provider):
    provider.script["refund_charge"] = ["refuse"]
    run = harness.start("flow", {"fail_after_charge": True})
    assert harness.advance(run) == "finished:failed_after_effect"
    undo = Step.objects.get(run=run, kind="compensation")
    assert undo.status == "failed"


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_an_undo_settled_by_a_person_lets_the_compensation_go_on(harness, provider, tenant):
    from datetime import timedelta

    from reconciliation.models import ReconciliationCase
    from reconciliation.services import case_record_lookup, case_resolve, newest_lookup

    run = harness.start("flow", {"fail_after_charge": True})
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "refund_charge")
    harness.backdate_sends(run, timedelta(hours=25).total_seconds())  # past its key window
    assert harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    undo = Step.objects.get(run=run, kind="compensation")
    case = ReconciliationCase.objects.get(step_id=undo.pk)
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("rita")
    case_record_lookup(
        case=case,
        user=user,
        outcome="succeeded",
        provider_reference="rf_1",
        note="the refund is in the provider's list",
    )
    case.refresh_from_db()
    case_resolve(
        case=case,
        user=user,
        resolution="happened",
        seen_version=case.version,
        seen_lookup_id=newest_lookup(case).pk,
    )
    run.refresh_from_db()
    assert run.status == "partially_completed_compensation_running"
    assert harness.advance(run) == "finished:compensated"
    assert provider.calls["refund_charge"] == 1
