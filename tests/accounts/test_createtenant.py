"""createtenant: a second tenant, and its first admin login, without the admin's raw forms."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command

from accounts.models import AuditEntry, Operator, Tenant
from tests.conftest import _grant_group_permissions

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a long and unusual passphrase 7"


@pytest.fixture
def admin_role(db):
    # Transactional tests flush the roles the data migration made.
    group, _ = Group.objects.get_or_create(name="admin")
    if not group.permissions.exists():
        _grant_group_permissions(group)
    return group


def test_it_creates_a_tenant_and_its_first_admin_on_the_new_tenants_record(
    admin_role, tmp_path, capsys, django_user_model
):
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    call_command(
        "createtenant", "acme", "--name", "Acme Ltd", "--admin", "alice",
        "--email", "alice@acme.example", "--password-file", str(secret),
    )  # fmt: skip
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.name == "Acme Ltd" and tenant.agent_config == {}
    user = django_user_model.objects.get(username="alice")
    assert user.check_password(PASSWORD) and user.operator.tenant == tenant
    assert list(user.groups.values_list("name", flat=True)) == ["admin"]
    assert user.has_perm("accounts.decide_approvals") and user.has_perm("accounts.view_audit")
    # The Django admin shows every tenant's records: a tenant's admin is not staff.
    assert not user.is_staff and not user.is_superuser
    created, operator = AuditEntry.objects.filter(tenant=tenant).order_by("id")
    assert (created.action, created.actor) == ("tenant.create", "command:createtenant")
    assert operator.action == "operator.create" and operator.after["username"] == "alice"
    assert operator.after["roles"] == ["admin"] and PASSWORD not in str(operator.after)
    out = capsys.readouterr().out
    assert "Created tenant acme (Acme Ltd)." in out and "setprovideraccount acme" in out


def test_a_tenant_alone_needs_no_login(db):
    call_command("createtenant", "solo")
    assert Tenant.objects.get(slug="solo").name == "solo"
    assert not Operator.objects.filter(tenant__slug="solo").exists()


def test_the_password_may_come_from_the_environment(admin_role, monkeypatch, django_user_model):
    monkeypatch.setenv("HOLDFAST_NEW_ADMIN_PASSWORD", PASSWORD)
    call_command("createtenant", "envco", "--admin", "erin")
    assert django_user_model.objects.get(username="erin").check_password(PASSWORD)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["not a slug"], "is not a slug"),
        (["tenant-x"], "a tenant 'tenant-x' exists already"),
        (["fresh", "--admin", "taken"], "the login 'taken' exists already"),
        (["fresh", "--admin", "bob"], "the password is refused"),
    ],
)
def test_it_refuses_what_cannot_be_made_and_makes_nothing(
    args, message, admin_role, django_user_model, monkeypatch
):
    Tenant.objects.create(slug="tenant-x", name="X")
    django_user_model.objects.create_user("taken", password=PASSWORD)
    monkeypatch.setenv("HOLDFAST_NEW_ADMIN_PASSWORD", "password" if "bob" in args else PASSWORD)
    before = (Tenant.objects.count(), django_user_model.objects.count())
    with pytest.raises(CommandError, match=message):
        call_command("createtenant", *args)
    assert (Tenant.objects.count(), django_user_model.objects.count()) == before
    assert not AuditEntry.objects.exists()


def test_a_login_without_a_password_to_read_is_refused(admin_role, monkeypatch):
    monkeypatch.delenv("HOLDFAST_NEW_ADMIN_PASSWORD", raising=False)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(CommandError, match="needs a password"):
        call_command("createtenant", "quiet", "--admin", "quinn")
    assert not Tenant.objects.filter(slug="quiet").exists()
