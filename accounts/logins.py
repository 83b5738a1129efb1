"""Failed logins and lockouts: what the audit log records and what a locked-out person reads.

django-axes counts failures per username and address and refuses a pair that failed
``AXES_FAILURE_LIMIT`` times until ``AXES_COOLOFF_TIME`` has passed since its last
failure (config/settings.py). This module is what Holdfast adds to it:

- every failed login, and every lockout, is an audit entry in the tenant of the
  operator whose username was tried (a username that is nobody's operator is logged);
- the login page says why it refuses, until when, and what to do.

``config/wiring.py`` connects the two receivers, after axes' own (axes is installed
before the apps), so a failure axes just counted shows its count here.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from accounts.client_address import client_address
from accounts.models import Tenant
from accounts.services import audit_record

logger = logging.getLogger("holdfast.logins")

# Who acts in a failed login: nobody known yet, whatever username they typed.
ANONYMOUS_ACTOR = "anonymous"


def _tenant_of(username: str | None) -> tuple[Tenant | None, int | None]:
    """The tenant of the operator with this username, and the login's id, if there is one."""
    if not username:
        return None, None
    user = (
        get_user_model()
        ._default_manager.filter(**{get_user_model().USERNAME_FIELD: username})
        .select_related("operator__tenant")
        .first()
    )
    if user is None:
        return None, None
    try:
        return user.operator.tenant, user.pk
    except ObjectDoesNotExist:
        return None, user.pk


def lockout_ends_at(*, username: str | None, ip_address: str | None) -> datetime:
    """When the lockout of this username and address ends: its last counted failure + cool-off.

    Attempts refused while locked out are not counted (AXES_RESET_COOL_OFF_ON_FAILURE_
    DURING_LOCKOUT is off), so this time does not move while someone keeps trying.
    """
    last = (
        AccessAttempt.objects.filter(username=username, ip_address=ip_address)
        .order_by("-attempt_time")
        .values_list("attempt_time", flat=True)
        .first()
    )
    return (last or timezone.now()) + get_cool_off()


def _audit_login(request: HttpRequest, *, username: str | None, action: str, after: dict) -> None:
    tenant, user_id = _tenant_of(username)
    if tenant is None:
        # No tenant's log to write it in: a username nobody has, or a login that is
        # nobody's operator (a bare superuser).
        logger.warning(
            "%s for %r from %s (no tenant): %s",
            action,
            username,
            client_address(request),
            after,
        )
        return
    audit_record(
        tenant=tenant,
        actor=ANONYMOUS_ACTOR,
        action=action,
        object_type="user",
        object_id=str(user_id),
        after={"username": username, "page": request.path, **after},
        request=request,
    )


def record_failed_login(sender, credentials: dict, request: HttpRequest | None = None, **kwargs):
    """Receiver of ``user_login_failed``: one ``login.failed`` entry per refused attempt."""
    if request is None:
        return
    username = get_client_username(request, credentials)
    # axes' backend marks the request before the password is checked when the pair is
    # already locked out; then axes counts nothing and leaves the count unset.
    refused_while_locked = getattr(request, "axes_locked_out", False) and (
        getattr(request, "axes_failures_since_start", None) is None
    )
    after = {"reason": "locked out" if refused_while_locked else "wrong username or password"}
    failures = getattr(request, "axes_failures_since_start", None)
    if failures is not None:
        after["failures"] = failures
    _audit_login(request, username=username, action="login.failed", after=after)


def record_lockout(sender, request: HttpRequest, username: str | None, ip_address, **kwargs):
    """Receiver of axes' ``user_locked_out``: one ``login.locked_out`` entry when a lockout starts.

    axes sends the signal again for every attempt refused while locked out; those are
    ``login.failed`` entries (reason "locked out"), not new lockouts.
    """
    failures = getattr(request, "axes_failures_since_start", None)
    if failures is None:
        return
    ends_at = lockout_ends_at(username=username, ip_address=ip_address)
    _audit_login(
        request,
        username=username,
        action="login.locked_out",
        after={"failures": failures, "until": ends_at.isoformat()},
    )


def lockout_response(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the login page, saying why it refuses, until when, what to do.

    Both login pages answer with it (the admin's too); its form posts back to the page
    it was asked from. axes calls it with the response and the credentials, in an order
    that differs between its sync and async middleware, so it reads neither.
    """
    username = get_client_username(request, getattr(request, "axes_credentials", None))
    ends_at = lockout_ends_at(
        username=username, ip_address=getattr(request, "axes_ip_address", None)
    )
    context = {
        "form": AuthenticationForm(request, initial={"username": username}),
        "next": request.POST.get("next", request.GET.get("next", "")),
        "lockout": {
            "username": username,
            "ends_at": ends_at,
            "ends_at_utc": ends_at.astimezone(UTC).strftime("%H:%M UTC"),
        },
    }
    return render(request, "registration/login.html", context, status=429)
