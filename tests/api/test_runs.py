"""/api/v1/runs: list, start, read, cancel, retry now: contract, tenant scope, scopes,
permissions, pagination under inserts, audit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import ApiToken, AuditEntry
from agentruns.models import Run, Step, StepKind, StepStatus
from approvals.models import Approval
from reconciliation.models import ReconciliationCase

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

RUN_FIELDS = {
    "id",
    "agent",
    "version",
    "request_id",
    "dedupe_key",
    "status",
    "terminal",
    "outcome",
    "outcome_code",
    "output",
    "created_at",
    "updated_at",
    "finished_at",
    "owner",
    "archived_at",
}
STEP_FIELDS = {
    "step_id",
    "kind",
    "name",
    "status",
    "attempts",
    "ambiguous_attempts",
    "is_effect",
    "effect_key",
    "provider_reference",
    "error_class",
    "error",
    "started_at",
    "completed_at",
    "sent_at",
    "in_flight",
    "may_land_until",
    "approval_id",
    "case_id",
    "waits_for",
}
BODY = {"agent": "order_status", "input": {"order_id": "A-1001"}, "request_id": "req-1"}


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [run["id"] for run in response.json()["items"]]


# --- list ------------------------------------------------------------------------------


def test_the_list_answers_the_tenants_runs_newest_first(api, harness, other_tenant):
    from tests.harness import Harness

    first = harness.start("flow", {"sleep": 600}, request_id="r-1")
    second = harness.start("flow", {"sleep": 600}, request_id="r-2")
    Harness(other_tenant).start("flow", {"sleep": 600}, request_id="theirs")
    response = api.get("/runs")
    body = response.json()
    assert _ids(response) == [str(second.id), str(first.id)]
    assert set(body["items"][0]) == RUN_FIELDS
    assert body["next_cursor"] is None
    assert body["items"][0]["status"] == "queued" and body["items"][0]["agent"] == "flow"


def test_the_list_filters_as_the_run_list_does(api, harness):
    now = timezone.now()
    sleeping = harness.start("flow", {"sleep": 600}, request_id="ticket-1")
    harness.advance(sleeping)
    queued = harness.start("flow", {"sleep": 600, "order_id": "ord_77"}, request_id="t-2")
    old = harness.start("flow", {"sleep": 600}, request_id="t-3")
    Run.objects.filter(pk=old.id).update(created_at=now - timedelta(days=3), retried=True)
    Run.objects.filter(pk=queued.id).update(outcome_code="refund_refused", reconciled=True)
    Step.objects.create(
        run=queued,
        seq=0,
        step_id="0000.tool.charge",
        kind=StepKind.TOOL,
        name="charge",
        status=StepStatus.SUCCEEDED,
        is_effect=True,
        effect_key="effect-of-queued",
    )
    cases = [
        ({"status": "sleeping"}, [sleeping]),
        ({"status": ["sleeping", "queued"]}, [queued, sleeping, old]),
        ({"agent": "flow"}, [queued, sleeping, old]),
        ({"agent": "other"}, []),
        ({"request_id": "ticket-1"}, [sleeping]),
        ({"order_id": "ord_77"}, [queued]),
        ({"effect_key": "effect-of-queued"}, [queued]),
        ({"effect_key": "nobody's"}, []),
        ({"mark": "retried"}, [old]),
        ({"mark": ["retried", "reconciled"]}, []),
        ({"outcome": "refund_refused"}, [queued]),
        ({"created_after": (now - timedelta(days=1)).isoformat()}, [queued, sleeping]),
        ({"created_before": (now - timedelta(days=1)).isoformat()}, [old]),
    ]
    for params, expected in cases:
        assert _ids(api.get("/runs", params)) == [str(r.id) for r in expected], params


def test_pages_neither_repeat_nor_skip_a_run_while_runs_are_started(api, harness):
    existing = [harness.start("flow", {"sleep": 600}, request_id=f"r-{i}") for i in range(7)]
    # Two pairs created in the same instant: the id breaks the tie.
    same = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(pk__in=[existing[2].id, existing[3].id]).update(created_at=same)
    Run.objects.filter(pk__in=[existing[4].id, existing[5].id]).update(
        created_at=same - timedelta(seconds=1)
    )
    seen: list[str] = []
    cursor = None
    for page in range(10):
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        response = api.get("/runs", params)
        seen.extend(_ids(response))
        cursor = response.json()["next_cursor"]
        # Runs started between pages are newer than every page already read.
        harness.start("flow", {"sleep": 600}, request_id=f"new-{page}")
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 7
    assert set(seen) == {str(r.id) for r in existing}


def test_a_list_never_shows_another_tenants_run(harness, other_tenant, make_operator, api_as):
    harness.start("flow", {"sleep": 600}, request_id="ours")
    theirs = api_as(make_operator(other_tenant, "operator", username="theo"))
    assert _ids(theirs.get("/runs")) == []
    assert _ids(theirs.get("/runs", {"request_id": "ours"})) == []


# --- start -------------------------------------------------------------------------------


def test_start_is_201_then_200_and_audited_with_the_token(api):
    created = api.post("/runs", BODY)
    assert created.status_code == 201
    assert set(created.json()) == RUN_FIELDS
    again = api.post("/runs", BODY)
    assert again.status_code == 200 and again.json()["id"] == created.json()["id"]
    entry = AuditEntry.objects.get(action="run.start")
    assert entry.actor == "user:olga"
    assert entry.object_id == created.json()["id"]
    assert entry.after["token"].startswith("token:helpdesk (hft_")


def test_start_with_other_input_for_the_same_request_is_409_with_the_run(api):
    run_id = api.post("/runs", BODY).json()["id"]
    response = api.post("/runs", {**BODY, "input": {"order_id": "A-2"}})
    assert response.status_code == 409
    assert response.json()["run"]["id"] == run_id
    assert set(response.json()["run"]) == RUN_FIELDS


# --- read --------------------------------------------------------------------------------


def _approval(run, step_id: str, **fields) -> Approval:
    return Approval.objects.create(
        tenant=run.tenant,
        run=run,
        step_id=step_id,
        tool="charge",
        args={"order_id": "o-1", "amount": 6000},
        args_hash="a" * 64,
        effect_key=f"key-{step_id}",
        requested_by="user:requester",
        resource="order:o-1",
        resource_fingerprint="f" * 64,
        preview="Charge 60.00 EUR",
        amount=6000,
        currency="eur",
        expires_at=timezone.now() + timedelta(hours=1),
        **fields,
    )


def _step(run, seq: int, name: str, status: str, **fields) -> Step:
    return Step.objects.create(
        run=run,
        seq=seq,
        step_id=f"{seq:04d}.tool.{name}",
        kind=StepKind.TOOL,
        name=name,
        status=status,
        is_effect=True,
        effect_key=f"key-{run.id}-{seq}",
        **fields,
    )


def test_a_run_is_read_with_every_step_field_the_run_page_shows(api, harness):
    run = harness.start("flow", {"sleep": 600})
    sent = timezone.now() - timedelta(seconds=2)
    in_flight = _step(
        run, 0, "charge", StepStatus.RUNNING, in_flight=True, last_sent_at=sent, attempts=2
    )
    waiting = _step(run, 1, "refund", StepStatus.PLANNED)
    unknown = _step(run, 2, "mail", StepStatus.UNKNOWN, ambiguous_attempts=3, attempts=3)
    approval = _approval(run, waiting.step_id)
    case = ReconciliationCase.objects.create(
        tenant=run.tenant,
        run=run,
        step=unknown,
        step_id_label=unknown.step_id,
        tool="mail",
        effect_key=unknown.effect_key,
    )
    response = api.get(f"/runs/{run.id}")
    assert response.status_code == 200
    data = response.json()
    assert set(data) == RUN_FIELDS | {"steps"}
    steps = {step["step_id"]: step for step in data["steps"]}
    assert list(steps) == [in_flight.step_id, waiting.step_id, unknown.step_id]
    assert all(set(step) == STEP_FIELDS for step in data["steps"])
    flying = steps[in_flight.step_id]
    assert flying["in_flight"] is True and flying["attempts"] == 2
    assert flying["sent_at"] is not None and flying["may_land_until"] > flying["sent_at"]
    assert flying["approval_id"] is None and flying["waits_for"] is None
    assert steps[waiting.step_id]["approval_id"] == approval.pk
    assert steps[waiting.step_id]["waits_for"] == "approval"
    assert steps[waiting.step_id]["in_flight"] is False
    assert steps[unknown.step_id]["ambiguous_attempts"] == 3
    assert steps[unknown.step_id]["case_id"] == case.pk
    assert steps[unknown.step_id]["waits_for"] == "case"


def test_a_decided_approval_and_a_resolved_case_stay_named_on_their_steps(api, harness):
    run = harness.start("flow", {"sleep": 600})
    done = _step(run, 0, "charge", StepStatus.SUCCEEDED)
    settled = _step(run, 1, "mail", StepStatus.SUCCEEDED)
    _approval(run, done.step_id, status="rejected")
    newest = _approval(run, done.step_id, status="approved")
    case = ReconciliationCase.objects.create(
        tenant=run.tenant,
        run=run,
        step=settled,
        step_id_label=settled.step_id,
        tool="mail",
        effect_key=settled.effect_key,
        status="resolved",
    )
    steps = api.get(f"/runs/{run.id}").json()["steps"]
    assert steps[0]["approval_id"] == newest.pk and steps[0]["waits_for"] is None
    assert steps[1]["case_id"] == case.pk and steps[1]["waits_for"] is None


def test_a_providers_words_are_shown_only_to_an_owner_who_may_read_them(
    harness, tenant, make_operator, api_as
):
    run = harness.start("flow", {"sleep": 600})
    _step(
        run,
        0,
        "charge",
        StepStatus.FAILED,
        last_error_class="provider_refused",
        last_error="card of ann@example.com declined",
    )
    plain = api_as(make_operator(tenant, "viewer", username="vic"))
    error = plain.get(f"/runs/{run.id}").json()["steps"][0]["error"]
    assert "declined" not in error and "example.com" not in error
    detail = api_as(make_operator(tenant, "admin", username="ada"))
    error = detail.get(f"/runs/{run.id}").json()["steps"][0]["error"]
    assert "declined" in error and "ann@" not in error


def test_the_address_from_before_v1_answers_what_v1_does(api, harness):
    run = harness.start("flow", {"sleep": 600})
    harness.advance(run)
    old = api.client.get(f"/api/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {api.secret}")
    assert old.status_code == 200
    assert old.json() == api.get(f"/runs/{run.id}").json()


# --- cancel and retry now ---------------------------------------------------------------


def test_cancel_ends_an_idle_run_and_is_audited_with_the_token(api, harness):
    run = harness.start("flow", {"sleep": 600})
    harness.advance(run)
    response = api.post(f"/runs/{run.id}/cancel")
    assert response.status_code == 200
    assert set(response.json()) == RUN_FIELDS
    assert response.json()["status"] == "cancelled_no_effect"
    assert Run.objects.get(pk=run.id).status == "cancelled_no_effect"
    entry = AuditEntry.objects.get(action="run.cancel")
    assert entry.actor == "user:olga" and entry.object_id == str(run.id)
    assert entry.before == {"status": "sleeping"}
    assert entry.after["status"] == "cancelled_no_effect"
    assert entry.after["token"].startswith("token:helpdesk (hft_")


def test_cancel_while_an_effect_is_unknown_is_409_with_the_reason(api, harness, provider):
    provider.script["send_email"] = ["fail_after"]
    run = harness.start("mailer")
    harness.advance(run)
    response = api.post(f"/runs/{run.id}/cancel")
    assert response.status_code == 409
    assert "settle it before cancelling" in response.json()["error"]
    assert not AuditEntry.objects.filter(action="run.cancel").exists()


def test_cancel_of_an_ended_run_is_409(api, harness):
    run = harness.start("flow", {"sleep": 600})
    harness.advance(run)
    assert api.post(f"/runs/{run.id}/cancel").status_code == 200
    again = api.post(f"/runs/{run.id}/cancel")
    assert again.status_code == 409
    assert again.json()["error"].startswith("not cancelled: ")
    assert AuditEntry.objects.filter(action="run.cancel").count() == 1


def test_retry_now_wakes_a_waiting_run_and_is_audited(api, harness, provider):
    provider.script["lookup_order"] = ["fail_before"]
    run = harness.start("flow")
    harness.advance(run)
    assert Run.objects.get(pk=run.id).status == "waiting_for_retry"
    response = api.post(f"/runs/{run.id}/retry")
    assert response.status_code == 200
    run.refresh_from_db()
    assert run.next_attempt_at <= run.updated_at
    entry = AuditEntry.objects.get(action="run.retry_now")
    assert entry.before["status"] == "waiting_for_retry"
    assert entry.after["token"].startswith("token:helpdesk")


def test_retry_now_of_a_run_that_is_not_waiting_is_409_with_its_state(api, harness):
    run = harness.start("flow", {"sleep": 600})
    response = api.post(f"/runs/{run.id}/retry")
    assert response.status_code == 409
    assert response.json() == {"error": "nothing to retry: the run is queued (queued)"}
    assert not AuditEntry.objects.filter(action="run.retry_now").exists()


# --- tenant scope, scopes, permissions ----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", ""), ("post", "/cancel"), ("post", "/retry")],
)
def test_another_tenants_run_is_404(harness, other_tenant, make_operator, api_as, method, path):
    run = harness.start("flow", {"sleep": 600})
    theirs = api_as(make_operator(other_tenant, "admin", username="theo"))
    response = getattr(theirs, method)(f"/runs/{run.id}{path}")
    assert response.status_code == 404
    assert response.json() == {"error": f"no run {run.id}"}
    assert Run.objects.get(pk=run.id).cancel_requested_at is None
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("get", "", ApiToken.SCOPE_READ),
        ("get", "/{run}", ApiToken.SCOPE_READ),
        ("post", "", ApiToken.SCOPE_START),
        ("post", "/{run}/cancel", ApiToken.SCOPE_CANCEL),
        ("post", "/{run}/retry", ApiToken.SCOPE_RETRY),
    ],
)
def test_each_operation_needs_its_scope(harness, owner, api_as, method, path, scope):
    run = harness.start("flow", {"sleep": 600})
    others = [s for s in ApiToken.SCOPES if s != scope]
    api = api_as(owner, scopes=others)
    url = "/runs" + path.format(run=run.id)
    response = api.post(url, BODY) if method == "post" else api.get(url)
    assert response.status_code == 403
    assert response.json() == {"error": f"this token may not do {scope}"}
    assert Run.objects.get(pk=run.id).cancel_requested_at is None
    assert not AuditEntry.objects.exists()
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    ("role", "method", "path", "action"),
    [
        ("no_role", "get", "", "see runs"),
        ("no_role", "get", "/{run}", "see runs"),
        ("viewer", "post", "", "start runs"),
        ("viewer", "post", "/{run}/cancel", "cancel runs"),
        ("approver", "post", "/{run}/retry", "make runs retry now"),
    ],
)
def test_each_operation_needs_its_permission(
    harness, tenant, make_operator, api_as, role, method, path, action
):
    run = harness.start("flow", {"sleep": 600})
    user = make_operator(tenant, *([] if role == "no_role" else [role]), username="pat")
    api = api_as(user)
    url = "/runs" + path.format(run=run.id)
    response = api.post(url, BODY) if method == "post" else api.get(url)
    assert response.status_code == 403
    assert response.json() == {"error": f"this token's owner, pat, may not {action}"}
    assert Run.objects.get(pk=run.id).cancel_requested_at is None
    assert not AuditEntry.objects.exists()
