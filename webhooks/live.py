"""An endpoint's delivery log, live (agentruns.live): pushed again when one of its
delivery runs moves (an attempt failed, a retry is due, it was delivered), when a
new delivery starts, or when the endpoint is changed (its audit entries). Who may
not manage webhooks, or asks for another tenant's endpoint, is refused its socket
as for a page that is not there."""

from __future__ import annotations

from django.template.loader import render_to_string

from agentruns.live import Fresh, Watcher
from webhooks.selectors import delivery_log, endpoint_of, log_run_ids

PAGE = "webhooks/endpoint.html"


class DeliveryLogPage:
    def __init__(self, watcher: Watcher):
        self.watcher = watcher
        self.endpoint = (
            endpoint_of(watcher.tenant, watcher.object_id)
            if watcher.object_id is not None
            else None
        )

    def visible(self) -> bool:
        return self.endpoint is not None and self.watcher.user.has_perm("webhooks.manage_webhooks")

    def _render(self) -> str:
        self.endpoint.refresh_from_db()
        context = {"endpoint": self.endpoint, "rows": delivery_log(self.endpoint), "oob": True}
        return "".join(
            render_to_string(f"{PAGE}#{part}", context, request=self.watcher.request)
            for part in ("settings", "log")
        )

    def snapshot(self) -> str:
        return self._render()

    def changes(self, fresh: Fresh) -> str:
        moved = fresh.audited("webhook_endpoint", {str(self.endpoint.pk)})
        if moved or (fresh.runs and log_run_ids(self.endpoint, fresh.runs)):
            return self._render()
        return ""
