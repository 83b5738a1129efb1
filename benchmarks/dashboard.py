"""How fast the runs pages answer with a realistic amount of history, on PostgreSQL.

Fills a dedicated PostgreSQL database with 1,000,000 runs of 20 tenants over 90
days and 10 steps each (10,000,000 steps), with server-side SQL
(``INSERT ... SELECT FROM generate_series``), then times the real Django views
in-process through ``django.test.Client`` as a viewer of the biggest tenant:
the run list (first page, a page 50 pages deep by the keyset cursor, a page in
the middle of the tenant's history), every state tab and group tab, every mark
filter (alone and with a tab; the fill marks runs retried, recovered, reconciled,
approved and compensated in realistic shares), the search by run id, request id,
order id and effect key, and the detail page of a run with its steps. Prints the
median and p95 of each against the target (median < 50 ms), and for each page
whether the slowest statements the view ran use an index, from ``EXPLAIN
(ANALYZE, BUFFERS)``; the plan in full for every page that misses.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_dashboard_bench \\
        .venv/bin/python benchmarks/dashboard.py [--runs N] [--steps-per-run S] [--refill]

The overview (``/overview/``) is timed per range, whole and chart by chart (each
chart's read in ``overview.selectors``), against its own target: median < 200 ms.

With ``--with-retention`` each page is timed a second time while a retention pass
archives the tenants' runs past 30 days (one after another, in another process, in a
transaction rolled back at the end), and printed against its own quiet median.

The retention duty's reads (``retention.services``: the archive candidates and the
redaction candidates of one pass, a batch of 200) are timed under three policies set on
the benchmark's tenants (nothing is archived: the fill stays as it is): the
backlog (every tenant keeps 30 days, redacts after 7, nothing done yet) and the steady
state (nothing due: each read finds no entry below its cutoff in the partial index),
and the duty's whole pass in the steady state. Each is printed as a ratio of a primary-key read
of one run measured in the same run, with the indexes its plan used
(``EXPLAIN (ANALYZE, BUFFERS)``), and the plan in full when it scans a run table.

DATABASE_URL defaults to the URL above; the database's name must contain
"bench". It is created when missing and migrated. The fill is skipped when the
database already holds a complete fill of the requested size; otherwise (or with
--refill) the database is dropped and created again, so an interrupted fill never
leaves half a data set or a table without its indexes. A measurement, not a
test: exit status 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    import psycopg
    from django.test import Client

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/holdfast_dashboard_bench"
# Bumped whenever the generated data changes shape, so an old fill is redone.
FILL_VERSION = 2
META_TABLE = "bench_dashboard_fill"
TENANT_PREFIX = "bench-"
VIEWER_USERNAME = "dashboard-bench-viewer"
HISTORY_DAYS = 90
# Runs this recent (days) can still be working; older ones are nearly all finished.
RECENT_DAYS = 2
TARGET_MS = 50.0
CHART_TARGET_MS = 200.0  # the overview: each chart's read (overview.selectors)
FILL_TABLES = ("agentruns_run", "agentruns_step", "agentruns_runevent")
WATCHED_TABLES = ("agentruns_run", "agentruns_step", "agentruns_runevent")

# (agent name, share in 10,000, its tools): the snapshot pinned on each run lists the
# tools' schemas, 1 to 3 kB as the real agents' do (support.agents, examples.agents).
AGENTS = [
    (
        "order_support",
        4000,
        [
            "lookup_order",
            "get_customer",
            "search_kb",
            "issue_refund",
            "send_email",
            "create_ticket",
        ],
    ),
    (
        "refund_agent",
        3000,
        ["lookup_order", "get_customer", "issue_refund", "reverse_refund", "send_email"],
    ),
    ("billing_triage", 1500, ["lookup_order", "create_ticket"]),
    ("shipping_updates", 1000, ["lookup_order", "send_email"]),
    ("fraud_review", 500, ["get_customer", "create_ticket"]),
]
AGENT_VERSIONS = 4
# Run status mix in 10,000 by age; "completed" takes what is left.
RECENT_MIX = {
    "queued": 300,
    "running": 200,
    "sleeping": 300,
    "waiting_for_approval": 400,
    "waiting_for_retry": 150,
    "effect_unknown_reconciliation_required": 50,
    "partially_completed_compensation_running": 30,
    "blocked": 70,
    "failed_before_effect": 300,
    "failed_after_effect": 80,
    "compensated": 50,
    "cancelled_no_effect": 150,
    "cancelled_after_irreversible_effect": 20,
}
OLD_MIX = {
    # Runs that got stuck and stayed so: someone has to look at them.
    "sleeping": 5,
    "waiting_for_approval": 20,
    "effect_unknown_reconciliation_required": 10,
    "blocked": 10,
    "failed_before_effect": 350,
    "failed_after_effect": 90,
    "compensated": 60,
    "cancelled_no_effect": 180,
    "cancelled_after_irreversible_effect": 20,
}
# Runs marked for what happened on their way (agentruns.marks), in 10,000: retried and
# approved are common, the others rare; compensated goes with the compensated state
# and a share of failed_after_effect.
MARK_SHARES = {"retried": 800, "recovered": 50, "reconciled": 30, "approved": 1500}
EFFECT_TOOLS = ["issue_refund", "send_email", "create_ticket"]
READ_TOOLS = ["lookup_order", "get_customer", "search_kb"]


# --- environment -----------------------------------------------------------------------


def configure_environment() -> Path:
    """Point settings at the benchmark database and throw-away places; set Django up."""
    scratch = Path(tempfile.mkdtemp(prefix="holdfast-dashboard-bench-"))
    os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    # Nothing under the project's var/ is read or written: SQLite files, media, secret key.
    os.environ["HOLDFAST_VAR_DIR"] = str(scratch)
    os.environ["DJANGO_SECRET_KEY"] = "benchmark-only-not-secret"
    # DEBUG would keep every query in connection.queries and render debug pages.
    os.environ["DJANGO_DEBUG"] = "false"
    # The test client speaks plain HTTP: without DEBUG every page would be a 301 to https.
    os.environ["HOLDFAST_SSL_REDIRECT"] = "false"
    import django

    django.setup()
    return scratch


def database_settings() -> dict[str, Any]:
    from django.db import connection

    settings_dict = connection.settings_dict
    if connection.vendor != "postgresql":
        sys.exit("this benchmark runs on PostgreSQL only: set DATABASE_URL=postgres://...")
    name = settings_dict["NAME"]
    if "bench" not in name:
        sys.exit(
            f"refusing to fill database {name!r}: point DATABASE_URL at a dedicated database "
            f"whose name contains 'bench', e.g. {DEFAULT_DATABASE_URL}"
        )
    return settings_dict


def connect(settings_dict: dict[str, Any], dbname: str | None = None) -> psycopg.Connection:
    import psycopg

    params = {
        "host": settings_dict["HOST"] or None,
        "port": settings_dict["PORT"] or None,
        "user": settings_dict["USER"] or None,
        "password": settings_dict["PASSWORD"] or None,
        "dbname": dbname or settings_dict["NAME"],
    }
    return psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True)


@dataclass
class Size:
    runs: int
    steps_per_run: int
    tenants: int

    @property
    def steps(self) -> int:
        return self.runs * self.steps_per_run


def existing_fill(settings_dict: dict[str, Any]) -> dict[str, Any] | None:
    """The completed fill recorded in the benchmark database, if there is one."""
    import psycopg

    try:
        conn = connect(settings_dict)
    except psycopg.OperationalError:
        return None  # no such database (yet)
    with conn:
        if conn.execute("SELECT to_regclass(%s)", [META_TABLE]).fetchone()[0] is None:
            return None
        row = conn.execute(
            f"SELECT runs, steps_per_run, tenants, version, anchor, seconds, filled_at "
            f"FROM {META_TABLE} ORDER BY filled_at DESC LIMIT 1"
        ).fetchone()
    if row is None:
        return None
    keys = ("runs", "steps_per_run", "tenants", "version", "anchor", "seconds", "filled_at")
    return dict(zip(keys, row, strict=True))


def recreate_database(settings_dict: dict[str, Any]) -> None:
    from psycopg import sql

    name = settings_dict["NAME"]
    with connect(settings_dict, "postgres") as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def foreign_runs(settings_dict: dict[str, Any]) -> bool:
    """Whether the database holds runs that this benchmark did not write (then it is kept)."""
    import psycopg

    try:
        conn = connect(settings_dict)
    except psycopg.OperationalError:
        return False
    with conn:
        tables = conn.execute(
            "SELECT to_regclass('agentruns_run'), to_regclass(%s)", [META_TABLE]
        ).fetchone()
        if tables[0] is None or tables[1] is not None:
            return False
        return conn.execute("SELECT EXISTS (SELECT 1 FROM agentruns_run)").fetchone()[0]


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


# --- generated data --------------------------------------------------------------------


def bucket(expr: str, seed: int, modulus: int = 10_000) -> str:
    """A deterministic pseudo-random integer in [0, modulus) from an integer SQL expression."""
    return f"mod(mod(hashint8extended(({expr})::bigint, {seed}), {modulus}) + {modulus}, {modulus})"


def weighted_case(value: str, weights: list[tuple[str, int]], otherwise: str) -> str:
    """CASE mapping a bucket in [0, 10000) to a value (an SQL literal) by cumulative weight."""
    parts, upto = [], 0
    for label, weight in weights:
        upto += weight
        parts.append(f"WHEN {value} < {upto} THEN {label}")
    assert upto <= 10_000, weights
    return f"CASE {' '.join(parts)} ELSE {otherwise} END"


def quoted(weights: dict[str, int]) -> list[tuple[str, int]]:
    return [(f"'{label}'", weight) for label, weight in weights.items()]


TOOL_ARGS = {
    "lookup_order": {"order_id": "string"},
    "get_customer": {"customer_id": "string", "include_orders": "boolean"},
    "search_kb": {"query": "string", "limit": "integer"},
    "issue_refund": {"order_id": "string", "amount_cents": "integer", "reason": "string"},
    "reverse_refund": {"refund_id": "string"},
    "send_email": {"to": "string", "template": "string", "variables": "object"},
    "create_ticket": {"subject": "string", "body": "string", "priority": "string"},
}
TOOL_RECOVERY = {
    "issue_refund": {"kind": "idempotent", "window_seconds": 86400},
    "reverse_refund": {"kind": "idempotent", "window_seconds": 86400},
    "send_email": {"kind": "lookup"},
    "create_ticket": {"kind": "lookup"},
}


def agent_snapshot(name: str, version: int, tools: list[str]) -> dict[str, Any]:
    """What the engine pins on a run (Agent.snapshot()), shaped like a pydantic schema dump."""
    import hashlib
    import json

    def digest(value: Any) -> str:
        return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()

    snapshot_tools = {}
    for tool_name in tools:
        title = "".join(part.title() for part in tool_name.split("_")) + "Args"
        schema = {
            "properties": {
                arg: {
                    "title": arg.replace("_", " ").title(),
                    "type": kind,
                    "description": f"The {arg.replace('_', ' ')} the {tool_name} call uses.",
                }
                for arg, kind in TOOL_ARGS[tool_name].items()
            },
            "required": list(TOOL_ARGS[tool_name]),
            "title": title,
            "type": "object",
        }
        snapshot_tools[tool_name] = {
            "schema": schema,
            "schema_hash": digest(schema),
            "recovery": TOOL_RECOVERY.get(tool_name, {"kind": "read_only"}),
            "undo": "reverse_refund" if tool_name == "issue_refund" else None,
        }
    return {
        "agent": name,
        "version": version,
        "tools": snapshot_tools,
        "tool_schema_version": digest({n: t["schema_hash"] for n, t in snapshot_tools.items()}),
        "budget": {"max_steps": 40, "max_model_calls": 20, "max_cost_usd": "0.50"},
        "model": {"provider": "openai", "model": "gpt-4o-mini", "temperature": 0},
        "config": {"refund_limit_cents": 20000, "escalate_after_failures": 2},
    }


def agent_snapshots() -> list[dict[str, Any]]:
    """All agents' snapshots, at index (agent number - 1) * AGENT_VERSIONS + version - 1."""
    return [
        agent_snapshot(name, version, tools)
        for name, _, tools in AGENTS
        for version in range(1, AGENT_VERSIONS + 1)
    ]


def step_kind_sql(n: str, s: str) -> tuple[str, str, str]:
    """(kind, name, is_effect) SQL for step ``s`` of run ``n``; about 30% are effects."""
    k = bucket(f"({n}) * 1000 + ({s})", 4, 100)
    effect_names = ", ".join(f"'{x}'" for x in EFFECT_TOOLS)
    read_names = ", ".join(f"'{x}'" for x in READ_TOOLS)
    kind = (
        f"CASE WHEN {s} = 1 THEN 'model' WHEN {k} < 60 THEN 'tool' "
        f"WHEN {k} < 95 THEN 'model' ELSE 'approval' END"
    )
    name = (
        f"CASE WHEN {s} = 1 THEN 'plan' "
        f"WHEN {k} < 33 THEN (ARRAY[{effect_names}])[1 + mod({k}, 3)] "
        f"WHEN {k} < 60 THEN (ARRAY[{read_names}])[1 + mod({k}, 3)] "
        f"WHEN {k} < 95 THEN 'decide' ELSE 'approve_refund' END"
    )
    effect = f"({s} > 1 AND {k} < 33)"
    return kind, name, effect


def per_run_sql() -> str:
    """One row per run number n in [lo, hi]: the run's id, tenant, agent, time and status.

    Parameters: lo, hi, total, recent_from (first n of the recent days), anchor
    (the newest run's time), span (seconds of history), tenants (ids, biggest first)
    and tenant_count.
    """
    h_status = bucket("n", 1)
    h_tenant = bucket("n", 2)
    h_agent = bucket("n", 3)
    recent = weighted_case("hs", quoted(RECENT_MIX), "'completed'")
    old = weighted_case("hs", quoted(OLD_MIX), "'completed'")
    shares = [(str(i + 1), share) for i, (_, share, _) in enumerate(AGENTS[:-1])]
    agent = weighted_case("ha", shares, str(len(AGENTS)))
    names = ", ".join(f"'{a[0]}'" for a in AGENTS)
    return f"""
        SELECT n, run_id, tenant_id, created_at, agent_i, agent_version,
               (ARRAY[{names}])[agent_i] AS agent_name,
               CASE WHEN n >= %(recent_from)s THEN {recent} ELSE {old} END AS status
        FROM (
            SELECT n,
                   md5('run:' || n)::uuid AS run_id,
                   {h_status} AS hs,
                   {agent} AS agent_i,
                   -- older runs ran older versions of their agent
                   1 + ({AGENT_VERSIONS} * (n - 1)) / %(total)s AS agent_version,
                   -- a fifth of all runs are the biggest tenant's, the rest spread evenly
                   CASE WHEN ht < 2000 THEN (%(tenants)s::bigint[])[1]
                        ELSE (%(tenants)s::bigint[])[2 + mod(ht, %(tenant_count)s - 1)]
                   END AS tenant_id,
                   %(anchor)s::timestamptz
                     - make_interval(secs => (%(total)s - n) * %(span)s::float8 / %(total)s)
                     AS created_at
            FROM (
                SELECT n, {h_tenant} AS ht, {h_agent} AS ha
                FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS n
            ) AS g
        ) AS r
    """


TERMINAL_SQL = (
    "('completed', 'failed_before_effect', 'failed_after_effect', 'compensated', "
    "'cancelled_no_effect', 'cancelled_after_irreversible_effect')"
)


def insert_runs_sql() -> str:
    kind, name, _ = step_kind_sql("r.n", "%(steps)s")
    last_step = f"lpad(%(steps)s::text, 4, '0') || '.' || ({kind}) || '.' || ({name})"
    return f"""
        INSERT INTO agentruns_run (
            id, tenant_id, requested_by, agent_name, agent_version, agent_snapshot, input,
            input_hash, request_id, dedupe_key, status, outcome_detail, output, current_step,
            state_version, lease_owner, lease_expires_at, next_attempt_at, enqueued_at,
            claim_count, cancel_requested_at, cancel_requested_by, steps_used,
            model_calls_used, tokens_used, cost_micros, created_at, updated_at, finished_at,
            outcome_code, retried, recovered, reconciled, approved_by, compensated
        )
        SELECT
            r.run_id, r.tenant_id,
            CASE WHEN mod(r.n, 4) = 0 THEN 'user:ann' ELSE 'token:checkout (hft_3f9a2c1b…)' END,
            r.agent_name, r.agent_version,
            %(snapshots)s::jsonb -> ((r.agent_i - 1) * {AGENT_VERSIONS} + r.agent_version - 1)::int,
            jsonb_build_object(
                'order_id', 'ord_' || substr(md5('ord:' || r.n), 1, 16),
                'customer_id', 'cus_' || substr(md5('cus:' || mod(r.n, 50000)), 1, 14),
                'amount_cents', 500 + mod(r.n * 7919, 20000),
                'reason', 'item arrived damaged'
            ),
            encode(sha256(convert_to('input:' || r.n, 'UTF8')), 'hex'),
            'req_' || substr(md5('req:' || r.n), 1, 24),
            NULL,
            r.status,
            CASE WHEN r.status LIKE 'failed%%'
                 THEN 'issue_refund: card_declined (provider answered 402)' ELSE '' END,
            CASE WHEN r.status = 'completed'
                 THEN jsonb_build_object('refund_id', 're_' || substr(md5('re:' || r.n), 1, 14),
                                         'ok', true) END,
            {last_step},
            2 * %(steps)s + 3,
            CASE WHEN r.status IN ('running', 'partially_completed_compensation_running')
                 THEN 'worker-' || mod(r.n, 4) || ':' || (1000 + mod(r.n, 9000)) ELSE '' END,
            CASE WHEN r.status IN ('running', 'partially_completed_compensation_running')
                 THEN %(anchor)s::timestamptz + interval '3 seconds' END,
            CASE WHEN r.status IN ('sleeping', 'waiting_for_retry')
                 THEN %(anchor)s::timestamptz + make_interval(secs => mod(r.n, 3600)) END,
            r.created_at,
            1 + (mod(r.n, 50) = 0)::int,
            NULL, '',
            %(steps)s,
            (%(steps)s + 1) / 2,
            1200 * %(steps)s + mod(r.n, 5000),
            300 * %(steps)s + mod(r.n, 2000),
            r.created_at,
            r.created_at + make_interval(secs => 2 * %(steps)s + 1),
            CASE WHEN r.status IN {TERMINAL_SQL}
                 THEN r.created_at + make_interval(secs => 2 * %(steps)s + 1) END,
            '',
            {bucket("r.n", 5)} < {MARK_SHARES["retried"]},
            {bucket("r.n", 6)} < {MARK_SHARES["recovered"]},
            {bucket("r.n", 7)} < {MARK_SHARES["reconciled"]},
            CASE WHEN {bucket("r.n", 8)} < {MARK_SHARES["approved"]}
                  AND r.status <> 'waiting_for_approval' THEN 'user:ann' ELSE '' END,
            r.status = 'compensated'
              OR (r.status = 'failed_after_effect' AND {bucket("r.n", 9)} < 3000)
        FROM ({per_run_sql()}) AS r
    """


def insert_steps_sql() -> str:
    kind, name, effect = step_kind_sql("r.n", "s")
    last_status = """CASE r.status
                WHEN 'failed_before_effect' THEN 'failed'
                WHEN 'failed_after_effect' THEN 'failed'
                WHEN 'blocked' THEN 'failed'
                WHEN 'running' THEN 'running'
                WHEN 'partially_completed_compensation_running' THEN 'running'
                WHEN 'queued' THEN 'planned'
                WHEN 'waiting_for_approval' THEN 'planned'
                WHEN 'waiting_for_retry' THEN 'planned'
                WHEN 'effect_unknown_reconciliation_required' THEN 'unknown'
                ELSE 'succeeded' END"""
    return f"""
        INSERT INTO agentruns_step (
            run_id, seq, step_id, kind, name, status, is_effect, recovery, input, input_hash,
            effect_key, request, first_sent_at, last_sent_at, in_flight, attempts,
            ambiguous_attempts, resent_after_absence, last_error_class, last_error, result,
            result_hash, provider_reference, model_provider, model_id, prompt_version,
            tool_schema_version, input_tokens, output_tokens, cost_micros, created_at,
            started_at, completed_at
        )
        SELECT
            st.run_id, st.s, lpad(st.s::text, 4, '0') || '.' || st.kind || '.' || st.name,
            st.kind, st.name, st.status, st.effect,
            CASE WHEN st.effect THEN '{{"kind": "idempotent", "window_seconds": 86400}}'::jsonb
                 WHEN st.kind = 'tool' THEN '{{"kind": "read_only"}}'::jsonb END,
            jsonb_build_object('order_id', st.order_id, 'i', st.s),
            encode(sha256(convert_to(st.run_id::text || ':in:' || st.s, 'UTF8')), 'hex'),
            st.effect_key,
            CASE WHEN st.kind = 'tool'
                 THEN jsonb_build_object('order_id', st.order_id, 'idempotency_key',
                                         st.effect_key) END,
            CASE WHEN st.kind = 'tool' THEN st.at END,
            CASE WHEN st.kind = 'tool' THEN st.at END,
            false,
            CASE WHEN st.status = 'planned' THEN 0 ELSE 1 END,
            (st.status = 'unknown')::int,
            false,
            CASE WHEN st.status IN ('failed', 'unknown') THEN 'ProviderError' ELSE '' END,
            CASE WHEN st.status IN ('failed', 'unknown')
                 THEN 'HTTP 402: card_declined' ELSE '' END,
            CASE WHEN st.status = 'succeeded' THEN
                CASE WHEN st.kind = 'model'
                     THEN jsonb_build_object('action', 'call_tool', 'tool', 'issue_refund')
                     ELSE jsonb_build_object('ok', true, 'id', 'obj_' || st.s) END END,
            CASE WHEN st.status = 'succeeded'
                 THEN encode(sha256(convert_to(st.run_id::text || ':out:' || st.s, 'UTF8')),
                             'hex')
                 ELSE '' END,
            CASE WHEN st.effect AND st.status = 'succeeded'
                 THEN 're_' || substr(st.effect_key, 4, 14) ELSE '' END,
            CASE WHEN st.kind = 'model' THEN 'openai' ELSE '' END,
            CASE WHEN st.kind = 'model' THEN 'gpt-4o-mini' ELSE '' END,
            CASE WHEN st.kind = 'model' THEN 'v3' ELSE '' END,
            CASE WHEN st.kind = 'model' THEN st.schema_version ELSE '' END,
            CASE WHEN st.kind = 'model' THEN 900 + mod(st.n + st.s, 600) END,
            CASE WHEN st.kind = 'model' THEN 80 + mod(st.n * st.s, 300) END,
            CASE WHEN st.kind = 'model' THEN 400 + mod(st.n, 300) END,
            st.at, st.at,
            CASE WHEN st.status IN ('succeeded', 'failed') THEN st.at + interval '1 second' END
        FROM (
            SELECT r.n, r.run_id, a.s, a.kind, a.name, a.effect,
                   'ord_' || substr(md5('ord:' || r.n), 1, 16) AS order_id,
                   md5(r.agent_name || r.agent_version) || md5(r.agent_name || ':tools')
                     AS schema_version,
                   r.created_at + make_interval(secs => 2 * a.s) AS at,
                   CASE WHEN a.effect
                        THEN 'hf_' || substr(md5(r.run_id::text || ':' || a.s)
                                             || md5(a.s || ':' || r.run_id::text), 1, 48)
                   END AS effect_key,
                   CASE WHEN a.s < %(steps)s THEN 'succeeded' ELSE {last_status} END AS status
            FROM ({per_run_sql()}) AS r
            CROSS JOIN LATERAL (
                SELECT s, {kind} AS kind, {name} AS name, {effect} AS effect
                FROM generate_series(1, %(steps)s) AS s
            ) AS a
        ) AS st
    """


def insert_events_sql() -> str:
    return f"""
        INSERT INTO agentruns_runevent (run_id, type, state_version, step_id, payload, created_at)
        SELECT r.run_id,
               (ARRAY['run_started', 'claimed', 'step_recorded', 'step_recorded',
                      'run_finished'])[e],
               e - 1,
               CASE WHEN e IN (3, 4) THEN lpad((e - 2)::text, 4, '0') || '.model.plan'
                    ELSE '' END,
               CASE WHEN e = 5 THEN jsonb_build_object('status', r.status)
                    ELSE jsonb_build_object('agent', r.agent_name) END,
               r.created_at + make_interval(secs => e)
        FROM ({per_run_sql()}) AS r
        -- one event for most runs, five for every tenth (the detail page opens one of those)
        CROSS JOIN LATERAL generate_series(1, CASE WHEN mod(r.n, 10) = 0 THEN 5 ELSE 1 END) AS e
    """


@dataclass
class IndexDef:
    table: str
    name: str
    definition: str  # CREATE INDEX ..., or the constraint definition
    constraint: bool

    def drop_sql(self) -> str:
        if self.constraint:
            return f'ALTER TABLE {self.table} DROP CONSTRAINT "{self.name}"'
        return f'DROP INDEX "{self.name}"'

    def create_sql(self) -> str:
        if self.constraint:
            return f'ALTER TABLE {self.table} ADD CONSTRAINT "{self.name}" {self.definition}'
        return self.definition


def secondary_indexes(conn: psycopg.Connection) -> list[IndexDef]:
    """Every index of the filled tables but their primary keys, as the migrations made them."""
    rows = conn.execute(
        """
        SELECT t.relname, ix.relname, pg_get_indexdef(i.indexrelid),
               c.conname, pg_get_constraintdef(c.oid)
        FROM pg_index i
        JOIN pg_class t ON t.oid = i.indrelid
        JOIN pg_class ix ON ix.oid = i.indexrelid
        LEFT JOIN pg_constraint c
               ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid AND c.contype IN ('u', 'x')
        WHERE t.relname = ANY(%s) AND NOT i.indisprimary
        ORDER BY t.relname, ix.relname
        """,
        [list(FILL_TABLES)],
    ).fetchall()
    return [
        IndexDef(table, conname or index, condef if conname else indexdef, bool(conname))
        for table, index, indexdef, conname, condef in rows
    ]


def chunks(total: int, size: int) -> Iterator[tuple[int, int]]:
    lo = 1
    while lo <= total:
        hi = min(total, lo + size - 1)
        yield lo, hi
        lo = hi + 1


def fill(settings_dict: dict[str, Any], size: Size, tenant_ids: list[int], jobs: int) -> float:
    """Fill the (fresh, migrated) database; returns the seconds it took."""
    from psycopg.types.json import Jsonb

    anchor = datetime.now(UTC).replace(microsecond=0)
    base = {
        "total": size.runs,
        "recent_from": size.runs - size.runs * RECENT_DAYS // HISTORY_DAYS + 1,
        "anchor": anchor,
        "span": HISTORY_DAYS * 86400,
        "tenants": tenant_ids,
        "tenant_count": len(tenant_ids),
        "steps": size.steps_per_run,
        "snapshots": Jsonb(agent_snapshots()),
    }
    began = time.monotonic()

    def session(conn: psycopg.Connection) -> None:
        # Bulk-load settings for this session only: no FK triggers (the data are
        # consistent by construction; the indexes are rebuilt afterwards), no waiting
        # for WAL flushes, room to sort for the index builds.
        conn.execute("SET session_replication_role = replica")
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("SET max_parallel_maintenance_workers = 0")
        conn.execute("SET jit = off")

    conns = [connect(settings_dict) for _ in range(jobs)]
    try:
        # First, so that a fill cut short is known for this benchmark's own (and redone);
        # it gets its row when the fill is complete.
        conns[0].execute(
            f"CREATE TABLE IF NOT EXISTS {META_TABLE} (runs bigint, steps_per_run int, "
            "tenants int, version int, anchor timestamptz, seconds float8, "
            "filled_at timestamptz DEFAULT now())"
        )
        for conn in conns:
            session(conn)
        indexes = secondary_indexes(conns[0])
        phase_began = time.monotonic()
        for index in indexes:
            conns[0].execute(index.drop_sql())
        print(f"  dropped {len(indexes)} secondary indexes for the load", flush=True)

        def run_all(label: str, sql: str, ranges: list[tuple[int, int]], rows_per_n: float) -> None:
            started = time.monotonic()
            done = [0]

            def one(worker: int, lo: int, hi: int) -> None:
                conns[worker].execute(sql, {**base, "lo": lo, "hi": hi})
                done[0] += hi - lo + 1

            # Each worker takes every jobs-th range, on its own connection.
            def worker_loop(worker: int) -> None:
                for lo, hi in ranges[worker::jobs]:
                    one(worker, lo, hi)
                    elapsed = time.monotonic() - started
                    print(
                        f"    {label}: {int(done[0] * rows_per_n):>11,} rows ({elapsed:6.1f} s)",
                        flush=True,
                    )

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(worker_loop, range(jobs)))
            elapsed = time.monotonic() - started
            rows = int(size.runs * rows_per_n)
            print(
                f"  {label}: {rows:,} rows in {elapsed:.1f} s ({rows / elapsed:,.0f} rows/s)",
                flush=True,
            )

        run_chunk = max(1, min(250_000, math.ceil(size.runs / jobs)))
        run_all("runs", insert_runs_sql(), list(chunks(size.runs, run_chunk)), 1)
        # Batches of about 1M steps.
        step_chunk = max(1, 1_000_000 // max(1, size.steps_per_run))
        run_all(
            "steps",
            insert_steps_sql(),
            list(chunks(size.runs, step_chunk)),
            size.steps_per_run,
        )
        run_all("events", insert_events_sql(), list(chunks(size.runs, run_chunk)), 1.4)
        load_seconds = time.monotonic() - phase_began

        started = time.monotonic()

        def build(worker: int) -> None:
            for index in indexes[worker::jobs]:
                t = time.monotonic()
                conns[worker].execute(index.create_sql())
                print(f"    index {index.name}: {time.monotonic() - t:.1f} s", flush=True)

        # Biggest first so the two workers finish together.
        indexes.sort(key=lambda ix: FILL_TABLES.index(ix.table) != 1)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(build, range(jobs)))
        index_seconds = time.monotonic() - started
        print(f"  indexes rebuilt in {index_seconds:.1f} s", flush=True)

        started = time.monotonic()
        # Sets hint bits and the visibility map (index-only scans), and the statistics.
        tables = ["agentruns_step", "agentruns_run", "agentruns_runevent", "accounts_tenant"]

        def vacuum(worker: int) -> None:
            for table in tables[worker::jobs]:
                conns[worker].execute(f"VACUUM ANALYZE {table}")

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(vacuum, range(jobs)))
        vacuum_seconds = time.monotonic() - started
        print(f"  VACUUM ANALYZE in {vacuum_seconds:.1f} s", flush=True)

        seconds = time.monotonic() - began
        conns[0].execute(
            f"INSERT INTO {META_TABLE} (runs, steps_per_run, tenants, version, anchor, seconds) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            [size.runs, size.steps_per_run, size.tenants, FILL_VERSION, anchor, seconds],
        )
        print(
            f"  load {load_seconds:.1f} s + indexes {index_seconds:.1f} s + vacuum "
            f"{vacuum_seconds:.1f} s",
            flush=True,
        )
        return seconds
    finally:
        for conn in conns:
            conn.close()


def ensure_tenants(count: int) -> list[int]:
    """The benchmark's tenants, created if missing; the first is the biggest."""
    from accounts.models import Tenant

    ids = []
    for i in range(count):
        tenant, _ = Tenant.objects.get_or_create(
            slug=f"{TENANT_PREFIX}{i:02d}", defaults={"name": f"Bench tenant {i:02d}"}
        )
        ids.append(tenant.id)
    return ids


def table_sizes() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, pg_size_pretty(pg_table_size(oid)), "
            "pg_size_pretty(pg_indexes_size(oid)) FROM pg_class "
            "WHERE relname = ANY(%s) ORDER BY relname",
            [list(FILL_TABLES)],
        )
        return ", ".join(f"{t} {heap} + {idx} indexes" for t, heap, idx in cursor.fetchall())


# --- what is measured ------------------------------------------------------------------


@dataclass
class Targets:
    tenant_id: int
    tenant_runs: int
    run_id: uuid.UUID
    request_id: str
    order_id: str
    effect_key: str
    detail_steps: int
    detail_events: int
    page51_cursor: str
    middle_cursor: str
    middle_offset: int


def cursor_text(created_at: datetime, run_id: uuid.UUID) -> str:
    # The format the view writes into its "Older runs" link.
    return f"{created_at.isoformat()}|{run_id}"


def find_targets(tenant_slug: str) -> Targets:
    from django.db import connection

    from accounts.models import Tenant

    tenant = Tenant.objects.get(slug=tenant_slug)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM agentruns_run WHERE tenant_id = %s", [tenant.id])
        tenant_runs = cursor.fetchone()[0]
        if tenant_runs < 100:
            sys.exit(f"tenant {tenant_slug} has only {tenant_runs} runs; fill more")

        def row_at(offset: int) -> tuple[datetime, uuid.UUID]:
            cursor.execute(
                "SELECT created_at, id FROM agentruns_run WHERE tenant_id = %s "
                "ORDER BY created_at DESC, id DESC OFFSET %s LIMIT 1",
                [tenant.id, offset],
            )
            return cursor.fetchone()

        # The last row of page 50: the cursor of page 51.
        page51 = row_at(min(tenant_runs - 1, 50 * 50 - 1))
        middle_offset = tenant_runs // 2
        middle = row_at(middle_offset)
        # A run in the middle of the tenant's history that has events and an effect.
        cursor.execute(
            """
            SELECT r.id, r.request_id, r.input ->> 'order_id',
                   (SELECT s.effect_key FROM agentruns_step s
                     WHERE s.run_id = r.id AND s.effect_key IS NOT NULL ORDER BY s.seq LIMIT 1),
                   (SELECT count(*) FROM agentruns_step s WHERE s.run_id = r.id),
                   (SELECT count(*) FROM agentruns_runevent e WHERE e.run_id = r.id)
            FROM agentruns_run r
            WHERE r.tenant_id = %s AND r.created_at <= %s
            ORDER BY r.created_at DESC, r.id DESC
            LIMIT 200
            """,
            [tenant.id, middle[0]],
        )
        rows = cursor.fetchall()
    candidates = [row for row in rows if row[3] is not None and row[5] > 1]
    if not candidates:
        candidates = [row for row in rows if row[3] is not None] or rows
    run_id, request_id, order_id, effect_key, steps, events = candidates[0]
    return Targets(
        tenant_id=tenant.id,
        tenant_runs=tenant_runs,
        run_id=run_id,
        request_id=request_id,
        order_id=order_id,
        effect_key=effect_key or "hf_none",
        detail_steps=steps,
        detail_events=events,
        page51_cursor=cursor_text(*page51),
        middle_cursor=cursor_text(*middle),
        middle_offset=middle_offset,
    )


def viewer_client(tenant_id: int) -> Client:
    """A client logged in as a viewer (the "viewer" group) of the tenant."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from accounts.models import Operator

    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=VIEWER_USERNAME)
    if created:
        user.set_password("correct horse battery")
        user.save()
    Operator.objects.update_or_create(user=user, defaults={"tenant_id": tenant_id})
    user.groups.set([Group.objects.get(name="viewer")])
    # Not "testserver": ALLOWED_HOSTS comes from the settings as they are. A page that
    # fails answers 500 (noted in the report) rather than ending the benchmark.
    client = Client(SERVER_NAME="localhost", raise_request_exception=False)
    client.force_login(user)
    return client


@dataclass
class Page:
    label: str
    url: str
    expect: str | None = None  # text the answer must contain (a search finds its run)
    target_ms: float = TARGET_MS


@dataclass
class Explained:
    sql: str
    captured_ms: float
    plan: str
    execution_ms: float
    seq_scans: list[str]
    indexes: list[str]


@dataclass
class Result:
    page: Page
    samples_ms: list[float] = field(default_factory=list)
    status: int = 0
    note: str = ""
    queries: int = 0
    sql_ms: float = 0.0
    explained: list[Explained] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else math.nan

    @property
    def p95(self) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def passed(self) -> bool:
        return self.status == 200 and not self.note and self.median < self.page.target_ms


def pages(targets: Targets) -> list[Page]:
    from agentruns.marks import MARKS
    from agentruns.models import RunStatus
    from agentruns.states import GROUPS

    def q(**params: str) -> str:
        return "/runs/?" + urlencode(params)

    run_path = f"/runs/{targets.run_id}/"
    result = [
        Page("list, first page", "/runs/"),
        Page("list, page 51 (keyset)", q(after=targets.page51_cursor)),
        Page(
            f"list, row {targets.middle_offset:,} deep",
            q(after=targets.middle_cursor),
        ),
    ]
    result += [Page(f"tab {status.value}", q(state=status.value)) for status in RunStatus]
    result += [Page(f"group {group.slug}", q(group=group.slug)) for group in GROUPS]
    result += [Page(f"mark {slug}", q(mark=slug)) for slug in MARKS]
    result += [
        Page(f"mark {slug} + tab {state}", q(mark=slug, state=state))
        for slug, state in [
            ("retried", "completed"),
            ("recovered", "completed"),
            ("approved", "failed_after_effect"),
            ("reconciled", "effect_unknown_reconciliation_required"),
        ]
    ]
    result.append(
        Page("mark recovered + group needs_person", q(mark="recovered", group="needs_person"))
    )
    result += [
        Page("search run id", q(q=str(targets.run_id)), run_path),
        Page("search request id", q(q=targets.request_id), run_path),
        Page("search order id", q(q=targets.order_id), run_path),
        Page("search effect key", q(q=targets.effect_key), run_path),
        Page(
            f"run detail ({targets.detail_steps} steps, {targets.detail_events} events)",
            run_path,
            targets.effect_key,
        ),
    ]
    result += [
        Page(f"overview {key} (all charts)", f"/overview/?range={key}", target_ms=CHART_TARGET_MS)
        for key in ("24h", "7d", "30d", "90d")
    ]
    return result


def overview_charts(tenant_id: int, repeat: int) -> list[tuple[str, list[float]]]:
    """Each chart's read of the overview, per range, timed alone (ms per call)."""
    from django.core.cache import cache

    from accounts.models import Tenant
    from overview import selectors as overview

    tenant = Tenant.objects.get(pk=tenant_id)
    timings = []
    for key in overview.RANGES:
        window = overview.window_for(key)
        charts = {
            # By day, the days before today come from the cache once read: timed both ways.
            "runs + cost, cache empty": lambda w: (cache.clear(), overview.run_counts(tenant, w)),
            "runs + cost": lambda w: overview.run_counts(tenant, w),
            "approval wait + case age": lambda w: (
                overview.approval_waits(tenant, w),
                overview.open_case_ages(tenant),
            ),
            "recoveries + reconciliations": lambda w: overview.repairs(tenant, w),
            "slowest tools": lambda w: overview.slowest_tools(tenant, w),
        }
        for chart, read in charts.items():
            read(window)  # warm-up
            samples = []
            for _ in range(max(3, repeat // 2)):
                started = time.perf_counter()
                read(window)
                samples.append((time.perf_counter() - started) * 1000)
            timings.append((f"{chart}, {key}", samples))
    return timings


def timed_get(client: Client, url: str) -> tuple[float, Any]:
    started = time.perf_counter()
    response = client.get(url)
    return (time.perf_counter() - started) * 1000, response


def measure(client: Client, page: Page, repeat: int, warmup: int, budget: float) -> Result:
    """Warm up, then time up to ``repeat`` requests (at least 3 once past ``budget`` seconds)."""
    result = Result(page)
    began = time.monotonic()
    for i in range(max(1, warmup)):
        _, response = timed_get(client, page.url)
        if i == 0:
            result.status = response.status_code
            body = response.content.decode(errors="replace")
            if response.exc_info:
                result.note = f"HTTP {response.status_code}: {response.exc_info[1]!r}"[:300]
            elif response.status_code != 200:
                result.note = f"HTTP {response.status_code}"
            elif page.expect and page.expect not in body:
                result.note = f"answer lacks {page.expect!r}"
        if time.monotonic() - began > budget / 4:
            break
    began = time.monotonic()
    while len(result.samples_ms) < repeat:
        ms, _ = timed_get(client, page.url)
        result.samples_ms.append(ms)
        if len(result.samples_ms) >= 3 and time.monotonic() - began > budget:
            break
    return result


SEQ_SCAN = re.compile(r"Seq Scan on (\w+)")
INDEX_USE = re.compile(
    r"(?:Index Scan|Index Only Scan|Index Scan Backward|Index Only Scan Backward) using (\w+)"
    r"|Bitmap Index Scan on (\w+)"
)
EXECUTION = re.compile(r"Execution Time: ([\d.]+) ms")


def explain(sql: str, captured_ms: float) -> Explained:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    seq = [t for t in SEQ_SCAN.findall(plan) if t in WATCHED_TABLES]
    used = [a or b for a, b in INDEX_USE.findall(plan)]
    execution = EXECUTION.search(plan)
    return Explained(
        sql=sql,
        captured_ms=captured_ms,
        plan=plan,
        execution_ms=float(execution.group(1)) if execution else float("nan"),
        seq_scans=sorted(set(seq)),
        indexes=sorted(set(used)),
    )


def capture_and_explain(client: Client, result: Result, top: int) -> None:
    """Run the page once more with its SQL captured; EXPLAIN the slowest statements."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    durations: list[float] = []

    def timer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            durations.append((time.perf_counter() - started) * 1000)

    # CaptureQueriesContext gives the statements as sent (literals in place) but times
    # them to the millisecond; the wrapper times the same calls to the microsecond.
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(timer):
        client.get(result.page.url)
    queries = captured.captured_queries
    if len(durations) != len(queries):
        durations = [float(q["time"]) * 1000 for q in queries]
    statements = [(ms, q["sql"]) for ms, q in zip(durations, queries, strict=True)]
    result.queries = len(statements)
    result.sql_ms = sum(ms for ms, _ in statements)
    selects = [s for s in statements if s[1].lstrip().upper().startswith("SELECT")]
    selects.sort(key=lambda s: -s[0])
    # The slowest always; the next ones while they cost a noticeable share of the target.
    chosen = selects[:1] + [s for s in selects[1:top] if s[0] >= TARGET_MS / 10]
    result.explained = [explain(sql, ms) for ms, sql in chosen]


SELECT_LIST = re.compile(r"^SELECT (DISTINCT )?(.{200,}?) FROM ", re.S)


def short_sql(sql: str) -> str:
    """The statement with a long column list folded, for reading."""
    match = SELECT_LIST.match(sql)
    if not match:
        return sql
    columns = match.group(2).count(",") + 1
    return f"SELECT {match.group(1) or ''}<{columns} columns> FROM " + sql[match.end() :]


def plan_summary(result: Result) -> str:
    parts = []
    for e in result.explained:
        if e.seq_scans:
            where = "SEQ SCAN " + ",".join(e.seq_scans)
        else:
            where = "index" if e.indexes else "no index, no run/step/event table"
        if e.indexes:
            where += " (" + ",".join(e.indexes) + ")"
        parts.append(f"{e.execution_ms:.1f}ms {where}")
    return "; ".join(parts)


def report_header(width: int) -> str:
    header = (
        f"{'page':<{width}}{'median':>9}{'p95':>9}{'n':>4}{'SQL ms':>9}{'stmts':>6}  "
        f"{'verdict':<8}slowest statements (EXPLAIN ANALYZE time, access)"
    )
    return header + "\n" + "-" * len(header)


def report_row(r: Result, width: int) -> str:
    verdict = "PASS" if r.passed else "MISS"
    median = f"{r.median:>9.1f}{r.p95:>9.1f}" if r.samples_ms else f"{'-':>9}{'-':>9}"
    line = (
        f"{r.page.label:<{width}}{median}{len(r.samples_ms):>4}"
        f"{r.sql_ms:>9.1f}{r.queries:>6}  {verdict:<8}{plan_summary(r)}"
    )
    if r.note:
        line += f"  [{r.note}]"
    return line


def miss_plans(results: list[Result]) -> str:
    lines: list[str] = []
    shown: dict[str, str] = {}
    for r in results:
        if r.passed:
            continue
        lines.append("")
        lines.append(f"=== MISS: {r.page.label}  GET {r.page.url}")
        lines.append(f"    median {r.median:.1f} ms, {r.queries} statements, {r.sql_ms:.1f} ms SQL")
        for e in r.explained:
            if e.sql in shown:
                lines.append(
                    f"--- {e.captured_ms:.1f} ms (captured): same statement as on "
                    f"'{shown[e.sql]}', plan above"
                )
                continue
            shown[e.sql] = r.page.label
            lines.append(f"--- {e.captured_ms:.1f} ms (captured): {short_sql(e.sql)}")
            lines.append(e.plan)
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------


# --- the retention duty ------------------------------------------------------------------


def _timed_sql(sql: str, params, repeat: int) -> list[float]:
    from django.db import connection

    samples = []
    with connection.cursor() as cursor:
        for _ in range(repeat):
            began = time.perf_counter()
            cursor.execute(sql, params)
            cursor.fetchall()
            samples.append((time.perf_counter() - began) * 1000)
    return samples


def _plan(sql: str, params) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def retention_reads(retention_days: int, personal_data_days: int | None) -> list[tuple[str, Any]]:
    """The duty's candidate reads under a policy every bench tenant has (in memory)."""
    from accounts.models import Tenant
    from retention.services import archive_candidates, redaction_candidates

    tenants = list(Tenant.objects.filter(slug__startswith=TENANT_PREFIX))
    for tenant in tenants:
        tenant.retention_days = retention_days
        tenant.personal_data_days = personal_data_days
    # One period for all: one query each.
    [redaction] = redaction_candidates(tenants)
    [archive] = archive_candidates(tenants)
    return [
        (label, query.values_list("pk", "tenant_id")[:200].query.sql_with_params())
        for label, query in [("redaction candidates", redaction), ("archive candidates", archive)]
    ]


def _retention_row(policy: str, label: str, sql: str, params, repeat: int, baseline: float):
    samples = _timed_sql(sql, params, repeat)
    plan = _plan(sql, params)
    median = statistics.median(samples)
    seq = [t for t in SEQ_SCAN.findall(plan) if t in WATCHED_TABLES]
    used = sorted({a or b for a, b in INDEX_USE.findall(plan)})
    rows = re.search(r"\(actual time=[\d.]+\.\.[\d.]+ rows=(\d+)", plan)
    print(
        f"  {policy:<44}{label:<22}{median:>9.2f} ms  x{median / baseline:>7.1f}  "
        f"{rows.group(1) if rows else '?':>4} runs  "
        f"{'SEQ SCAN ' + ','.join(seq) if seq else 'index: ' + ', '.join(used)}"
    )
    if seq or os.environ.get("HOLDFAST_BENCH_PLANS"):
        print("    " + plan.replace("\n", "\n    "))


ARCHIVER_FLAG = "--archive-until-stopped"


def archive_until_stopped() -> int:
    """The retention pass ``--with-retention`` runs beside the pages, in its own process
    (in a thread it would share the pages' interpreter lock): it archives the bench
    tenants' runs past 30 days one after another as fast as it goes (a backlog, the worst
    case: the sweeper's duty does a batch a minute), inside one transaction rolled back
    at the end, so the fill is left as it was; archives go to the scratch directory.
    Stops at SIGTERM and prints how many runs it archived."""
    import signal

    scratch = configure_environment()
    from django.db import transaction

    from accounts.models import Tenant
    from retention.services import archive_candidates, run_archive_and_prune

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    tenants = list(Tenant.objects.filter(slug__startswith=TENANT_PREFIX))
    for tenant in tenants:
        tenant.retention_days = 30
    archived = 0
    print("ready", flush=True)
    try:
        with transaction.atomic():
            while not stopping.is_set():
                [candidates] = archive_candidates(tenants)
                for run_id in candidates.values_list("pk", flat=True)[:50]:
                    if stopping.is_set():
                        break
                    # A savepoint inside the outer transaction, as a pass's own
                    # transaction: the same statements, the same row locks.
                    run_archive_and_prune(run_id, personal_data_days=None)
                    archived += 1
            transaction.set_rollback(True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"archived {archived}", flush=True)
    return 0


def print_pages_under_retention(client, selected, quiet, args, width: int) -> None:
    """Each page timed again while ``archive_until_stopped`` archives in another process
    (stopped with SIGSTOP between pages); its median against the page's own quiet median,
    measured in the same run just before."""
    import signal
    import subprocess

    archiver = subprocess.Popen(
        [sys.executable, __file__, ARCHIVER_FLAG], stdout=subprocess.PIPE, text=True
    )
    assert archiver.stdout is not None
    if archiver.stdout.readline().strip() != "ready":
        print("\nthe retention pass did not start; pages not timed under it")
        archiver.kill()
        return
    archiver.send_signal(signal.SIGSTOP)
    print(
        "\nPages while a retention pass archives runs in another process (one run after "
        "another, rolled back at the end); ratio: median with it / median without it, "
        "measured above:"
    )
    print(f"{'page':<{width}}{'quiet':>9}{'with':>9}{'ratio':>8}")
    try:
        for page, before in zip(selected, quiet, strict=True):
            archiver.send_signal(signal.SIGCONT)
            during = measure(client, page, args.repeat, args.warmup, args.page_seconds)
            archiver.send_signal(signal.SIGSTOP)
            print(
                f"{page.label:<{width}}{before.median:>9.1f}{during.median:>9.1f}"
                f"{during.median / before.median:>7.2f}x",
                flush=True,
            )
    finally:
        archiver.send_signal(signal.SIGCONT)
        archiver.terminate()
        out, _ = archiver.communicate(timeout=120)
    print(f"  runs archived meanwhile (then rolled back): {out.strip() or '?'}")


def print_retention(targets: Targets, repeat: int) -> None:
    """The retention duty's reads over the whole run table, against a primary-key read.

    The backlog: the fill as it is, every tenant keeping 30 days and redacting after 7,
    nothing done yet. The steady state: a pass that finds nothing due reads, per tenant,
    the partial index's range below its cutoff and finds it empty, however many entries
    lie above it; a policy longer than the fill's history (100 days) makes exactly that
    read without changing the fill. (Marking the old runs archived in a transaction to
    roll back would not do: their index entries stay until a vacuum, which cannot run
    inside it.)
    """
    from django.db import transaction

    from accounts.models import Tenant
    from agentruns.sweeper import SweepReport
    from retention import services
    from retention.services import retention_duty

    baseline = statistics.median(
        _timed_sql("SELECT id FROM agentruns_run WHERE id = %s", [targets.run_id], repeat)
    )
    print(
        f"\nRetention duty (retention.services), a batch of 200 over every tenant's runs; "
        f"baseline: a primary-key read of one run, median {baseline:.3f} ms (the machine "
        "is shared):"
    )
    steady = HISTORY_DAYS + 10
    policies = [
        ("backlog: keep 30 d, redact after 7 d", 30, 7),
        (f"steady: keep {steady} d, redact after {steady} d", steady, steady),
    ]
    for policy, days, personal in policies:
        for label, (sql, params) in retention_reads(days, personal):
            _retention_row(policy, label, sql, params, repeat, baseline)

    class _Pass:
        report = SweepReport()

        def keep_lease(self) -> bool:
            return True

    with transaction.atomic():
        # The policy saved for the duty to read, and rolled back.
        Tenant.objects.update(retention_days=steady, personal_data_days=steady)
        samples = []
        for _ in range(repeat):
            services._last_pass = 0.0
            started = time.perf_counter()
            retention_duty(_Pass())
            samples.append((time.perf_counter() - started) * 1000)
        transaction.set_rollback(True)
    median = statistics.median(samples)
    print(
        f"  {'steady: the whole duty (tenants + 2 reads), nothing due':<66}{median:>9.2f} ms  "
        f"x{median / baseline:>7.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs (default 1,000,000)")
    parser.add_argument("--steps-per-run", type=int, default=10, help="steps per run (default 10)")
    parser.add_argument("--tenants", type=int, default=20, help="tenants (default 20)")
    parser.add_argument("--refill", action="store_true", help="drop and fill again")
    parser.add_argument("--jobs", type=int, default=2, help="parallel fill connections (2)")
    parser.add_argument("--repeat", type=int, default=20, help="timed requests per page (20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests first (3)")
    parser.add_argument(
        "--page-seconds",
        type=float,
        default=15.0,
        help="stop timing a slow page after this many seconds, once it has 3 samples (15)",
    )
    parser.add_argument("--only", default="", help="measure only pages whose label has this")
    parser.add_argument(
        "--with-retention",
        action="store_true",
        help="time each page again while a retention pass archives runs (rolled back)",
    )
    args = parser.parse_args(argv)
    if args.runs < 100 or args.steps_per_run < 1 or args.tenants < 2:
        parser.error("--runs >= 100, --steps-per-run >= 1 and --tenants >= 2")
    size = Size(args.runs, args.steps_per_run, args.tenants)

    began = time.monotonic()
    scratch = configure_environment()
    try:
        from django.db import connection, connections

        settings_dict = database_settings()
        where = f"{settings_dict['NAME']} @ {settings_dict['HOST'] or 'socket'}"
        previous = existing_fill(settings_dict)
        filled = (
            previous is not None
            and not args.refill
            and (previous["runs"], previous["steps_per_run"], previous["tenants"])
            == (size.runs, size.steps_per_run, size.tenants)
            and previous["version"] == FILL_VERSION
        )
        if filled:
            assert previous is not None
            migrate()
            print(
                f"fill: already filled ({size.runs:,} runs, {size.steps:,} steps, "
                f"{size.tenants} tenants) on {previous['filled_at']:%Y-%m-%d %H:%M} in "
                f"{previous['seconds']:.1f} s; --refill to redo",
                flush=True,
            )
        else:
            print(
                f"fill: {size.runs:,} runs, {size.steps:,} steps, {size.tenants} tenants "
                f"into {where} (database dropped and created again)",
                flush=True,
            )
            if not args.refill and foreign_runs(settings_dict):
                sys.exit(
                    f"database {settings_dict['NAME']!r} holds runs this benchmark did not "
                    "write; it would be dropped and filled again. Point DATABASE_URL at a "
                    f"dedicated database (default {DEFAULT_DATABASE_URL}) or pass --refill."
                )
            started = time.monotonic()
            recreate_database(settings_dict)
            migrate()
            tenant_ids = ensure_tenants(size.tenants)
            connections.close_all()
            print(f"  database created and migrated in {time.monotonic() - started:.1f} s")
            seconds = fill(settings_dict, size, tenant_ids, max(1, args.jobs))
            print(f"fill time: {seconds:.1f} s ({seconds / 60:.1f} min)", flush=True)
        print(f"tables: {table_sizes()}")

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('server_version'), current_setting('shared_buffers'), "
                "current_setting('work_mem'), current_setting('jit')"
            )
            version, shared_buffers, work_mem, jit = cursor.fetchone()
            cursor.execute(
                "SELECT t.slug, count(*) FROM agentruns_run r "
                "JOIN accounts_tenant t ON t.id = r.tenant_id "
                "GROUP BY t.slug ORDER BY count(*) DESC LIMIT 1"
            )
            biggest = cursor.fetchone()[0]
        targets = find_targets(biggest)
        client = viewer_client(targets.tenant_id)
        print(
            f"PostgreSQL {version}, shared_buffers={shared_buffers} work_mem={work_mem} "
            f"jit={jit}; {os.cpu_count()} CPUs\n"
            f"viewer of {biggest} ({targets.tenant_runs:,} runs); run {targets.run_id}, "
            f"request {targets.request_id}, order {targets.order_id}, "
            f"effect key {targets.effect_key}",
            flush=True,
        )

        selected = [p for p in pages(targets) if not args.only or args.only in p.label]
        width = max((len(p.label) for p in selected), default=30) + 2
        if selected:
            print(
                f"\nHoldfast dashboard: {targets.tenant_runs:,} runs of the biggest tenant "
                f"({size.runs:,} runs, {size.steps:,} steps in all); django.test.Client "
                f"in-process; per page up to {args.warmup} warm-ups, then up to "
                f"{args.repeat} timed requests (at least 3; fewer past "
                f"{args.page_seconds:g} s); target median < {TARGET_MS:.0f} ms. SQL ms and "
                "stmts: one more request with its SQL captured."
            )
            print(report_header(width), flush=True)
        results = []
        for page in selected:
            result = measure(client, page, args.repeat, args.warmup, args.page_seconds)
            try:
                capture_and_explain(client, result, top=3)
            except Exception as exc:  # a page that broke mid-edit must not lose the others
                result.note = (result.note + "; " if result.note else "") + f"explain: {exc!r}"
            print(report_row(result, width), flush=True)
            results.append(result)
        if not args.only or "overview" in args.only:
            print(f"\nOverview charts one by one (target median < {CHART_TARGET_MS:.0f} ms):")
            for label, samples in overview_charts(targets.tenant_id, args.repeat):
                median = statistics.median(samples)
                p95 = sorted(samples)[max(0, math.ceil(0.95 * len(samples)) - 1)]
                verdict = "PASS" if median < CHART_TARGET_MS else "MISS"
                print(f"{label:<{width}}{median:>9.1f}{p95:>9.1f}{len(samples):>4}  {verdict}")
        if args.with_retention and selected:
            print_pages_under_retention(client, selected, results, args, width)
        if not args.only or "retention" in args.only:
            print_retention(targets, args.repeat)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"load average at the end: {load}")
        passed = sum(r.passed for r in results)
        print(
            f"\n{passed} of {len(results)} pages PASS; total time {time.monotonic() - began:.0f} s"
        )
        plans = miss_plans(results)
        if plans:
            print("\nPlans of the slowest statements of each MISS (EXPLAIN (ANALYZE, BUFFERS)):")
            print(plans)
        connections.close_all()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == [ARCHIVER_FLAG]:
        sys.exit(archive_until_stopped())
    sys.exit(main())
