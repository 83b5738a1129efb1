"""Every error the API answers, in one shape: ``{"error": "why", "errors": {field: [why]}}``.

``errors`` is there only when particular fields were wrong. Whatever raises the error
(an endpoint's ``ApiError``, ninja's validation, its authentication, Django's 404, a
body refused by ``api.parser``), a client system reads the same JSON.
"""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, ValidationError

# Where a value came from, as ninja names it in a validation error's location.
_SOURCES = {"body", "query", "path", "header", "cookie", "form", "file"}


class ErrorOut(Schema):
    """An error: what went wrong, in a sentence; per field, when fields were wrong."""

    error: str
    errors: dict[str, list[str]] | None = None


class ApiError(Exception):
    """An answer other than success, raised by an endpoint or the frame.

    ``extra`` goes into the body beside ``error`` (a conflicting run, say).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        errors: dict[str, list[str]] | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors
        self.headers = headers or {}
        self.extra = extra


def error_response(
    status: int,
    message: str,
    *,
    errors: dict[str, list[str]] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JsonResponse:
    body: dict[str, Any] = {"error": message, **extra}
    if errors:
        body["errors"] = errors
    response = JsonResponse(body, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def field_name(location: tuple | list, query_names=()) -> str:
    """A validation error's location as the field a client sent: ``input.order_id``,
    ``limit``, ``state``. The source (body, query) and the name of the endpoint's
    parameter the values are bound to are ninja's, not the client's; a repeated query
    parameter is named once, without the position of the bad value."""
    parts = [str(p) for p in location]
    source = parts.pop(0) if parts and parts[0] in _SOURCES else ""
    if source == "body" and parts:
        parts.pop(0)  # the parameter the body model is bound to
    elif source == "query":
        named = [i for i, part in enumerate(parts) if part in query_names]
        if named:
            parts = parts[named[0] : named[0] + 1]
        elif len(parts) > 1:
            parts = parts[1:2]  # (parameter, field): a field the client left out
    return ".".join(parts) or "body"


def field_errors(errors: list[dict[str, Any]], query_names=()) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for problem in errors:
        name = field_name(problem.get("loc", ()), query_names)
        found.setdefault(name, []).append(problem.get("msg", ""))
    return found


def install_handlers(api: NinjaAPI) -> None:
    """Give ``api`` the one error shape for everything ninja or Django may raise."""

    def api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
        return error_response(
            exc.status, exc.message, errors=exc.errors, headers=exc.headers, **exc.extra
        )

    def invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        return error_response(
            400,
            "the request has invalid fields",
            errors=field_errors(exc.errors, set(request.GET)),
        )

    def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return error_response(
            401,
            "a valid bearer token is required",
            headers={"WWW-Authenticate": 'Bearer realm="holdfast"'},
        )

    def forbidden(request: HttpRequest, exc: AuthorizationError) -> HttpResponse:
        return error_response(403, str(exc) or "this token may not do this")

    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        # ninja wraps what the body parser raised ("Cannot parse request body"): the
        # parser's own answer says why (api.parser).
        if isinstance(exc.__cause__, ApiError):
            return api_error(request, exc.__cause__)
        return error_response(exc.status_code, str(exc))

    def too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return error_response(
            413, f"the body is larger than {limit} bytes", errors={"body": ["too large"]}
        )

    def not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
        return error_response(404, str(exc) or f"nothing at {request.path}")

    api.add_exception_handler(ApiError, api_error)
    api.add_exception_handler(ValidationError, invalid)
    api.add_exception_handler(AuthenticationError, unauthenticated)
    api.add_exception_handler(AuthorizationError, forbidden)
    api.add_exception_handler(HttpError, http_error)
    api.add_exception_handler(Http404, not_found)
    api.add_exception_handler(RequestDataTooBig, too_big)


def json_not_allowed(view):
    """``view`` (one of ninja's path views), with its 405 in the API's JSON shape."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs):
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            allowed = response["Allow"]
            return error_response(
                405,
                f"{request.method} is not allowed here; use {allowed}",
                headers={"Allow": allowed},
            )
        return response

    return wrapped


@csrf_exempt  # nothing here acts; a POST gets the JSON 404, not an HTML 403
def not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """Every address under /api/ that names nothing: a JSON 404, never the site's HTML page."""
    return error_response(404, f"no such API address: {request.path}")


def json_urls(urls: tuple) -> tuple:
    """``api.urls`` with every path view answering a wrong method in JSON, and the
    API's root (which ninja answers with Django's HTML 404) a JSON 404."""
    patterns, app_name, namespace = urls
    for pattern in patterns:
        if pattern.name == "api-root":
            pattern.callback = not_found
        else:
            pattern.callback = json_not_allowed(pattern.callback)
    return patterns, app_name, namespace


# The statuses every operation may answer besides its own, documented with ErrorOut.
COMMON_ERRORS = {
    401: ErrorOut,
    403: ErrorOut,
}
