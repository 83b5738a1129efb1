"""Live pages other than the run list and the run page: the approvals inbox, one
approval, the reconciliation queue and one case.

A live socket (``agentruns.consumers``) follows two append-only logs of the viewer's
tenant: what happened to runs (``RunEvent``) and what people and the sweeper did
(``AuditEntry``: decisions, lookups, resolutions). Each page says what to push when
either moves. The pages belong to the apps above ``agentruns``; the composition root
(``config/wiring.py``) installs them here by name, and the socket route
``ws/live/<page>/[<object_id>/]`` picks one.

A page object lives as long as its socket and is called from the socket's database
thread only: it may keep what it last pushed, to push only what changed (an inbox
card being typed in is never replaced unless that approval changed).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Watcher:
    """Who watches which page: the socket's operator and the page's address."""

    user: Any
    tenant: Any
    params: Mapping[str, list[str]] = field(default_factory=dict)
    object_id: int | None = None
    # The page's request as the socket knows it (query, user, CSRF cookie), for
    # templates that read it: ``{% querystring %}``, ``{% csrf_token %}``, ``perms``.
    request: Any = None

    def param(self, name: str) -> str:
        values = self.params.get(name) or [""]
        return values[-1]

    @property
    def query(self) -> dict[str, str]:
        """The page's query as one value per name, as the page's view reads it."""
        return {name: values[-1] for name, values in self.params.items() if values}


@dataclass(frozen=True)
class Fresh:
    """What moved since the page's last look: runs with new events, new audit entries
    as (object_type, object_id, action)."""

    runs: frozenset[uuid.UUID]
    audit: tuple[tuple[str, str, str], ...]

    def audited(self, object_type: str, object_ids: set[str] | None = None) -> bool:
        return any(
            kind == object_type and (object_ids is None or object_id in object_ids)
            for kind, object_id, _ in self.audit
        )


class LivePage(Protocol):
    def visible(self) -> bool:
        """The page's object exists in the watcher's tenant (a socket to another
        tenant's case is refused like its page: 4404)."""

    def snapshot(self) -> str:
        """The fragments that bring a page loaded a moment ago up to date."""

    def changes(self, fresh: Fresh) -> str:
        """The fragments for what moved; "" when nothing on this page did."""


PageFactory = Callable[[Watcher], LivePage]

_pages: dict[str, PageFactory] = {}


def install_live_pages(pages: Mapping[str, PageFactory]) -> None:
    """The composition root names each live page (config/wiring.py)."""
    _pages.clear()
    _pages.update(pages)


def live_page(name: str) -> PageFactory | None:
    return _pages.get(name)
