"""The webhooks console: endpoints made, changed, rotated and disabled by the tenant's
admins (each audited, the secret shown once and nowhere else), the delivery log, live,
and nothing of another tenant."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from accounts.models import AuditEntry
from config.asgi import application
from tests.harness import browser_headers, pushed_until, socket_address
from webhooks.models import DeliveryStatus, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

FORM = {"url": "https://hooks.example/holdfast", "description": "CRM", "events": ["run.ended"]}


@pytest.fixture
def ada(world):
    client = Client()
    client.force_login(world.admin)
    return client


def _created(client, data=None) -> tuple[WebhookEndpoint, str, object]:
    response = client.post("/webhooks/new/", data or FORM)
    assert response.status_code == 200, response.content.decode()
    endpoint = WebhookEndpoint.objects.latest("pk")
    return endpoint, endpoint.secret, response


def test_an_admin_makes_an_endpoint_and_sees_its_secret_once(world, ada, caplog):
    caplog.set_level(logging.DEBUG)
    endpoint, secret, response = _created(ada)
    assert secret.startswith("whsec_")
    assert response["Cache-Control"] == "no-store"
    assert secret in response.content.decode()
    assert (endpoint.tenant, endpoint.url, endpoint.events) == (
        world.tenant,
        FORM["url"],
        ["run.ended"],
    )
    assert endpoint.created_by == "user:ada"
    # Never again: not on its page, the list, the edit form or the audit log.
    for url in ["/webhooks/", f"/webhooks/{endpoint.pk}/", f"/webhooks/{endpoint.pk}/edit/"]:
        page = ada.get(url)
        assert page.status_code == 200
        assert secret not in page.content.decode()
        assert secret.removeprefix("whsec_") not in page.content.decode()
    [entry] = AuditEntry.objects.filter(action="webhook.create")
    assert entry.actor == "user:ada"
    assert entry.object_id == str(endpoint.pk)
    assert entry.after == {**FORM, "is_active": True}
    assert secret.removeprefix("whsec_") not in str(list(AuditEntry.objects.values()))
    assert secret.removeprefix("whsec_") not in caplog.text


def test_bad_input_is_refused_with_the_reason_and_makes_nothing(ada):
    response = ada.post("/webhooks/new/", {"url": "ftp://files.example/x", "events": []})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Choose at least one event type." in page
    assert "Enter a valid URL." in page
    response = ada.post("/webhooks/new/", {**FORM, "events": ["run.started"]})
    assert response.status_code == 400
    assert not WebhookEndpoint.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="webhook.").exists()


def test_editing_is_audited_and_bad_input_changes_nothing(ada):
    endpoint, _, _ = _created(ada)
    response = ada.post(
        f"/webhooks/{endpoint.pk}/edit/",
        {**FORM, "url": "https://crm.example/in", "events": ["run.ended", "case.opened"]},
    )
    assert response.status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.url, endpoint.events) == (
        "https://crm.example/in",
        ["run.ended", "case.opened"],
    )
    [entry] = AuditEntry.objects.filter(action="webhook.edit")
    assert entry.before["url"] == FORM["url"]
    assert entry.after["events"] == ["run.ended", "case.opened"]
    response = ada.post(f"/webhooks/{endpoint.pk}/edit/", {"url": "", "events": []})
    assert response.status_code == 400
    endpoint.refresh_from_db()
    assert endpoint.url == "https://crm.example/in"
    assert AuditEntry.objects.filter(action="webhook.edit").count() == 1


def test_a_rotation_shows_the_new_secret_once_and_the_old_one_signs_for_a_day(ada):
    endpoint, old, _ = _created(ada)
    response = ada.post(f"/webhooks/{endpoint.pk}/rotate/")
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    endpoint.refresh_from_db()
    assert endpoint.secret != old and endpoint.secret in response.content.decode()
    assert endpoint.previous_secret == old
    assert endpoint.signing_secrets(now=endpoint.secret_rotated_at) == [endpoint.secret, old]
    assert endpoint.signing_secrets(now=endpoint.previous_secret_until) == [endpoint.secret]
    [entry] = AuditEntry.objects.filter(action="webhook.rotate")
    assert old.removeprefix("whsec_") not in str(entry.after)
    assert endpoint.secret.removeprefix("whsec_") not in str(entry.after)


def test_disabling_and_enabling_are_audited_once_each(ada):
    endpoint, _, _ = _created(ada)
    assert ada.post(f"/webhooks/{endpoint.pk}/disable/").status_code == 302
    assert ada.post(f"/webhooks/{endpoint.pk}/disable/").status_code == 302
    endpoint.refresh_from_db()
    assert not endpoint.is_active
    assert "disabled" in ada.get(f"/webhooks/{endpoint.pk}/").content.decode()
    assert ada.post(f"/webhooks/{endpoint.pk}/enable/").status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.is_active
    actions = list(
        AuditEntry.objects.filter(object_type="webhook_endpoint")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["webhook.create", "webhook.disable", "webhook.enable"]


def test_roles_without_manage_webhooks_are_refused(world, make_operator):
    endpoint, _ = world.endpoint()
    for role in ("viewer", "operator", "approver", "reconciler"):
        client = Client()
        client.force_login(make_operator(world.tenant, role, username=f"{role}-x"))
        assert client.get("/webhooks/").status_code == 403
        assert client.get(f"/webhooks/{endpoint.pk}/").status_code == 403
        assert client.post(f"/webhooks/{endpoint.pk}/rotate/").status_code == 403
        assert "Webhooks</a>" not in client.get("/runs/").content.decode()
    endpoint.refresh_from_db()
    assert endpoint.secret_rotated_at is None


def test_another_tenants_endpoints_and_deliveries_are_invisible(world, other_tenant, make_operator):
    endpoint, _ = world.endpoint()
    world.refund_ended()
    world.deliver_all()
    theirs = Client()
    theirs.force_login(make_operator(other_tenant, "admin", username="olga"))
    listing = theirs.get("/webhooks/").content.decode()
    assert endpoint.url not in listing and "acme receiver" not in listing
    for url in [f"/webhooks/{endpoint.pk}/", f"/webhooks/{endpoint.pk}/edit/"]:
        assert theirs.get(url).status_code == 404
    for action in ("rotate", "disable", "enable"):
        assert theirs.post(f"/webhooks/{endpoint.pk}/{action}/").status_code == 404
    endpoint.refresh_from_db()
    assert endpoint.is_active and endpoint.secret_rotated_at is None

    async def scenario():
        address = f"/ws/live/webhook/{endpoint.pk}/"
        socket = WebsocketCommunicator(application, address, headers=browser_headers(theirs))
        connected, _ = await socket.connect(timeout=20)
        assert connected
        await socket.receive_from(timeout=5)
        closed = await socket.receive_output(timeout=5)
        assert closed["code"] == 4404
        await socket.disconnect()

    async_to_sync(scenario)()


def test_the_delivery_log_shows_each_delivery_as_it_went(world, ada):
    endpoint, _ = world.endpoint()
    world.refund_ended()
    world.sandbox.arm("error_before", path="/hooks/acme")
    [run] = world.delivery_runs()
    world.harness.advance(run)
    page = ada.get(f"/webhooks/{endpoint.pk}/").content.decode()
    delivery = endpoint.deliveries.get()
    assert delivery.message_id in page
    assert "Failed, will be sent again" in page
    assert "HTTP 500" in page
    assert "Next retry" in page and 'class="delivery-attempts">1<' in page
    world.harness.drive(run)
    page = ada.get(f"/webhooks/{endpoint.pk}/").content.decode()
    assert 'class="delivery-state">Delivered<' in page
    assert "HTTP 200" in page and 'class="delivery-attempts">2<' in page
    assert "Webhooks</a>" in ada.get("/runs/").content.decode()


def test_the_log_is_pushed_when_a_delivery_moves(world, ada):
    endpoint, _ = world.endpoint()
    world.refund_ended()
    address = socket_address(ada.get(f"/webhooks/{endpoint.pk}/").content.decode())
    assert address == f"/ws/live/webhook/{endpoint.pk}/"
    [run] = world.delivery_runs()

    async def scenario():
        socket = WebsocketCommunicator(application, address, headers=browser_headers(ada))
        assert (await socket.connect(timeout=20))[0]
        snapshot = await socket.receive_from(timeout=5)
        assert 'id="webhook-log" hx-swap-oob="true"' in snapshot
        assert "Waiting to be sent" in snapshot
        await database_sync_to_async(world.harness.drive)(run)
        pushed = await pushed_until(socket, 'class="delivery-state">Delivered<')
        assert "HTTP 200" in pushed
        await socket.disconnect()

    async_to_sync(scenario)()
    assert endpoint.deliveries.get().status == DeliveryStatus.DELIVERED


def test_a_private_or_local_address_is_refused(ada, settings):
    settings.HOLDFAST_WEBHOOK_ALLOW_PRIVATE = False
    for url in (
        "http://127.0.0.1:8000/hooks",
        "http://10.0.0.5/in",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/in",
        "http://localhost/in",
    ):
        response = ada.post("/webhooks/new/", {**FORM, "url": url})
        assert response.status_code == 400, url
        assert "events are not posted there" in response.content.decode(), url
    assert not WebhookEndpoint.objects.exists()
