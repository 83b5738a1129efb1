"""What needs attention, for the navigation of every page an operator sees, and whether
the operator's time zone is still to be taken from their browser."""

from __future__ import annotations

from django.http import HttpRequest

from accounts.navigation import attention_for
from accounts.services import time_zone_chosen


def attention(request: HttpRequest) -> dict:
    operator = getattr(getattr(request, "user", None), "operator", None)
    if operator is None:
        return {}
    return {"attention": attention_for(operator.tenant)}


def time_zone_unchosen(request: HttpRequest) -> dict:
    """True (read only when a page asks) while the operator's zone is the default UTC and
    was never chosen: the page then offers the browser's zone (templates/base.html)."""
    operator = getattr(getattr(request, "user", None), "operator", None)
    if operator is None or operator.time_zone != "UTC":
        return {}
    return {"time_zone_unchosen": lambda: not time_zone_chosen(operator)}
