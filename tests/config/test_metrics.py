"""/metrics: what the engine measured in this process and what the database says now."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agentruns.models import Run, SweeperLease
from agentruns.runtime import faults
from agentruns.sweeper import SWEEPER_LEASE_NAME
from approvals.models import Approval
from config.management.commands.metricsserver import metrics_app
from config.metrics import PrometheusSink
from tests.agentruns.runtime import agents
from tests.harness import Harness

# The aggregates are read from a thread of their own, which sees only what is committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider():
    agents.PROVIDER.reset()
    yield agents.PROVIDER
    agents.PROVIDER.reset()


def _scrape(client, **headers) -> dict[tuple[str, frozenset], float]:
    answer = client.get("/metrics", **headers)
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain; version=")
    return _samples(answer.content.decode())


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples, metric: str, /, **labels) -> float:
    return samples.get((metric, frozenset(labels.items())), 0.0)


def test_a_run_through_the_engine_shows_in_the_metrics(client, tenant, provider):
    """Counters and histograms are the host's totals (every process, every earlier test
    run in this var dir), so the test reads what one run added."""
    harness = Harness(tenant)
    before = _scrape(client)
    run = harness.start("flow")
    assert harness.advance(run) == "finished:completed"
    model_run = harness.start("support", {"scenario": "refund"})
    assert harness.drive(model_run).status == "completed"
    after = _scrape(client)

    def added(metric, /, **labels):
        return _value(after, metric, **labels) - _value(before, metric, **labels)

    lookup = {"agent": "flow", "kind": "tool", "name": "lookup_order"}
    charge = {"agent": "flow", "kind": "tool", "name": "charge"}
    chat = {"agent": "support", "kind": "model", "name": "chat"}
    assert added("holdfast_steps_started_total", **lookup) == 1
    assert added("holdfast_steps_started_total", **charge) == 1
    assert added("holdfast_steps_started_total", **chat) == 3
    assert added("holdfast_step_results_total", **lookup, status="succeeded") == 1
    assert added("holdfast_step_results_total", **charge, status="succeeded") == 1
    assert added("holdfast_step_results_total", **chat, status="succeeded") == 3
    assert added("holdfast_step_duration_seconds_count", **charge) == 1
    assert added("holdfast_step_duration_seconds_sum", **charge) > 0
    assert added("holdfast_provider_call_duration_seconds_count", **charge, outcome="ok") == 1
    assert added("holdfast_provider_call_duration_seconds_count", **chat, outcome="ok") == 3
    assert _value(after, "holdfast_runs", state="completed", agent="flow") == 1
    assert _value(after, "holdfast_runs", state="completed", agent="support") == 1
    assert _value(after, "holdfast_database_up") == 1


def test_failed_and_retried_attempts_are_counted_apart(client, tenant, provider):
    harness = Harness(tenant)
    before = _scrape(client)
    provider.script["lookup_order"] = ["fail_before", "refuse"]
    run = harness.start("flow")
    assert harness.drive(run).status == "completed"
    after = _scrape(client)
    lookup = {"agent": "flow", "kind": "tool", "name": "lookup_order"}
    for status, count in (("retrying", 1), ("failed", 1), ("succeeded", 0)):
        assert (
            _value(after, "holdfast_step_results_total", **lookup, status=status)
            - _value(before, "holdfast_step_results_total", **lookup, status=status)
        ) == count
    assert (
        _value(after, "holdfast_provider_call_duration_seconds_count", **lookup, outcome="error")
        - _value(before, "holdfast_provider_call_duration_seconds_count", **lookup, outcome="error")
    ) == 2


def test_lease_takeovers_and_crash_loop_blocks_are_counted(client, tenant, provider):
    harness = Harness(tenant)
    before = _scrape(client)
    # A worker dies after its first step; the next claim takes the expired lease over.
    run = harness.start("flow")
    harness.interrupt(run, faults.AFTER_RESULT_RECORDED, "lookup_order")
    assert harness.advance(run) == "finished:completed"
    # A run whose worker dies before every step ends blocked as a crash loop.
    engine = harness.build()

    def crash():
        raise SystemExit("worker killed")

    engine.faults.arm(faults.BEFORE_STEP_RECORDED, crash, step_name="lookup_order", times=100)
    looping = harness.start("flow", request_id="looping")
    limit = harness.settings.max_claims_without_progress
    for _ in range(limit):
        with pytest.raises(SystemExit):
            harness.advance(looping, engine)
        harness.expire_lease(looping)
    assert harness.advance(looping, engine) == "blocked"
    after = _scrape(client)
    takeovers = _value(after, "holdfast_lease_takeovers_total", agent="flow") - _value(
        before, "holdfast_lease_takeovers_total", agent="flow"
    )
    assert takeovers == 1 + limit
    assert _value(after, "holdfast_runs_blocked", reason="crash_loop") == 1
    assert _value(after, "holdfast_runs_blocked", reason="other") == 0
    assert _value(after, "holdfast_runs", state="blocked", agent="flow") == 1


def test_what_waits_for_a_person_and_for_a_worker(client, tenant, provider):
    harness = Harness(tenant)
    # An email whose provider answer was lost: unknown, a case for a person.
    provider.script["send_email"] = ["fail_after"]
    mail = harness.start("mailer")
    assert harness.drive(mail).status == "effect_unknown_reconciliation_required"
    queued = harness.start("flow", request_id="queued")
    Run.objects.filter(pk=queued.id).update(updated_at=timezone.now() - timedelta(seconds=40))
    Approval.objects.create(
        tenant=tenant,
        run=mail,
        step_id="0000.tool.send_email",
        tool="send_email",
        args={},
        args_hash="h",
        effect_key="k",
        resource="mail",
        resource_fingerprint="f",
        preview="an email",
        created_at=timezone.now() - timedelta(seconds=300),
        expires_at=timezone.now() + timedelta(hours=1),
    )
    SweeperLease.objects.create(
        name=SWEEPER_LEASE_NAME, owner="s", expires_at=timezone.now() - timedelta(seconds=3)
    )
    samples = _scrape(client)
    assert _value(samples, "holdfast_effects_awaiting_reconciliation") == 1
    assert _value(samples, "holdfast_approvals_pending") == 1
    assert 299 <= _value(samples, "holdfast_approval_oldest_pending_age_seconds") < 330
    assert _value(samples, "holdfast_queue_depth", reason="queued") == 1
    assert 39 <= _value(samples, "holdfast_queue_lag_seconds", reason="queued") < 70
    assert _value(samples, "holdfast_queue_depth", reason="due") == 0
    assert _value(samples, "holdfast_sweeper_lease_held") == 0
    # Renewed with a 5 s lease, expired 3 s ago: renewed about 8 s ago.
    assert 7.5 <= _value(samples, "holdfast_sweeper_lag_seconds") < 20


def test_a_token_is_asked_for_when_one_is_set(client, settings):
    settings.HOLDFAST_METRICS_TOKEN = "s3cret"
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_metrics_need_no_login_and_no_token_by_default(client):
    assert client.get("/metrics").status_code == 200


def test_the_metrics_server_serves_this_hosts_processes(settings):
    settings.HOLDFAST_METRICS_TOKEN = "s3cret"
    PrometheusSink().step_started("metricsserver", "tool", "probe")
    app = metrics_app(database=False)
    answers = []

    def start_response(status, headers):
        answers.append(status)

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""}
    app(dict(environ), start_response)
    body = app({**environ, "HTTP_AUTHORIZATION": "Bearer s3cret"}, start_response)
    assert answers == ["401 Unauthorized", "200 OK"]
    text = b"".join(body).decode()
    # The processes' measurements, not the database's aggregates.
    samples = _samples(text)
    assert (
        _value(
            samples,
            "holdfast_steps_started_total",
            agent="metricsserver",
            kind="tool",
            name="probe",
        )
        >= 1
    )
    assert "holdfast_runs" not in _families(text)


def _families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}
