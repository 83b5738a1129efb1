"""Cursor pagination for every list: newest first, by ``(created_at, id)``.

A page ends with ``next_cursor``, an opaque signed token naming the last row given;
the next page is the rows strictly after it in that order (keyset pagination), so rows
inserted between two requests never shift a page: nothing is given twice and nothing
that existed is skipped. A new row, being newer, appears on a fresh first page.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from django.core import signing
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from ninja import Field, Schema

from api.errors import ApiError

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
_SALT = "api.cursor"

T = TypeVar("T")


class PageQuery(Schema):
    """Where a page starts and how long it is. A list's filters extend it."""

    cursor: str | None = Field(
        default=None, description="`next_cursor` of the previous page; absent: the first page"
    )
    limit: int = Field(
        default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="rows on the page, at most 200"
    )


class Page(Schema, Generic[T]):
    """One page of a list, newest first."""

    items: list[T]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null on the last page"
    )


def _encode(row: Any) -> str:
    return signing.dumps([row.created_at.isoformat(), str(row.pk)], salt=_SALT, compress=True)


def _decode(cursor: str) -> tuple[datetime, str]:
    try:
        created_at, pk = signing.loads(cursor, salt=_SALT)
        return datetime.fromisoformat(created_at), str(pk)
    except (signing.BadSignature, ValueError, TypeError) as exc:
        raise _not_a_cursor() from exc


def _not_a_cursor() -> ApiError:
    return ApiError(
        400,
        "the cursor is not one this API gave",
        errors={"cursor": ["not a cursor of this list; start again without one"]},
    )


def only_known_parameters(request: HttpRequest, filters: PageQuery) -> None:
    """Refuse (400) a query parameter the list's filters do not name. Ignored, a misspelt
    filter (``?state=`` for ``?status=``) would answer every row as if each had matched."""
    unknown = sorted(set(request.GET) - set(type(filters).model_fields))
    if unknown:
        known = ", ".join(type(filters).model_fields)
        raise ApiError(
            400,
            "the request has invalid fields",
            errors={name: [f"not a filter of this list (it takes: {known})"] for name in unknown},
        )


def paginate(queryset: QuerySet, page: PageQuery) -> dict[str, Any]:
    """``{"items": [...rows], "next_cursor": ...}`` of ``queryset``, newest first.

    The queryset is ordered here; its model needs ``created_at`` and a primary key
    that orders (an integer, or a UUID compared as the database stores it).
    """
    queryset = queryset.order_by("-created_at", "-pk")
    if page.cursor:
        created_at, pk = _decode(page.cursor)
        try:
            pk_value = queryset.model._meta.pk.to_python(pk)
        except ValidationError as exc:
            raise _not_a_cursor() from exc
        # The plain created_at bound turns the OR into an index range (the model's
        # (tenant, -created_at, -id) index).
        queryset = queryset.filter(created_at__lte=created_at).filter(
            Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=pk_value)
        )
    rows = list(queryset[: page.limit + 1])
    more = len(rows) > page.limit
    rows = rows[: page.limit]
    return {"items": rows, "next_cursor": _encode(rows[-1]) if more else None}
