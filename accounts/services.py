"""Who is asking, which tenant they see, and the audit trail of what they did."""

from __future__ import annotations

from typing import Any

from accounts.models import ApiToken, AuditEntry, Tenant


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
        remote_addr = request.META.get("REMOTE_ADDR") or None
        user_agent = request.META.get("HTTP_USER_AGENT", "")[:300]
    return AuditEntry.objects.create(
        tenant=tenant,
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        before=before,
        after=after,
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
