"""A tenant's own provider accounts: references to secrets, read at call time, on the record."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from accounts.models import AuditEntry, ProviderAccount
from accounts.provider_accounts import (
    credentials,
    provider_account_remove,
    provider_account_set,
)
from agentruns.runtime import CallInfo, ToolRefused
from agentruns.services import credential_source

pytestmark = pytest.mark.django_db


def _set(tenant, provider="payments", **fields):
    values = {"endpoint": "", "secret_ref": "", "sender": "", **fields}
    return provider_account_set(tenant=tenant, provider=provider, actor="user:root", **values)


def test_the_default_tenant_without_accounts_acts_with_the_deployments_settings(tenant, settings):
    settings.PAYMENTS_API_BASE = "https://payments.example"
    settings.PAYMENTS_API_KEY = "sk_test_deployment"
    settings.DEFAULT_FROM_EMAIL = "help@shop.example"
    payments = credentials(tenant.pk, "payments")
    assert (payments.endpoint, payments.secret) == (
        "https://payments.example",
        "sk_test_deployment",
    )
    assert credentials(tenant.pk, "mail").sender == "help@shop.example"


def test_another_tenant_without_an_account_is_refused_never_given_the_deployments(
    other_tenant, settings
):
    settings.PAYMENTS_API_KEY = "sk_test_deployment"
    with pytest.raises(LookupError, match="tenant 'other' has no payments account"):
        credentials(other_tenant.pk, "payments")


def test_a_secret_is_read_from_its_environment_variable_at_each_call(other_tenant, monkeypatch):
    _set(other_tenant, secret_ref="env:HOLDFAST_SECRET_OTHER_PAYMENTS")
    monkeypatch.setenv("HOLDFAST_SECRET_OTHER_PAYMENTS", "sk_test_other_1")
    assert credentials(other_tenant.pk, "payments").secret == "sk_test_other_1"
    # Rotated: the next call uses the new key, nothing was cached or stored.
    monkeypatch.setenv("HOLDFAST_SECRET_OTHER_PAYMENTS", "sk_test_other_2")
    assert credentials(other_tenant.pk, "payments").secret == "sk_test_other_2"
    assert "sk_test_other" not in str(ProviderAccount.objects.values().get())
    monkeypatch.delenv("HOLDFAST_SECRET_OTHER_PAYMENTS")
    with pytest.raises(LookupError, match="HOLDFAST_SECRET_OTHER_PAYMENTS is not set"):
        credentials(other_tenant.pk, "payments")


def test_a_secret_is_read_from_a_file_in_the_secrets_directory(other_tenant, settings, tmp_path):
    settings.HOLDFAST_SECRETS_DIR = tmp_path
    (tmp_path / "other-shop").write_text("sk_test_other_shop\n")
    _set(other_tenant, "shop", endpoint="https://shop.other.example", secret_ref="file:other-shop")
    shop = credentials(other_tenant.pk, "shop")
    assert (shop.endpoint, shop.secret) == ("https://shop.other.example", "sk_test_other_shop")
    (tmp_path / "other-shop").write_text("")
    with pytest.raises(LookupError, match="other-shop is missing or empty"):
        credentials(other_tenant.pk, "shop")


def test_a_blank_endpoint_is_the_deployments_but_the_secret_is_always_the_tenants(
    other_tenant, settings, monkeypatch
):
    settings.PAYMENTS_API_BASE = "https://api.stripe.example"
    settings.PAYMENTS_API_KEY = "sk_live_deployment"
    monkeypatch.setenv("HOLDFAST_SECRET_OTHER", "sk_live_other")
    _set(other_tenant, secret_ref="env:HOLDFAST_SECRET_OTHER")
    payments = credentials(other_tenant.pk, "payments")
    assert (payments.endpoint, payments.secret) == ("https://api.stripe.example", "sk_live_other")
    assert "sk_live_other" not in repr(payments)


@pytest.mark.parametrize(
    "reference",
    [
        "env:DJANGO_SECRET_KEY",  # the deployment's own secrets cannot be named
        "env:DATABASE_URL",
        "file:../secret_key",  # a name in the secrets directory, never a path
        "file:/etc/passwd",
        "sk_test_pasted_by_mistake",  # the secret itself is not a reference
        "vault:kv/other",
    ],
)
def test_a_reference_that_could_reach_other_secrets_is_refused(other_tenant, reference):
    with pytest.raises(ValidationError) as refused:
        _set(other_tenant, secret_ref=reference)
    assert "is not a secret reference" in str(refused.value.message_dict["secret_ref"])
    assert not ProviderAccount.objects.exists()
    assert not AuditEntry.objects.filter(action="provider_account.set").exists()


def test_an_account_says_what_it_lacks(other_tenant):
    with pytest.raises(ValidationError) as refused:
        _set(other_tenant, "mail")
    assert refused.value.message_dict == {
        "sender": ["a mail account needs the address mail is sent from"]
    }
    with pytest.raises(ValidationError) as refused:
        _set(other_tenant, "payments")
    assert "secret_ref" in refused.value.message_dict
    with pytest.raises(ValidationError) as refused:
        _set(other_tenant, "fax", secret_ref="env:HOLDFAST_SECRET_FAX")
    assert "unknown provider" in str(refused.value.message_dict["provider"])


def test_setting_and_removing_an_account_is_audited_with_the_reference_never_a_secret(
    other_tenant, monkeypatch
):
    monkeypatch.setenv("HOLDFAST_SECRET_OTHER", "sk_test_other")
    account = _set(other_tenant, secret_ref="env:HOLDFAST_SECRET_OTHER")
    _set(other_tenant, secret_ref="env:HOLDFAST_SECRET_OTHER", endpoint="https://p.example")
    assert provider_account_remove(tenant=other_tenant, provider="payments", actor="user:root")
    entries = list(AuditEntry.objects.filter(tenant=other_tenant).order_by("id"))
    assert [e.action for e in entries] == [
        "provider_account.set",
        "provider_account.set",
        "provider_account.remove",
    ]
    assert entries[0].before is None
    assert entries[0].after["secret_ref"] == "env:HOLDFAST_SECRET_OTHER"
    assert entries[1].before["endpoint"] == "" and entries[1].after["endpoint"] == (
        "https://p.example"
    )
    assert entries[2].object_id == str(account.pk)
    assert "sk_test_other" not in str([(e.before, e.after) for e in entries])


def test_a_tool_asking_for_a_missing_account_is_refused_before_anything_is_sent(other_tenant):
    call = CallInfo(
        run_id="r",
        step_id="s",
        effect_key=None,
        attempt=1,
        timeout=1.0,
        config={},
        tenant_id=other_tenant.pk,
        credential_source=credential_source(),
    )
    with pytest.raises(ToolRefused) as refused:
        call.credentials("payments")
    assert refused.value.error_class == "no_provider_account"
    assert "tenant 'other' has no payments account" in str(refused.value)


def test_the_command_sets_shows_checks_and_removes_an_account(other_tenant, capsys, monkeypatch):
    call_command("setprovideraccount", "other", "payments", "--secret", "env:HOLDFAST_SECRET_OTHER")
    call_command("setprovideraccount", "other", "--check")
    shown = capsys.readouterr().out
    assert "other payments: endpoint=(ours), secret=env:HOLDFAST_SECRET_OTHER" in shown
    assert "HOLDFAST_SECRET_OTHER is not set" in shown
    assert "other shop: none" in shown
    monkeypatch.setenv("HOLDFAST_SECRET_OTHER", "sk_test_other")
    call_command("setprovideraccount", "other", "--check")
    assert "other payments: endpoint=(ours), secret=env:HOLDFAST_SECRET_OTHER  [usable]" in (
        capsys.readouterr().out
    )
    with pytest.raises(CommandError, match="is not a secret reference"):
        call_command("setprovideraccount", "other", "shop", "--secret", "env:DATABASE_URL")
    with pytest.raises(CommandError, match="no tenant 'nobody'"):
        call_command("setprovideraccount", "nobody")
    call_command("setprovideraccount", "other", "payments", "--remove")
    assert not ProviderAccount.objects.exists()


def test_admin_changes_to_an_account_are_audited(client, other_tenant, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-1")
    client.force_login(root)
    answer = client.post(
        "/admin/accounts/provideraccount/add/",
        {
            "tenant": other_tenant.pk,
            "provider": "payments",
            "endpoint": "",
            "secret_ref": "env:DJANGO_SECRET_KEY",
            "sender": "",
        },
    )
    assert answer.status_code == 200
    assert "is not a secret reference" in answer.content.decode()
    assert not ProviderAccount.objects.exists()
    answer = client.post(
        "/admin/accounts/provideraccount/add/",
        {
            "tenant": other_tenant.pk,
            "provider": "payments",
            "endpoint": "",
            "secret_ref": "env:HOLDFAST_SECRET_OTHER",
            "sender": "",
        },
    )
    assert answer.status_code == 302
    entry = AuditEntry.objects.get(tenant=other_tenant, action="admin.add")
    assert entry.after["secret_ref"] == "env:HOLDFAST_SECRET_OTHER"
