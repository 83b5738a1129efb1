"""Access to the dashboard: logged in, an operator of one tenant, holding the permission."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.services import user_actor_name

PERMISSION_NAMES = {
    "view_runs": "see runs",
    "start_runs": "start runs",
    "cancel_runs": "cancel runs",
    "retry_runs": "make runs retry now",
    "decide_approvals": "decide approvals",
    "settle_effects": "settle unknown effects",
    "view_audit": "read the audit log",
}


def forbidden(request: HttpRequest, reason: str) -> HttpResponse:
    return render(request, "accounts/forbidden.html", {"reason": reason}, status=403)


def operator_required(permission: str) -> Callable:
    """Let the view run only for a logged-in operator holding ``accounts.<permission>``.

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
            if not request.user.has_perm(f"accounts.{permission}"):
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
