"""The audit log's page, live: a socket of agentruns.live (installed by config/wiring.py)
pushes its entries again whenever the tenant's audit log grows. Who may not read the
audit log is refused its socket as for a page that is not there."""

from __future__ import annotations

from django.template.loader import render_to_string

from accounts.selectors import audit_context


class AuditPage:
    def __init__(self, watcher):
        self.watcher = watcher

    def visible(self) -> bool:
        return self.watcher.user.has_perm("accounts.view_audit")

    def _render(self) -> str:
        context = {**audit_context(self.watcher.tenant, self.watcher.query), "oob": True}
        return render_to_string(
            "accounts/audit_list.html#entries", context, request=self.watcher.request
        )

    def snapshot(self) -> str:
        return self._render()

    def changes(self, fresh) -> str:
        return self._render() if fresh.audit else ""
