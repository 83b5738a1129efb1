"""Reads of runs that the pages and the live websocket share: the list, the detail, the counts."""

from __future__ import annotations

import contextlib
import math
import uuid
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections, router
from django.db.models import Count, Q, QuerySet
from django.http import QueryDict
from django.utils import timezone

from accounts.models import AuditEntry, Tenant
from accounts.services import for_tenant
from agentruns.archives import ArchiveUnreadable, run_archive
from agentruns.dbclock import DbNow
from agentruns.marks import MARKS
from agentruns.models import Run, RunEvent, RunStatus, Step, StepKind, StepStatus
from agentruns.money import format_amount
from agentruns.services import engine_settings, get_registry
from agentruns.states import GROUPS, RunState, StateGroup, group_named, state_of, states_of

PAGE_SIZE = 50
# Tab counts stop at this many: "1000+" says as much as an exact 213,419 and costs
# a bounded index range per state instead of a scan of the tenant's whole history.
COUNT_CAP = 1000
SINCE = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
# The list's filters besides the tab (a state or a group), in the order its links carry them.
FILTERS = ("agent", "since", "q", "outcome", "mark")
# The run states the navigation counts (templates/accounts/_attention.html).
ATTENTION_STATES = (
    RunStatus.WAITING_FOR_APPROVAL.value,
    RunStatus.EFFECT_UNKNOWN.value,
    RunStatus.BLOCKED.value,
)


def _cursor(value: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not value:
        return None
    created, _, run_id = value.partition("|")
    try:
        return datetime.fromisoformat(created), uuid.UUID(run_id)
    except ValueError:
        return None


def _param(params, name: str) -> str:
    value = params.get(name, "")
    return ((value[0] if isinstance(value, list) else value) or "").strip()


class Tab(NamedTuple):
    state: RunState
    count: int  # up to COUNT_CAP + 1


class TabGroup(NamedTuple):
    group: StateGroup
    count: int  # its states' counts, each taken up to COUNT_CAP
    capped: bool  # some state of it has more than COUNT_CAP runs
    tabs: list[Tab]


def _filtered(tenant: Tenant, params) -> tuple[QuerySet[Run], str, str]:
    """The tenant's runs under the page's filters, before the tab; and the tab: a
    state, or else a group's slug (or neither: all runs)."""
    agent, since, query = _param(params, "agent"), _param(params, "since"), _param(params, "q")
    outcome, mark = _param(params, "outcome"), MARKS.get(_param(params, "mark"))
    runs = for_tenant(Run.objects.all(), tenant)
    if agent:
        runs = runs.filter(agent_name=agent)
    if outcome:
        # run_tenant_outcome index
        runs = runs.filter(outcome_code=outcome)
    if mark is not None:
        # run_tenant_<mark> index: a rare mark's runs are read from it and sorted; a
        # common one's are met soon enough walking run_tenant_recent
        runs = runs.filter(mark.condition)
    if since in SINCE:
        runs = runs.filter(created_at__gte=timezone.now() - SINCE[since])
    if query:
        # No join to steps: the effect key's runs are looked up first (a unique
        # index), so the search stays one indexed OR over runs (run_tenant_order_id,
        # run_unique_request_id_per_tenant, the primary key).
        by_effect = list(
            Step.objects.filter(effect_key=query).values_list("run_id", flat=True)[:100]
        )
        match = Q(request_id=query) | Q(input__order_id=query) | Q(pk__in=by_effect)
        with contextlib.suppress(ValueError):  # not every query is a run id
            match |= Q(pk=uuid.UUID(query))
        runs = runs.filter(match)
    state = _param(params, "state")
    if state in RunStatus.values:
        return runs, state, ""
    group = _param(params, "group")
    return runs, "", group if group_named(group) is not None else ""


def _in_tab(runs: QuerySet[Run], state: str, group: str) -> QuerySet[Run]:
    if state:
        return runs.filter(status=state)
    if group:
        return runs.filter(status__in=[s.value for s in states_of(group_named(group))])
    return runs


def capped_counts(querysets: dict[str, QuerySet[Run]]) -> dict[str, int]:
    """How many runs each queryset holds, counting no further than ``COUNT_CAP + 1``.

    Each is a ``count(*) FROM (... LIMIT cap+1)`` walking its index range (for a
    state, run_tenant_status), so a state with 200,000 runs costs what one with 1,001
    does. All of them go in one statement: the run list counts every state on every
    render, pushed ones included, and a round trip and a compiled query each cost more
    than the count itself.
    """
    names = list(querysets)
    parts: list[str] = []
    params: list[Any] = []
    for n, name in enumerate(names):
        capped = querysets[name].order_by().values("pk")[: COUNT_CAP + 1]
        sql, sql_params = capped.query.sql_with_params()
        # The SQL is Django's own, compiled from the queryset; values travel as params.
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS capped_{n})")  # noqa: S608
        params.extend(sql_params)
    with connections[router.db_for_read(Run)].cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}", params)
        row = cursor.fetchone()
    return dict(zip(names, row, strict=True))


def run_tabs_context(tenant: Tenant, params) -> dict[str, Any]:
    """The run list's tabs for ``params``: each state's count in its group, and the
    page's filters their links keep. A live page pushes these alone when a run moves."""
    runs, state, group = _filtered(tenant, params)
    return _tabs(runs, state, group, params)


def _tabs(runs: QuerySet[Run], state: str, group: str, params) -> dict[str, Any]:
    counts = capped_counts({"": runs} | {s.value: runs.filter(status=s.value) for s in RunStatus})
    total = counts.pop("")
    tab_groups = []
    for state_group in GROUPS:
        tabs = [Tab(s, counts[s.value]) for s in states_of(state_group)]
        tab_groups.append(
            TabGroup(
                state_group,
                sum(min(tab.count, COUNT_CAP) for tab in tabs),
                any(tab.count > COUNT_CAP for tab in tabs),
                tabs,
            )
        )
    filters = QueryDict(mutable=True)
    tab = (("state", state), ("group", group))
    for name, value in (*tab, *((n, _param(params, n)) for n in FILTERS)):
        if value:
            filters[name] = value
    return {
        "state": state,
        "group": group,
        # The page's own filters, for links that keep them ({% querystring filters %}):
        # fragments pushed over the socket are rendered without a request.
        "filters": filters,
        # The states in their groups, as the tabs show them, with their counts.
        "tabs": tab_groups,
        "total": total,
        "count_cap": COUNT_CAP,
    }


def run_list_context(tenant: Tenant, params) -> dict[str, Any]:
    """Everything the run list shows for ``params`` (a QueryDict or a dict of lists)."""
    runs, state, group = _filtered(tenant, params)
    tabs = _tabs(runs, state, group, params)
    runs = _in_tab(runs, state, group)
    # Keyset pagination: the page after (created_at, id), never OFFSET. The extra
    # created_at bound turns the OR into an index range (run_tenant_recent).
    after = _cursor(_param(params, "after"))
    if after is not None:
        runs = runs.filter(created_at__lte=after[0]).filter(
            Q(created_at__lt=after[0]) | Q(created_at=after[0], id__lt=after[1])
        )
    page = list(runs.order_by("-created_at", "-id")[: PAGE_SIZE + 1])
    next_cursor = None
    if len(page) > PAGE_SIZE:
        page = page[:PAGE_SIZE]
        last = page[-1]
        next_cursor = f"{last.created_at.isoformat()}|{last.id}"
    mark = _param(params, "mark")
    group_label = group_named(group).label if group else ""
    return {
        **tabs,
        "runs": page,
        "agent": _param(params, "agent"),
        "since": _param(params, "since"),
        "q": _param(params, "q"),
        "outcome": _param(params, "outcome"),
        "mark": mark if mark in MARKS else "",
        # The open tab in words, for the empty list's sentence.
        "tab_label": state_of(state).label if state else group_label,
        "marks": MARKS.values(),
        # The deployment's agents, not a scan of every run for its agent name.
        "agents": get_registry().names(),
        "next_cursor": next_cursor,
    }


def run_matches(run: Run, params) -> bool:
    """Whether a run belongs on a list page opened with ``params`` (for live rows)."""
    runs, state, group = _filtered(run.tenant, params)
    return _in_tab(runs, state, group).filter(pk=run.id).exists()


def matching_runs(tenant: Tenant, params) -> QuerySet[Run]:
    """Every run of the tenant a list page opened with ``params`` shows, on all its
    pages, newest first (what a bulk action's "all matching" takes)."""
    runs, state, group = _filtered(tenant, params)
    return _in_tab(runs, state, group).order_by("-created_at", "-id")


def runs_filtered(
    tenant: Tenant,
    *,
    states: list[str] | None = None,
    agent: str = "",
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    request_id: str = "",
    order_id: str = "",
    effect_key: str = "",
    marks: list[str] | None = None,
    outcome: str = "",
) -> QuerySet[Run]:
    """The tenant's runs under the API's filters, unordered; every filter given must
    hold (``states``: any of them; ``marks``: all of them). Names are checked by the
    caller: an unknown state or mark here matches nothing."""
    runs = for_tenant(Run.objects.all(), tenant)
    if states:
        runs = runs.filter(status__in=states)  # run_tenant_status index
    if agent:
        runs = runs.filter(agent_name=agent)
    if created_after is not None:
        runs = runs.filter(created_at__gte=created_after)
    if created_before is not None:
        runs = runs.filter(created_at__lt=created_before)
    if request_id:
        runs = runs.filter(request_id=request_id)  # run_unique_request_id_per_tenant
    if order_id:
        runs = runs.filter(input__order_id=order_id)  # run_tenant_order_id
    if effect_key:
        # As the page's search: the step's run looked up first (a unique index), no join.
        owner = Step.objects.filter(effect_key=effect_key).values_list("run_id", flat=True)
        runs = runs.filter(pk__in=list(owner[:1]))
    for slug in marks or ():
        mark = MARKS.get(slug)
        runs = runs.filter(mark.condition) if mark is not None else runs.none()
    if outcome:
        runs = runs.filter(outcome_code=outcome)  # run_tenant_outcome index
    return runs


class StepTiming(NamedTuple):
    """How long a step's call took, and apart from it how long the step waited and for what.

    Either part may be missing: a step settled by a person has no call time of its
    own, a step that needed one call and no wait has no waiting.
    """

    call_started: datetime | None
    call_ended: datetime | None
    waited_started: datetime | None = None
    waited_ended: datetime | None = None
    waited_for: str = ""


def step_timing(step: Step, *, approved: bool, asked: bool = False) -> StepTiming | None:
    """The truth about a settled step's time. ``approved``: an approval was consumed by
    it; ``asked``: an approval was asked for it at all."""
    start, end = step.started_at, step.completed_at
    if start is None or end is None:
        return None
    if step.kind == StepKind.WAIT:
        return StepTiming(None, None, start, end, "its timer")
    if step.is_effect and step.last_sent_at is None and asked:
        # Never sent (rejected, or refused before its send): no call took any time;
        # all of it was the wait for a person.
        return StepTiming(None, None, start, end, "approval")
    if not step.is_effect or step.last_sent_at is None:
        if step.attempts > 1:
            # Recorded after each call: the calls and the waits between them are one span.
            return StepTiming(
                None, None, start, end, f"{step.attempts} attempts and the waits between them"
            )
        return StepTiming(start, end)
    actions = {
        entry.get("action") for entry in (step.recovery_log or []) if isinstance(entry, dict)
    }
    before = ""
    if step.last_sent_at > start:
        before = "approval" if approved else "retries"
    if "settled" in actions:
        # Its outcome came from a person, not from an answer to the last send.
        return StepTiming(None, None, step.last_sent_at, end, "a person to settle it")
    if "lookup" in actions:
        return StepTiming(None, None, step.last_sent_at, end, "recovery after an interrupted send")
    if before:
        return StepTiming(step.last_sent_at, end, start, step.last_sent_at, before)
    return StepTiming(step.last_sent_at, end)


class RunOwner(NamedTuple):
    """The worker recorded as holding a run: ``Run.lease_owner`` is ``host:pid:random``
    (``runtime.engine.new_owner_id``). ``pid`` is None for an owner id of another shape."""

    host: str
    pid: int | None
    lease_expires_at: datetime | None


def run_owner(run: Run) -> RunOwner | None:
    """Who holds ``run``'s lease, or held it last if the lease lapsed; None when the
    run was released (suspended, finished, waiting for a person) or never claimed."""
    if not run.lease_owner:
        return None
    parts = run.lease_owner.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return RunOwner(parts[0], int(parts[1]), run.lease_expires_at)
    return RunOwner(run.lease_owner, None, run.lease_expires_at)


def is_in_flight(step: Step) -> bool:
    """A send of this effect step was cleared and no answer to it is recorded yet."""
    return (
        step.is_effect
        and step.status == StepStatus.RUNNING
        and step.in_flight
        and step.last_sent_at is not None
    )


def send_may_land_until(run: Run, step: Step) -> datetime | None:
    """Until when ``step``'s send in flight may still reach the provider; None when
    no send of it is in flight.

    The engine does not record this instant, so it is computed here from what it does
    record, by the engine's own rule. The clearing commit stamps ``last_sent_at`` with
    the database clock; the worker sends only while the tool's whole timeout still fits
    in the tool's send budget counted from that commit (``runtime.sending.send``); and
    recovery treats ``last_sent_at + send budget`` as the instant after which the send
    can no longer land, waiting for it before a lookup's "not found" may mean "did not
    happen" (``runtime.recovery.recover_ambiguous``). The budget is
    ``runtime.sending.send_budget``'s: min(tool timeout + send margin, the deployment's
    longest send budget). A tool this deployment no longer has gets the longest budget,
    which bounds every send.
    """
    if not is_in_flight(step):
        return None
    settings = engine_settings()
    tool = get_registry().tool_of(run, step.name)
    budget = settings.max_send_budget_seconds
    if tool is not None:
        budget = min(tool.timeout + settings.send_margin_seconds, budget)
    return step.last_sent_at + timedelta(seconds=budget)


class SendInFlight(NamedTuple):
    """A send in flight as the run page shows it: ``seconds`` are whole seconds until
    its deadline (``passed`` False) or since it (``passed`` True)."""

    step_id: str
    sent_at: datetime
    may_land_until: datetime
    seconds: int
    passed: bool


def _whole_seconds(seconds: float) -> int:
    # "expires in 1 s" until the instant itself, "expired 0 s ago" just after it.
    return math.ceil(seconds) if seconds > 0 else math.floor(-seconds)


def run_holder_context(run: Run, steps: list[Step] | None = None) -> dict[str, Any]:
    """Which worker holds ``run`` and what it has in flight, measured on the database's
    clock (leases and sends are stamped with it; the web host's clock may differ).

    ``owner`` is a ``RunOwner`` or None; ``lease_left`` is whole seconds until its
    lease expires or, with ``lease_expired``, since it did; ``sends_in_flight`` are
    ``SendInFlight``s; ``holder_changing`` says the page should read this again soon
    (a lease or a send deadline is counting). ``steps``: the run's steps, when the
    caller has them already.
    """
    now = Run.objects.filter(pk=run.pk).annotate(now=DbNow()).values_list("now", flat=True)[0]
    if steps is None:
        steps = list(run.steps.filter(status=StepStatus.RUNNING, in_flight=True).order_by("seq"))
    sends = []
    for step in steps:
        may_land_until = send_may_land_until(run, step)
        if may_land_until is not None:
            left = (may_land_until - now).total_seconds()
            sends.append(
                SendInFlight(
                    step.step_id, step.last_sent_at, may_land_until, _whole_seconds(left), left <= 0
                )
            )
    owner = run_owner(run)
    context: dict[str, Any] = {
        "owner": owner,
        "lease_expired": False,
        "lease_left": None,
        "sends_in_flight": sends,
        "holder_changing": owner is not None or bool(sends),
    }
    if owner is not None and owner.lease_expires_at is not None:
        left = (owner.lease_expires_at - now).total_seconds()
        context["lease_expired"] = left <= 0
        context["lease_left"] = _whole_seconds(left)
    return context


class StepRow(NamedTuple):
    """One step of the timeline, with what it waits for: the approval a planned step
    waits on, the open case an unknown step waits on (None when it waits for neither),
    its timing, and until when its send may still land while one is in flight."""

    step: Step
    awaiting_approval: Any
    open_case: Any
    timing: StepTiming | None = None
    may_land_until: datetime | None = None
    # The step's latest approval and its case, whatever their state (or None).
    approval: Any = None
    case: Any = None


def run_step_rows(run: Run) -> list[StepRow]:
    """The run's steps in order, each with its approval, case, timing and send deadline:
    what the run page's timeline and the API's run show."""
    approvals = list(run.approvals.order_by("-id"))
    cases = list(run.cases.order_by("id"))
    return _step_rows(run, list(run.steps.order_by("seq")), approvals, cases)


def _step_rows(run: Run, steps: list[Step], approvals: list, cases: list) -> list[StepRow]:
    """``approvals`` newest first; ``cases`` any order."""
    # At most one of each per step: one pending approval per (run, step_id)
    # (approval_one_live_per_step) and one case per step (a one-to-one).
    pending = {approval.step_id: approval for approval in approvals if approval.is_pending}
    open_cases = {case.step_id: case for case in cases if case.is_open}
    latest: dict[str, Any] = {}
    for approval in approvals:
        latest.setdefault(approval.step_id, approval)
    case_of = {case.step_id: case for case in cases}
    consumed = {a.consumed_by_effect_key for a in approvals if a.consumed_by_effect_key}
    asked = {approval.step_id for approval in approvals}
    rows = []
    for step in steps:
        approval = pending.get(step.step_id) if step.status == StepStatus.PLANNED else None
        case = open_cases.get(step.pk) if step.status == StepStatus.UNKNOWN else None
        timing = step_timing(
            step, approved=step.effect_key in consumed, asked=step.step_id in asked
        )
        rows.append(
            StepRow(
                step,
                approval,
                case,
                timing,
                send_may_land_until(run, step),
                latest.get(step.step_id),
                case_of.get(step.pk),
            )
        )
    return rows


def _audit_of(run: Run) -> list[AuditEntry]:
    """What people did to the run, its approvals and its cases (audit_object index)."""
    approvals = [str(pk) for pk in run.approvals.values_list("pk", flat=True)]
    cases = [str(pk) for pk in run.cases.values_list("pk", flat=True)]
    concerns = Q(object_type="run", object_id=str(run.id))
    if approvals:
        concerns |= Q(object_type="approval", object_id__in=approvals)
    if cases:
        concerns |= Q(object_type="case", object_id__in=cases)
    return list(for_tenant(AuditEntry.objects.all(), run.tenant).filter(concerns)[:100])


def step_events(run: Run, step_id: str, limit: int = 200) -> list[RunEvent]:
    """The events of one of ``run``'s steps, oldest first (a case's attempts); an archived
    run's from its archive, none when that cannot be read."""
    if not run.archived_at:
        return list(run.events.filter(step_id=step_id).order_by("id")[:limit])
    try:
        events = run_archive(run).events
    except ArchiveUnreadable:
        return []
    return [event for event in events if event.step_id == step_id][:limit]


def _events_of(run: Run, steps: list[Step]) -> tuple[list[RunEvent], str]:
    """The run's latest 200 events, newest first; an archived run's from its archive,
    whose step payloads are put back on ``steps``. The second value says why the
    archive could not be read ("" when it could, or the run is not archived)."""
    if not run.archived_at:
        return list(run.events.order_by("-id")[:200]), ""
    try:
        archive = run_archive(run)
    except ArchiveUnreadable as exc:
        return [], str(exc)
    archive.fill(steps)
    return archive.events[::-1][:200], ""


def run_detail_context(run: Run, user) -> dict[str, Any]:
    """Everything the run page shows ``user``. (The run is already the viewer's
    tenant's; so are its approvals and cases.)

    ``approvals`` are (approval, amount as a person reads it), newest first;
    ``steps`` are ``StepRow``s in the run's order; the worker holding the run is
    described by ``run_holder_context``'s keys.
    """
    approvals = list(run.approvals.order_by("-id"))
    cases = list(run.cases.order_by("id"))
    steps = list(run.steps.order_by("seq"))
    events, archive_problem = _events_of(run, steps)
    return {
        "run": run,
        "archive_problem": archive_problem,
        **run_holder_context(run, steps),
        "approvals": [(a, format_amount(a.amount, a.currency)) for a in approvals],
        "cases": cases,
        "steps": _step_rows(run, steps, approvals, cases),
        "events": events,
        "audit": _audit_of(run),
        "error_detail": user.has_perm("accounts.view_provider_errors"),
        "can_cancel": user.has_perm("accounts.cancel_runs")
        and not run.is_terminal
        and run.status != RunStatus.EFFECT_UNKNOWN,
        "can_retry": user.has_perm("accounts.retry_runs")
        and run.status in (RunStatus.WAITING_FOR_RETRY, RunStatus.SLEEPING),
    }


def run_attention_counts(tenant: Tenant) -> dict[str, int]:
    """The tenant's runs in each of ``ATTENTION_STATES``, for the navigation."""
    counts = dict(
        for_tenant(Run.objects.all(), tenant)
        .filter(status__in=ATTENTION_STATES)
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {state: counts.get(state, 0) for state in ATTENTION_STATES}
