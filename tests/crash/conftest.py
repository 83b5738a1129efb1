"""Real worker processes on a fresh database per test (tests/crash/harness.py watches them).

Each test gets its own database (a SQLite file under ``tmp_path``, or a fresh
PostgreSQL database when ``DATABASE_URL`` is set) and its own provider ledger. The
schema is made once per session by ``manage.py migrate`` in a subprocess, into a
template each test's database is copied from (the files on SQLite, ``CREATE DATABASE
… TEMPLATE`` on PostgreSQL): a migrate per test cost several seconds of CPU each.
Teardown SIGKILLs every process group the test started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.crash.agents import LEDGER_ENV, create_ledger
from tests.crash.harness import (
    MANAGE,
    PYTHON,
    ROOT,
    CrashWorld,
    EngineDatabase,
    Ledger,
    RefundWorld,
)
from tests.harness import Sandbox

# --- fixtures ------------------------------------------------------------------------


def _base_env(tmp_path: Path, ledger_path: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HOLDFAST_", "DJANGO_", "DATABASE_URL", "REDIS_URL"))
    }
    env.update(
        {
            "HOLDFAST_AGENT_MODULES": "tests.crash.agents",
            "HOLDFAST_VAR_DIR": str(tmp_path),
            LEDGER_ENV: str(ledger_path),
            "HOLDFAST_LEASE_SECONDS": "2",
            "HOLDFAST_SWEEP_INTERVAL_SECONDS": "0.2",
            "HOLDFAST_WORKERS": "1",
            "HOLDFAST_REQUEUE_AFTER_SECONDS": "3",
            # One key for every process: django-q2 signs the task packages with it.
            "DJANGO_SECRET_KEY": f"crash-tests-{uuid.uuid4().hex}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _migrate(env: dict[str, str], *databases: str) -> None:
    # On SQLite the two databases are separate files: migrate them side by side.
    procs = [
        subprocess.Popen(
            [PYTHON, MANAGE, "migrate", "--noinput", "-v0", "--database", alias],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for alias in databases
    ]
    for alias, proc in zip(databases, procs, strict=True):
        output, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            pytest.fail(f"migrate --database {alias} failed:\n{output}")


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


SQLITE_FILES = ("holdfast.sqlite3", "holdfast-queue.sqlite3")


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory) -> Iterator[Path | str]:
    """The migrated schema every test's database starts as: a directory holding the
    SQLite files, or the name of a PostgreSQL template database."""
    server_url = os.environ.get("DATABASE_URL", "")
    if not server_url:
        directory = tmp_path_factory.mktemp("crash-template")
        env = _base_env(directory, directory / "ledger.sqlite3")
        env["HOLDFAST_SQLITE_PATH"] = str(directory / SQLITE_FILES[0])
        _migrate(env, "default", "queue")
        yield directory
        return

    import psycopg
    from psycopg import sql

    name = f"crash_template_{uuid.uuid4().hex[:12]}"
    admin_url = _with_database(server_url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name))
        )
    try:
        env = _base_env(tmp_path_factory.mktemp("crash-template"), Path(os.devnull))
        env["DATABASE_URL"] = _with_database(server_url, name)
        _migrate(env, "default")
        yield name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def fresh_database(
    tmp_path: Path, migrated_template
) -> Iterator[tuple[dict[str, str], EngineDatabase]]:
    """Environment for the processes and a reader for the engine's tables, on a new
    database copied from the session's migrated template."""
    ledger_path = tmp_path / "ledger.sqlite3"
    env = _base_env(tmp_path, ledger_path)
    server_url = os.environ.get("DATABASE_URL", "")
    if not server_url:
        # Nothing has the template open: its files (with a WAL the migrating process
        # left, if it left one) are a consistent copy.
        for file_name in SQLITE_FILES:
            for suffix in ("", "-wal"):
                source = migrated_template / f"{file_name}{suffix}"
                if source.exists():
                    shutil.copyfile(source, tmp_path / f"{file_name}{suffix}")
        sqlite_path = tmp_path / SQLITE_FILES[0]
        env["HOLDFAST_SQLITE_PATH"] = str(sqlite_path)
        db = EngineDatabase(sqlite_path=sqlite_path)
        yield env, db
        db.close()
        return

    import psycopg
    from psycopg import sql

    name = f"crash_{uuid.uuid4().hex[:12]}"
    admin_url = _with_database(server_url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        # A template may have no other connection while it is copied; none has any.
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(migrated_template)
            )
        )
        # As the suite's own database (tests/conftest.py): the processes here are killed,
        # never the server, so a commit need not wait for the disk.
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name))
        )
    url = _with_database(server_url, name)
    env["DATABASE_URL"] = url
    db = EngineDatabase(postgres_url=url)
    try:
        yield env, db
    finally:
        db.close()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def world(tmp_path: Path, fresh_database) -> Iterator[CrashWorld]:
    env, db = fresh_database
    ledger_path = Path(env[LEDGER_ENV])
    create_ledger(ledger_path)
    crash_world = CrashWorld(tmp_path, env, db, Ledger(ledger_path))
    try:
        yield crash_world
    finally:
        # Before the database goes: no process of this test may outlive it.
        crash_world.kill_all()


@pytest.fixture
def refunds(world: CrashWorld, sandbox: Sandbox) -> RefundWorld:
    world.env.update(
        {
            "HOLDFAST_AGENT_MODULES": "support.agents",
            "PAYMENTS_API_BASE": sandbox.url,
            "SHOP_API_BASE": sandbox.url,
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(sandbox.smtp_port),
        }
    )
    assert sandbox.stats()["refunds"]["total"] == 0
    return RefundWorld(world, sandbox)
