"""Starting the notify runs: when an approval is requested or a case opens, and the digests.

Delivery rides on Holdfast's own engine. Each event starts one ``notify`` run whose
request id names the event (``notify:approval:<id>``, ``notify:case:<id>``, and
``…:reopened:<n>`` for a case opened again): admission is idempotent per request id,
so the hook called twice (a step asked again after a crash, a case opened by the
desk and again by the sweeper) starts one run. The hooks never raise into the gate
or the desk; the sweeper's duty starts the run a failed hook left unstarted.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from accounts.models import Tenant
from accounts.provider_accounts import credentials
from agentruns.models import Run
from agentruns.runtime import AdmissionError
from agentruns.services import run_start
from approvals.models import Approval, ApprovalStatus
from notifications.agents import NOTIFY, NOTIFY_AGENTS, NOTIFY_DIGEST
from notifications.models import DigestEntry
from reconciliation.models import CaseStatus, ReconciliationCase

log = logging.getLogger("holdfast.notifications")

REQUESTED_BY = "holdfast:notifications"
# How far back the sweeper looks for an event nobody was told of.
MISSED_WINDOW = timedelta(days=1)


def approval_request_id(approval: Approval) -> str:
    return f"notify:approval:{approval.pk}"


def case_request_id(case: ReconciliationCase) -> str:
    base = f"notify:case:{case.pk}"
    return f"{base}:reopened:{case.reopened}" if case.reopened else base


def has_audience(tenant_id: int) -> bool:
    """Whether anyone could be told in the tenant: an active operator with an address,
    or a webhook. Without one no notify run is started (the inbox and the queue still
    show what waits); who exactly may act is the run's own question."""
    User = get_user_model()
    if (
        User.objects.filter(is_active=True, operator__tenant_id=tenant_id)
        .exclude(email="")
        .exists()
    ):
        return True
    try:
        return bool(credentials(tenant_id, "webhook").endpoint)
    except LookupError:
        return False


def _start(tenant_id: int, request_id: str, kind: str, object_id: int) -> Run:
    run, _ = run_start(
        tenant=Tenant.objects.get(pk=tenant_id),
        agent_name=NOTIFY,
        input={"kind": kind, "object_id": object_id},
        request_id=request_id,
        requested_by=REQUESTED_BY,
    )
    return run


def approval_notify(approval: Approval) -> None:
    """The approval gate's hook: tell who may decide it. Idempotent; never raises."""
    try:
        if has_audience(approval.tenant_id):
            _start(approval.tenant_id, approval_request_id(approval), "approval", approval.pk)
    except Exception:
        log.exception(
            "approval %s: could not start its notification; the sweeper will", approval.pk
        )


def case_notify(case: ReconciliationCase) -> None:
    """The reconciliation desk's hook: tell who may settle it. Idempotent; never raises."""
    try:
        if Run.objects.filter(pk=case.run_id, agent_name__in=NOTIFY_AGENTS).exists():
            return
        if has_audience(case.tenant_id):
            _start(case.tenant_id, case_request_id(case), "case", case.pk)
    except Exception:
        log.exception("case %s: could not start its notification; the sweeper will", case.pk)


def notifications_missed() -> int:
    """Start the notify run of each waiting approval and open case that has none (its
    hook failed, or the process died between the write and the hook)."""
    since = timezone.now() - MISSED_WINDOW
    approvals = Approval.objects.filter(status=ApprovalStatus.PENDING, created_at__gte=since)
    cases = ReconciliationCase.objects.filter(status=CaseStatus.OPEN, opened_at__gte=since).exclude(
        run__agent_name__in=NOTIFY_AGENTS
    )
    wanted = {approval_request_id(a): (a.tenant_id, "approval", a.pk) for a in approvals}
    wanted.update({case_request_id(c): (c.tenant_id, "case", c.pk) for c in cases})
    # Request ids are unique per tenant: another tenant's run of the same id is not it.
    started = set(Run.objects.filter(request_id__in=wanted).values_list("tenant_id", "request_id"))
    missing = [
        (request_id, event)
        for request_id, event in wanted.items()
        if (event[0], request_id) not in started
    ]
    audience: dict[int, bool] = {}
    count = 0
    for request_id, (tenant_id, kind, object_id) in missing:
        if tenant_id not in audience:
            audience[tenant_id] = has_audience(tenant_id)
        if not audience[tenant_id]:
            continue
        try:
            _start(tenant_id, request_id, kind, object_id)
            count += 1
        except AdmissionError:
            # The tenant's own run already holds the id (started through the API):
            # said once per pass in the log, and the next duties still run.
            log.exception("%s: could not start its notification", request_id)
    return count


def period_start(moment: datetime, seconds: int) -> int:
    """The start of the digest period ``moment`` falls in, as a Unix time."""
    epoch = int(moment.timestamp())
    return epoch - epoch % seconds


def digests_start(*, now: datetime | None = None) -> int:
    """Start one digest run per operator and finished period that held notices.

    An entry belongs to the period its ``created_at`` falls in; a period is digested
    once it has ended. The run and the entries' claim commit together, and the
    request id ``digest:<user>:<period start>`` makes a second start the same run.
    """
    seconds = settings.HOLDFAST_DIGEST_SECONDS
    current = period_start(now or timezone.now(), seconds)
    cutoff = datetime.fromtimestamp(current, tz=UTC)
    waiting = DigestEntry.objects.filter(digest_request="", created_at__lt=cutoff)
    groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for pk, user_id, tenant_id, created_at in waiting.values_list(
        "pk", "user_id", "tenant_id", "created_at"
    )[:1000]:
        groups[(user_id, tenant_id, period_start(created_at, seconds))].append(pk)
    for (user_id, tenant_id, start), entry_ids in groups.items():
        request_id = f"digest:{user_id}:{start}"
        with transaction.atomic():
            DigestEntry.objects.filter(pk__in=entry_ids, digest_request="").update(
                digest_request=request_id
            )
            run_start(
                tenant=Tenant.objects.get(pk=tenant_id),
                agent_name=NOTIFY_DIGEST,
                input={"user_id": user_id, "digest_request": request_id},
                request_id=request_id,
                requested_by=REQUESTED_BY,
            )
    return len(groups)


def notifications_duty(sweep_pass) -> None:
    """The sweeper's duty: start missed notifications and the digests of ended periods."""
    missed = notifications_missed()
    digests = digests_start()
    if missed or digests:
        log.info("notifications: %d missed started, %d digests started", missed, digests)
