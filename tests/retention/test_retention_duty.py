"""The sweeper's retention duty: a pass every interval, nothing in between, and the
sweeper's report says what it did."""

from __future__ import annotations

import pytest

from agentruns.sweeper import SweepPass, SweepReport
from config.wiring import SWEEPER_DUTIES
from retention import services

pytestmark = pytest.mark.django_db


def _sweep_pass() -> SweepPass:
    return SweepPass(owner="test", push=lambda run_id: None, limit=500, report=SweepReport())


@pytest.fixture(autouse=True)
def _due(monkeypatch):
    monkeypatch.setattr(services, "_last_pass", 0.0)


def test_the_sweeper_performs_it(settings):
    assert services.retention_duty in [duty.perform for duty in SWEEPER_DUTIES]


def test_it_archives_and_reports_then_waits_for_its_interval(tenant, make_run, monkeypatch):
    make_run(tenant)
    monkeypatch.setattr(SweepPass, "keep_lease", lambda self: True)
    first = _sweep_pass()
    services.retention_duty(first)
    assert first.report.retention == {"redacted": 0, "archived": 1, "failed": 0}

    make_run(tenant)
    second = _sweep_pass()
    services.retention_duty(second)  # within the interval: nothing read, nothing done
    assert second.report.retention == {}


def test_with_nothing_to_do_it_reads_the_tenants_and_one_index(
    tenant, make_run, django_assert_num_queries
):
    make_run(tenant, ended_days_ago=1)
    # The tenants' settings, and the archive candidates (no tenant redacts earlier).
    with django_assert_num_queries(2):
        services.retention_duty(_sweep_pass())
