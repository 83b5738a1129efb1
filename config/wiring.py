"""The composition root: the one module that knows every app and plugs them together.

Each app exposes what it offers through its own modules and registers nothing
by itself; this module hands each part to the app that uses it:

- the engine gets its approval gate (``approvals.gate``), its reconciliation
  desk (``reconciliation.desk``) and the tenants' provider accounts
  (``accounts.provider_accounts``): ``agentruns.services.build_engine`` builds
  with them;
- the sweeper gets its duties, in the order one pass performs them;
- the navigation gets the attention counts every page shows, and the live socket
  the approvals and reconciliation pages it pushes to;
- the engine's measurements go to Prometheus (``config.metrics``), and the JSON
  log lines read the run and step the engine works on (``config.logging``);
- failed logins and lockouts go to the audit log (``accounts.logins``);
- an approval that waits and a case that opens start a notify run
  (``notifications.services``): the gate and the desk get the hooks;
- every webhook event (``webhooks.services``) is raised where its fact is written:
  the gate (approval requested), the decision (approval decided, in its
  transaction), the desk (case opened), the resolutions (case resolved) and the
  engine's ending path (run ended); the sweeper repairs what a dead process missed.

``install()`` runs once per process, from ``HoldfastConfig.ready()``: the web
process, each worker, the sweeper, every command and the tests alike.
"""

from __future__ import annotations

from axes.signals import user_locked_out
from django.contrib.auth.signals import user_login_failed

from accounts import logins, navigation
from accounts.live import AuditPage
from accounts.provider_accounts import TenantCredentials
from agentruns import live, services, sweeper
from agentruns.runtime import observe
from agentruns.selectors import run_attention_counts
from approvals.gate import DatabaseApprovalGate, install_requested_hooks
from approvals.live import ApprovalPage, InboxPage
from approvals.selectors import pending_approval_count
from approvals.services import (
    approvals_expire_duty,
    approvals_resume_duty,
    install_decided_hooks,
)
from bulk.services import bulk_resume_duty
from config import logging as log_format
from config import metrics
from notifications.services import approval_notify, case_notify, notifications_duty
from reconciliation.desk import DatabaseDesk, install_opened_hooks
from reconciliation.live import CasePage, QueuePage
from reconciliation.lookups import lookups_duty
from reconciliation.selectors import open_case_count
from reconciliation.services import cases_sweep_duty, install_resolved_hooks
from retention.services import retention_duty
from webhooks import services as webhooks
from webhooks.live import DeliveryLogPage

# What one sweeper pass does, in order. The run duties first: they only knock on
# runs; then approvals (an expiry is an event a page shows; a decision whose
# wake-up was lost is resumed); then reconciliation (its lookups are workers'
# tasks, a few at a time, so a provider that hangs never holds up a pass); retention
# after the rest (it touches only runs that ended long ago); the orphan check last,
# over the result.
SWEEPER_DUTIES: tuple[sweeper.Duty, ...] = (
    sweeper.Duty("wake runs whose retry or timer is due", sweeper.wake_due),
    sweeper.Duty("recover runs whose lease expired", sweeper.recover_expired),
    sweeper.Duty("re-enqueue queued runs nobody picked up", sweeper.requeue_stale),
    sweeper.Duty("expire approvals past their expiry", approvals_expire_duty),
    sweeper.Duty("sweep reconciliation cases", cases_sweep_duty),
    sweeper.Duty("hand due automatic lookups to workers", lookups_duty),
    sweeper.Duty("resume runs whose approval was decided", approvals_resume_duty),
    sweeper.Duty("start missed notifications and due digests", notifications_duty),
    sweeper.Duty("hand lost bulk actions to a worker again", bulk_resume_duty),
    sweeper.Duty("raise missed webhook events, start their deliveries", webhooks.webhooks_duty),
    # Every minute at most, after everything that moves runs along: it only ever
    # touches runs that ended long ago.
    sweeper.Duty("redact and archive runs past their retention", retention_duty),
    sweeper.Duty("report runs nobody is responsible for", sweeper.report_orphans),
)

# What needs a person, for the navigation every page shows: accounts is the lowest
# app, so each app above it offers its count rather than accounts reaching up.
ATTENTION_COUNTERS = (run_attention_counts, pending_approval_count, open_case_count)

# The live pages of the apps above agentruns, by the name in their socket's address
# (ws/live/<name>/): agentruns' socket follows the logs, each page says what to push.
LIVE_PAGES = {
    "audit": AuditPage,
    "inbox": InboxPage,
    "approval": ApprovalPage,
    "cases": QueuePage,
    "case": CasePage,
    "webhook": DeliveryLogPage,
}


def install() -> None:
    services.install_engine_parts(
        approvals=DatabaseApprovalGate,
        desk=DatabaseDesk,
        credentials=TenantCredentials,
        ended=webhooks.run_ended_hook,
    )
    sweeper.install_duties(SWEEPER_DUTIES)
    install_requested_hooks(approval_notify, webhooks.approval_requested_hook)
    install_decided_hooks(webhooks.approval_decided_hook)
    install_opened_hooks(case_notify, webhooks.case_opened_hook)
    install_resolved_hooks(webhooks.case_resolved_hook)
    navigation.install_attention(ATTENTION_COUNTERS)
    live.install_live_pages(LIVE_PAGES)
    observe.install_sink(metrics.process_sink())
    log_format.install_context(observe.log_context)
    # After axes' own receivers (it is installed before the apps), so a failure it
    # just counted carries its count.
    user_login_failed.connect(logins.record_failed_login, dispatch_uid="holdfast.login_failed")
    user_locked_out.connect(logins.record_lockout, dispatch_uid="holdfast.login_locked_out")
