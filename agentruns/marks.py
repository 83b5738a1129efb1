"""Marks on a run: what happened on its way, beside its state (retried, recovered, …).

Each is a column of the run written in the commit that records its fact (see the
comment on ``Run.retried``), so a page of runs shows them with no query of its own
and ``?mark=`` filters by a partial index (``run_tenant_<mark>``).
"""

from __future__ import annotations

from typing import NamedTuple

from django.db.models import Q

from agentruns.models import Run


class Mark(NamedTuple):
    slug: str  # what ?mark= carries, and the word on the row
    explanation: str
    condition: Q  # the runs that have it


MARKS: dict[str, Mark] = {
    mark.slug: mark
    for mark in [
        Mark(
            "retried",
            "A step took more than one attempt, or an operator pressed Retry now.",
            Q(retried=True),
        ),
        Mark(
            "recovered",
            "A worker stopped holding it (it crashed, stalled or lost the database) and "
            "another took the run over when its lease expired.",
            Q(recovered=True),
        ),
        Mark(
            "reconciled",
            "An effect whose outcome was unknown was settled: by a person, a lookup or the "
            "provider's late answer.",
            Q(reconciled=True),
        ),
        Mark(
            "approved",
            "A person approved an effect of it (the latest approver is named).",
            ~Q(approved_by=""),
        ),
        Mark(
            "compensated",
            "It ended with an effect undone by its compensation.",
            Q(compensated=True),
        ),
    ]
}


class ShownMark(NamedTuple):
    slug: str
    text: str
    explanation: str


def marks_of(run: Run) -> list[ShownMark]:
    """The marks ``run`` has, in the order of ``MARKS``, worded for its row."""
    shown = []
    for mark in MARKS.values():
        if mark.slug == "approved":
            if run.approved_by:
                # Actors are recorded as "user:ann", "token:…": a person by their login.
                who = run.approved_by.removeprefix("user:")
                shown.append(ShownMark(mark.slug, f"approved by {who}", mark.explanation))
        elif getattr(run, mark.slug):
            # The other marks are the run's boolean column of the same name.
            shown.append(ShownMark(mark.slug, mark.slug, mark.explanation))
    return shown
