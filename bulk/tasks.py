"""django-q2 entry point for bulk actions."""

from __future__ import annotations

from bulk.services import carry_out as _carry_out


def carry_out(action_id: int) -> int:
    return _carry_out(action_id)
