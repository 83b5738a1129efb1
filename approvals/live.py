"""The approvals pages, live (agentruns.live): the inbox and one approval.

A card is pushed only when what it shows changed (its approval's status, decision,
renewal, or its run's state): an approver typing a note on another card keeps it.
"""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string

from accounts.services import for_tenant, user_actor_name
from agentruns.live import Fresh, Watcher
from approvals.models import Approval
from approvals.selectors import (
    PENDING,
    Viewer,
    approval_card,
    approval_detail_context,
    card_signature,
    cards_seen,
    inbox_context,
)

INBOX = "approvals/inbox.html"


def _viewer(watcher: Watcher) -> Viewer:
    return Viewer.of(watcher.user, watcher.tenant, actor=user_actor_name(watcher.user))


# At most this many card ids are read from a page's socket address (a page shows
# PAGE_SIZE cards; the rest of a longer or tampered list is ignored).
SHOWN_LIMIT = 200


def _shown_ids(text: str) -> list[int]:
    """The card ids a page says it shows; anything that is not an id is skipped. Only
    the viewer's tenant's approvals are ever read for them (``for_tenant``)."""
    ids = []
    for part in text.split(",")[:SHOWN_LIMIT]:
        part = part.strip()
        # isascii: "²" is a digit to str.isdigit() and no number to int().
        if part.isascii() and part.isdigit():
            ids.append(int(part))
    return ids


class InboxPage:
    def __init__(self, watcher: Watcher):
        self.watcher = watcher
        self.shown: dict[int, str] = {}
        # The page says "No approvals are waiting" (#approval-cards-empty) until a card
        # arrives: htmx reports a push to an element that is not there as an error.
        self.empty = False

    def visible(self) -> bool:
        return True

    def _context(self) -> dict[str, Any]:
        return inbox_context(_viewer(self.watcher), self.watcher.query)

    def _render(self, part: str, context: dict[str, Any]) -> str:
        context = {**context, "oob": True}
        return render_to_string(f"{INBOX}#{part}", context, request=self.watcher.request)

    def snapshot(self) -> str:
        context = self._context()
        cards = context["cards"]
        self.shown = {card.approval.pk: card_signature(card) for card in cards}
        self.empty = not cards
        if self.watcher.param("seen") == cards_seen(cards):
            return self._render("tabs", context)
        if context["show"] != PENDING:
            # The page is older than what is there: a list of decisions, pushed whole.
            return self._render("tabs", context) + self._render("decided", context)
        # The page is older than what is there (its socket connected after a decision
        # made on it, or again after an outage): every card it shows is drawn again in
        # place, a decided one as decided, and the new ones are added. Never the whole
        # list: that would take away a card its reader just decided. (A note being
        # typed on a card is lost then, as it was when the list was pushed whole.)
        self.shown = {pk: "" for pk in _shown_ids(self.watcher.param("shown"))}
        self.empty = not self.shown
        return self._in_place(context)

    def changes(self, fresh: Fresh) -> str:
        if not fresh.runs and not fresh.audited("approval"):
            return ""
        context = self._context()
        if context["show"] != PENDING:
            # A list of what was decided holds no form: it is pushed whole.
            return self._render("tabs", context) + self._render("decided", context)
        return self._in_place(context)

    def _in_place(self, context: dict[str, Any]) -> str:
        """The tabs, the cards on the page whose signature moved (those that left the
        list included, changed in place), and the new ones appended."""
        parts = [self._render("tabs", context)]
        listed = {card.approval.pk: card for card in context["cards"]}
        # Cards on the page that left the list (decided, expired): changed in place.
        gone = [pk for pk in self.shown if pk not in listed]
        viewer = _viewer(self.watcher)
        approvals = for_tenant(Approval.objects.select_related("run"), self.watcher.tenant)
        for approval in approvals.filter(pk__in=gone):
            listed[approval.pk] = approval_card(viewer, approval)
        added = []
        for pk, card in listed.items():
            signature = card_signature(card)
            if pk not in self.shown:
                added.append(card)
            elif self.shown[pk] != signature:
                parts.append(self._render("card", {**context, "card": card}))
            self.shown[pk] = signature
        if added:
            cards = "".join(
                render_to_string(f"{INBOX}#card", {"card": card}, request=self.watcher.request)
                for card in added
            )
            if self.empty:
                parts.append('<p id="approval-cards-empty" hx-swap-oob="delete"></p>')
                self.empty = False
            parts.append(f'<div hx-swap-oob="beforeend:#approval-cards">{cards}</div>')
        return "".join(parts)


class ApprovalPage:
    def __init__(self, watcher: Watcher):
        self.watcher = watcher
        self.approval = (
            for_tenant(Approval.objects.select_related("run"), watcher.tenant)
            .filter(pk=watcher.object_id)
            .first()
        )
        self.shown = ""

    def visible(self) -> bool:
        return self.approval is not None

    def _render(self) -> str:
        self.approval.refresh_from_db()
        self.approval.run.refresh_from_db(fields=["status"])
        viewer = _viewer(self.watcher)
        card = approval_card(viewer, self.approval)
        context = {**approval_detail_context(viewer, card), "oob": True}
        parts = [
            render_to_string("approvals/detail.html#history", context, request=self.watcher.request)
        ]
        seen = cards_seen([card])
        if seen != self.shown:
            self.shown = seen
            parts.append(render_to_string(f"{INBOX}#card", context, request=self.watcher.request))
        return "".join(parts)

    def snapshot(self) -> str:
        # The card as rendered is current unless the page says otherwise.
        if self.watcher.param("seen"):
            self.shown = self.watcher.param("seen")
        return self._render()

    def changes(self, fresh: Fresh) -> str:
        if self.approval.run_id in fresh.runs or fresh.audited("approval", {str(self.approval.pk)}):
            return self._render()
        return ""
