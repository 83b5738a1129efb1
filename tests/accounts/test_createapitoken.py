"""createapitoken: a token is issued to an operator, printed once, and on the record."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from accounts.models import ApiToken, AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_issues_a_token_to_the_owner_in_their_tenant_and_prints_it_once(
    tenant, make_operator, capsys
):
    owner = make_operator(tenant, "operator", username="olga")
    call_command("createapitoken", "ci", "--owner", "olga", "--scope", "runs:read")
    secret = capsys.readouterr().out.strip()
    token = ApiToken.authenticate(secret)
    assert token.name == "ci" and token.scopes == ["runs:read"]
    assert token.owner == owner and token.tenant == tenant
    assert secret not in token.token_hash
    [entry] = AuditEntry.objects.filter(action="token.issue")
    assert entry.tenant == tenant and entry.actor == "command:createapitoken"
    assert entry.after["owner"] == "user:olga" and secret not in str(entry.after)


def test_it_requires_an_owner(tenant):
    with pytest.raises(CommandError, match="--owner"):
        call_command("createapitoken", "ci")
    assert not ApiToken.objects.exists()


def test_it_refuses_an_unknown_or_deactivated_owner_or_one_who_is_no_operator(
    tenant, make_operator, django_user_model
):
    with pytest.raises(CommandError, match="no user 'ghost'"):
        call_command("createapitoken", "ci", "--owner", "ghost")
    gone = make_operator(tenant, "operator", username="gone")
    gone.is_active = False
    gone.save()
    with pytest.raises(CommandError, match="gone is deactivated"):
        call_command("createapitoken", "ci", "--owner", "gone")
    django_user_model.objects.create_user(username="outsider")
    with pytest.raises(CommandError, match="outsider is no operator"):
        call_command("createapitoken", "ci", "--owner", "outsider")
    assert not ApiToken.objects.exists()
