"""A provider's own error text (hosts, ports, request details) is read only by people
who act on providers (``view_provider_errors``); everyone else reads what kind of
failure it was and a reference: on the run page, the case page, over the live socket
and in the API. Holdfast's own explanations are read by everyone."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from accounts.models import ApiToken
from accounts.privacy import error_reference, shown_error
from agentruns.models import Step
from config.asgi import application
from reconciliation.models import ProviderLookup
from tests.harness import ORDER, ReconciliationWorld, point_at_sandbox, refund_harness

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

HOST_DETAIL = "HTTPConnectionPool(host='payments.internal.example', port=8443): timed out"


def test_the_rule_names_the_category_and_a_stable_reference():
    shown = shown_error("unreachable", HOST_DETAIL, detail=False)
    assert shown == f"the provider could not be reached (reference {error_reference(HOST_DETAIL)})"
    assert "payments.internal" not in shown
    # The same error has the same reference wherever it is shown.
    assert error_reference(HOST_DETAIL) == error_reference(HOST_DETAIL)
    assert shown_error("unexpected", HOST_DETAIL, detail=False).startswith("the call failed")
    detailed = shown_error("unreachable", HOST_DETAIL, detail=True)
    assert "payments.internal.example" in detailed and error_reference(HOST_DETAIL) in detailed


def test_holdfasts_own_explanations_are_read_by_everyone():
    text = "not sent: the payment is in EUR, not JPY"
    assert shown_error("currency_mismatch", text, detail=False) == text
    # ... masked like any text.
    assert shown_error("invalid_arguments", "to ann@example.com", detail=False) == (
        "to ••••@example.com"
    )


@pytest.fixture
def world(sandbox, settings, tenant) -> ReconciliationWorld:
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return ReconciliationWorld(harness, sandbox, order, settings)


@pytest.fixture
def case(world):
    """A refund whose send met a 500 and whose lookups fail: an open case whose step
    error and failed lookup carry the provider client's words."""
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    assert run.status == "effect_unknown_reconciliation_required"
    world.clear_faults()
    case = world.case_of(run)
    # The provider's words as a real outage writes them: an internal host name.
    Step.objects.filter(pk=case.step_id).update(last_error=HOST_DETAIL)
    ProviderLookup.objects.create(
        case=case,
        method=ProviderLookup.Method.AUTOMATIC,
        actor="system",
        outcome="inconclusive",
        evidence={"error": f"ConnectionError: {HOST_DETAIL}"},
        note="the provider could not be asked",
    )
    return case


def _as(tenant, make_operator, *groups):
    client = Client()
    user = make_operator(tenant, *groups)
    client.force_login(user)
    return client, user


def test_a_viewer_reads_categories_and_references_a_reconciler_the_detail(
    case, tenant, make_operator
):
    viewer, _ = _as(tenant, make_operator, "viewer")
    rita, _ = _as(tenant, make_operator, "reconciler")
    for url in [f"/reconciliation/{case.pk}/", f"/runs/{case.run_id}/"]:
        page = viewer.get(url).content.decode()
        assert "payments.internal" not in page and "127.0.0.1" not in page, url
        assert f"(reference {error_reference(HOST_DETAIL)})" in page, url
        detailed = rita.get(url).content.decode()
        assert "payments.internal.example" in detailed, url
        assert error_reference(HOST_DETAIL) in detailed, url
    # The failed lookup: the viewer is told it failed, not how.
    page = viewer.get(f"/reconciliation/{case.pk}/").content.decode()
    reference = error_reference(f"ConnectionError: {HOST_DETAIL}")
    lookup_error = f"the call failed (reference {reference})"
    assert "ConnectionError" not in page and lookup_error in page
    assert "ConnectionError" in rita.get(f"/reconciliation/{case.pk}/").content.decode()


def test_the_api_answers_by_the_token_owners_permission(case, tenant, make_operator):
    client = Client()
    _, viewer = _as(tenant, make_operator, "viewer")
    _, operator = _as(tenant, make_operator, "operator")
    bodies = {}
    for user in (viewer, operator):
        _, secret = ApiToken.issue(owner=user, name=f"{user.username}-reads")
        response = client.get(f"/api/runs/{case.run_id}", HTTP_AUTHORIZATION=f"Bearer {secret}")
        bodies[user] = json.dumps(response.json())
    assert "payments.internal" not in bodies[viewer]
    assert error_reference(HOST_DETAIL) in bodies[viewer]
    assert "payments.internal.example" in bodies[operator]


def test_the_live_run_page_pushes_by_the_same_rule(case, tenant, make_operator, world):
    viewer, _ = _as(tenant, make_operator, "viewer")
    cookie = f"{settings.SESSION_COOKIE_NAME}={viewer.cookies[settings.SESSION_COOKIE_NAME].value}"
    headers = [(b"origin", b"http://127.0.0.1"), (b"cookie", cookie.encode())]
    address = "grace.hopper@example.com"

    async def scenario():
        socket = WebsocketCommunicator(application, f"/ws/runs/{case.run_id}/", headers=headers)
        assert (await socket.connect(timeout=20))[0]
        await socket.receive_from(timeout=5)  # the snapshot
        # Something happens to the run: the page is pushed its fragments again.
        await _touch(case, address)
        pushed = ""
        for _ in range(5):
            pushed += await socket.receive_from(timeout=5)
            if "run-timeline" in pushed or "timeline" in pushed:
                break
        await socket.disconnect()
        return pushed

    pushed = async_to_sync(scenario)()
    assert "payments.internal" not in pushed
    assert error_reference(HOST_DETAIL) in pushed
    assert address not in pushed and "••••@example.com" in pushed


async def _touch(case, address):
    from channels.db import database_sync_to_async

    from agentruns.doorbell import doorbell_ring
    from agentruns.models import Run, RunEvent

    def touch():
        Run.objects.filter(pk=case.run_id).update(outcome_detail=f"customer {address} asked twice")
        run = Run.objects.get(pk=case.run_id)
        RunEvent.objects.create(run=run, type="note", state_version=run.state_version, payload={})
        doorbell_ring(run.id)  # as the engine's Store does after a commit that wrote an event

    await database_sync_to_async(touch)()


def test_the_reference_is_one_word_a_viewer_can_quote():
    assert re.fullmatch(r"E-[0-9a-f]{8}", error_reference(HOST_DETAIL))
