from __future__ import annotations

from django import template

from accounts.audit_changes import audit_changes

register = template.Library()


@register.inclusion_tag("accounts/_audit_changes.html#changes")
def changes(entry) -> dict:
    """An audit entry's before → after, field by field (accounts.audit_changes)."""
    return {"changes": audit_changes(entry.before, entry.after)}
