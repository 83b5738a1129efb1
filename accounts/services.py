"""Who is asking, which tenant they see, and the audit trail of what they did."""

from __future__ import annotations

import zoneinfo
from typing import Any

from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction
from django.utils import timezone

from accounts.client_address import client_address
from accounts.models import ApiToken, AuditEntry, Operator, Tenant
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


def through(token: ApiToken | None, after: dict[str, Any]) -> dict[str, Any]:
    """An audit entry's ``after`` for an action taken through ``token`` (named in it, so
    the trail tells a click from a client system's call), or ``after`` as it is."""
    return {**after, "token": token_actor(token)} if token is not None else after


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


class TenantRefused(ValueError):
    """A tenant or its first login that cannot be made (the message says why)."""


def tenant_create(
    *,
    slug: str,
    name: str,
    actor: str,
    admin_username: str = "",
    admin_email: str = "",
    admin_password: str = "",
) -> tuple[Tenant, Any]:
    """A new tenant, and with ``admin_username`` its first operator in the admin role,
    all or nothing, each on the new tenant's audit log. Returns (tenant, login or None).

    The login may use the console with every operator permission; it is not staff: the
    Django admin shows every tenant's records, so it stays the deployment's own.
    """
    try:
        validate_slug(slug)
    except ValidationError:
        raise TenantRefused(
            f"{slug!r} is not a slug: use letters, digits, hyphens and underscores"
        ) from None
    if len(slug) > Tenant._meta.get_field("slug").max_length:
        raise TenantRefused(f"{slug!r} is longer than 64 characters")
    if Tenant.objects.filter(slug=slug).exists():
        raise TenantRefused(f"a tenant {slug!r} exists already")
    User = get_user_model()
    group = None
    if admin_username:
        if User._default_manager.filter(username=admin_username).exists():
            raise TenantRefused(
                f"the login {admin_username!r} exists already; a login works for one tenant"
            )
        group = Group.objects.filter(name="admin").first()
        if group is None:
            raise TenantRefused("there is no admin role: run manage.py migrate first")
        candidate = User(username=admin_username, email=admin_email)
        try:
            password_validation.validate_password(admin_password, candidate)
        except ValidationError as exc:
            raise TenantRefused("the password is refused: " + " ".join(exc.messages)) from None
    with transaction.atomic():
        tenant = Tenant.objects.create(slug=slug, name=name or slug)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="tenant.create",
            object_type="tenant",
            object_id=str(tenant.pk),
            after={"slug": tenant.slug, "name": tenant.name},
        )
        user = None
        if admin_username:
            user = User._default_manager.create_user(admin_username, admin_email, admin_password)
            user.groups.add(group)
            operator = Operator.objects.create(user=user, tenant=tenant)
            audit_record(
                tenant=tenant,
                actor=actor,
                action="operator.create",
                object_type="operator",
                object_id=str(operator.pk),
                after={"username": admin_username, "email": admin_email, "roles": ["admin"]},
            )
    return tenant, user


TIME_ZONE_ACTION = "operator.time_zone"


class TimeZoneRefused(ValueError):
    """Not a time zone Holdfast knows (the message says what to choose instead)."""


def time_zone_names() -> list[str]:
    """The zones an operator may pick: the IANA names this system's zoneinfo holds."""
    return sorted(zoneinfo.available_timezones())


def time_zone_chosen(operator: Operator) -> bool:
    """Whether the operator's zone was ever set, by them or from their browser (audited)."""
    return AuditEntry.objects.filter(
        tenant_id=operator.tenant_id,
        object_type="operator",
        object_id=str(operator.pk),
        action=TIME_ZONE_ACTION,
    ).exists()


def operator_time_zone_set(
    *, operator: Operator, time_zone: str, from_browser: bool = False, request=None
) -> bool:
    """Show the operator's times in ``time_zone`` from now on, audited; False if nothing changed.

    ``from_browser``: the zone the operator's browser reports, taken only while the
    operator has never chosen one (the first page they open); a choice always wins.
    """
    time_zone = (time_zone or "").strip()
    if time_zone not in zoneinfo.available_timezones():
        raise TimeZoneRefused(
            f"“{time_zone}” is not a time zone Holdfast knows: choose one from the list, "
            "a region and a city such as Europe/Berlin"
            if time_zone
            else "choose a time zone from the list"
        )
    with transaction.atomic():
        # Locked: two first pages opened at once record the browser's zone once.
        current = Operator.objects.select_for_update().get(pk=operator.pk)
        chosen = time_zone_chosen(current)
        if from_browser and chosen:
            return False
        if current.time_zone == time_zone and chosen:
            return False
        before = current.time_zone
        Operator.objects.filter(pk=current.pk).update(time_zone=time_zone)
        audit_record(
            tenant=current.tenant,
            actor=user_actor_name(current.user),
            action=TIME_ZONE_ACTION,
            object_type="operator",
            object_id=str(current.pk),
            before={"time_zone": before},
            after={"time_zone": time_zone, "source": "browser" if from_browser else "chosen"},
            request=request,
        )
    operator.time_zone = time_zone
    return True
