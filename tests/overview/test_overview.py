"""The overview page: each chart's numbers from rows made here, per tenant and range."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from agentruns.models import Run, RunStatus, Step
from approvals.models import Approval, ApprovalStatus
from overview import selectors
from reconciliation.models import CaseStatus, ReconciliationCase

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 30, 15, 40, tzinfo=UTC)


def make_run(tenant, *, at, status=RunStatus.COMPLETED, agent="order_support", cost=0, ended=None):
    return Run.objects.create(
        tenant=tenant,
        agent_name=agent,
        agent_version=1,
        request_id=f"req-{uuid.uuid4()}",
        input_hash="0" * 64,
        status=status,
        cost_micros=cost,
        created_at=at,
        updated_at=at,
        finished_at=ended,
    )


def make_step(run, seq, *, name="issue_refund", kind="tool", seconds=None):
    started = run.created_at + timedelta(seconds=1)
    return Step.objects.create(
        run=run,
        seq=seq,
        step_id=f"{seq:04d}.{kind}.{name}",
        kind=kind,
        name=name,
        status="succeeded" if seconds is not None else "running",
        started_at=started,
        completed_at=started + timedelta(seconds=seconds) if seconds is not None else None,
    )


def make_approval(tenant, run, *, at, waited=None):
    return Approval.objects.create(
        tenant=tenant,
        run=run,
        step_id=f"0002.tool.issue_refund.{uuid.uuid4().hex[:6]}",
        tool="issue_refund",
        args={},
        args_hash="h",
        effect_key=f"hf_{uuid.uuid4().hex}",
        resource="ch_1",
        resource_fingerprint="f",
        preview="refund 5.00 EUR",
        status=ApprovalStatus.APPROVED if waited is not None else ApprovalStatus.PENDING,
        created_at=at,
        expires_at=at + timedelta(days=1),
        decided_at=at + timedelta(seconds=waited) if waited is not None else None,
    )


def make_case(tenant, *, opened, resolved=None):
    run = make_run(tenant, at=opened - timedelta(minutes=5), status=RunStatus.EFFECT_UNKNOWN)
    step = make_step(run, 1, seconds=1)
    return ReconciliationCase.objects.create(
        tenant=tenant,
        run=run,
        step=step,
        step_id_label=step.step_id,
        tool="issue_refund",
        effect_key=f"hf_{uuid.uuid4().hex}",
        status=CaseStatus.RESOLVED if resolved else CaseStatus.OPEN,
        opened_at=opened,
        resolved_at=resolved,
    )


def hour(h: int, minute: int = 10) -> datetime:
    return NOW.replace(hour=h, minute=minute)


@pytest.fixture
def viewer(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    return client


# --- the numbers ---------------------------------------------------------------------


def test_runs_started_are_counted_per_hour_stacked_by_how_they_ended(tenant):
    make_run(tenant, at=hour(14), status=RunStatus.COMPLETED)
    make_run(tenant, at=hour(14, 50), status=RunStatus.COMPLETED)
    make_run(tenant, at=hour(14, 20), status=RunStatus.FAILED_AFTER_EFFECT)
    make_run(tenant, at=hour(14, 30), status=RunStatus.CANCELLED_NO_EFFECT)
    make_run(tenant, at=hour(15), status=RunStatus.WAITING_FOR_APPROVAL)
    make_run(tenant, at=hour(15, 5), status=RunStatus.COMPENSATED, agent="refund_agent")
    make_run(tenant, at=NOW - timedelta(hours=30))  # before the range
    window = selectors.window_for("24h", NOW)
    counts = selectors.run_counts(tenant, window)
    i14 = window.buckets.index(hour(14, 0))
    assert counts.started == {
        (i14, "order_support", "completed"): 2,
        (i14, "order_support", "failed"): 1,
        (i14, "order_support", "cancelled"): 1,
        (i14 + 1, "order_support", "not_ended"): 1,
        (i14 + 1, "refund_agent", "compensated"): 1,
    }
    assert counts.total == 6
    assert counts.agents == ["order_support", "refund_agent"]
    assert len(window.buckets) == 24 and window.buckets[-1] == hour(15, 0)


def test_runs_are_counted_as_ended_in_the_hour_they_ended(tenant):
    make_run(tenant, at=NOW - timedelta(days=3), ended=hour(13, 5))
    make_run(tenant, at=hour(12), ended=hour(13, 55))
    make_run(tenant, at=hour(12), ended=hour(14, 1))
    make_run(tenant, at=hour(12), status=RunStatus.RUNNING)
    window = selectors.window_for("24h", NOW)
    counts = selectors.run_counts(tenant, window)
    i13 = window.buckets.index(hour(13, 0))
    assert counts.ended == {i13: 2, i13 + 1: 1}


def test_cost_is_summed_per_agent_per_day(tenant):
    today = NOW.replace(hour=1)
    make_run(tenant, at=today, cost=1_250_000)
    make_run(tenant, at=today, cost=250_000)
    make_run(tenant, at=today - timedelta(days=1), cost=40_000)
    make_run(tenant, at=today, cost=3_000, agent="refund_agent")
    window = selectors.window_for("7d", NOW)
    counts = selectors.run_counts(tenant, window)
    assert counts.cost == {
        (6, "order_support"): 1_500_000,
        (5, "order_support"): 40_000,
        (6, "refund_agent"): 3_000,
    }
    assert selectors.usd(1_500_000) == "1.50 USD"
    assert selectors.usd(3_000) == "0.0030 USD"
    assert selectors.usd(1_234_567_890) == "1,234.57 USD"


def test_days_before_today_are_kept_a_minute_and_today_is_always_read(tenant):
    window = selectors.window_for("7d", NOW)
    earlier = make_run(tenant, at=NOW - timedelta(days=2), status=RunStatus.SLEEPING)
    with time_machine.travel(NOW, tick=False) as clock:
        assert selectors.run_counts(tenant, window).started == {
            (4, "order_support", "not_ended"): 1
        }
        make_run(tenant, at=NOW - timedelta(minutes=1))
        Run.objects.filter(pk=earlier.pk).update(status=RunStatus.COMPLETED)
        assert selectors.run_counts(tenant, window).started == {
            (4, "order_support", "not_ended"): 1,
            (6, "order_support", "completed"): 1,
        }
        clock.shift(selectors.CLOSED_DAYS_SECONDS + 1)
        assert selectors.run_counts(tenant, window).started == {
            (4, "order_support", "completed"): 1,
            (6, "order_support", "completed"): 1,
        }


def test_approval_wait_percentiles_are_interpolated_as_postgresql_does(tenant):
    run = make_run(tenant, at=hour(9), status=RunStatus.WAITING_FOR_APPROVAL)
    for waited in (10, 20, 30, 40, 100):
        make_approval(tenant, run, at=hour(10), waited=waited)
    make_approval(tenant, run, at=NOW - timedelta(days=9), waited=5000)  # before the range
    make_approval(tenant, run, at=NOW - timedelta(minutes=25))  # still waiting
    waits = selectors.approval_waits(tenant, selectors.window_for("7d", NOW), NOW)
    assert waits.decided.count == 5
    assert waits.decided.p50 == pytest.approx(30)
    # percentile_cont(0.95): 40 + (100 - 40) * 0.8
    assert waits.decided.p95 == pytest.approx(88)
    assert waits.decided.longest == pytest.approx(100)
    assert waits.waiting == 1
    assert waits.oldest_waiting == pytest.approx(25 * 60)


def test_open_cases_are_aged_from_now(tenant):
    for minutes in (10, 20, 30, 60):
        make_case(tenant, opened=NOW - timedelta(minutes=minutes))
    make_case(tenant, opened=NOW - timedelta(days=2), resolved=NOW - timedelta(days=1))
    ages = selectors.open_case_ages(tenant, NOW)
    assert ages.count == 4
    assert ages.p50 == pytest.approx(25 * 60)
    assert ages.p95 == pytest.approx((30 + 30 * 0.85) * 60)
    assert ages.longest == pytest.approx(60 * 60)


def test_recoveries_and_reconciliations_are_counted_per_day(tenant):
    # A run a worker took over after its holder stopped carries the recovered mark.
    Run.objects.filter(pk=make_run(tenant, at=NOW - timedelta(days=2)).pk).update(recovered=True)
    Run.objects.filter(pk=make_run(tenant, at=NOW - timedelta(days=2)).pk).update(recovered=True)
    make_run(tenant, at=NOW - timedelta(days=1))  # not recovered
    Run.objects.filter(pk=make_run(tenant, at=NOW - timedelta(days=8)).pk).update(recovered=True)
    make_case(tenant, opened=NOW - timedelta(days=3), resolved=NOW - timedelta(days=1))
    make_case(tenant, opened=NOW - timedelta(days=3), resolved=NOW - timedelta(hours=1))
    make_case(tenant, opened=NOW - timedelta(hours=2))  # open: not a reconciliation
    window = selectors.window_for("7d", NOW)
    found = selectors.repairs(tenant, window)
    assert found.recoveries == {4: 2}
    assert found.reconciliations == {5: 1, 6: 1}


def test_the_slowest_tools_come_first_with_their_percentiles(tenant):
    for n, seconds in enumerate([1, 2, 3, 4, 5]):
        run = make_run(tenant, at=hour(9, n))
        make_step(run, 1, name="issue_refund", seconds=seconds)
        make_step(run, 2, name="lookup_order", seconds=0.5)
        make_step(run, 3, name="plan", kind="model", seconds=60)  # a model call, not a tool
        make_step(run, 4, name="send_email")  # still running: no duration yet
    times = selectors.slowest_tools(tenant, selectors.window_for("24h", NOW))
    names = [name for name, _ in times.tools]
    assert names == ["issue_refund", "lookup_order"]
    refund = times.tools[0][1]
    assert (refund.count, refund.p50, refund.longest) == (5, pytest.approx(3), pytest.approx(5))
    assert refund.p95 == pytest.approx(4.8)
    assert times.runs_read == 5 and not times.capped


def test_the_slowest_tools_read_the_newest_runs_when_the_range_has_many(tenant, monkeypatch):
    monkeypatch.setattr(selectors, "TOOL_RUNS", 2)
    old = make_run(tenant, at=hour(8))
    make_step(old, 1, name="create_ticket", seconds=90)
    for n in range(2):
        make_step(make_run(tenant, at=hour(9, n)), 1, name="issue_refund", seconds=1)
    times = selectors.slowest_tools(tenant, selectors.window_for("24h", NOW))
    assert [name for name, _ in times.tools] == ["issue_refund"]
    assert times.capped and times.runs_read == 2


def test_another_tenants_rows_are_never_counted(tenant, other_tenant):
    theirs = make_run(other_tenant, at=hour(14), cost=5_000_000, ended=hour(14, 30))
    make_step(theirs, 1, seconds=9)
    make_approval(other_tenant, theirs, at=hour(10), waited=50)
    make_case(other_tenant, opened=NOW - timedelta(hours=1))
    make_case(other_tenant, opened=NOW - timedelta(days=1), resolved=NOW - timedelta(hours=1))
    window = selectors.window_for("7d", NOW)
    counts = selectors.run_counts(tenant, window)
    assert (counts.started, counts.cost, counts.ended) == ({}, {}, {})
    assert selectors.approval_waits(tenant, window, NOW).decided.count == 0
    assert selectors.open_case_ages(tenant, NOW).count == 0
    assert selectors.repairs(tenant, window).total == 0
    assert selectors.slowest_tools(tenant, window).tools == []


def test_ranges_set_their_buckets():
    assert [len(selectors.window_for(key, NOW).buckets) for key in ("24h", "7d", "30d", "90d")] == [
        24,
        7,
        30,
        90,
    ]
    week = selectors.window_for("7d", NOW)
    assert week.start == datetime(2026, 11, 24, tzinfo=UTC)
    assert week.end == datetime(2026, 12, 1, tzinfo=UTC)
    assert selectors.window_for("nonsense", NOW).range.key == selectors.DEFAULT_RANGE


# --- the page ------------------------------------------------------------------------


def test_the_page_draws_each_chart_with_its_numbers(viewer, tenant):
    run = make_run(tenant, at=hour(14), cost=1_500_000, ended=hour(14, 20))
    make_run(tenant, at=hour(14, 30), status=RunStatus.FAILED_BEFORE_EFFECT, ended=hour(14, 31))
    make_step(run, 1, seconds=2)
    make_approval(tenant, run, at=hour(14), waited=90)
    make_case(tenant, opened=NOW - timedelta(minutes=30))
    with time_machine.travel(NOW, tick=False):
        page = viewer.get("/overview/?range=24h").content.decode()
    assert '<strong class="started-total">3</strong>' in page  # the case's run too
    assert '<strong class="ended-total">2</strong>' in page
    assert "<svg" in page and 'class="bar tone-0"' in page and 'class="bar tone-1"' in page
    assert "<title>30 Nov 14:00 to 15:00 UTC: 1 run started, completed</title>" in page
    assert "1.50 USD" in page
    assert '<strong class="open-cases">1</strong>' in page
    assert "approval wait (decided)" in page and "1 min 30 s" in page
    assert "issue_refund" in page and "2 s" in page
    assert "<summary>Numbers per hour</summary>" in page
    assert "No runs in this range" not in page


def test_switching_range_changes_the_buckets(viewer, tenant):
    make_run(tenant, at=NOW - timedelta(days=3))
    with time_machine.travel(NOW, tick=False):
        day = viewer.get("/overview/?range=24h").content.decode()
        week = viewer.get("/overview/?range=7d").content.decode()
    assert "No runs in this range." in day
    assert '<strong class="started-total">1</strong>' in week
    assert "<summary>Numbers per day</summary>" in week
    assert 'aria-current="page">last 7 days' in week


def test_an_empty_range_says_so(viewer):
    page = viewer.get("/overview/").content.decode()
    assert "No runs in this range." in page
    assert "No tool call completed in this range." in page
    assert "No recovery and no reconciliation in this range." in page


def test_agent_names_are_escaped_in_the_charts_and_tables(viewer, tenant):
    name = '<script>alert("x")</script>'
    make_run(tenant, at=hour(14), agent=name, cost=10)
    with time_machine.travel(NOW, tick=False):
        page = viewer.get("/overview/?range=24h").content.decode()
    assert name not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_htmx_gets_the_charts_alone_to_replace_them(viewer, tenant):
    make_run(tenant, at=timezone_now() - timedelta(minutes=5))
    fragment = viewer.get("/overview/?range=24h", HTTP_HX_REQUEST="true").content.decode()
    assert fragment.lstrip().startswith('<div id="overview-charts"')
    assert 'hx-trigger="every 30s"' in fragment
    assert "<html" not in fragment


def test_the_page_needs_a_login_and_takes_no_post(client, viewer):
    assert viewer.post("/overview/").status_code == 405
    client.logout()
    response = client.get("/overview/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_time_of_the_reading_is_in_the_operators_zone_with_utc_on_hover(
    client, tenant, make_operator
):
    client.force_login(make_operator(tenant, "viewer", time_zone="Europe/Paris"))
    with time_machine.travel(NOW, tick=False):
        page = client.get("/overview/").content.decode()
    assert 'title="2026-11-30 15:40:00 UTC">16:40:00 CET</time>' in page


def timezone_now() -> datetime:
    from django.utils import timezone

    return timezone.now()
