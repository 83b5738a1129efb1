"""Display helpers for step payloads: sensitive fields masked, large ones shortened."""

from __future__ import annotations

import json
import re
from typing import Any

from django import template

register = template.Library()

SENSITIVE = re.compile(
    r"(pass(word)?|secret|token|api[_-]?key|authorization|card|iban|email|phone|ssn)", re.I
)
MASK = "••••"
EMAIL = re.compile(r"[^@\s\"']+@([^@\s\"']+\.[^@\s\"']+)")
LARGE = 4000


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: MASK if SENSITIVE.search(str(key)) and value[key] not in (None, "") else _mask(v)
            for key, v in value.items()
        }
    if isinstance(value, list):
        return [_mask(item) for item in value]
    if isinstance(value, str):
        # An address is personal data wherever it appears; the domain is enough to debug.
        return EMAIL.sub(lambda m: f"{MASK}@{m.group(1)}", value)
    return value


@register.filter
def payload(value: Any) -> str:
    """A step input or result as indented JSON, sensitive fields masked, large ones cut."""
    if value is None:
        return "—"
    text = json.dumps(_mask(value), indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > LARGE:
        return f"{text[:LARGE]}\n… ({len(text) - LARGE} more characters)"
    return text


@register.simple_tag
def duration(start, end) -> str:
    """How long from ``start`` to ``end``, precise enough for a step: "340 ms", "2.4 s"."""
    if start is None or end is None:
        return ""
    seconds = (end - start).total_seconds()
    if seconds < 0:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
