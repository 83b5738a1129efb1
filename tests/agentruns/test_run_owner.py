"""Which worker holds a run: its host, pid and lease on the run page and in the API, and
for a send in flight when it went out and until when it may still land."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from accounts.models import ApiToken
from agentruns.models import Run, RunStatus, Step, StepKind, StepStatus
from agentruns.runtime.sending import send_budget
from agentruns.selectors import run_owner, send_may_land_until
from agentruns.services import engine_settings, get_registry, run_start
from config.asgi import application

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

OWNER = "worker-b.prod.internal:48213:5f0c1a2b3d"
SENT_AT = datetime(2026, 11, 30, 12, 0, 1, tzinfo=UTC)


def _as_json(moment) -> str:
    # As the API writes a time: ISO 8601 to the millisecond, UTC as Z.
    return DjangoJSONEncoder().default(moment)


@pytest.fixture
def viewer(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    return client


@pytest.fixture
def api_token(tenant, make_operator):
    return ApiToken.issue(owner=make_operator(tenant, "operator", username="olga"), name="hd")[1]


@pytest.fixture
def refund_run(tenant) -> Run:
    run, _ = run_start(
        tenant=tenant,
        agent_name="refund_support",
        input={"order_id": "ord_1001", "amount": 700},
        request_id="owner-1",
    )
    return run


def _hold(run: Run, *, owner: str = OWNER, seconds: float = 10.0) -> None:
    """As a worker's claim would leave the run: its owner id and a lease."""
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING,
        lease_owner=owner,
        lease_expires_at=timezone.now() + timedelta(seconds=seconds),
    )
    run.refresh_from_db()


def _refund_in_flight(run: Run, *, name: str = "issue_refund", sent_at=SENT_AT) -> Step:
    """As the clearing commit leaves an effect step: running, in flight, sent."""
    return Step.objects.create(
        run=run,
        seq=3,
        step_id=f"0003.tool.{name}",
        kind=StepKind.TOOL,
        name=name,
        status=StepStatus.RUNNING,
        is_effect=True,
        in_flight=True,
        effect_key="hf_owner_test_key",
        attempts=1,
        first_sent_at=sent_at,
        last_sent_at=sent_at,
        started_at=sent_at,
    )


def _api(client, run, token):
    response = client.get(f"/api/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    return response.json()


def _holder(client, run):
    return client.get(f"/runs/{run.id}/", {"part": "holder"}, HTTP_HX_REQUEST="true")


# --- a run a worker holds ----------------------------------------------------------


def test_the_page_shows_the_worker_holding_the_run_and_when_its_lease_expires(viewer, refund_run):
    _hold(refund_run, seconds=10)
    page = viewer.get(f"/runs/{refund_run.id}/").content.decode()
    assert "<code>worker-b.prod.internal</code> pid 48213" in page
    expiry = timezone.localtime(refund_run.lease_expires_at).strftime("%H:%M:%S UTC")
    assert "lease until <time title=" in page and f">{expiry}</time>" in page
    assert "(expires in 10 s)" in page or "(expires in 9 s)" in page
    # It reads itself again while the lease counts: heartbeats write no event.
    assert f'hx-get="/runs/{refund_run.id}/?part=holder" hx-trigger="every 2s"' in page


def test_the_api_shows_the_owner_host_pid_and_lease_expiry(client, api_token, refund_run):
    _hold(refund_run)
    data = _api(client, refund_run, api_token)
    assert data["owner"] == {
        "host": "worker-b.prod.internal",
        "pid": 48213,
        "lease_expires_at": _as_json(refund_run.lease_expires_at),
    }


def test_a_lapsed_lease_says_how_long_ago_and_that_any_worker_may_take_the_run(
    client, viewer, api_token, refund_run
):
    _hold(refund_run, seconds=-30)
    page = viewer.get(f"/runs/{refund_run.id}/").content.decode()
    assert "<code>worker-b.prod.internal</code> pid 48213" in page
    assert "(expired 30 s ago: any worker may take the run over)" in page or (
        "(expired 31 s ago: any worker may take the run over)" in page
    )
    owner = _api(client, refund_run, api_token)["owner"]
    assert owner["lease_expires_at"] == _as_json(refund_run.lease_expires_at)


def test_the_holder_fragment_alone_is_what_the_page_polls(viewer, refund_run):
    _hold(refund_run)
    fragment = _holder(viewer, refund_run).content.decode()
    assert fragment.startswith('<dd id="run-holder"')
    assert "pid 48213" in fragment and "run-summary" not in fragment
    # Released: the fragment says so and stops polling.
    Run.objects.filter(pk=refund_run.pk).update(lease_owner="", lease_expires_at=None)
    fragment = _holder(viewer, refund_run).content.decode()
    assert "No worker holds it" in fragment and "hx-get" not in fragment


def test_an_owner_id_of_another_shape_is_shown_whole_without_a_pid(
    client, viewer, api_token, refund_run
):
    _hold(refund_run, owner="<b>w1</b>")
    page = viewer.get(f"/runs/{refund_run.id}/").content.decode()
    assert "<code>&lt;b&gt;w1&lt;/b&gt;</code>, lease until" in page
    assert "<b>w1</b>" not in page
    assert _api(client, refund_run, api_token)["owner"]["host"] == "<b>w1</b>"
    assert _api(client, refund_run, api_token)["owner"]["pid"] is None


def test_a_host_name_is_escaped(viewer, refund_run):
    _hold(refund_run, owner='"><script>alert(1)</script>:7:abc')
    page = viewer.get(f"/runs/{refund_run.id}/").content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_another_tenants_operator_sees_neither_the_page_nor_its_holder(
    client, refund_run, other_tenant, make_operator
):
    _hold(refund_run)
    client.force_login(make_operator(other_tenant, "viewer"))
    assert client.get(f"/runs/{refund_run.id}/").status_code == 404
    assert _holder(client, refund_run).status_code == 404


# --- a run nobody holds ------------------------------------------------------------


def test_a_run_nobody_holds_says_so_on_the_page_and_in_the_api(
    client, viewer, api_token, refund_run
):
    page = viewer.get(f"/runs/{refund_run.id}/").content.decode()
    assert "<dt>Worker</dt>" in page and "No worker holds it" in page
    assert "?part=holder" not in page
    assert _api(client, refund_run, api_token)["owner"] is None


# --- a step in flight --------------------------------------------------------------


def test_a_send_in_flight_shows_when_it_was_sent_and_until_when_it_may_land(viewer, refund_run):
    _hold(refund_run, seconds=14)
    _refund_in_flight(refund_run)
    page = viewer.get(f"/runs/{refund_run.id}/").content.decode()
    # The refund tool's timeout is 10 s, the engine's send margin 1 s: 11 s.
    summary = page[page.index('id="run-holder"') : page.index("</dd>", page.index("run-holder"))]
    assert "In flight: <code>0003.tool.issue_refund</code>, sent" in summary
    assert ">12:00:01 UTC</time>, may land until" in summary
    assert ">12:00:12 UTC</time> (passed " in summary  # long past: SENT_AT is fixed
    timeline = page[page.index('id="timeline"') :]
    assert "In flight: sent <time" in timeline and ">12:00:12 UTC</time>" in timeline


def test_a_send_still_landing_counts_down_and_keeps_the_holder_polling(viewer, refund_run):
    # Released by a worker that stopped mid-send: no owner, but the send may still land.
    _refund_in_flight(refund_run, sent_at=timezone.now())
    fragment = _holder(viewer, refund_run).content.decode()
    assert "No worker holds it" in fragment and "hx-get" in fragment
    assert "(in 11 s)" in fragment or "(in 10 s)" in fragment


def test_the_api_shows_the_send_time_and_until_when_it_may_land(client, api_token, refund_run):
    _hold(refund_run, seconds=14)
    _refund_in_flight(refund_run)
    Step.objects.create(
        run=refund_run,
        seq=1,
        step_id="0001.tool.lookup_order",
        kind=StepKind.TOOL,
        name="lookup_order",
        status=StepStatus.SUCCEEDED,
    )
    steps = {step["step_id"]: step for step in _api(client, refund_run, api_token)["steps"]}
    refund = steps["0003.tool.issue_refund"]
    assert refund["sent_at"] == _as_json(SENT_AT)
    assert refund["may_land_until"] == _as_json(SENT_AT + timedelta(seconds=11))
    assert steps["0001.tool.lookup_order"]["sent_at"] is None
    assert steps["0001.tool.lookup_order"]["may_land_until"] is None


def test_an_answered_send_may_no_longer_land(client, api_token, refund_run):
    step = _refund_in_flight(refund_run)
    Step.objects.filter(pk=step.pk).update(status=StepStatus.SUCCEEDED, in_flight=False)
    (refund,) = _api(client, refund_run, api_token)["steps"]
    assert refund["sent_at"] == _as_json(SENT_AT) and refund["may_land_until"] is None


def test_the_deadline_is_the_engines_send_budget_after_the_send(refund_run, settings):
    # The engine's own formula, so the page can never promise less than recovery waits.
    step = _refund_in_flight(refund_run)
    tool = get_registry().tool_of(refund_run, "issue_refund")
    budget = send_budget(SimpleNamespace(settings=engine_settings()), tool)
    assert send_may_land_until(refund_run, step) == SENT_AT + timedelta(seconds=budget)
    settings.HOLDFAST = {**settings.HOLDFAST, "SEND_BUDGET_SECONDS": 5.0}
    assert send_may_land_until(refund_run, step) == SENT_AT + timedelta(seconds=5)


def test_a_tool_no_longer_deployed_gets_the_longest_budget(refund_run):
    step = _refund_in_flight(refund_run, name="retired_tool")
    longest = engine_settings().max_send_budget_seconds
    assert send_may_land_until(refund_run, step) == SENT_AT + timedelta(seconds=longest)


def test_the_owner_id_is_read_as_the_engine_writes_it(refund_run):
    from agentruns.runtime.engine import new_owner_id

    refund_run.lease_owner = new_owner_id()
    owner = run_owner(refund_run)
    assert owner is not None and owner.pid is not None
    assert f"{owner.host}:{owner.pid}:" in refund_run.lease_owner


# --- the live page -----------------------------------------------------------------


def test_the_live_socket_pushes_the_same_holder_line(viewer, refund_run):
    _hold(refund_run)
    cookie = f"{settings.SESSION_COOKIE_NAME}={viewer.cookies[settings.SESSION_COOKIE_NAME].value}"
    headers = [(b"origin", b"http://127.0.0.1"), (b"cookie", cookie.encode())]

    async def scenario():
        socket = WebsocketCommunicator(application, f"/ws/runs/{refund_run.id}/", headers=headers)
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        await socket.disconnect()
        return snapshot

    snapshot = async_to_sync(scenario)()
    assert "<code>worker-b.prod.internal</code> pid 48213" in snapshot
    assert '<dd id="run-holder" hx-get=' in snapshot


def test_the_api_body_is_json_with_the_owner_even_when_the_run_was_just_started(client, api_token):
    body = {"agent": "order_status", "input": {"order_id": "A-1001"}, "request_id": "o-2"}
    response = client.post(
        "/api/runs",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_token}",
    )
    assert response.status_code == 201 and response.json()["owner"] is None
