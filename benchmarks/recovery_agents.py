"""Agents for ``benchmarks/recovery.py``.

``slow_steps`` is a run of read-only tool steps that each sleep a little, so a
worker can be killed in the middle of one. Every execution of a step body is
written to an independent SQLite ledger (``HOLDFAST_BENCH_LEDGER``) that the
engine never touches: a row when the body starts, completed when it returns.
The benchmark counts executions there, not in the engine's tables.

``fast_steps`` is two trivial read-only steps, for the worker memory check.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agentruns.runtime import READ_ONLY, Budget, CallInfo, RunContext, agent, tool

LEDGER_ENV = "HOLDFAST_BENCH_LEDGER"
# Which worker cluster this process belongs to (set by the benchmark per cluster).
CLUSTER_ENV = "HOLDFAST_BENCH_CLUSTER"

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS execution (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    step_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    pgid INTEGER NOT NULL,
    cluster TEXT NOT NULL,
    start_mono REAL NOT NULL,
    start_wall REAL NOT NULL,
    end_mono REAL,
    end_wall REAL
);
CREATE INDEX IF NOT EXISTS execution_run ON execution (run_id, start_mono);
"""


def ledger_connect(path: str | Path) -> sqlite3.Connection:
    """A connection to the ledger: autocommit, WAL, and waiting (not failing) on a lock."""
    conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    # A killed process loses nothing the OS already has; fsync is not what is measured.
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def init_ledger(path: str | Path) -> None:
    conn = ledger_connect(path)
    try:
        conn.executescript(LEDGER_SCHEMA)
    finally:
        conn.close()


def _ledger_path() -> str:
    path = os.environ.get(LEDGER_ENV)
    if not path:
        raise RuntimeError(f"{LEDGER_ENV} is not set; the recovery agents need a ledger")
    return path


def _record_start(call: CallInfo) -> int:
    seq = int(call.step_id.split(".", 1)[0])
    conn = ledger_connect(_ledger_path())
    try:
        cursor = conn.execute(
            "INSERT INTO execution (run_id, seq, step_id, attempt, pid, pgid, cluster, "
            "start_mono, start_wall) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                call.run_id,
                seq,
                call.step_id,
                call.attempt,
                os.getpid(),
                os.getpgrp(),
                os.environ.get(CLUSTER_ENV, ""),
                time.monotonic(),
                time.time(),
            ),
        )
        row_id = cursor.lastrowid
    finally:
        conn.close()
    assert row_id is not None
    return row_id


def _record_end(row_id: int) -> None:
    conn = ledger_connect(_ledger_path())
    try:
        conn.execute(
            "UPDATE execution SET end_mono = ?, end_wall = ? WHERE id = ?",
            (time.monotonic(), time.time(), row_id),
        )
    finally:
        conn.close()


class SlowStepArgs(BaseModel):
    index: int = Field(ge=0)
    sleep: float = Field(ge=0, le=10)


@tool(
    name="slow_step",
    args=SlowStepArgs,
    description="Sleep a little and note every execution in the ledger.",
    recovery=READ_ONLY,
)
def slow_step(request: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    row_id = _record_start(call)
    time.sleep(request["sleep"])
    _record_end(row_id)
    return {"index": request["index"], "pid": os.getpid()}


class SlowInput(BaseModel):
    steps: int = Field(default=8, ge=1, le=100)
    sleep: float = Field(default=0.3, ge=0, le=10)
    trial: int = 0


@agent(
    name="slow_steps",
    version=1,
    tools=[slow_step],
    input_model=SlowInput,
    budget=Budget(max_steps=200),
)
def slow_steps(ctx: RunContext, input: dict[str, Any]) -> dict[str, Any]:
    done = 0
    for index in range(input["steps"]):
        result = ctx.tool("slow_step", {"index": index, "sleep": input["sleep"]})
        if not result.ok:
            return {"ok": False, "steps": done, "error": result.error}
        done += 1
    return {"ok": True, "steps": done}


class EchoArgs(BaseModel):
    n: int


@tool(name="echo", args=EchoArgs, description="Return its argument.", recovery=READ_ONLY)
def echo(request: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    return {"n": request["n"]}


class FastInput(BaseModel):
    n: int = 0


@agent(name="fast_steps", version=1, tools=[echo], input_model=FastInput)
def fast_steps(ctx: RunContext, input: dict[str, Any]) -> dict[str, Any]:
    first = ctx.tool("echo", {"n": input["n"]})
    second = ctx.tool("echo", {"n": input["n"] + 1})
    return {"ok": first.ok and second.ok}


AGENTS = [slow_steps, fast_steps]
