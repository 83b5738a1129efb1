"""An audit entry's before and after, read field by field: ``field: old → new``.

Only the fields that differ are listed; a field only after is *added*, one only
before is *removed*. Values are compact JSON (a string as it is), through the
masking rule like every value that leaves the database, and a long one is cut with
the whole of it kept for the hover and the expand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from accounts.privacy import mask

SHORT = 60  # characters of a value shown before it is cut
MISSING = object()


@dataclass(frozen=True)
class Shown:
    full: str
    short: str

    @property
    def cut(self) -> bool:
        return self.short != self.full


@dataclass(frozen=True)
class Change:
    field: str  # "" when the entry's before or after is not a set of fields
    kind: str  # "changed", "added", "removed"
    old: Shown | None
    new: Shown | None


def _shown(value: Any, field: str = "") -> Shown:
    # Masked with its field's name: a field called "email" is hidden whole. Compared
    # before masking, so a secret that changed still shows as changed.
    value = mask({field: value})[field] if field else mask(value)
    if isinstance(value, str):
        full = value
    else:
        full = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    short = full if len(full) <= SHORT else full[: SHORT - 1] + "…"
    return Shown(full=full, short=short)


def audit_changes(before: Any, after: Any) -> list[Change]:
    """What changed from ``before`` to ``after``, one field at a time, in the after's order."""
    if isinstance(before, dict | None) and isinstance(after, dict | None):
        old, new = before or {}, after or {}
        changes = []
        for field in [*new, *(f for f in old if f not in new)]:
            was, now = old.get(field, MISSING), new.get(field, MISSING)
            if was == now:
                continue
            if was is MISSING:
                changes.append(Change(str(field), "added", None, _shown(now, str(field))))
            elif now is MISSING:
                changes.append(Change(str(field), "removed", _shown(was, str(field)), None))
            else:
                changes.append(
                    Change(str(field), "changed", _shown(was, str(field)), _shown(now, str(field)))
                )
        return changes
    # A list or a single value on one side: the whole value is the change.
    if before == after:
        return []
    if before is None:
        return [Change("", "added", None, _shown(after))]
    if after is None:
        return [Change("", "removed", _shown(before), None)]
    return [Change("", "changed", _shown(before), _shown(after))]
