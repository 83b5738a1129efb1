"""Durable timers and large results."""

from __future__ import annotations

import pytest
from django.core.files.storage import default_storage

from agentruns.models import Blob, Run, Step
from agentruns.runtime import READ_ONLY, Registry, agent, tool
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)


def test_sleep_suspends_the_run_without_holding_a_worker(harness, provider):
    run = harness.start("flow", {"sleep": 3600})
    assert harness.advance(run) == "suspended:sleeping"
    run.refresh_from_db()
    assert run.status == "sleeping"
    assert run.lease_owner == "" and run.lease_expires_at is None
    assert (run.next_attempt_at - run.updated_at).total_seconds() == pytest.approx(3600, abs=1)
    wait = Step.objects.get(run=run, kind="wait")
    assert wait.status == "running"
    # Woken early (a duplicate wake-up), it stays asleep.
    assert harness.advance(run) == "not_claimed"
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    wait.refresh_from_db()
    assert wait.status == "succeeded"


@tool(name="big_report", args=agents.OrderArgs, description="A large read.", recovery=READ_ONLY)
def big_report(request, call):
    return {"rows": ["x" * 1000] * 400}


@agent(name="reporter", version=1, tools=[big_report])
def reporter(ctx, input):
    first = ctx.tool("big_report", {"order_id": "o-1"})
    ctx.sleep(60)
    return {"rows": len(first.value["rows"])}


def test_results_over_the_inline_limit_go_to_blob_storage(harness, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    harness.registry = Registry([reporter])
    harness.engine = harness.build()
    run = harness.start("reporter")
    harness.advance(run)
    step = Step.objects.get(run=run, name="big_report")
    assert step.result is None
    blob = Blob.objects.get(pk=step.result_blob_id)
    assert blob.size > 256 * 1024
    assert step.result_hash == blob.sha256
    assert default_storage.exists(blob.storage_name)
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    assert Run.objects.get(pk=run.id).output == {"rows": 400}
