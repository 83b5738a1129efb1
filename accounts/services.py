"""Who is asking, which tenant they see, and the audit trail of what they did."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.client_address import client_address
from accounts.models import ApiToken, AuditEntry, Tenant
from accounts.privacy import mask


def audit_record(
    *,
    tenant: Tenant,
    actor: str,
    action: str,
    object_type: str,
    object_id: str,
    before: Any = None,
    after: Any = None,
    request=None,
) -> AuditEntry:
    remote_addr = None
    user_agent = ""
    if request is not None:
        remote_addr = client_address(request)
        user_agent = request.META.get("HTTP_USER_AGENT", "")[:300]
    return AuditEntry.objects.create(
        tenant=tenant,
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        # The trail records what changed, never a secret or an address in clear.
        before=mask(before),
        after=mask(after),
        remote_addr=remote_addr,
        user_agent=user_agent,
    )


def user_actor_name(user) -> str:
    """How a person appears as the actor of what they did (audit rows, runs, cases)."""
    return f"user:{user.get_username()}"


def token_actor(token: ApiToken) -> str:
    return f"token:{token.name} ({token.prefix}…)"


def for_tenant(queryset, tenant: Tenant):
    """The one place where what a caller may see is narrowed to their tenant.

    Every view and endpoint reads tenant-owned rows through this; an object of
    another tenant is simply not found (404), never forbidden (which would
    confirm it exists).
    """
    return queryset.filter(tenant=tenant)


def bearer_token(request) -> ApiToken | None:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return ApiToken.authenticate(secret.strip())


def api_token_revoke(*, token: ApiToken, actor: str, request=None) -> bool:
    """Revoke the token if it is still active and audit it; False if it already was revoked.

    A conditional UPDATE: two admins revoking at once write one revocation, one entry.
    """
    with transaction.atomic():
        revoked_at = timezone.now()
        won = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=revoked_at
        )
        if won:
            audit_record(
                tenant=token.tenant,
                actor=actor,
                action="token.revoke",
                object_type="apitoken",
                object_id=str(token.pk),
                before={"revoked_at": None},
                after={"revoked_at": revoked_at.isoformat()},
                request=request,
            )
    return bool(won)


def api_token_issue(
    *, owner, name: str, scopes: list[str] | None, actor: str, request=None
) -> tuple[ApiToken, str]:
    """Issue a token to an operator and audit it; the secret is returned once, never stored."""
    with transaction.atomic():
        token, secret = ApiToken.issue(owner=owner, name=name, scopes=scopes)
        audit_record(
            tenant=token.tenant,
            actor=actor,
            action="token.issue",
            object_type="apitoken",
            object_id=str(token.pk),
            after={
                "name": token.name,
                "prefix": token.prefix,
                "scopes": token.scopes,
                "owner": user_actor_name(owner),
            },
            request=request,
        )
    return token, secret
