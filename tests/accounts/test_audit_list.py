from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from accounts.services import audit_record
from config.asgi import application
from tests.harness import browser_headers, pushed_until, refused_with, socket_address

pytestmark = pytest.mark.django_db


def _entry(tenant, **overrides):
    values = {
        "actor": "user:ann",
        "action": "run.cancel",
        "object_type": "run",
        "object_id": "0d6f3a52-7a3f-4a47-9ab9-2f0a7a0f6d11",
    }
    return audit_record(tenant=tenant, **{**values, **overrides})


def test_an_admin_reads_the_tenants_audit_filtered(client, tenant, other_tenant, make_operator):
    client.force_login(make_operator(tenant, "admin"))
    _entry(tenant)
    _entry(tenant, actor="token:ci (hft_x…)", action="run.start")
    _entry(other_tenant, actor="user:mallory")
    page = client.get("/audit/").content.decode()
    assert "user:ann" in page and "token:ci" in page and "user:mallory" not in page
    filtered = client.get("/audit/", {"action": "run.start"}).content.decode()
    assert "token:ci" in filtered and "user:ann" not in filtered


def test_reading_the_audit_needs_its_permission(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "operator"))
    assert client.get("/audit/").status_code == 403


def test_the_audit_page_refuses_post(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "admin"))
    assert client.post("/audit/").status_code == 405


def test_an_empty_audit_explains_itself(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "admin"))
    assert b"Nothing has been done yet" in client.get("/audit/").content


def test_the_navigation_counts_what_needs_attention(client, tenant, make_operator):
    from agentruns.models import Run
    from tests.harness import Harness

    harness = Harness(tenant)
    run = harness.start("flow")
    Run.objects.filter(pk=run.id).update(status="blocked")
    client.force_login(make_operator(tenant, "viewer"))
    page = client.get("/runs/").content.decode()
    assert 'Blocked <span class="badge hot">1</span>' in page
    assert "Audit</a>" not in page  # viewers do not read the audit


@pytest.mark.django_db(transaction=True)
def test_the_audit_page_is_live_for_who_may_read_it(tenant, make_operator):
    admin, viewer = Client(), Client()
    admin.force_login(make_operator(tenant, "admin", username="adele"))
    viewer.force_login(make_operator(tenant, "viewer", username="vic"))
    address = socket_address(admin.get("/audit/").content.decode())
    assert address.startswith("/ws/live/audit/")

    async def scenario():
        socket = WebsocketCommunicator(application, address, headers=browser_headers(admin))
        assert (await socket.connect(timeout=20))[0]
        assert 'id="audit-entries" hx-swap-oob="true"' in await socket.receive_from(timeout=5)
        await database_sync_to_async(audit_record)(
            tenant=tenant,
            actor="user:ann",
            action="approval.approve",
            object_type="approval",
            object_id="7",
            after={"status": "approved"},
        )
        pushed = await pushed_until(socket, "approval.approve")
        assert "user:ann" in pushed
        await socket.disconnect()
        refused = WebsocketCommunicator(application, address, headers=browser_headers(viewer))
        code, _ = await refused_with(refused)
        assert code == 4404

    async_to_sync(scenario)()
