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
        # The page is older than what is there (a reconnect after an outage): all of it.
        list_part = "cards" if context["show"] == PENDING else "decided"
        return self._render("tabs", context) + self._render(list_part, context)

    def changes(self, fresh: Fresh) -> str:
        if not fresh.runs and not fresh.audited("approval"):
            return ""
        context = self._context()
        if context["show"] != PENDING:
            # A list of what was decided holds no form: it is pushed whole.
            return self._render("tabs", context) + self._render("decided", context)
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
