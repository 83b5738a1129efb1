"""Real worker processes and a way to watch them, for the crash tests.

The engine's tables are read with raw SQL, as an outside observer would; effects are
counted in the provider's own ledger. Every process runs in its own session so
``os.killpg`` reaches all of a qcluster's processes: killing only its parent leaves
the pusher and workers running (DESIGN §2, reference stack-mechanics A.1.4).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.crash.agents import connect_ledger
from tests.harness import Sandbox

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python")
if not Path(PYTHON).exists():
    PYTHON = sys.executable
MANAGE = str(ROOT / "manage.py")

DEADLINE_SECONDS = 60.0
POLL_SECONDS = 0.05
TERMINAL = {
    "completed",
    "failed_before_effect",
    "failed_after_effect",
    "compensated",
    "cancelled_no_effect",
    "cancelled_after_irreversible_effect",
}
# A run in one of these waits for a person: no worker will move it again.
NEEDS_A_PERSON = {"effect_unknown_reconciliation_required", "blocked", "waiting_for_approval"}

# What each refund run of the crash tests refunds (minor units); every demo order is larger.
AMOUNT = 700

SQLITE_NOW = "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"

T = TypeVar("T")


# --- the engine's database, read directly ---------------------------------------------


class EngineDatabase:
    """Reads the engine's tables the way an outside observer would: raw SQL."""

    def __init__(self, *, sqlite_path: Path | None = None, postgres_url: str | None = None):
        self.sqlite_path = sqlite_path
        self.postgres_url = postgres_url
        self._pg = None

    @property
    def is_postgres(self) -> bool:
        return self.postgres_url is not None

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        if self.is_postgres:
            import psycopg
            from psycopg.rows import dict_row

            for attempt in range(40):
                try:
                    if self._pg is None or self._pg.closed or self._pg.broken:
                        self._pg = psycopg.connect(
                            self.postgres_url, autocommit=True, row_factory=dict_row
                        )
                    return list(self._pg.execute(sql, params).fetchall())
                except psycopg.OperationalError:
                    # The observer outlives a restart of the server too.
                    if attempt == 39:
                        raise
                    time.sleep(0.25)
        conn = sqlite3.connect(self.sqlite_path, timeout=10.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(row) for row in conn.execute(sql.replace("%s", "?"), params)]
        finally:
            conn.close()

    def _run_key(self, run_id: str) -> str:
        # Django stores a UUID as 32 hex digits on SQLite and as uuid on PostgreSQL.
        return run_id if self.is_postgres else uuid.UUID(run_id).hex

    def run(self, run_id: str) -> dict[str, Any]:
        rows = self.query(
            "SELECT id, status, outcome_detail, output, state_version, lease_owner, "
            "lease_expires_at, next_attempt_at, enqueued_at, claim_count, current_step, "
            "steps_used, model_calls_used FROM agentruns_run WHERE id = %s",
            (self._run_key(run_id),),
        )
        assert rows, f"no run {run_id} in the engine's database"
        return rows[0]

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT seq, step_id, kind, name, status, attempts, ambiguous_attempts, in_flight, "
            "effect_key, provider_reference, last_error_class, last_error, recovery_log, result "
            "FROM agentruns_step WHERE run_id = %s ORDER BY seq",
            (self._run_key(run_id),),
        )

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT id, type, state_version, step_id, payload FROM agentruns_runevent "
            "WHERE run_id = %s ORDER BY id",
            (self._run_key(run_id),),
        )

    def lease_expired(self, run_id: str) -> bool:
        """Whether the run's lease has lapsed, by the database's clock (as a claim judges it)."""
        now = "statement_timestamp()" if self.is_postgres else SQLITE_NOW
        rows = self.query(
            f"SELECT lease_expires_at IS NOT NULL AND lease_expires_at < {now} AS expired "
            "FROM agentruns_run WHERE id = %s",
            (self._run_key(run_id),),
        )
        return bool(rows and rows[0]["expired"])

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
            self._pg = None


# --- the provider's ledger ----------------------------------------------------------


class Ledger:
    """The provider's own records: what executed, and what effects exist."""

    def __init__(self, path: Path):
        self.path = path

    def rows(self, table: str, where: str = "", params: tuple[Any, ...] = ()) -> list[dict]:
        conn = connect_ledger(self.path)
        try:
            sql = f"SELECT * FROM {table} {where} ORDER BY rowid"
            return [dict(row) for row in conn.execute(sql, params)]
        finally:
            conn.close()

    def executions(self, tool: str | None = None) -> list[dict[str, Any]]:
        if tool is None:
            return self.rows("executions")
        return self.rows("executions", "WHERE tool = ?", (tool,))

    def execution_counts(self) -> Counter[tuple[str, str]]:
        """How many times each (tool, canonical args) body ran."""
        return Counter((row["tool"], row["args"]) for row in self.executions())

    def charges(self) -> list[dict[str, Any]]:
        return self.rows("charges")

    def emails(self) -> list[dict[str, Any]]:
        return self.rows("emails")

    def lookups(self) -> list[dict[str, Any]]:
        return self.rows("lookups")

    def dump(self) -> str:
        parts = []
        for table in ("executions", "charges", "emails", "lookups"):
            parts.append(f"{table}:")
            parts.extend(f"  {row}" for row in self.rows(table))
        return "\n".join(parts)


# --- processes ----------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    stdout_path: Path
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        out = self.stdout_path.read_text(errors="replace").splitlines()[-lines:]
        err = self.stderr_path.read_text(errors="replace").splitlines()[-lines:]
        return (
            f"--- {self.name} (pid {self.pid}, exit {self.popen.returncode}) stdout tail:\n"
            + "\n".join(out)
            + f"\n--- {self.name} stderr tail:\n"
            + "\n".join(err)
        )


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: split after the last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def process_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat (T when stopped), or None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[0]


class CrashWorld:
    """One test's database, ledger and processes, with bounded waits that explain themselves."""

    def __init__(self, tmp_path: Path, env: dict[str, str], db: EngineDatabase, ledger: Ledger):
        self.tmp_path = tmp_path
        self.env = env
        self.db = db
        self.ledger = ledger
        self.procs: list[Proc] = []
        # The run the diagnostics describe (set by startrun).
        self.run_id: str | None = None

    # processes

    def start(self, name: str, *args: str, faults: str | None = None, **env: str) -> Proc:
        """Start ``manage.py ARGS`` in its own session, output to files under tmp_path."""
        full_env = dict(self.env, **env)
        if faults:
            full_env["HOLDFAST_FAULTS"] = faults
        index = len(self.procs)
        stdout_path = self.tmp_path / f"{index:02d}-{name}.out"
        stderr_path = self.tmp_path / f"{index:02d}-{name}.err"
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            popen = subprocess.Popen(
                [PYTHON, MANAGE, *args],
                cwd=ROOT,
                env=full_env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = Proc(name, popen, stdout_path, stderr_path)
        self.procs.append(proc)
        return proc

    def start_cluster(self, name: str = "qcluster", *, faults: str | None = None) -> Proc:
        return self.start(name, "worker", faults=faults)

    def start_sweeper(self) -> Proc:
        return self.start("sweeper", "sweep", "--loop")

    def start_host(self, host_id: str) -> Proc:
        """A host: a worker cluster and a sweeper in one process group (one session),
        named ``host_id`` in every lease they take, so ``kill_group`` ends the host."""
        env = dict(self.env, HOLDFAST_HOST_ID=host_id)
        stdout_path = self.tmp_path / f"{len(self.procs):02d}-{host_id}.out"
        stderr_path = self.tmp_path / f"{len(self.procs):02d}-{host_id}.err"
        script = f'"{PYTHON}" "{MANAGE}" worker & "{PYTHON}" "{MANAGE}" sweep --loop & wait'
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            popen = subprocess.Popen(
                ["/bin/sh", "-c", script],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = Proc(host_id, popen, stdout_path, stderr_path)
        self.procs.append(proc)
        return proc

    def startrun(self, input: dict[str, Any], *, agent: str = "crashy") -> str:
        proc = self.start("startrun", "startrun", agent, "--input", json.dumps(input))
        self.wait_exit(proc)
        if proc.popen.returncode != 0:
            pytest.fail(f"startrun failed\n{self.diagnostics()}")
        run_id = proc.output().strip().splitlines()[-1]
        uuid.UUID(run_id)
        self.run_id = run_id
        return run_id

    def wait_exit(self, proc: Proc, timeout: float = DEADLINE_SECONDS) -> int:
        try:
            return proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{proc.name} did not exit within {timeout}s\n{self.diagnostics()}")

    def wait_group_gone(self, proc: Proc, timeout: float = DEADLINE_SECONDS) -> None:
        """Wait until no process of ``proc``'s group is alive (it killed its whole group)."""

        def gone() -> bool:
            proc.popen.poll()  # reap the leader so it does not linger as a zombie
            return proc.popen.returncode is not None and not group_members(proc.pid)

        self.wait_until(gone, f"every process of {proc.name}'s group to be gone", timeout)

    def kill_group(self, proc: Proc) -> None:
        if proc.popen.poll() is not None and not group_members(proc.pid):
            # Leader reaped and no member left: the number may now name someone else's group.
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.popen.wait()

    def kill_all(self) -> None:
        for proc in self.procs:
            self.kill_group(proc)
        deadline = time.monotonic() + 10
        while any(group_members(p.pid) for p in self.procs) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)

    # waiting

    def wait_until(
        self, predicate: Callable[[], T], what: str, timeout: float = DEADLINE_SECONDS
    ) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout}s waiting for {what}\n{self.diagnostics()}")
            time.sleep(POLL_SECONDS)

    def wait_for_status(self, run_id: str, status: str, timeout: float = DEADLINE_SECONDS) -> dict:
        """Wait for the run to reach ``status``; fail at once if it settles anywhere else."""

        def reached() -> dict | None:
            run = self.db.run(run_id)
            if run["status"] == status:
                return run
            if run["status"] in TERMINAL | NEEDS_A_PERSON:
                pytest.fail(
                    f"run {run_id} settled as {run['status']!r}, not {status!r}\n"
                    f"{self.diagnostics()}"
                )
            return None

        return self.wait_until(reached, f"run {run_id} to be {status}", timeout)

    # what to show when something is wrong

    def diagnostics(self) -> str:
        parts = []
        if self.run_id is not None:
            try:
                parts.append(f"run: {self.db.run(self.run_id)}")
                parts.append("steps:")
                parts.extend(f"  {step}" for step in self.db.steps(self.run_id))
                parts.append("events:")
                parts.extend(f"  {event}" for event in self.db.events(self.run_id))
            except Exception as exc:
                parts.append(f"(could not read the run: {type(exc).__name__}: {exc})")
        try:
            parts.append(self.ledger.dump())
        except Exception as exc:
            parts.append(f"(could not read the ledger: {type(exc).__name__}: {exc})")
        parts.extend(proc.tail() for proc in self.procs)
        return "\n".join(parts)


# --- the refund agent against the sandbox ----------------------------------------------


@dataclass
class RefundWorld:
    """The crash world with its workers pointed at the sandbox."""

    world: CrashWorld
    sandbox: Sandbox
    run_ids: list[str] = field(default_factory=list)

    def order(self, order_id: str) -> dict[str, Any]:
        answer = self.sandbox.get(f"/shop/orders/{order_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    # processes

    def start_run(self, order_id: str, *, agent: str = "refund_support", **extra: Any) -> str:
        run_input = {"order_id": order_id, "amount": AMOUNT, "email_customer": False, **extra}
        proc = self.world.start("startrun", "startrun", agent, "--input", json.dumps(run_input))
        self.world.wait_exit(proc)
        if proc.popen.returncode != 0:
            pytest.fail(f"startrun failed\n{self.explain()}")
        run_id = proc.output().strip().splitlines()[-1]
        uuid.UUID(run_id)
        self.run_ids.append(run_id)
        return run_id

    def kill_cluster_at(
        self, fault: str, order_id: str, *, agent: str = "refund_support", **run_input: Any
    ) -> str:
        """Start a cluster armed to kill its group at ``fault``, start a run, wait for the death.

        Every earlier cluster is dead and the sweeper is not running yet, so this
        cluster is the only worker and this run the only one it can take.
        """
        cluster = self.world.start_cluster("qcluster-armed", faults=f"{fault}=killgroup")
        run_id = self.start_run(order_id, agent=agent, **run_input)
        self.world.wait_group_gone(cluster)
        return run_id

    def restart(self) -> None:
        self.world.start_cluster("qcluster-clean")
        self.world.start_sweeper()

    def wait_for_status(self, run_id: str, status: str) -> dict[str, Any]:
        """Wait for the run to reach ``status``; fail at once if it settles anywhere else."""
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            run = self.world.db.run(run_id)
            if run["status"] == status:
                return run
            if run["status"] in TERMINAL | NEEDS_A_PERSON:
                pytest.fail(
                    f"run {run_id} settled as {run['status']!r}, not {status!r}\n{self.explain()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"run {run_id} is not {status} after {DEADLINE_SECONDS}s\n{self.explain()}"
                )
            time.sleep(POLL_SECONDS)

    # the records

    def stats(self) -> dict[str, Any]:
        return self.sandbox.stats()

    def refunds_of(self, payment_intent: str) -> dict[str, int]:
        by_intent = self.stats()["refunds"]["by_payment_intent"]
        return by_intent.get(payment_intent, {"count": 0, "amount": 0})

    def listed_refunds(self, payment_intent: str) -> list[Any]:
        """Every refund of a payment, as the Stripe SDK lists them."""
        page = self.sandbox.client().v1.refunds.list(
            params={"payment_intent": payment_intent, "limit": 100}
        )
        assert not page.has_more, self.explain()
        return list(page.data)

    def tool_steps(self, run_id: str) -> dict[str, dict[str, Any]]:
        """The run's tool steps by tool name; a tool recorded twice fails the test."""
        steps = [s for s in self.world.db.steps(run_id) if s["kind"] != "model"]
        assert len({s["name"] for s in steps}) == len(steps), self.explain()
        return {step["name"]: step for step in steps}

    def explain(self) -> str:
        """Every run of the test, the processes' output, and the sandbox's records."""
        parts = []
        for run_id in self.run_ids:
            try:
                parts.append(f"run: {self.world.db.run(run_id)}")
                parts.extend(f"  step: {step}" for step in self.world.db.steps(run_id))
                parts.extend(f"  event: {event}" for event in self.world.db.events(run_id))
            except Exception as exc:
                parts.append(f"(could not read run {run_id}: {type(exc).__name__}: {exc})")
        parts.extend(proc.tail() for proc in self.world.procs)
        try:
            parts.append(f"sandbox stats: {self.stats()}")
            parts.append(f"sandbox messages: {self.sandbox.get('/_sandbox/messages').json()}")
        except Exception as exc:
            parts.append(f"(could not read the sandbox: {type(exc).__name__}: {exc})")
        return "\n".join(parts)
