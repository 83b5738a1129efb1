"""What the admin may still change lands in the tenant's audit log; tokens stay as issued."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.utils import timezone

from accounts.models import ApiToken, AuditEntry, Operator
from agentruns.services import get_registry
from config.tenant_settings import approving_agents

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_operator(tenant, admin_user):
    Operator.objects.create(user=admin_user, tenant=tenant)
    return admin_user


def _settings(tenant) -> dict[str, str]:
    # The tenant settings form as it is shown, unchanged (config/tenant_settings.py).
    data = {
        "slug": tenant.slug,
        "name": tenant.name,
        "retention_days": str(tenant.retention_days),
        "personal_data_days": ""
        if tenant.personal_data_days is None
        else str(tenant.personal_data_days),
        "other_settings": "{}",
    }
    for agent in approving_agents(get_registry()):
        data[f"{agent.name}__approvals_enabled"] = "on"
        data[f"{agent.name}__auto_approve"] = "50.00 EUR"
    return data


def _entries(**filters):
    return list(AuditEntry.objects.filter(**filters).order_by("id"))


def test_a_tenant_changed_in_the_admin_is_audited_with_before_and_after(
    admin_client, admin_operator, tenant
):
    response = admin_client.post(
        f"/admin/accounts/tenant/{tenant.pk}/change/",
        {**_settings(tenant), "name": "Renamed", "refund_support__auto_approve": "80.00 EUR"},
    )
    assert response.status_code == 302
    [entry] = _entries(object_type="tenant")
    assert entry.tenant == tenant and entry.action == "admin.change"
    assert entry.actor == "user:admin" and entry.object_id == str(tenant.pk)
    assert entry.before["name"] == "Default" and entry.after["name"] == "Renamed"
    assert entry.after["agent_config"] == {
        "refund_support": {"approvals": {"auto_approve_up_to": {"eur": 8000}}}
    }
    assert entry.remote_addr == "127.0.0.1"


def test_a_tenant_cannot_be_deleted_in_the_admin(admin_client, tenant):
    assert admin_client.get(f"/admin/accounts/tenant/{tenant.pk}/delete/").status_code == 403


def test_an_operator_moved_to_another_tenant_is_audited_in_both(
    admin_client, make_operator, tenant, other_tenant
):
    user = make_operator(tenant, "viewer", username="vic")
    operator = user.operator
    response = admin_client.post(
        f"/admin/accounts/operator/{operator.pk}/change/",
        {"user": user.pk, "tenant": other_tenant.pk, "time_zone": "UTC"},
    )
    assert response.status_code == 302
    entries = _entries(object_type="operator")
    assert {e.tenant_id for e in entries} == {tenant.pk, other_tenant.pk}
    for entry in entries:
        assert entry.action == "admin.change"
        assert entry.before["tenant_id"] == tenant.pk
        assert entry.after["tenant_id"] == other_tenant.pk


def test_an_operator_added_and_deleted_in_the_admin_is_audited(
    admin_client, django_user_model, tenant
):
    user = django_user_model.objects.create_user(username="new-hire")
    response = admin_client.post(
        "/admin/accounts/operator/add/",
        {"user": user.pk, "tenant": tenant.pk, "time_zone": "Europe/Berlin"},
    )
    assert response.status_code == 302
    operator = Operator.objects.get(user=user)
    changelist = admin_client.get("/admin/accounts/operator/").content.decode()
    assert "delete_selected" in changelist  # a setting, unlike a record, may be deleted
    response = admin_client.post(
        "/admin/accounts/operator/",
        {"action": "delete_selected", "_selected_action": [operator.pk], "post": "yes"},
    )
    assert response.status_code == 302
    assert not Operator.objects.filter(pk=operator.pk).exists()
    added, deleted = _entries(object_type="operator")
    assert added.action == "admin.add" and added.after["time_zone"] == "Europe/Berlin"
    assert deleted.action == "admin.delete" and deleted.object_id == str(operator.pk)
    assert deleted.before["user_id"] == user.pk and deleted.after is None
    assert added.tenant == deleted.tenant == tenant


def test_an_unchanged_save_writes_no_entry(admin_client, tenant):
    response = admin_client.post(f"/admin/accounts/tenant/{tenant.pk}/change/", _settings(tenant))
    assert response.status_code == 302
    assert _entries() == []


@pytest.fixture
def olga(tenant, make_operator):
    return make_operator(tenant, "operator", username="olga")


def test_a_revoked_token_cannot_be_unrevoked_or_moved_in_the_admin(
    admin_client, tenant, other_tenant, olga, make_operator
):
    token, _ = ApiToken.issue(owner=olga, name="helpdesk")
    theirs = make_operator(other_tenant, "operator", username="theo")
    revoked_at = timezone.now()
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=revoked_at)
    url = f"/admin/accounts/apitoken/{token.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200  # shown, read-only
    assert 'name="revoked_at' not in page.content.decode()
    assert 'name="tenant"' not in page.content.decode()
    assert 'name="owner"' not in page.content.decode()
    response = admin_client.post(
        url,
        {
            "owner": theirs.pk,
            "tenant": other_tenant.pk,
            "name": "helpdesk",
            "scopes": '["runs:start"]',
            "revoked_at": "",
        },
    )
    assert response.status_code == 403
    token.refresh_from_db()
    assert token.tenant == tenant and token.owner == olga and token.revoked_at == revoked_at
    assert token.scopes == list(ApiToken.SCOPES)
    assert admin_client.get(f"/admin/accounts/apitoken/{token.pk}/delete/").status_code == 403


def test_revoking_tokens_in_the_admin_is_one_audited_action(admin_client, tenant, olga):
    token, secret = ApiToken.issue(owner=olga, name="helpdesk")
    changelist = admin_client.get("/admin/accounts/apitoken/").content.decode()
    assert "Revoke selected tokens" in changelist
    assert "delete_selected" not in changelist
    for _ in range(2):  # the second time it is already revoked: no second entry
        response = admin_client.post(
            "/admin/accounts/apitoken/",
            {"action": "revoke", "_selected_action": [token.pk]},
        )
        assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert ApiToken.authenticate(secret) is None
    [entry] = _entries(action="token.revoke")
    assert entry.tenant == tenant and entry.actor == "user:admin"
    assert entry.object_id == str(token.pk) and entry.before == {"revoked_at": None}


def test_the_admin_issues_a_token_to_an_operator_in_their_tenant_on_the_record(
    admin_client, other_tenant, make_operator
):
    theo = make_operator(other_tenant, "operator", username="theo")
    form = admin_client.get("/admin/accounts/apitoken/add/").content.decode()
    assert 'name="owner"' in form and 'name="tenant"' not in form
    response = admin_client.post(
        "/admin/accounts/apitoken/add/",
        {"owner": theo.pk, "name": "helpdesk", "scopes": ["runs:start", "runs:read"]},
    )
    assert response.status_code == 200
    token = ApiToken.objects.get(name="helpdesk")
    assert token.owner == theo and token.tenant == other_tenant
    # Shown once, on the answer's own page: never through messages (a cookie).
    page = response.content.decode()
    secret = page.split('id="issued-secret"', 1)[1].split(">", 1)[1].split("<", 1)[0]
    assert ApiToken.authenticate(secret) == token
    [entry] = _entries(action="token.issue")
    assert entry.tenant == other_tenant and entry.actor == "user:admin"
    assert entry.after["owner"] == "user:theo"


def test_the_admin_does_not_issue_a_token_without_an_owner(admin_client, django_user_model):
    outsider = django_user_model.objects.create_user(username="outsider")
    for owner in ["", outsider.pk]:  # no owner; a login who is no operator
        response = admin_client.post(
            "/admin/accounts/apitoken/add/",
            {"owner": owner, "name": "helpdesk", "scopes": '["runs:read"]'},
        )
        assert response.status_code == 200  # the form again, with the error
        assert "errorlist" in response.content.decode()
    assert not ApiToken.objects.exists()


def test_a_login_put_in_a_group_in_the_admin_is_audited_in_its_tenant(
    admin_client, make_operator, tenant
):
    user = make_operator(tenant, "viewer", username="vic")
    approver = Group.objects.get_or_create(name="approver")[0]
    viewer = Group.objects.get(name="viewer")
    page = admin_client.get(f"/admin/auth/user/{user.pk}/change/")
    assert page.status_code == 200
    form = {
        "username": "vic",
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "groups": [viewer.pk, approver.pk],
        "last_login_0": "",
        "last_login_1": "",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
    }
    response = admin_client.post(f"/admin/auth/user/{user.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    [entry] = _entries(object_type="user")
    assert entry.tenant == tenant and entry.action == "admin.change"
    assert entry.before["groups"] == ["viewer"]
    assert entry.after["groups"] == ["approver", "viewer"]
    assert "password" not in entry.after


def test_a_role_given_a_permission_is_audited_in_every_tenant(
    admin_client, make_operator, tenant, other_tenant
):
    make_operator(tenant, "viewer", username="vic")
    viewer = Group.objects.get(name="viewer")
    decide = Permission.objects.get(codename="decide_approvals")
    permissions = [*viewer.permissions.values_list("pk", flat=True), decide.pk]
    response = admin_client.post(
        f"/admin/auth/group/{viewer.pk}/change/",
        {"name": "viewer", "permissions": permissions},
    )
    assert response.status_code == 302
    entries = _entries(object_type="group")
    assert {e.tenant_id for e in entries} == {tenant.pk, other_tenant.pk}
    for entry in entries:
        assert "accounts.decide_approvals" not in entry.before["permissions"]
        assert "accounts.decide_approvals" in entry.after["permissions"]


def test_a_password_set_in_the_admin_is_audited_without_the_password(
    admin_client, make_operator, tenant
):
    user = make_operator(tenant, "viewer", username="vic")
    response = admin_client.post(
        f"/admin/auth/user/{user.pk}/password/",
        {"password1": "a new long passphrase", "password2": "a new long passphrase"},
    )
    assert response.status_code == 302
    [entry] = _entries(object_type="user")
    assert entry.action == "admin.password_change" and entry.tenant == tenant
    assert entry.after == {"username": "vic"}
    assert "passphrase" not in str(entry.before) + str(entry.after)
