"""The sandbox as a test fixture: one process for the whole session; every test that asks
for ``sandbox`` starts from a wiped, seeded sandbox.

The sandbox stands for the outside world, so tests reach it only over HTTP and SMTP,
never through the ORM (pytest-django's test databases are not the ones it uses).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import stripe

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "sk_test_sandbox"
# Long enough that no test's key expires by itself; the clock endpoint moves past it.
TTL_SECONDS = 600


@dataclass
class Sandbox:
    url: str
    smtp_port: int

    def get(self, path: str, **kwargs) -> requests.Response:
        return requests.get(self.url + path, timeout=10, **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return requests.post(self.url + path, timeout=10, **kwargs)

    def delete(self, path: str, **kwargs) -> requests.Response:
        return requests.delete(self.url + path, timeout=10, **kwargs)

    def stats(self) -> dict:
        return self.get("/_sandbox/stats").json()

    def arm(self, kind: str, path: str = "/v1/refunds", method: str = "POST", **extra) -> None:
        answer = self.post(
            "/_sandbox/faults", json={"kind": kind, "path": path, "method": method, **extra}
        )
        assert answer.status_code == 200, answer.text

    def client(self, api_key: str = API_KEY) -> stripe.StripeClient:
        return stripe.StripeClient(api_key, base_addresses={"api": self.url}, max_network_retries=0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True
    )


@pytest.fixture(scope="session")
def sandbox_process(tmp_path_factory) -> Iterator[Sandbox]:
    var_dir = tmp_path_factory.mktemp("sandbox")
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
    sandbox = Sandbox(url=f"http://127.0.0.1:{port}", smtp_port=smtp_port)
    deadline = time.monotonic() + 20
    while True:
        try:
            if sandbox.get("/_sandbox/stats").status_code == 200:
                break
        except requests.ConnectionError:
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
