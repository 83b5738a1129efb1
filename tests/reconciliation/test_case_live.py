"""The queue and a case page, live: an automatic lookup appears without a reload, the
forms stay as typed while the case is open, and a settled case is redrawn."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application
from reconciliation.services import case_lookup_now
from tests.harness import browser_headers, pushed_until, socket_address

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def case(world):
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    assert run.status == "effect_unknown_reconciliation_required"
    return world.case_of(run)


@pytest.fixture
def rita(reconciler):
    client = Client()
    client.force_login(reconciler)
    return client


def test_an_automatic_lookup_appears_and_the_forms_are_left_alone(case, rita, world):
    address = socket_address(rita.get(f"/reconciliation/{case.pk}/").content.decode())
    assert address == f"/ws/live/case/{case.pk}/?seen={case.version}-open"

    async def scenario():
        socket = WebsocketCommunicator(application, address, headers=browser_headers(rita))
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        assert 'id="case-lookups" hx-swap-oob="true"' in snapshot
        # The provider still cannot be asked: an inconclusive lookup, the case stays open.
        await database_sync_to_async(case_lookup_now)(case=case, actor="sweeper")
        pushed = await pushed_until(socket, "automatic lookup")
        assert 'id="case-lookups" hx-swap-oob="true"' in pushed
        assert "Inconclusive" in pushed or "inconclusive" in pushed
        assert 'id="case-audit" hx-swap-oob="true"' in pushed
        # What a reconciler is typing in the forms is not replaced.
        assert "<form" not in pushed and 'id="case-body"' not in pushed
        await socket.disconnect()

    async_to_sync(scenario)()


def test_a_case_settled_elsewhere_is_redrawn_whole(case, rita, world, tenant, make_operator):
    address = socket_address(rita.get(f"/reconciliation/{case.pk}/").content.decode())
    other = Client()
    other.force_login(make_operator(tenant, "reconciler", username="sam"))
    world.clear_faults()

    async def scenario():
        socket = WebsocketCommunicator(application, address, headers=browser_headers(rita))
        assert (await socket.connect(timeout=20))[0]
        await socket.receive_from(timeout=5)
        # Another reconciler asks the provider: it did not happen, and the case
        # settles itself (a conclusive lookup).
        answer = await database_sync_to_async(other.post)(f"/reconciliation/{case.pk}/lookup")
        assert answer.status_code in (200, 302)
        pushed = await pushed_until(socket, 'id="case-body" hx-swap-oob="true"')
        assert "case-resolved" in pushed
        await socket.disconnect()

    async_to_sync(scenario)()


def test_the_queue_follows_the_cases(case, rita, world):
    address = socket_address(rita.get("/reconciliation/").content.decode())
    assert address.startswith("/ws/live/cases/")
    world.clear_faults()

    async def scenario():
        socket = WebsocketCommunicator(application, address, headers=browser_headers(rita))
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        assert f"/reconciliation/{case.pk}/" in snapshot
        assert '<span class="count" id="open-case-count" hx-swap-oob="true">1</span>' in snapshot
        await database_sync_to_async(case_lookup_now)(case=case, actor="sweeper")
        pushed = await pushed_until(socket, 'id="open-case-count" hx-swap-oob="true">0<')
        assert f"/reconciliation/{case.pk}/" not in pushed
        await socket.disconnect()

    async_to_sync(scenario)()
