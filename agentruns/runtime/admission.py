"""Starting runs: admission is idempotent per (tenant, request_id)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import IntegrityError, connections, router, transaction
from django.db.models import Model
from pydantic import ValidationError

from agentruns.dbclock import DbNow
from agentruns.models import Run, RunEvent
from agentruns.runtime.effects import canonical_json, content_hash
from agentruns.runtime.inserts import insert_sql, saved
from agentruns.runtime.registry import Agent, Registry, UnknownAgent
from agentruns.runtime.tools import validation_errors, validation_message


@dataclass(frozen=True)
class QueuedTask:
    """A run's first wake-up as a row of the queue's table, written in the run's own
    statement (PostgreSQL, the queue in the run's database), and what to say once it
    has committed (the broker's knock to its pushers)."""

    row: Model
    announce: Callable[[], None]


class AdmissionError(Exception):
    """The run could not be started; the message says why."""


class InvalidRunInput(AdmissionError):
    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.errors = errors or []


class RequestConflict(AdmissionError):
    """The request id was already used for a different run request."""

    def __init__(self, message: str, existing: Run):
        super().__init__(message)
        self.existing = existing


class DuplicateActiveRun(AdmissionError):
    """Another active run of this agent already holds the dedupe key."""

    def __init__(self, message: str, existing: Run):
        super().__init__(message)
        self.existing = existing


def start_run(
    *,
    registry: Registry,
    tenant,
    agent_name: str,
    input: dict[str, Any],
    request_id: str | None = None,
    dedupe_key: str | None = None,
    requested_by: str = "",
    enqueue: Callable[[uuid.UUID], None] | None = None,
    queued_task: Callable[[uuid.UUID], QueuedTask | None] | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> tuple[Run, bool]:
    """Start a run of the newest registered version of ``agent_name``.

    ``config_overrides`` (the tenant's settings for the agent) are merged into the
    agent's configuration, key by key, and pinned with it.

    Returns ``(run, created)``. A repeated ``request_id`` with the same agent and
    input returns the run it started the first time (``created`` is False); with
    anything different it raises ``RequestConflict``. The run is enqueued after
    the insert commits with ``enqueue``, or, on PostgreSQL, written to the queue in
    the same statement as the run when ``queued_task`` gives its row (either way no
    worker hears of a run that is not committed).
    """
    try:
        agent = registry.latest(agent_name)
    except UnknownAgent as exc:
        raise AdmissionError(str(exc)) from None
    input = _validated_input(agent, input)
    input_hash = content_hash({"agent": agent.name, "input": input})
    if request_id:
        if len(request_id) > 200:
            raise InvalidRunInput("request_id is longer than 200 characters")
        existing = Run.objects.filter(tenant=tenant, request_id=request_id).first()
        if existing is not None:
            return _same_request(existing, input_hash), False
    else:
        # A fresh id: no run holds it, so there is nothing to look up first (the
        # unique constraint still decides, below).
        request_id = uuid.uuid4().hex

    run = Run(
        tenant=tenant,
        requested_by=requested_by,
        agent_name=agent.name,
        agent_version=agent.version,
        agent_snapshot=_pinned_snapshot(agent, input, config_overrides),
        input=input,
        input_hash=input_hash,
        request_id=request_id,
        dedupe_key=dedupe_key or None,
        # Stamped with the database clock: the sweeper compares it with that clock.
        enqueued_at=DbNow() if enqueue is not None or queued_task is not None else None,
    )
    try:
        _insert(run, enqueue, queued_task)
    except IntegrityError:
        existing = Run.objects.filter(tenant=tenant, request_id=request_id).first()
        if existing is not None:
            return _same_request(existing, input_hash), False
        if dedupe_key:
            _refuse_duplicate(tenant, agent.name, dedupe_key)
        raise
    return run, True


def _validated_input(agent: Agent, input: Any) -> dict[str, Any]:
    """The input as the agent's input model reads it, exactly as it will be recorded."""
    if not isinstance(input, dict):
        raise InvalidRunInput("input must be a JSON object")
    if agent.input_model is not None:
        try:
            input = agent.input_model.model_validate(input).model_dump(mode="json")
        except ValidationError as exc:
            raise InvalidRunInput(
                validation_message(exc, what="input"), validation_errors(exc)
            ) from None
    return json.loads(canonical_json(input))


def _pinned_snapshot(
    agent: Agent, input: dict[str, Any], config_overrides: dict[str, Any] | None
) -> dict[str, Any]:
    """The agent's configuration as this run will see it for its whole life."""
    snapshot = agent.snapshot()
    if config_overrides:
        snapshot["config"] = merged_config(snapshot["config"], config_overrides)
    scenario = input.get("scenario") or agent.config.get("scenario")
    if agent.model.provider == "scripted" and agent.scenarios:
        if scenario is None and len(agent.scenarios) == 1:
            scenario = next(iter(agent.scenarios))
        if scenario not in agent.scenarios:
            known = ", ".join(sorted(agent.scenarios)) or "none"
            raise InvalidRunInput(
                f"scenario: {agent.name} has no scripted scenario {scenario!r} (known: {known})",
                [{"field": "scenario", "message": f"unknown scenario {scenario!r}"}],
            )
        snapshot["model"]["scenario"] = scenario
    return snapshot


def _insert(
    run: Run,
    enqueue: Callable[[uuid.UUID], None] | None,
    queued_task: Callable[[uuid.UUID], QueuedTask | None] | None,
) -> None:
    created = RunEvent(run=run, type="created", state_version=0, payload={"by": run.requested_by})
    alias = router.db_for_write(Run)
    if connections[alias].vendor == "postgresql":
        task = queued_task(run.id) if queued_task is not None else None
        _insert_in_one_statement(run, created, task, alias)
        if task is not None:
            transaction.on_commit(task.announce, using=alias, robust=True)
        elif enqueue is not None:
            transaction.on_commit(lambda: enqueue(run.id), using=alias, robust=True)
    else:
        with transaction.atomic(using=alias):
            run.save(force_insert=True)
            created.save(force_insert=True)
            if enqueue is not None:
                # robust: the run exists once committed; a failed wake-up is the
                # sweeper's to repair, never the caller's error.
                transaction.on_commit(lambda: enqueue(run.id), using=alias, robust=True)
    if isinstance(run.__dict__.get("enqueued_at"), DbNow):
        # The database's clock stamped it: leave it deferred, read on first use (most
        # callers never ask), instead of a SELECT per admission.
        del run.__dict__["enqueued_at"]


def _insert_in_one_statement(
    run: Run, created: RunEvent, task: QueuedTask | None, alias: str
) -> None:
    """The run, its "created" event and its first wake-up (when given): one statement,
    its own transaction unless the caller holds one (then a savepoint, so a repeated
    request id leaves the caller's transaction usable).

    Through the ORM this was BEGIN, two INSERTs, COMMIT and then the queue's INSERT in a
    second transaction: five round trips and two commits waiting on the disk, and each
    INSERT built by Django's compiler.
    """
    connection = connections[alias]
    statements = [insert_sql(run, connection)]
    if task is not None:
        statements.append(insert_sql(task.row, connection))
    event_sql, event_params = insert_sql(created, connection)
    ctes = ", ".join(f"w{index} AS ({sql})" for index, (sql, _) in enumerate(statements))
    params = [param for _, statement_params in statements for param in statement_params]
    savepoint = transaction.atomic(using=alias) if connection.in_atomic_block else None
    with savepoint or contextlib.nullcontext():
        connection.ensure_connection()
        # On the raw connection, its parameters bound by the server (Django's cursors
        # quote each one into the SQL text first); errors as Django's (IntegrityError).
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(f"WITH {ctes} {event_sql}", [*params, *event_params])
    saved(run, alias)
    saved(created, alias)


def _refuse_duplicate(tenant, agent_name: str, dedupe_key: str) -> None:
    """Raise ``DuplicateActiveRun`` if an active run holds the dedupe key."""
    holder = (
        Run.objects.active()
        .filter(tenant=tenant, agent_name=agent_name, dedupe_key=dedupe_key)
        .first()
    )
    if holder is not None:
        raise DuplicateActiveRun(
            f"run {holder.id} of {agent_name} is still active with dedupe key {dedupe_key!r}",
            holder,
        ) from None


def merged_config(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """An agent's configuration with a tenant's overrides merged in, key by key, nested:
    what a run pins."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merged_config(merged[key], value)
        else:
            merged[key] = value
    return merged


def _same_request(existing: Run, input_hash: str) -> Run:
    if existing.input_hash != input_hash:
        raise RequestConflict(
            f"request id {existing.request_id!r} was already used for run {existing.id} "
            "with a different agent or input; use a new request id for a new request",
            existing,
        )
    return existing
