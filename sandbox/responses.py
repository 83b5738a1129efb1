"""What a sandbox handler answers: a status, a JSON body and headers; and Stripe's errors."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str, length: int = 24) -> str:
    """A Stripe-shaped object id: ``re_`` + random alphanumerics."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


@dataclass
class Response:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)
    # Close the socket without writing anything (the "lost reply" fault).
    drop: bool = False


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload), dict(headers or {}))


class ApiError(Exception):
    """A Stripe error: answered as ``{"error": {...}}`` with the HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def payload(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.code:
            error["code"] = self.code
            error["doc_url"] = f"https://stripe.com/docs/error-codes/{self.code.replace('_', '-')}"
        if self.param:
            error["param"] = self.param
        return {"error": error}

    def response(self) -> Response:
        return json_response(self.status, self.payload(), self.headers)


def resource_missing(kind: str, object_id: str, param: str = "id") -> ApiError:
    return ApiError(404, f"No such {kind}: '{object_id}'", code="resource_missing", param=param)


def api_error() -> ApiError:
    return ApiError(
        500,
        "An unknown error occurred while processing your request.",
        type="api_error",
    )
