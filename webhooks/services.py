"""Endpoints (made, changed, rotated, disabled: each audited) and events (raised once,
delivered once per endpoint by a ``webhook_deliver`` run).

How an event is never lost: the places a fact is written call a hook here (the
approval gate and decision, the reconciliation desk and resolutions, the engine's
ending path; ``config/wiring.py`` installs them). The hook records the event and its
deliveries in one transaction and starts the delivery runs after it commits. A
process that dies between the fact's commit and the hook, or a hook that fails,
leaves the fact without an event: the sweeper's duty (``webhooks_duty``) finds such
facts of the last day and raises their events, and starts any delivery whose run was
not started. ``WebhookEvent.topic`` is unique per tenant and a delivery is unique per
(event, endpoint), and admission dedupes a run per request id
(``webhook:<delivery id>``): a repeated hook or repair adds nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, Min, OuterRef
from django.utils import timezone

from accounts.models import Tenant
from accounts.services import audit_record, user_actor_name
from agentruns.models import TERMINAL_STATUSES, Run
from agentruns.runtime.reads import compiled_read
from agentruns.services import run_start
from approvals.models import Approval, ApprovalStatus
from notifications.agents import NOTIFY_AGENTS
from reconciliation.models import CaseStatus, ReconciliationCase
from webhooks import payloads
from webhooks.addresses import address_problem
from webhooks.agents import WEBHOOK_AGENTS, WEBHOOK_DELIVER
from webhooks.models import (
    EventType,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from webhooks.signing import secret_new

log = logging.getLogger("holdfast.webhooks")

REQUESTED_BY = "holdfast:webhooks"
# How far back the sweeper looks for a fact that has no event.
MISSED_WINDOW = timedelta(days=1)
# The repair reads a day of facts: once per this many seconds is enough, since the
# hooks raise nearly every event at once and the repair is for what they missed.
REPAIR_INTERVAL_SECONDS = 10.0
# How long a rotated-out secret keeps signing, so receivers can switch.
ROTATION_GRACE = timedelta(hours=24)
# Runs of the built-in agents end unannounced: a delivery run's own end announced
# would start another delivery, and so on.
UNANNOUNCED_AGENTS = (*NOTIFY_AGENTS, *WEBHOOK_AGENTS)


class EndpointRefused(Exception):
    """What was asked of an endpoint cannot be done; the message says why."""


# --- endpoints --------------------------------------------------------------------------


def _endpoint_view(endpoint: WebhookEndpoint) -> dict:
    # What the audit log records of an endpoint: never its secret.
    return {
        "url": endpoint.url,
        "description": endpoint.description,
        "events": list(endpoint.events),
        "is_active": endpoint.is_active,
    }


def _checked(url: str, events: Iterable[str]) -> tuple[str, list[str]]:
    url = (url or "").strip()
    if not url.startswith(("https://", "http://")):
        raise EndpointRefused("the address must be an http:// or https:// URL")
    if problem := address_problem(url):
        raise EndpointRefused(problem)
    chosen = [value for value in EventType.values if value in set(events)]
    unknown = set(events) - set(EventType.values)
    if unknown:
        raise EndpointRefused(f"unknown event types: {', '.join(sorted(unknown))}")
    if not chosen:
        raise EndpointRefused("choose at least one event type")
    return url, chosen


def endpoint_create(
    *, tenant: Tenant, url: str, description: str, events: Iterable[str], user, request=None
) -> tuple[WebhookEndpoint, str]:
    """Make an endpoint; returns it with its secret, which is shown this once."""
    url, chosen = _checked(url, list(events))
    secret = secret_new()
    actor = user_actor_name(user)
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(
            tenant=tenant,
            url=url,
            description=description.strip(),
            events=chosen,
            secret=secret,
            created_by=actor,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="webhook.create",
            object_type="webhook_endpoint",
            object_id=endpoint.pk,
            after=_endpoint_view(endpoint),
            request=request,
        )
    return endpoint, secret


def endpoint_update(
    *,
    endpoint: WebhookEndpoint,
    url: str,
    description: str,
    events: Iterable[str],
    user,
    request=None,
) -> WebhookEndpoint:
    url, chosen = _checked(url, list(events))
    before = _endpoint_view(endpoint)
    with transaction.atomic():
        endpoint.url, endpoint.description, endpoint.events = url, description.strip(), chosen
        endpoint.save(update_fields=["url", "description", "events"])
        audit_record(
            tenant=endpoint.tenant,
            actor=user_actor_name(user),
            action="webhook.edit",
            object_type="webhook_endpoint",
            object_id=endpoint.pk,
            before=before,
            after=_endpoint_view(endpoint),
            request=request,
        )
    return endpoint


def endpoint_rotate(*, endpoint: WebhookEndpoint, user, request=None) -> str:
    """A new secret, returned to be shown once; the old one signs too for a day."""
    secret = secret_new()
    now = timezone.now()
    with transaction.atomic():
        # Locked: two rotations at once must not both keep the same previous secret.
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        endpoint.previous_secret = endpoint.secret
        endpoint.previous_secret_until = now + ROTATION_GRACE
        endpoint.secret = secret
        endpoint.secret_rotated_at = now
        endpoint.save(
            update_fields=[
                "secret",
                "previous_secret",
                "previous_secret_until",
                "secret_rotated_at",
            ]
        )
        audit_record(
            tenant=endpoint.tenant,
            actor=user_actor_name(user),
            action="webhook.rotate",
            object_type="webhook_endpoint",
            object_id=endpoint.pk,
            after={"previous_secret_signs_until": endpoint.previous_secret_until.isoformat()},
            request=request,
        )
    return secret


def endpoint_set_active(
    *, endpoint: WebhookEndpoint, active: bool, user, request=None
) -> WebhookEndpoint:
    with transaction.atomic():
        changed = WebhookEndpoint.objects.filter(pk=endpoint.pk, is_active=not active).update(
            is_active=active
        )
        endpoint.refresh_from_db()
        if changed:
            audit_record(
                tenant=endpoint.tenant,
                actor=user_actor_name(user),
                action="webhook.enable" if active else "webhook.disable",
                object_type="webhook_endpoint",
                object_id=endpoint.pk,
                before={"is_active": not active},
                after={"is_active": active},
                request=request,
            )
    return endpoint


# --- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """One thing that happened, as an event would name it."""

    tenant_id: int
    type: str
    topic: str
    object_id: str
    occurred_at: datetime
    data: payloads.EventData


def run_fact(run: Run) -> Fact:
    return Fact(
        run.tenant_id,
        EventType.RUN_ENDED,
        f"run:{run.pk}:ended",
        str(run.pk),
        run.finished_at or timezone.now(),
        payloads.run_data(run),
    )


def approval_requested_fact(approval: Approval) -> Fact:
    return Fact(
        approval.tenant_id,
        EventType.APPROVAL_REQUESTED,
        f"approval:{approval.pk}:requested",
        str(approval.pk),
        approval.created_at,
        {**payloads.approval_data(approval), "status": ApprovalStatus.PENDING.value},
    )


def approval_decided_fact(approval: Approval) -> Fact:
    return Fact(
        approval.tenant_id,
        EventType.APPROVAL_DECIDED,
        f"approval:{approval.pk}:decided",
        str(approval.pk),
        approval.decided_at or timezone.now(),
        payloads.approval_data(approval),
    )


def case_opened_fact(case: ReconciliationCase) -> Fact:
    return Fact(
        case.tenant_id,
        EventType.CASE_OPENED,
        f"case:{case.pk}:opened:{case.reopened}",
        str(case.pk),
        case.opened_at,
        {**payloads.case_data(case), "status": CaseStatus.OPEN.value},
    )


def case_resolved_fact(case: ReconciliationCase) -> Fact:
    return Fact(
        case.tenant_id,
        EventType.CASE_RESOLVED,
        f"case:{case.pk}:resolved:{case.reopened}",
        str(case.pk),
        case.resolved_at or timezone.now(),
        payloads.case_data(case),
    )


def event_raise(fact: Fact) -> WebhookEvent | None:
    """Record the fact's event and one delivery per endpoint that takes it, once.

    The endpoints are the tenant's active ones for the type that existed when the
    fact happened. Delivery runs start after the commit. Returns None when no
    endpoint takes it.
    """
    endpoints = [
        endpoint
        for endpoint in WebhookEndpoint.objects.filter(
            tenant_id=fact.tenant_id, is_active=True, created_at__lte=fact.occurred_at
        )
        if endpoint.receives(fact.type)
    ]
    if not endpoints:
        return None
    with transaction.atomic():
        event = WebhookEvent.objects.filter(tenant_id=fact.tenant_id, topic=fact.topic).first()
        if event is None:
            event_id = uuid.uuid4()
            tenant = Tenant.objects.get(pk=fact.tenant_id)
            body = payloads.payload(
                event_id=f"evt_{event_id.hex}",
                event_type=fact.type,
                created_at=timezone.now().isoformat().replace("+00:00", "Z"),
                tenant_slug=tenant.slug,
                data=fact.data,
            )
            try:
                with transaction.atomic():
                    event = WebhookEvent.objects.create(
                        id=event_id,
                        tenant_id=fact.tenant_id,
                        type=fact.type,
                        topic=fact.topic,
                        object_id=fact.object_id,
                        payload=body,
                    )
            except IntegrityError:
                # Raised by another process this moment (the hook and the repair).
                event = WebhookEvent.objects.get(tenant_id=fact.tenant_id, topic=fact.topic)
        have = set(event.deliveries.values_list("endpoint_id", flat=True))
        for endpoint in endpoints:
            if endpoint.pk not in have:
                WebhookDelivery.objects.bulk_create(
                    [WebhookDelivery(tenant_id=fact.tenant_id, event=event, endpoint=endpoint)],
                    ignore_conflicts=True,
                )
        transaction.on_commit(lambda: deliveries_start(event.deliveries.filter(run__isnull=True)))
    return event


def deliveries_start(deliveries: Iterable[WebhookDelivery]) -> int:
    """Start the delivery run of each; a second start is the same run (its request id)."""
    started = 0
    for delivery in deliveries:
        # The run and the delivery's link to it commit together: a live delivery log that
        # reads the run's first event then finds its delivery (it renders on the runs of
        # its deliveries), and a worker that takes the run at once finds it linked.
        with transaction.atomic():
            run, _ = run_start(
                tenant=Tenant.objects.get(pk=delivery.tenant_id),
                agent_name=WEBHOOK_DELIVER,
                input={"delivery_id": delivery.pk},
                request_id=f"webhook:{delivery.pk}",
                requested_by=REQUESTED_BY,
            )
            started += WebhookDelivery.objects.filter(pk=delivery.pk, run__isnull=True).update(
                run=run
            )
    return started


def _raise_quietly(fact_of, obj) -> None:
    """A hook never raises into the gate, the desk, a decision or the engine: what
    it could not raise, the sweeper's repair raises."""
    try:
        # A savepoint: a failure here leaves the caller's transaction (a decision's)
        # usable, on PostgreSQL too.
        with transaction.atomic():
            event_raise(fact_of(obj))
    except Exception:
        log.exception("%s %s: could not raise its webhook event", fact_of.__name__, obj.pk)


def approval_requested_hook(approval: Approval) -> None:
    _raise_quietly(approval_requested_fact, approval)


def approval_decided_hook(approval: Approval) -> None:
    _raise_quietly(approval_decided_fact, approval)


def case_opened_hook(case: ReconciliationCase) -> None:
    _raise_quietly(case_opened_fact, case)


def case_resolved_hook(case: ReconciliationCase) -> None:
    _raise_quietly(case_resolved_fact, case)


def _run_if_announced(run_id: uuid.UUID):
    endpoints = WebhookEndpoint.objects.filter(tenant_id=OuterRef("tenant_id"), is_active=True)
    return Run.objects.filter(pk=run_id).filter(Exists(endpoints))


def run_ended_hook(run_id: uuid.UUID) -> None:
    """The engine's ending path, after the terminal commit (config/wiring.py)."""
    try:
        # One statement: the run only if its tenant has an active endpoint. Most
        # tenants have none, and then no run is read and no event is built. Its SQL
        # is compiled once: building the query cost a worker more than running it.
        found = compiled_read("run_if_announced", _run_if_announced).fetch(run_id)
        if not found:
            return
        run = found[0]
        if run.status in TERMINAL_STATUSES and run.agent_name not in UNANNOUNCED_AGENTS:
            event_raise(run_fact(run))
    except Exception:
        log.exception("run %s: could not raise its webhook event; the sweeper will", run_id)


# --- the sweeper's repair ---------------------------------------------------------------

_last_repair = 0.0


def _facts_since(tenant_id: int, types: set[str], since: datetime) -> list[Fact]:
    facts: list[Fact] = []
    if EventType.RUN_ENDED in types:
        runs = Run.objects.filter(
            tenant_id=tenant_id, finished_at__gte=since, status__in=TERMINAL_STATUSES
        ).exclude(agent_name__in=UNANNOUNCED_AGENTS)
        facts += [run_fact(run) for run in runs.iterator(chunk_size=500)]
    approvals = Approval.objects.filter(tenant_id=tenant_id)
    if EventType.APPROVAL_REQUESTED in types:
        facts += [approval_requested_fact(a) for a in approvals.filter(created_at__gte=since)]
    if EventType.APPROVAL_DECIDED in types:
        decided = approvals.filter(
            decided_at__gte=since, status__in=[ApprovalStatus.APPROVED, ApprovalStatus.REJECTED]
        )
        facts += [approval_decided_fact(a) for a in decided]
    cases = ReconciliationCase.objects.filter(tenant_id=tenant_id)
    if EventType.CASE_OPENED in types:
        facts += [case_opened_fact(c) for c in cases.filter(opened_at__gte=since)]
    if EventType.CASE_RESOLVED in types:
        resolved = cases.filter(resolved_at__gte=since, status=CaseStatus.RESOLVED)
        facts += [case_resolved_fact(c) for c in resolved]
    return facts


def events_missed(*, now: datetime | None = None) -> int:
    """Raise the event of every fact of the last day that has none (its hook failed,
    or the process died between the fact's commit and the hook). Only facts since
    the tenant's endpoints exist: a new endpoint is not sent the day before it."""
    now = now or timezone.now()
    raised = 0
    active = WebhookEndpoint.objects.filter(is_active=True)
    firsts = active.values("tenant_id").annotate(first=Min("created_at"))
    for row in firsts:
        tenant_id = row["tenant_id"]
        since = max(now - MISSED_WINDOW, row["first"])
        subscribed = active.filter(tenant_id=tenant_id).values_list("events", flat=True)
        types = {event_type for events in subscribed for event_type in events}
        facts = _facts_since(tenant_id, types, since)
        for start in range(0, len(facts), 500):
            chunk = facts[start : start + 500]
            known = set(
                WebhookEvent.objects.filter(
                    tenant_id=tenant_id, topic__in=[fact.topic for fact in chunk]
                ).values_list("topic", flat=True)
            )
            for fact in chunk:
                if fact.topic not in known and event_raise(fact) is not None:
                    raised += 1
    return raised


def deliveries_unstarted(limit: int = 500) -> int:
    """Start each delivery whose run was never started (its commit hook did not run)."""
    waiting = WebhookDelivery.objects.filter(run__isnull=True).order_by("created_at")[:limit]
    return deliveries_start(list(waiting))


def webhooks_duty(sweep_pass) -> None:
    """The sweeper's duty: start unstarted deliveries every pass; raise missed events
    every ``REPAIR_INTERVAL_SECONDS``."""
    global _last_repair
    raised = 0
    if time.monotonic() - _last_repair >= REPAIR_INTERVAL_SECONDS:
        raised = events_missed()
        _last_repair = time.monotonic()
    started = deliveries_unstarted()
    if raised or started:
        log.info("webhooks: %d missed events raised, %d deliveries started", raised, started)
