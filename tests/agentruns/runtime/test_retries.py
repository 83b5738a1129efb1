"""Retries of steps that did not take effect: backoff with jitter, Retry-After, deadlines."""

from __future__ import annotations

import random

import pytest

from agentruns.models import Run, Step
from agentruns.runtime import RetryPolicy

pytestmark = pytest.mark.django_db(transaction=True)


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    policy = RetryPolicy(initial_delay=1.0, multiplier=2.0, max_delay=10.0)
    rng = random.Random(7)
    for attempt, step in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (9, 10.0)]:
        delays = [policy.delay(attempt, rng=rng) for _ in range(200)]
        assert min(delays) >= step / 2
        assert max(delays) <= step
        assert len(set(delays)) > 100  # jittered, not lockstep


def test_retry_after_is_a_floor():
    policy = RetryPolicy(initial_delay=1.0)
    assert policy.delay(1, retry_after=30.0) == 30.0
    assert policy.delay(1, retry_after=0.1) >= 0.5


def test_a_failing_read_only_step_waits_for_retry_with_next_attempt_at(harness, provider):
    provider.script["lookup_order"] = ["fail_before"]
    run = harness.start("flow")
    assert harness.advance(run) == "suspended:waiting_for_retry"
    run.refresh_from_db()
    assert run.status == "waiting_for_retry"
    assert run.next_attempt_at is not None
    assert run.lease_owner == ""
    step = Step.objects.get(run=run, name="lookup_order")
    assert step.status == "planned"
    assert step.attempts == 1
    assert step.last_error_class == "connection"
    assert step.retry_deadline is not None
    # Not due yet: a duplicate wake-up finds nothing to do.
    assert harness.advance(run) == "not_claimed"
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    step.refresh_from_db()
    assert step.status == "succeeded" and step.attempts == 2
    assert provider.calls["lookup_order"] == 2


def test_a_read_only_step_honours_retry_after(harness, provider):
    provider.script["lookup_order"] = ["busy"]
    run = harness.start("flow")
    harness.advance(run)
    run.refresh_from_db()
    step = Step.objects.get(run=run, name="lookup_order")
    assert step.provider_retry_after == 3.0
    assert (run.next_attempt_at - run.updated_at).total_seconds() >= 2.9


def test_non_retryable_errors_fail_at_once_with_the_reason(harness, provider):
    provider.script["lookup_order"] = ["auth"]
    run = harness.start("flow")
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    step = Step.objects.get(run=run, name="lookup_order")
    assert step.status == "failed"
    assert step.attempts == 1
    assert step.last_error_class == "authentication"
    assert run.output == {"refused": "bad credentials"}


def test_a_step_gives_up_after_its_attempts_and_the_agent_sees_why(harness, provider):
    provider.script["lookup_order"] = ["fail_before"] * 10
    run = harness.drive(harness.start("flow"))
    step = Step.objects.get(run=run, name="lookup_order")
    assert step.status == "failed"
    assert step.attempts == RetryPolicy().max_attempts
    assert run.output == {"refused": "ConnectionError: shop unreachable"}


def test_a_step_gives_up_at_its_deadline(harness, provider):
    provider.script["lookup_order"] = ["fail_before"] * 3
    run = harness.start("flow")
    harness.advance(run)
    Step.objects.filter(run=run).update(retry_deadline=Run.objects.get(pk=run.id).created_at)
    harness.make_due(run)
    harness.advance(run)
    step = Step.objects.get(run=run, name="lookup_order")
    assert step.status == "failed"
    assert step.attempts == 2


def test_a_busy_effect_that_never_got_through_fails_without_effect_at_its_deadline(
    harness, provider
):
    provider.script["charge"] = ["busy"] * 3
    run = harness.start("flow")
    harness.advance(run)
    Step.objects.filter(run=run, name="charge").update(
        retry_deadline=Run.objects.get(pk=run.id).created_at
    )
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    step = Step.objects.get(run=run, name="charge")
    assert step.status == "failed"
    assert "gave up after 1 busy answer(s)" in step.last_error
    assert provider.effect_count() == 0
