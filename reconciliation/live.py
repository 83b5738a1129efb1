"""The reconciliation pages, live (agentruns.live): the queue and one case.

The case page's forms are pushed only when the case is settled (they no longer
apply): a reconciler typing what they found keeps it while lookups, the run's state
and the audit change around it. A resolve form posted against an older version of
the case is refused with what changed (reconciliation.services), so a form left in
place is never acted on blindly.
"""

from __future__ import annotations

from django.template.loader import render_to_string

from accounts.services import for_tenant
from agentruns.live import Fresh, Watcher
from reconciliation.models import ReconciliationCase
from reconciliation.selectors import case_context, case_queue_context

CASE = "reconciliation/case.html"


class QueuePage:
    def __init__(self, watcher: Watcher):
        self.watcher = watcher

    def visible(self) -> bool:
        return True

    def _render(self) -> str:
        context = {**case_queue_context(self.watcher.tenant, self.watcher.query), "oob": True}
        table = render_to_string(
            "reconciliation/queue.html#case_table", context, request=self.watcher.request
        )
        count = context["open_count"]
        return f'<span class="count" id="open-case-count" hx-swap-oob="true">{count}</span>{table}'

    def snapshot(self) -> str:
        return self._render()

    def changes(self, fresh: Fresh) -> str:
        if fresh.runs or fresh.audited("case"):
            return self._render()
        return ""


class CasePage:
    def __init__(self, watcher: Watcher):
        self.watcher = watcher
        self.case = (
            for_tenant(ReconciliationCase.objects.select_related("run"), watcher.tenant)
            .filter(pk=watcher.object_id)
            .first()
        )
        # The case as the page shows it ("<version>-<status>"): its forms are current.
        self.shown = watcher.param("seen")

    def visible(self) -> bool:
        return self.case is not None

    def _render(self) -> str:
        case = self.case
        case.refresh_from_db()
        case.run.refresh_from_db(fields=["status"])
        context = {**case_context(case, self.watcher.user), "oob": True}
        request = self.watcher.request
        shown = f"{case.version}-{case.status}"
        if self.shown and self.shown.endswith("-open") and not case.is_open:
            # Settled meanwhile: the forms no longer apply, the whole case is redrawn.
            self.shown = shown
            return render_to_string(f"{CASE}#case_body", context, request=request)
        self.shown = shown
        return "".join(
            render_to_string(f"{CASE}#{part}", context, request=request)
            for part in ("facts", "lookups", "audit")
        )

    def snapshot(self) -> str:
        return self._render()

    def changes(self, fresh: Fresh) -> str:
        if self.case.run_id in fresh.runs or fresh.audited("case", {str(self.case.pk)}):
            return self._render()
        return ""
