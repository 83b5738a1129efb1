"""What needs attention, for the navigation of every page an operator sees."""

from __future__ import annotations

from django.http import HttpRequest

from accounts.navigation import attention_for


def attention(request: HttpRequest) -> dict:
    operator = getattr(getattr(request, "user", None), "operator", None)
    if operator is None:
        return {}
    return {"attention": attention_for(operator.tenant)}
