"""What an engine write says, before the store turns it into SQL.

Values the database computes (``NOW``, ``NowPlus``, ``Sql``), JSON for a JSON
column, the fence a decision is made under, a step's insert or update, the
RunEvent that goes with a transition, and what a commit reports back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


class _Now:
    def __repr__(self) -> str:
        return "NOW"


NOW = _Now()


@dataclass(frozen=True)
class NowPlus:
    seconds: float


@dataclass(frozen=True)
class Sql:
    """A literal SQL expression over the row's own columns, e.g. ``attempts + 1``."""

    expression: str


@dataclass(frozen=True)
class Increment:
    """Add ``by`` to the column, as a bound parameter: the statement's text stays the
    same whatever the amount, so PostgreSQL prepares it once."""

    by: int


@dataclass(frozen=True)
class Json:
    value: Any


@dataclass(frozen=True)
class Fence:
    """Who may decide for a run: the version it claimed, the owner, an unexpired lease."""

    run_id: uuid.UUID
    version: int
    owner: str


@dataclass
class StepInsert:
    values: dict[str, Any]


@dataclass
class StepUpdate:
    pk: int
    values: dict[str, Any]
    # Only update when the step is in one of these statuses (a fact never
    # overwrites a settled step).
    only_if_status: tuple[str, ...] = ()
    # The step's second or later attempt: its commit marks the run retried.
    another_attempt: bool = False


@dataclass
class Event:
    type: str
    step_id: str = ""
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_attempt(cls, step_id: str, values: dict[str, Any]) -> Event:
        """The event of a step attempt written with ``values``: its status and error."""
        return cls(
            "step_" + str(values["status"]), step_id, {"error": values.get("last_error", "")}
        )


@dataclass(frozen=True)
class Committed:
    fenced: bool  # the run's compare-and-set matched
    state_version: int | None
    cancel_requested: bool
    step_pk: int | None  # the inserted or updated step's id, if any row was written
    # A guard was given and matched no row: nothing was written.
    guard_failed: bool = False
    # A claim's columns as it wrote them (``Store.claim``): the claimed run without
    # reading it again. None for every other transition, and for a claim that missed.
    claimed: dict[str, Any] | None = None
