from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from accounts.models import Tenant
from sandbox.control import ControlTokenMissing, read_token, token_path
from tests.harness import ROOT, TTL_SECONDS, Sandbox


@pytest.fixture(scope="session")
def django_db_modify_db_settings_xdist_suffix(request) -> None:
    """pytest-django's, for SQLite files kept apart already: each test process has a var
    directory of its own (tests/environment.py), so its SQLite test files keep their
    names. A suffix would break the worker processes the tests start, which find the
    queue's file by the main file's name. A PostgreSQL test database gets the process's
    suffix, as pytest-django gives it."""
    from django.conf import settings

    worker = getattr(request.config, "workerinput", {}).get("workerid")
    if not worker:
        return
    for db_settings in settings.DATABASES.values():
        if db_settings["ENGINE"] == "django.db.backends.sqlite3":
            continue
        test_name = db_settings.get("TEST", {}).get("NAME") or f"test_{db_settings['NAME']}"
        db_settings.setdefault("TEST", {})["NAME"] = f"{test_name}_{worker}"


@pytest.fixture(scope="session", autouse=True)
def _flush_by_delete() -> Iterator[None]:
    """Transactional tests empty PostgreSQL's tables with DELETE, not TRUNCATE.

    Django flushes after every transactional test with one ``TRUNCATE`` of every table:
    PostgreSQL gives each table and index a new file, about 0.2 s for this schema however
    few rows a test wrote. A ``DELETE`` per table of those few rows takes about 10 ms.
    The flush runs in one transaction and every foreign key is deferrable (Django makes
    them so; no migration adds one of its own), so the order of the tables does not
    matter. A flush that resets sequences keeps Django's own statements.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        return [
            "SET CONSTRAINTS ALL DEFERRED",
            *(f"DELETE FROM {self.quote_name(table)}" for table in tables),
        ]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = truncate


@pytest.fixture(scope="session", autouse=True)
def _hang_up_doorbells(django_db_setup, django_db_blocker) -> Iterator[None]:
    """PostgreSQL: commits to the test database do not wait for the disk, and before it
    is dropped the connections a process's own threads keep to it (the live pages'
    doorbell, agentruns/doorbell.py) are ended: PostgreSQL refuses to drop a database
    someone is connected to.

    ``synchronous_commit = off`` loses a commit only when the server itself crashes;
    the tests kill Holdfast's processes, never the server (the restart test stops it
    cleanly, which writes everything first), so what they prove is unchanged, and the
    suite stops queueing on the disk's flushes. Set on the database, every connection
    gets it: the live servers', the worker processes' a test starts."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                f"ALTER DATABASE {connection.ops.quote_name(connection.settings_dict['NAME'])} "
                "SET synchronous_commit = off"
            )
            cursor.execute("SET synchronous_commit = off")
    yield
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def _empty_cache():
    """Each test starts with an empty cache (pages share provider readings in it)."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def tenant(db):
    # Transactional tests flush the database, data migrations included.
    return Tenant.objects.get_or_create(slug="default", defaults={"name": "Default"})[0]


@pytest.fixture
def other_tenant(db):
    return Tenant.objects.get_or_create(slug="other", defaults={"name": "Other"})[0]


@pytest.fixture
def make_operator(db, django_user_model):
    """A logged-in-able operator of ``tenant`` in the permission ``groups`` named."""
    from django.contrib.auth.models import Group

    from accounts.models import Operator

    def make(tenant, *groups: str, username: str | None = None, time_zone: str = "UTC"):
        user = django_user_model.objects.create_user(
            username=username or f"{'-'.join(groups) or 'nobody'}-{tenant.slug}",
            password="correct horse battery",
        )
        Operator.objects.create(user=user, tenant=tenant, time_zone=time_zone)
        for name in groups:
            # Transactional tests flush the groups the data migration made.
            group, _ = Group.objects.get_or_create(name=name)
            if not group.permissions.exists():
                _grant_group_permissions(group)
            user.groups.add(group)
        return user

    return make


def _grant_group_permissions(group) -> None:
    import importlib

    from django.contrib.auth.models import Permission

    groups = importlib.import_module("accounts.migrations.0004_create_operator_groups")
    grants = importlib.import_module("accounts.migrations.0008_provider_error_permission")
    webhooks = importlib.import_module("webhooks.migrations.0002_grant_manage_webhooks")
    codenames = groups.GROUPS[group.name] + grants.GRANTS.get(group.name, [])
    group.permissions.set(
        [
            *Permission.objects.filter(content_type__app_label="accounts", codename__in=codenames),
            *Permission.objects.filter(
                content_type__app_label="webhooks",
                codename__in=webhooks.GRANTS.get(group.name, []),
            ),
        ]
    )


# --- the sandbox: one process for the whole session; every test that asks for
# ``sandbox`` starts from a wiped, seeded sandbox. It makes its own control token, in
# ``sandbox_var_dir``, as it does for a developer.


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True
    )


@pytest.fixture(scope="session")
def sandbox_var_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sandbox")


@pytest.fixture(scope="session")
def sandbox_process(sandbox_var_dir: Path) -> Iterator[Sandbox]:
    var_dir = sandbox_var_dir
    env = {
        **os.environ,
        "HOLDFAST_VAR_DIR": str(var_dir),
        "HOLDFAST_SQLITE_PATH": str(var_dir / "holdfast.sqlite3"),
        "HOLDFAST_SANDBOX_SQLITE_PATH": str(var_dir / "sandbox.sqlite3"),
        "SANDBOX_IDEMPOTENCY_TTL_SECONDS": str(TTL_SECONDS),
    }
    # The sandbox gets a fresh SQLite file; HOLDFAST_TEST_SANDBOX_DATABASE_URL runs it on a
    # (disposable: reset wipes it) PostgreSQL database instead.
    env.pop("SANDBOX_DATABASE_URL", None)
    env.pop("SANDBOX_CONTROL_TOKEN", None)
    env.pop("SANDBOX_CONTROL_TOKEN_FILE", None)
    if os.environ.get("HOLDFAST_TEST_SANDBOX_DATABASE_URL"):
        env["SANDBOX_DATABASE_URL"] = os.environ["HOLDFAST_TEST_SANDBOX_DATABASE_URL"]
    _manage("migrate", "--database", "sandbox", "--noinput", env=env)
    _manage("seedsandbox", env=env)
    port, smtp_port = _free_port(), _free_port()
    log = (var_dir / "sandbox.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "runsandbox",
            "--port",
            str(port),
            "--smtp-port",
            str(smtp_port),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            # Written before the sandbox listens: once it answers, the token is there.
            sandbox = Sandbox(
                url=f"http://127.0.0.1:{port}",
                smtp_port=smtp_port,
                control_token=read_token(token_path(var_dir)),
            )
            if sandbox.get("/_sandbox/stats").status_code == 200:
                break
        except (ControlTokenMissing, requests.ConnectionError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail("the sandbox did not start:\n" + (var_dir / "sandbox.log").read_text())
        time.sleep(0.1)
    yield sandbox
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.close()


@pytest.fixture
def sandbox(sandbox_process: Sandbox) -> Sandbox:
    answer = sandbox_process.post("/_sandbox/reset", json={"seed": True})
    assert answer.status_code == 200, answer.text
    return sandbox_process
