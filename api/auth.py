"""Who is calling: a bearer token (``accounts.models.ApiToken``) acting as its owner.

Every operation is declared with ``operation(scope, …)``, which documents the scope and
authenticates with ``TokenAuth(scope)``: 401 without a valid token; 403 naming what is
missing unless the token carries the scope and its owner holds the scope's permission
(``ApiToken.SCOPE_RIGHTS``) in the token's tenant. The operation then finds the token
in ``request.auth``. ``audit`` records an action with the owner as actor and the token
in the entry.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from accounts.access import api_token_problem
from accounts.models import ApiToken, AuditEntry
from accounts.services import audit_record, token_actor, user_actor_name
from api.errors import COMMON_ERRORS, ApiError


class TokenAuth(HttpBearer):
    """``Authorization: Bearer hft_…``: an active token allowed ``scope``.

    No valid token: None, which ninja answers with 401. A token that may not do
    ``scope`` now: ``ApiError`` 403 naming why. This runs before ninja reads the body
    or the query, so a caller without the right learns nothing from validation.
    """

    def __init__(self, scope: str | None = None):
        super().__init__()
        self.scope = scope

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        secret = token.strip()
        found = ApiToken.authenticate(secret) if secret else None
        if found is not None and self.scope is not None:
            require(found, self.scope)
        return found


def require(token: ApiToken, scope: str) -> None:
    """Nothing if ``token`` may do ``scope`` now; else ``ApiError`` 403 with why.

    The owner is checked first (deactivated, moved to another tenant, or without the
    scope's permission), then the token's own scopes; a token allowed is stamped used.
    """
    permission = ApiToken.SCOPE_RIGHTS[scope][0]
    problem = api_token_problem(token, permission)
    if problem:
        raise ApiError(403, problem)
    if not token.allows(scope):
        raise ApiError(403, f"this token may not do {scope}")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())


def actor(token: ApiToken) -> str:
    """Who acts through the token: its owner, as they appear everywhere else."""
    return user_actor_name(token.owner)


def audit(
    request: HttpRequest,
    token: ApiToken,
    *,
    action: str,
    object_type: str,
    object_id: Any,
    before: Any = None,
    after: dict[str, Any] | None = None,
) -> AuditEntry:
    """An audit row for what the token's owner did through the API; the token is named
    in ``after`` so the trail tells a click from a client system's call."""
    return audit_record(
        tenant=token.tenant,
        actor=actor(token),
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        before=before,
        after={**(after or {}), "token": token_actor(token)},
        request=request,
    )


def operation(
    scope: str, *, summary: str, description: str, response: dict[int, Any], url_name: str
) -> dict[str, Any]:
    """The keyword arguments of a router's decorator for an operation needing ``scope``:
    it authenticates with ``TokenAuth(scope)``, and its documentation names the scope
    and the owner's permission (also as ``x-holdfast-scope`` and
    ``x-holdfast-permission``) and every error status it may answer besides
    ``response``'s own (401, 403). One declaration: what is documented is enforced."""
    permission = ApiToken.SCOPE_RIGHTS[scope][0]
    return {
        "summary": summary,
        "description": (
            f"{description}\n\n**Scope:** `{scope}`. **Permission** of the token's owner: "
            f"`{permission}`."
        ),
        "response": {**response, **COMMON_ERRORS},
        "openapi_extra": {"x-holdfast-scope": scope, "x-holdfast-permission": permission},
        "url_name": url_name,
        "auth": TokenAuth(scope),
    }
