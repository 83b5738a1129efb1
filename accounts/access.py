"""Access to the dashboard: logged in, an operator of one tenant, holding the permission."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.models import ApiToken
from accounts.services import user_actor_name

PERMISSION_NAMES = {
    "view_runs": "see runs",
    "start_runs": "start runs",
    "cancel_runs": "cancel runs",
    "retry_runs": "make runs retry now",
    "decide_approvals": "decide approvals",
    "settle_effects": "settle unknown effects",
    "view_audit": "read the audit log",
    "webhooks.manage_webhooks": "manage webhook endpoints",
}


def forbidden(request: HttpRequest, reason: str) -> HttpResponse:
    return render(request, "accounts/forbidden.html", {"reason": reason}, status=403)


def operator_required(permission: str) -> Callable:
    """Let the view run only for a logged-in operator holding ``accounts.<permission>``
    (or ``<app>.<permission>`` when it names its app; any operator, whatever their
    role, when ``permission`` is "").

    Sets ``request.tenant``: views read tenant-owned rows through
    ``accounts.services.for_tenant(queryset, request.tenant)`` and nothing else.
    """

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            try:
                operator = request.user.operator
            except ObjectDoesNotExist:
                return forbidden(request, "Your login is not an operator of any tenant.")
            full = permission if "." in permission else f"accounts.{permission}"
            if permission and not request.user.has_perm(full):
                action = PERMISSION_NAMES.get(permission, permission)
                return forbidden(
                    request,
                    f"Your role does not allow you to {action}. Ask an admin of "
                    f"{operator.tenant} for a role that does.",
                )
            request.operator = operator
            request.tenant = operator.tenant
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def user_actor(request: HttpRequest) -> str:
    return user_actor_name(request.user)


def api_token_problem(token: ApiToken, permission: str) -> str | None:
    """Why the token may not act with ``accounts.<permission>`` now, or None if it may.

    A token acts as its owner: a token with no owner, an owner who is deactivated or
    no longer an operator of the token's tenant, or one whose role lacks the
    permission, is refused.
    """
    owner = token.owner
    if owner is None:
        return "this token has no owner; issue a new one with createapitoken --owner"
    if not owner.is_active:
        return f"this token's owner, {owner.get_username()}, is deactivated"
    try:
        operator = owner.operator
    except ObjectDoesNotExist:
        return f"this token's owner, {owner.get_username()}, is no operator of any tenant"
    if operator.tenant_id != token.tenant_id:
        return (
            f"this token's owner, {owner.get_username()}, no longer works for the "
            "token's tenant; issue a new one"
        )
    if not owner.has_perm(f"accounts.{permission}"):
        action = PERMISSION_NAMES.get(permission, permission)
        return f"this token's owner, {owner.get_username()}, may not {action}"
    return None
