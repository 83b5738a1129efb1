"""Both login pages lock a username and address pair out after the configured failures.

django-axes counts; Holdfast audits each failure and lockout in the tenant of the
operator whose username was tried, and the page says until when and what to do.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import AsyncClient

from accounts.models import AuditEntry

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery"
LIMIT = settings.AXES_FAILURE_LIMIT
COOL_OFF = settings.AXES_COOLOFF_TIME
PAGES = ["/accounts/login/", "/admin/login/"]
NINE_O_CLOCK = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def ann(tenant, make_operator):
    user = make_operator(tenant, "viewer", username="ann")
    # Staff, so the admin's login page would let her in too.
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    return user


def log_in(client, page, password, username="ann", **extra):
    return client.post(page, {"username": username, "password": password}, **extra)


def fail(client, page, times, username="ann", **extra):
    for _ in range(times):
        log_in(client, page, "not my password", username, **extra)


def logged_in(client) -> bool:
    return "_auth_user_id" in client.session


def test_the_settings_lock_out_after_five_failures_for_fifteen_minutes():
    assert LIMIT == 5 and timedelta(minutes=15) == COOL_OFF
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


@pytest.mark.parametrize("page", PAGES)
def test_it_locks_the_pair_out_and_refuses_even_the_right_password(client, ann, page):
    for attempt in range(1, LIMIT):
        assert log_in(client, page, "not my password").status_code == 200, attempt
    assert log_in(client, page, "not my password").status_code == 429
    refused = log_in(client, page, PASSWORD)
    assert refused.status_code == 429
    assert not logged_in(client)


@pytest.mark.parametrize("page", PAGES)
def test_the_page_says_until_when_and_what_to_do(client, ann, page):
    with time_machine.travel(NINE_O_CLOCK, tick=False):
        fail(client, page, LIMIT)
        response = log_in(client, page, PASSWORD)
    text = response.content.decode()
    assert response.status_code == 429
    assert "Too many failed logins" in text
    assert "locked until 09:15 UTC (in 15" in text
    assert "even with the right password" in text
    assert "ask an" in text and "administrator" in text
    # The form is still there, posting back to the page it came from.
    assert f'action="{page}"' in text and 'name="password"' in text


def test_the_lockout_ends_when_the_page_says_and_trying_meanwhile_does_not_extend_it(client, ann):
    page = "/accounts/login/"
    with time_machine.travel(NINE_O_CLOCK, tick=False) as clock:
        fail(client, page, LIMIT)
        clock.shift(COOL_OFF - timedelta(minutes=1))
        assert log_in(client, page, PASSWORD).status_code == 429
        clock.shift(timedelta(minutes=1, seconds=1))
        response = log_in(client, page, PASSWORD)
        assert response.status_code == 302 and logged_in(client)


def test_a_success_resets_the_count(client, ann):
    page = "/accounts/login/"
    fail(client, page, LIMIT - 1)
    assert log_in(client, page, PASSWORD).status_code == 302
    client.logout()
    fail(client, page, LIMIT - 1)
    assert log_in(client, page, PASSWORD).status_code == 302


def test_the_lock_is_per_username_and_address(client, ann, tenant, make_operator):
    make_operator(tenant, "viewer", username="bob")
    page = "/accounts/login/"
    fail(client, page, LIMIT)
    # The same address, another login.
    assert log_in(client, page, PASSWORD, username="bob").status_code == 302
    client.logout()
    # The same login, from elsewhere.
    assert log_in(client, page, PASSWORD, REMOTE_ADDR="198.51.100.7").status_code == 302


def test_behind_a_trusted_proxy_each_client_is_counted_apart(client, ann, settings):
    settings.HOLDFAST_TRUSTED_PROXIES = ["10.0.0.0/8"]
    page = "/accounts/login/"
    via_proxy = {"REMOTE_ADDR": "10.0.0.5"}
    fail(client, page, LIMIT, HTTP_X_FORWARDED_FOR="203.0.113.9", **via_proxy)
    locked = log_in(client, page, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.9", **via_proxy)
    assert locked.status_code == 429
    # Another client through the same proxy is not the one who failed.
    ok = log_in(client, page, PASSWORD, HTTP_X_FORWARDED_FOR="198.51.100.7", **via_proxy)
    assert ok.status_code == 302


def test_failures_and_the_lockout_are_in_the_audit_log_of_the_operators_tenant(client, ann, tenant):
    page = "/admin/login/"
    with time_machine.travel(NINE_O_CLOCK, tick=False):
        fail(client, page, LIMIT)
        log_in(client, page, PASSWORD)
    entries = list(AuditEntry.objects.filter(tenant=tenant).order_by("id"))
    failed = [e for e in entries if e.action == "login.failed"]
    [locked] = [e for e in entries if e.action == "login.locked_out"]
    assert len(failed) == LIMIT + 1
    assert [e.after["reason"] for e in failed] == ["wrong username or password"] * LIMIT + [
        "locked out"
    ]
    assert [e.after.get("failures") for e in failed] == [*range(1, LIMIT + 1), None]
    assert locked.after["failures"] == LIMIT
    assert locked.after["until"] == (NINE_O_CLOCK + COOL_OFF).isoformat()
    for entry in entries:
        assert entry.actor == "anonymous"
        assert (entry.object_type, entry.object_id) == ("user", str(ann.pk))
        assert entry.after["username"] == "ann" and entry.after["page"] == page
        assert entry.remote_addr == "127.0.0.1"


def test_a_username_of_no_tenant_is_logged_instead(client, caplog, admin_user):
    caplog.set_level(logging.WARNING, logger="holdfast.logins")
    log_in(client, "/accounts/login/", "guess", username="nobody")
    log_in(client, "/admin/login/", "guess", username=admin_user.username)
    assert not AuditEntry.objects.exists()
    assert "login.failed for 'nobody' from 127.0.0.1 (no tenant)" in caplog.text
    assert f"login.failed for '{admin_user.username}' from 127.0.0.1 (no tenant)" in caplog.text


def test_under_asgi_the_locked_out_page_is_the_same(ann):
    # daphne runs the middleware asynchronously, where axes calls the lockout page
    # with its arguments in another order.
    client = AsyncClient()
    post = async_to_sync(client.post)
    for _ in range(LIMIT):
        post("/accounts/login/", {"username": "ann", "password": "not my password"})
    response = post("/accounts/login/", {"username": "ann", "password": PASSWORD})
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
