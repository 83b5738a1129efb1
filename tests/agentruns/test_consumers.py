"""Live pages over websockets: authenticated, origin-checked, tenant-scoped, snapshot first."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from config.asgi import application
from tests.harness import refused_with

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1")


def _headers(client, origin=ORIGIN):
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return [origin, (b"cookie", cookie.encode())]


def _run(scenario):
    async_to_sync(scenario)()


@pytest.fixture
def viewer_client(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    return client


def test_the_list_socket_sends_a_snapshot_then_changes_made_elsewhere(viewer_client, harness):
    run = harness.start("flow", {"sleep": 600})

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/runs/", headers=_headers(viewer_client))
        connected, _ = await socket.connect(timeout=20)
        assert connected
        snapshot = await socket.receive_from(timeout=5)
        assert f'id="run-{run.id}"' in snapshot and 'id="run-table" hx-swap-oob="true"' in snapshot
        assert "queued" in snapshot
        # A worker (here: the engine in this process, writing only to the database)
        # advances the run; the socket learns it from the event log.
        await database_sync_to_async(harness.advance)(run)
        update = await socket.receive_from(timeout=5)
        assert f'<tr id="run-{run.id}" hx-swap-oob="true"' in update
        assert "sleeping" in update
        assert 'id="state-tabs" aria-label="States" hx-swap-oob="true"' in update, update
        await socket.disconnect()

    _run(scenario)


def test_a_new_run_is_added_on_top_of_a_matching_list(viewer_client, harness):
    async def scenario():
        socket = WebsocketCommunicator(
            application, "/ws/runs/?state=queued", headers=_headers(viewer_client)
        )
        assert (await socket.connect(timeout=20))[0]
        await socket.receive_from(timeout=5)
        run = await database_sync_to_async(harness.start)("flow")
        update = await socket.receive_from(timeout=5)
        assert 'id="run-table" hx-swap-oob="true"' in update and f"run-{run.id}" in update
        # Once it leaves the tab's state, the row goes away.
        await database_sync_to_async(harness.advance)(run)
        update = await socket.receive_from(timeout=5)
        assert f'<tr id="run-{run.id}" hx-swap-oob="delete">' in update
        await socket.disconnect()

    _run(scenario)


def test_a_reconnect_gets_a_full_snapshot(viewer_client, harness):
    run = harness.start("flow")

    async def scenario():
        for _ in range(2):
            socket = WebsocketCommunicator(
                application, f"/ws/runs/{run.id}/", headers=_headers(viewer_client)
            )
            assert (await socket.connect(timeout=20))[0]
            snapshot = await socket.receive_from(timeout=5)
            for part in ('id="run-summary"', 'id="timeline"', 'id="events"', 'id="attention"'):
                assert part in snapshot
            await socket.disconnect()

    _run(scenario)


def test_another_tenants_socket_gets_nothing(client, harness, other_tenant, make_operator):
    client.force_login(make_operator(other_tenant, "viewer"))
    run = harness.start("flow", {"sleep": 600})

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/runs/", headers=_headers(client))
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        assert str(run.id) not in snapshot
        await database_sync_to_async(harness.advance)(run)
        assert await socket.receive_nothing(timeout=1.5)
        await socket.disconnect()
        # Nor may it open another tenant's run.
        detail = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=_headers(client))
        code, notice = await refused_with(detail)
        assert code == 4404 and "no such live page" in notice

    _run(scenario)


def test_anonymous_and_foreign_origin_sockets_are_refused(viewer_client):
    async def scenario():
        anonymous = WebsocketCommunicator(application, "/ws/runs/", headers=[ORIGIN])
        code, notice = await refused_with(anonymous)
        assert code == 4401 and "signed out" in notice and "Sign in again" in notice
        foreign = WebsocketCommunicator(
            application,
            "/ws/runs/",
            headers=_headers(viewer_client, origin=(b"origin", b"https://evil.example")),
        )
        connected, _ = await foreign.connect(timeout=20)
        assert not connected

    _run(scenario)


def test_a_login_without_the_view_permission_is_refused(client, tenant, make_operator):
    client.force_login(make_operator(tenant))

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/runs/", headers=_headers(client))
        code, notice = await refused_with(socket)
        assert code == 4403 and "may not see runs" in notice and "run-table" not in notice

    _run(scenario)


def test_the_navigation_socket_sends_only_the_navigation(viewer_client, harness):
    run = harness.start("flow", {"sleep": 600})

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/nav/", headers=_headers(viewer_client))
        connected, _ = await socket.connect(timeout=20)
        assert connected
        snapshot = await socket.receive_from(timeout=5)
        assert snapshot.startswith('<nav id="attention"') and "run-table" not in snapshot
        await database_sync_to_async(harness.advance)(run)
        update = await socket.receive_from(timeout=5)
        assert update.startswith('<nav id="attention"') and f"run-{run.id}" not in update
        await socket.disconnect()

    _run(scenario)


def test_the_pushed_navigation_keeps_the_links_its_viewer_may_follow(
    client, tenant, make_operator, harness
):
    """The Audit link stays on every push for whoever may read the audit log, and is
    never pushed to whoever may not."""
    admin = make_operator(tenant, "admin", username="adm")
    viewer = make_operator(tenant, "viewer", username="vic")
    pushed = {}
    for user in (admin, viewer):
        client.force_login(user)
        headers = _headers(client)

        async def scenario(headers=headers):
            socket = WebsocketCommunicator(application, "/ws/nav/", headers=headers)
            assert (await socket.connect(timeout=20))[0]
            first = await socket.receive_from(timeout=5)
            await database_sync_to_async(harness.start)("flow", {})
            later = await socket.receive_from(timeout=5)
            await socket.disconnect()
            return first + later

        pushed[user.username] = async_to_sync(scenario)()
    assert pushed["adm"].count('href="/audit/"') == 2
    assert 'href="/audit/"' not in pushed["vic"]


def test_the_run_page_pushes_its_audit_entries(client, tenant, make_operator, harness):
    from accounts.services import audit_record

    client.force_login(make_operator(tenant, "viewer"))
    run = harness.start("flow", {"sleep": 600})

    async def scenario():
        socket = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=_headers(client))
        assert (await socket.connect(timeout=20))[0]
        await socket.receive_from(timeout=5)
        await database_sync_to_async(audit_record)(
            tenant=tenant,
            actor="user:ann",
            action="run.retry",
            object_type="run",
            object_id=str(run.id),
        )
        pushed = await socket.receive_from(timeout=5)
        assert 'id="run-audit" hx-swap-oob="true"' in pushed and "run.retry" in pushed
        await socket.disconnect()

    _run(scenario)


def test_pushed_fragments_show_times_in_the_operators_time_zone(
    client, tenant, make_operator, harness
):
    client.force_login(make_operator(tenant, "viewer", time_zone="Asia/Tokyo"))
    run = harness.start("flow", {"sleep": 600})

    async def scenario():
        socket = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=_headers(client))
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        await database_sync_to_async(harness.advance)(run)
        pushed = await socket.receive_from(timeout=5)
        await socket.disconnect()
        return snapshot + pushed

    pushed = async_to_sync(scenario)()
    assert "JST" in pushed and " UTC<" not in pushed
