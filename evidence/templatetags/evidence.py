"""How the printable evidence page writes the bundle's values: times and JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django import template

register = template.Library()


@register.filter
def at(value: str | datetime | None) -> str:
    """An instant (the bundle's ISO text) as a person reads it: "2025-03-01 14:02:07.318 UTC"."""
    if not value:
        return "—"
    instant = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    instant = instant.astimezone(UTC)
    return f"{instant:%Y-%m-%d %H:%M:%S}.{instant.microsecond // 1000:03d} UTC"


@register.filter
def pretty(value: Any) -> str:
    """A JSON value, indented (already masked in the bundle; escaped by the template)."""
    if value is None:
        return "—"
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def compact(value: Any) -> str:
    """A small JSON value on one line; nothing for an empty one."""
    if value in (None, {}, []):
        return ""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))
