"""Display helpers: step payloads (sensitive fields masked, large ones shortened), and a
run's state and marks as badges in words."""

from __future__ import annotations

import json
from typing import Any

from django import template

from accounts.privacy import mask, mask_text, shown_error
from agentruns.marks import marks_of
from agentruns.states import state_of

register = template.Library()

LARGE = 4000


@register.filter
def masked(value: Any) -> Any:
    """Any text shown on a page (an error, a note) under the one masking rule."""
    return mask_text(value) if isinstance(value, str) else mask(value)


@register.simple_tag(takes_context=True)
def error_shown(context, error_class: str, text: str) -> str:
    """An error as this page's reader may read it: a provider's own words only with
    ``error_detail`` in the context (``view_provider_errors``), else its category and
    reference (accounts.privacy.shown_error). Escaped by the template engine."""
    return shown_error(error_class or "", text or "", detail=bool(context.get("error_detail")))


@register.filter
def payload(value: Any) -> str:
    """A step input or result as indented JSON, sensitive fields masked, large ones cut."""
    if value is None:
        return "—"
    text = json.dumps(mask(value), indent=2, sort_keys=True, ensure_ascii=False, default=str)
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


@register.inclusion_tag("agentruns/_badges.html#state")
def run_state(status: str) -> dict[str, Any]:
    """A run's state as a badge: its label, its explanation on hover and for screen
    readers, its raw name in the class (``state-<status>``) for its colour."""
    return {"state": state_of(status)}


@register.inclusion_tag("agentruns/_badges.html#marks")
def run_marks(run) -> dict[str, Any]:
    """What happened on the run's way (agentruns.marks), each a link to the runs marked so."""
    return {"marks": marks_of(run)}
