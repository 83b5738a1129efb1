"""A live server (daphne, in a forked process) and a real worker, for Chromium to drive.

Debian's Chromium is driven through Playwright's Python package with
``executable_path``; Playwright's own browser download is never used.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.harness import SCREENSHOTS

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
PROVIDER_SETTINGS = ("PAYMENTS_API_BASE", "SHOP_API_BASE")


def _fresh_connections() -> None:
    # The forked server inherits settings that already name the test databases
    # (channels' own helper would prefix "test_" a second time on PostgreSQL);
    # it only must not share the parent's open connections. Abandon them rather
    # than close them: closing would end the parent's session on the same socket.
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        conn.connection = None


@pytest.fixture(scope="module")
def live_server_url(django_db_setup, django_db_blocker):
    from channels.testing.live import make_application
    from daphne.testing import DaphneProcess
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    with django_db_blocker.unblock():
        server = DaphneProcess(
            "127.0.0.1",
            partial(make_application, static_wrapper=ASGIStaticFilesHandler),
            setup=_fresh_connections,
        )
        server.start()
        assert server.ready.wait(15), "daphne did not start"
    yield f"http://127.0.0.1:{server.port.value}"
    # Killed, not terminated: without a terminal the reactor ignores SIGTERM, and waiting
    # for it cost every browser module 10 s. The server holds nothing to hand back: its
    # connections to the test databases end with the process.
    server.kill()
    server.join(10)


@pytest.fixture(scope="module")
def sandbox_provider(sandbox_process):
    """Point the refund tools at the sandbox: the live server reads the payment
    for "state now" (forked, so set before the fork) and the workers send the
    refund (their own processes, so through the environment).

    A module that needs it overrides ``live_server_url`` to depend on it, so the
    server forks only once the settings are in place."""
    saved = {name: (getattr(settings, name), os.environ.get(name)) for name in PROVIDER_SETTINGS}
    for name in PROVIDER_SETTINGS:
        setattr(settings, name, sandbox_process.url)
        os.environ[name] = sandbox_process.url
    yield sandbox_process
    for name, (value, environ) in saved.items():
        setattr(settings, name, value)
        if environ is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = environ


@pytest.fixture(scope="module")
def browser(live_server_url):
    from playwright.sync_api import expect, sync_playwright

    # An assertion waits up to 30 s for the page to agree, not Playwright's 5: the suite
    # runs in several processes on a small machine, and the wait ends as soon as it agrees.
    expect.set_options(timeout=30_000)

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    yield context.new_page()
    context.close()


@pytest.fixture
def screenshot(page):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def workers(tmp_path):
    """A real worker cluster and sweeper on the test database, in their own process groups."""
    env = {**os.environ, "HOLDFAST_SWEEP_INTERVAL_SECONDS": "0.2", "HOLDFAST_WORKERS": "1"}
    db = settings.DATABASES["default"]
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    else:
        env["HOLDFAST_SQLITE_PATH"] = str(db["NAME"])
    processes = []
    logs = []
    for command in (["worker"], ["sweep", "--loop"]):
        logs.append(tmp_path / f"{command[0]}.log")
        log = logs[-1].open("w")
        processes.append(
            subprocess.Popen(
                [sys.executable, "manage.py", *command],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    yield processes
    for process in processes:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    # Shown by pytest only when the test failed: what the worker and the sweeper did.
    for path in logs:
        lines = path.read_text(errors="replace").splitlines()
        print(f"--- {path.name}, last 60 of {len(lines)} lines:", *lines[-60:], sep="\n")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class WebProcess:
    """daphne on one fixed port, stopped and started again like a restarted web process."""

    def __init__(self):
        self.port = _free_port()
        self.process = None

    def start(self) -> None:
        from channels.testing.live import make_application
        from daphne.testing import DaphneProcess
        from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

        self.process = DaphneProcess(
            "127.0.0.1",
            partial(make_application, static_wrapper=ASGIStaticFilesHandler),
            setup=_fresh_connections,
            port=self.port,
        )
        self.process.start()
        assert self.process.ready.wait(15), "daphne did not start"

    def stop(self) -> None:
        self.process.kill()
        self.process.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def web(django_db_blocker):
    """A web process of its own that a test stops and starts again."""
    server = WebProcess()
    with django_db_blocker.unblock():
        server.start()
    yield server
    if server.process.is_alive():
        server.stop()
