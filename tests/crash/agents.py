"""The agent and tools the crash tests run in real worker processes.

Loaded by the workers through ``HOLDFAST_AGENT_MODULES=tests.crash.agents``.

The "provider" is a SQLite ledger file (``HOLDFAST_CRASH_LEDGER``) that the
engine never writes: every execution of a tool body (and of the scripted model)
appends a row to ``executions``, and the effects themselves live in the
provider's own tables. ``charges`` behaves like Stripe: a call whose
idempotency key is already there gets the saved charge back instead of a new
one. The tests count effects here, never in the engine's records.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from agentruns.llm.base import ModelRequest
from agentruns.llm.scripted import ScriptedCall, ScriptedReply, turn_index
from agentruns.runtime import (
    MANUAL,
    READ_ONLY,
    CallInfo,
    LookupResult,
    ModelSpec,
    RunContext,
    agent,
    idempotent,
    lookup,
    tool,
)

LEDGER_ENV = "HOLDFAST_CRASH_LEDGER"
# Long enough that a fault point fires mid-run rather than between runs; the
# tests arm named points, so nothing depends on this being exact.
CALL_SECONDS = 0.05
# The send budget is the tool's timeout plus a margin: a short timeout keeps
# the lease a killed worker leaves behind short.
EFFECT_TIMEOUT = 1.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    effect_key TEXT,
    attempt INTEGER,
    outcome TEXT NOT NULL,
    pid INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lookups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tool TEXT NOT NULL,
    effect_key TEXT,
    found TEXT,
    pid INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS charges (
    charge_id TEXT PRIMARY KEY,
    -- Stripe-like idempotency: one charge per key (NULL for calls without one).
    idempotency_key TEXT UNIQUE,
    -- The effect key written into the charge's own record, for lookups.
    metadata_key TEXT,
    order_id TEXT NOT NULL,
    amount INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS emails (
    email_id TEXT PRIMARY KEY,
    recipient TEXT NOT NULL,
    body TEXT NOT NULL,
    pid INTEGER NOT NULL,
    at REAL NOT NULL
);
"""


def connect_ledger(path: str | Path | None = None) -> sqlite3.Connection:
    """A connection to the ledger in autocommit mode; callers open their own transactions."""
    path = path or os.environ[LEDGER_ENV]
    conn = sqlite3.connect(path, timeout=10.0, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def create_ledger(path: str | Path) -> None:
    conn = connect_ledger(path)
    try:
        conn.executescript(SCHEMA)
    finally:
        conn.close()


def _args_json(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"))


def _record_execution(
    conn: sqlite3.Connection,
    tool_name: str,
    args: dict[str, Any],
    call: CallInfo | None,
    outcome: str,
) -> None:
    conn.execute(
        "INSERT INTO executions (tool, args, effect_key, attempt, outcome, pid, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            tool_name,
            _args_json(args),
            call.effect_key if call else None,
            call.attempt if call else None,
            outcome,
            os.getpid(),
            time.time(),
        ),
    )


def _charge_answer(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["charge_id"],
        "order_id": row["order_id"],
        "amount": row["amount"],
        "metadata": {"effect_key": row["metadata_key"]},
    }


def _create_charge(
    conn: sqlite3.Connection,
    request: dict[str, Any],
    *,
    idempotency_key: str | None,
    call: CallInfo,
) -> sqlite3.Row:
    charge_id = f"ch_{uuid.uuid4().hex[:16]}"
    conn.execute(
        "INSERT INTO charges (charge_id, idempotency_key, metadata_key, order_id, amount, pid, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            charge_id,
            idempotency_key,
            call.effect_key,
            request["order_id"],
            request["amount"],
            os.getpid(),
            time.time(),
        ),
    )
    return conn.execute("SELECT * FROM charges WHERE charge_id = ?", (charge_id,)).fetchone()


class NoteArgs(BaseModel):
    note: str = Field(min_length=1)


class ChargeArgs(BaseModel):
    order_id: str = Field(min_length=1)
    amount: int = Field(gt=0)


class EmailArgs(BaseModel):
    to: str
    body: str


@tool(
    name="read_note",
    args=NoteArgs,
    description="Read a note about the order.",
    recovery=READ_ONLY,
    timeout=EFFECT_TIMEOUT,
)
def read_note(request: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    time.sleep(CALL_SECONDS)
    conn = connect_ledger()
    try:
        _record_execution(conn, "read_note", request, call, "read")
    finally:
        conn.close()
    return {"note": request["note"], "text": f"the {request['note']} note for order o-1"}


def _find_charge_by_idempotency_key(request: dict[str, Any], call: CallInfo) -> LookupResult:
    return _find_charge("charge", "idempotency_key", call)


def _find_charge_by_metadata(request: dict[str, Any], call: CallInfo) -> LookupResult:
    return _find_charge("charge_lookup_only", "metadata_key", call)


def _find_charge(tool_name: str, column: str, call: CallInfo) -> LookupResult:
    conn = connect_ledger()
    try:
        # The whole charges table is read, so "absent" is conclusive.
        row = conn.execute(
            f"SELECT * FROM charges WHERE {column} = ?",  # the column is fixed in code
            (call.effect_key,),
        ).fetchone()
        conn.execute(
            "INSERT INTO lookups (tool, effect_key, found, pid, at) VALUES (?, ?, ?, ?, ?)",
            (
                tool_name,
                call.effect_key,
                row["charge_id"] if row else None,
                os.getpid(),
                time.time(),
            ),
        )
    finally:
        conn.close()
    if row is None:
        return LookupResult("absent", conclusive=True, detail="no charge carries this key")
    return LookupResult("found", _charge_answer(row), conclusive=True)


@tool(
    name="charge",
    args=ChargeArgs,
    description="Charge the order (the provider honours idempotency keys for 24 h).",
    recovery=idempotent(timedelta(hours=24), lookup=True),
    lookup=_find_charge_by_idempotency_key,
    timeout=EFFECT_TIMEOUT,
)
def charge(request: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    time.sleep(CALL_SECONDS)
    conn = connect_ledger()
    try:
        # Check-then-insert under the write lock: the provider's idempotency.
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(
            "SELECT * FROM charges WHERE idempotency_key = ?", (call.effect_key,)
        ).fetchone()
        if row is None:
            row = _create_charge(conn, request, idempotency_key=call.effect_key, call=call)
            _record_execution(conn, "charge", request, call, "created")
        else:
            _record_execution(conn, "charge", request, call, "replayed")
        conn.execute("COMMIT")
    finally:
        conn.close()
    return _charge_answer(row)


@tool(
    name="charge_lookup_only",
    args=ChargeArgs,
    description="Charge the order through a provider without idempotency keys, only a search.",
    recovery=lookup(),
    lookup=_find_charge_by_metadata,
    timeout=EFFECT_TIMEOUT,
)
def charge_lookup_only(request: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    time.sleep(CALL_SECONDS)
    conn = connect_ledger()
    try:
        # No idempotency: every call is a new charge; the key is only metadata.
        conn.execute("BEGIN IMMEDIATE")
        row = _create_charge(conn, request, idempotency_key=None, call=call)
        _record_execution(conn, "charge_lookup_only", request, call, "created")
        conn.execute("COMMIT")
    finally:
        conn.close()
    return _charge_answer(row)


@tool(
    name="send_email",
    args=EmailArgs,
    description="Send an email (SMTP: no key, no lookup).",
    recovery=MANUAL,
    timeout=EFFECT_TIMEOUT,
)
def send_email(request: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    time.sleep(CALL_SECONDS)
    email_id = f"em_{uuid.uuid4().hex[:16]}"
    conn = connect_ledger()
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO emails (email_id, recipient, body, pid, at) VALUES (?, ?, ?, ?, ?)",
            (email_id, request["to"], request["body"], os.getpid(), time.time()),
        )
        _record_execution(conn, "send_email", request, call, "sent")
        conn.execute("COMMIT")
    finally:
        conn.close()
    return {"id": email_id}


TOOLS = [read_note, charge, charge_lookup_only, send_email]

CHARGE_ARGS: dict[str, Any] = {"order_id": "o-1", "amount": 1250}
EMAIL_ARGS: dict[str, Any] = {"to": "customer@example.com", "body": "Your order is on its way."}
INTRO_NOTE: dict[str, Any] = {"note": "intro"}
RECEIPT_NOTE: dict[str, Any] = {"note": "receipt"}
# What the model asks for in each scenario (the run's input picks one).
MODEL_CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "charge": ("charge", CHARGE_ARGS),
    "charge_lookup_only": ("charge_lookup_only", CHARGE_ARGS),
    "email": ("send_email", EMAIL_ARGS),
}


def _scenario(tool_name: str, args: dict[str, Any]) -> Callable[[ModelRequest], ScriptedReply]:
    """The model asks for one tool call, then answers in words; each ask is in the ledger."""

    def reply(request: ModelRequest) -> ScriptedReply:
        turn = turn_index(request)
        time.sleep(CALL_SECONDS)
        conn = connect_ledger()
        try:
            _record_execution(conn, "chat", {"turn": turn}, None, "answered")
        finally:
            conn.close()
        if turn == 0:
            return ScriptedReply(tool_calls=[ScriptedCall(tool_name, args)])
        return ScriptedReply(content="done")

    return reply


class CrashyInput(BaseModel):
    scenario: Literal["charge", "charge_lookup_only", "email"] = "charge"


@agent(
    name="crashy",
    version=1,
    tools=TOOLS,
    input_model=CrashyInput,
    model=ModelSpec(provider="scripted", model="scripted-1", prompt_version="crashy-1"),
    scenarios={name: _scenario(*call) for name, call in MODEL_CALLS.items()},
)
def crashy(ctx: RunContext, input: dict[str, Any]) -> dict[str, Any]:
    """read_note → the model picks an effect → the effect → read_note again."""
    intro = ctx.tool("read_note", INTRO_NOTE)
    response = ctx.model(
        [
            {"role": "system", "content": "You settle orders."},
            {"role": "user", "content": intro.value["text"] if intro.ok else "no note"},
        ]
    )
    effects = [ctx.call_model_tool(call).for_model() for call in response.tool_calls]
    receipt = ctx.tool("read_note", RECEIPT_NOTE)
    return {"effects": effects, "receipt": receipt.value}


class PlodInput(BaseModel):
    steps: int = Field(default=12, ge=1, le=100)
    seconds: float = Field(default=0.3, ge=0, le=5)


class SlowNoteArgs(BaseModel):
    n: int
    seconds: float


@tool(
    name="slow_note",
    args=SlowNoteArgs,
    description="Read a note slowly (a read that takes a while).",
    recovery=READ_ONLY,
    timeout=10.0,
)
def slow_note(request: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    time.sleep(request["seconds"])
    conn = connect_ledger()
    try:
        _record_execution(conn, "slow_note", request, call, "read")
    finally:
        conn.close()
    return {"n": request["n"], "pid": os.getpid()}


@agent(name="plodder", version=1, tools=[slow_note], input_model=PlodInput)
def plodder(ctx: RunContext, input: dict[str, Any]) -> dict[str, Any]:
    """Many slow read steps: a run that is always between two steps soon."""
    pids = [
        ctx.tool("slow_note", {"n": n, "seconds": input["seconds"]}).value["pid"]
        for n in range(input["steps"])
    ]
    return {"pids": pids}


AGENTS = [crashy, plodder]
