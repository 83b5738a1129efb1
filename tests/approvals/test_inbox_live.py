"""The inbox and an approval's page, live: new cards arrive, decided cards change in
place, counts follow; a pushed card's form posts with a token the page accepts."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from approvals.models import Approval
from config.asgi import application
from tests.harness import (
    browser_headers,
    post_decision,
    pushed_until,
    refused_with,
    socket_address,
)

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def other_approver(tenant, make_operator):
    client = Client()
    client.force_login(make_operator(tenant, "approver", username="bo"))
    return client


def test_a_new_request_appears_and_another_approvers_decision_changes_it_in_place(
    ann, pending, world, other_approver
):
    page = ann.get("/approvals/").content.decode()
    address = socket_address(page)
    assert address.startswith("/ws/live/inbox/?seen=")

    async def scenario():
        socket = WebsocketCommunicator(application, address, headers=browser_headers(ann))
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        # The page is current: only the counts, no card replaced under the reader.
        assert 'id="approval-tabs"' in snapshot and "<article" not in snapshot

        run = await database_sync_to_async(world.start_refund)(requested_by="user:requester")
        await database_sync_to_async(world.harness.advance)(run)
        arrived = await pushed_until(socket, 'hx-swap-oob="beforeend:#approval-cards"')
        newer = await database_sync_to_async(world.waiting_approval)(run)
        assert f'id="approval-{newer.pk}"' in arrived
        assert 'Waiting <span class="count">2</span>' in arrived
        assert f'id="approval-{pending.pk}"' not in arrived  # unchanged: left alone

        decided = await database_sync_to_async(post_decision)(other_approver, pending)
        assert decided.status_code in (200, 302)
        changed = await pushed_until(socket, f'id="approval-{pending.pk}"')
        assert "approval-approved" in changed and "<dt>Decided</dt><dd>user:bo" in changed
        assert 'Waiting <span class="count">1</span>' in changed
        await socket.disconnect()
        return arrived, newer

    arrived, newer = async_to_sync(scenario)()
    # The pushed card's form carries a token this browser's next POST passes with.
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', arrived).group(1)
    strict = Client(enforce_csrf_checks=True)
    strict.cookies = ann.cookies
    form = {"decision": "reject", "note": "not this one", "args_hash": newer.args_hash}
    answer = strict.post(f"/approvals/{newer.pk}/decide", {**form, "csrfmiddlewaretoken": token})
    assert answer.status_code != 403
    newer.refresh_from_db()
    assert newer.status == "rejected"


def _snapshot(ann, address: str) -> str:
    async def scenario():
        socket = WebsocketCommunicator(application, address, headers=browser_headers(ann))
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        await socket.disconnect()
        return snapshot

    return async_to_sync(scenario)()


def test_a_page_older_than_the_inbox_has_its_cards_changed_in_place_on_connect(ann, pending, world):
    address = socket_address(ann.get("/approvals/").content.decode())
    assert f"shown={pending.pk}" in address
    Approval.objects.filter(pk=pending.pk).update(status="expired")
    newer_run = world.start_refund(requested_by="user:requester", request_id="newer")
    world.harness.advance(newer_run)
    newer = world.waiting_approval(newer_run)

    snapshot = _snapshot(ann, address)
    # The card it showed is drawn again as it is now; the new one is added after it.
    assert f'<article id="approval-{pending.pk}"' in snapshot
    assert "approval-expired" in snapshot
    assert 'hx-swap-oob="beforeend:#approval-cards"' in snapshot
    assert f'id="approval-{newer.pk}"' in snapshot
    # Never the whole list, which would take the expired card away under its reader.
    assert 'id="approval-cards" hx-swap-oob="true"' not in snapshot


def test_a_card_decided_before_the_socket_connected_stays_on_the_page_decided(ann, pending):
    page = ann.get("/approvals/").content.decode()
    # The approver decides before the page's socket is up (a quick click on a slow link).
    assert post_decision(ann, pending, HTTP_HX_REQUEST="true").status_code == 200
    snapshot = _snapshot(ann, socket_address(page))
    assert f'<article id="approval-{pending.pk}"' in snapshot
    assert "approval-approved" in snapshot
    assert 'Waiting <span class="count">0</span>' in snapshot
    assert 'hx-swap-oob="delete"' not in snapshot


def test_a_page_claiming_another_tenants_cards_is_shown_none_of_them(
    pending, other_tenant, make_operator
):
    outsider = Client()
    outsider.force_login(make_operator(other_tenant, "approver"))
    # A page address written by hand: out of date, claiming the other tenant's card.
    snapshot = _snapshot(outsider, f"/ws/live/inbox/?seen=x&shown={pending.pk},x,-3,\u00b2")
    assert 'id="approval-tabs"' in snapshot
    assert f"approval-{pending.pk}" not in snapshot
    assert "ord_" not in snapshot


def test_an_approvals_page_follows_its_card_and_history(ann, pending, other_approver):
    page = ann.get(f"/approvals/{pending.pk}/").content.decode()
    address = socket_address(page)
    assert address.startswith(f"/ws/live/approval/{pending.pk}/")

    async def scenario():
        socket = WebsocketCommunicator(application, address, headers=browser_headers(ann))
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        assert "<article" not in snapshot  # current as rendered
        await database_sync_to_async(post_decision)(other_approver, pending, "reject", "no")
        changed = await pushed_until(socket, "approval.reject")
        assert f'id="approval-{pending.pk}"' in changed and "approval-rejected" in changed
        await socket.disconnect()

    async_to_sync(scenario)()


def test_another_tenants_approval_and_an_unknown_page_are_refused(
    pending, other_tenant, make_operator
):
    outsider = Client()
    outsider.force_login(make_operator(other_tenant, "approver"))

    async def scenario():
        for address in (f"/ws/live/approval/{pending.pk}/", "/ws/live/nothing/"):
            socket = WebsocketCommunicator(application, address, headers=browser_headers(outsider))
            code, _ = await refused_with(socket)
            assert code == 4404, address

    async_to_sync(scenario)()
