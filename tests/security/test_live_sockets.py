"""A live socket keeps checking who is watching; it reads a bounded window of the log
on connect; a login holds a bounded number of sockets."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from agentruns import consumers
from agentruns.follower import TRAILING_WINDOW, TenantLog
from agentruns.models import RunEvent
from config.asgi import application
from tests.harness import Harness, refused_with

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1")


def _headers(client):
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return [ORIGIN, (b"cookie", cookie.encode())]


@pytest.fixture
def harness(tenant) -> Harness:
    return Harness(tenant)


@pytest.fixture(autouse=True)
def quick_rechecks(monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.2)


@pytest.fixture
def viewer(client, tenant, make_operator):
    user = make_operator(tenant, "viewer")
    client.force_login(user)
    return client, user


def _lose_access(how: str, client, user, other_tenant) -> None:
    from django.contrib.auth.models import Group

    if how == "logged out":
        client.logout()
    elif how == "deactivated":
        user.is_active = False
        user.save(update_fields=["is_active"])
    elif how == "removed from the tenant":
        user.operator.tenant = other_tenant
        user.operator.save(update_fields=["tenant"])
    elif how == "lost every group":
        user.groups.remove(*Group.objects.all())


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("logged out", "you were signed out"),
        ("deactivated", "your login was deactivated"),
        ("removed from the tenant", "you are no longer an operator of this tenant"),
        ("lost every group", "you may no longer see runs"),
    ],
)
def test_a_socket_closes_within_seconds_once_its_viewer_may_no_longer_watch(
    viewer, other_tenant, harness, how, reason
):
    client, user = viewer
    headers = _headers(client)

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/runs/", headers=headers)
        assert (await socket.connect(timeout=20))[0]
        await socket.receive_from(timeout=5)  # the snapshot
        await database_sync_to_async(_lose_access)(how, client, user, other_tenant)
        # A new run arrives meanwhile: it must not reach this socket.
        await database_sync_to_async(harness.start)("flow", {})
        notice = await socket.receive_from(timeout=5)
        assert 'id="live-notice"' in notice and reason in notice
        assert "run-table" not in notice
        closed = await socket.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4403}

    async_to_sync(scenario)()


def test_a_socket_of_a_viewer_who_still_may_watch_stays_open(viewer, harness):
    client, _ = viewer

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/runs/", headers=_headers(client))
        assert (await socket.connect(timeout=20))[0]
        await socket.receive_from(timeout=5)
        run = await database_sync_to_async(harness.start)("flow", {})
        update = await socket.receive_from(timeout=5)
        assert f"run-{run.id}" in update
        assert await socket.receive_nothing(timeout=0.6)  # rechecked, nothing ended
        await socket.disconnect()

    async_to_sync(scenario)()


def test_the_snapshot_reads_only_the_newest_window_of_the_log(viewer, harness, tenant):
    run = harness.start("flow", {})
    RunEvent.objects.bulk_create(
        RunEvent(run=run, type="step_succeeded", state_version=1, payload={}) for _ in range(3000)
    )
    log = TenantLog(tenant.id)
    log.start()
    assert 0 < len(log.events_seen) <= TRAILING_WINDOW
    assert max(log.events_seen) == RunEvent.objects.latest("id").id


def test_a_login_holds_a_bounded_number_of_sockets(viewer, settings):
    client, _ = viewer
    settings.HOLDFAST_MAX_SOCKETS_PER_USER = 2
    headers = _headers(client)

    async def scenario():
        first = WebsocketCommunicator(application, "/ws/nav/", headers=headers)
        second = WebsocketCommunicator(application, "/ws/nav/", headers=headers)
        third = WebsocketCommunicator(application, "/ws/nav/", headers=headers)
        assert (await first.connect(timeout=20))[0]
        assert (await second.connect(timeout=20))[0]
        code, notice = await refused_with(third)
        assert code == 4429 and "live pages open already" in notice
        await first.disconnect()
        again = WebsocketCommunicator(application, "/ws/nav/", headers=headers)
        assert (await again.connect(timeout=20))[0]  # a closed socket frees its place
        await second.disconnect()
        await again.disconnect()

    async_to_sync(scenario)()
