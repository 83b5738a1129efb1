"""Ended runs of the refund agent as the engine records them, built row by row: a lookup
of the order (personal data), a model step that read it, a refund sent with an effect
key, a large result kept as a blob, and the event log."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns.models import Run, RunEvent, RunStatus, Step, StepKind, StepStatus
from agentruns.runtime.effects import content_hash
from agentruns.runtime.results import result_columns
from agentruns.runtime.writes import Json
from agentruns.services import get_registry

CUSTOMER = {"name": "Ann Example", "email": "ann@example.com", "address": "1 High Street"}


@pytest.fixture(autouse=True)
def _storage(settings, tmp_path):
    # Archives and blobs go to this test's own directory.
    settings.MEDIA_ROOT = tmp_path / "media"


def _result(value, *, inline_limit: int = 256 * 1024) -> dict:
    columns = result_columns(value, inline_limit=inline_limit)
    if isinstance(columns.get("result"), Json):
        columns["result"] = value
    return columns


@pytest.fixture
def make_run(db):
    def make(
        tenant,
        *,
        ended_days_ago: float | None = 40,
        status: str = RunStatus.COMPLETED,
        large_result: bool = False,
    ) -> Run:
        now = timezone.now()
        started = now - timedelta(days=(ended_days_ago or 0) + 1)
        agent = get_registry().latest("refund_support")
        run = Run.objects.create(
            tenant=tenant,
            agent_name=agent.name,
            agent_version=agent.version,
            agent_snapshot=agent.snapshot(),
            input={"order_id": "ord_1", "amount": 2500},
            input_hash="0" * 64,
            request_id=f"req-{uuid.uuid4()}",
            status=status,
            output={"reply": "Refunded 25.00 EUR"},
            created_at=started,
            finished_at=now - timedelta(days=ended_days_ago)
            if ended_days_ago is not None
            else None,
        )
        order = {"id": "ord_1", "customer": CUSTOMER, "amount": 2500}
        if large_result:
            order["notes"] = "x" * 2048
        Step.objects.create(
            run=run,
            seq=1,
            step_id="0001.tool.lookup_order",
            kind=StepKind.TOOL,
            name="lookup_order",
            status=StepStatus.SUCCEEDED,
            input={"order_id": "ord_1"},
            input_hash=content_hash({"order_id": "ord_1"}),
            request={"order_id": "ord_1"},
            attempts=1,
            created_at=started,
            completed_at=started,
            **_result(order, inline_limit=1024 if large_result else 256 * 1024),
        )
        conversation = {"messages": [{"role": "tool", "content": CUSTOMER["email"]}]}
        Step.objects.create(
            run=run,
            seq=2,
            step_id="0002.model.chat",
            kind=StepKind.MODEL,
            name="chat",
            status=StepStatus.SUCCEEDED,
            input=conversation,
            input_hash=content_hash(conversation),
            model_id="scripted-1",
            attempts=1,
            created_at=started,
            **_result({"content": f"Refund for {CUSTOMER['name']}"}),
        )
        refund_args = {"order_id": "ord_1", "amount": 2500, "currency": "eur"}
        Step.objects.create(
            run=run,
            seq=3,
            step_id="0003.tool.issue_refund",
            kind=StepKind.TOOL,
            name="issue_refund",
            status=StepStatus.SUCCEEDED,
            is_effect=True,
            input=refund_args,
            input_hash=content_hash(refund_args),
            effect_key=f"ek_{uuid.uuid4().hex[:24]}",
            request={**refund_args, "metadata": {"order_id": "ord_1"}},
            provider_reference="re_123",
            attempts=1,
            recovery_log=[{"action": "send", "attempt": 1, "after": "planned"}],
            created_at=started,
            completed_at=started,
            **_result({"id": "re_123", "status": "succeeded"}),
        )
        for version, (kind, step_id) in enumerate(
            [("run_started", ""), ("effect_sent", "0003.tool.issue_refund"), ("run_ended", "")],
            start=1,
        ):
            RunEvent.objects.create(
                run=run,
                type=kind,
                state_version=version,
                step_id=step_id,
                payload={"status": status, "note": CUSTOMER["email"]},
                created_at=started,
            )
        return run

    return make
