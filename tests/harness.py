"""What the test packages drive Holdfast with: the engine in-process, the sandbox over
HTTP, and the refund agent pointed at it. Fixtures live in the conftests and build
on these; no test module imports a conftest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import requests
import stripe
from django.core.management import call_command
from django.utils import timezone
from django.utils.module_loading import import_string

from agentruns.doorbell import doorbell_ring
from agentruns.models import Run, Step
from agentruns.runtime import Engine, EngineSettings, Registry, start_run
from reconciliation.models import ReconciliationCase
from reconciliation.services import case_resolve, newest_lookup
from support.agents import refund_support
from tests.agentruns.runtime import agents

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "var" / "screenshots"

# The sandbox's seeded order the refund tests settle.
ORDER = "ord_1001"
# Under the refund agent's auto-approval amount (5000): no approval in the way.
AMOUNT = 700
# Above the refund agent's auto-approval amount (5000), below the order's 8900.
OVER_LIMIT = 6000


# --- the engine, in-process ----------------------------------------------------------


class Harness:
    """Drives the engine in-process, the way a worker and a sweeper would."""

    def __init__(self, tenant, **settings):
        self.tenant = tenant
        self.enqueued: list = []
        self.registry = agents.registry()
        self.settings = EngineSettings(**{"lease_seconds": 30.0, **settings})
        self.engine = self.build()

    def build(self, **overrides) -> Engine:
        from accounts.provider_accounts import TenantCredentials
        from approvals.gate import DatabaseApprovalGate
        from reconciliation.desk import DatabaseDesk

        return Engine(
            registry=overrides.pop("registry", self.registry),
            settings=overrides.pop("settings", self.settings),
            enqueue=self.enqueued.append,
            approvals=overrides.pop("approvals", DatabaseApprovalGate()),
            desk=overrides.pop("desk", DatabaseDesk()),
            credentials=overrides.pop("credentials", TenantCredentials()),
            # As agentruns.services.build_engine: commits ring the live pages' doorbell.
            committed=overrides.pop("committed", doorbell_ring),
            **overrides,
        )

    def start(self, agent_name: str, input: dict | None = None, **kwargs) -> Run:
        # The tenant's own settings for the agent, as agentruns.services.run_start does.
        self.tenant.refresh_from_db()
        kwargs.setdefault("config_overrides", (self.tenant.agent_config or {}).get(agent_name))
        run, created = start_run(
            registry=self.registry,
            tenant=self.tenant,
            agent_name=agent_name,
            input=input or {},
            enqueue=self.enqueued.append,
            **kwargs,
        )
        if created:
            doorbell_ring(run.id)  # as run_start does: live run lists show it now
        return run

    def advance(self, run: Run, engine: Engine | None = None) -> str:
        return (engine or self.engine).advance(run.id)

    def interrupt(self, run: Run, point: str, step_name: str) -> None:
        """Advance the run in a worker that dies at ``point`` of ``step_name``; then
        let its lease lapse, as if the process had been killed there."""
        engine = self.build()

        def die() -> None:
            raise SystemExit(f"worker killed at {point}@{step_name}")

        engine.faults.arm(point, die, step_name=step_name)
        with pytest.raises(SystemExit):
            engine.advance(run.id)
        self.expire_lease(run)

    def make_due(self, run: Run) -> None:
        """As if the run's wake time had come (the database clock cannot be moved)."""
        now = timezone.now()
        Run.objects.filter(pk=run.id).update(
            next_attempt_at=now - timedelta(seconds=1),
            enqueued_at=now - timedelta(seconds=30),
        )

    def expire_lease(self, run: Run) -> None:
        """As if the lease holder had vanished long enough ago for its lease to lapse."""
        Run.objects.filter(pk=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    def backdate_sends(self, run: Run, seconds: float) -> None:
        for step in Step.objects.filter(run=run, first_sent_at__isnull=False):
            step.first_sent_at -= timedelta(seconds=seconds)
            step.last_sent_at -= timedelta(seconds=seconds)
            step.save(update_fields=["first_sent_at", "last_sent_at"])

    def drive(self, run: Run, *, max_rounds: int = 20) -> Run:
        """Advance until the run stops needing a worker, making waits due at once."""
        for _ in range(max_rounds):
            run.refresh_from_db()
            if run.status in ("waiting_for_retry", "sleeping"):
                self.make_due(run)
            elif run.status not in ("queued", "running"):
                return run
            self.advance(run)
        run.refresh_from_db()
        return run


def recorded_before_marks() -> None:
    """As if every run so far had been recorded before runs had marks: the mark columns
    dropped (agentruns back to 0005, and the migrations that depend on it) and added
    again, filled by the data migrations from what was recorded."""
    try:
        call_command("migrate", "agentruns", "0005", verbosity=0)
    finally:
        call_command("migrate", verbosity=0)


# --- the sandbox, over HTTP ----------------------------------------------------------
# The sandbox stands for the outside world, so tests reach it only over HTTP and SMTP,
# never through the ORM (pytest-django's test databases are not the ones it uses).

API_KEY = "sk_test_sandbox"
# Long enough that no test's key expires by itself; the clock endpoint moves past it.
TTL_SECONDS = 600


@dataclass
class Sandbox:
    url: str
    smtp_port: int
    # Every /_sandbox/ route asks for it (sandbox.control): the fixture reads the file
    # runsandbox wrote.
    control_token: str

    def get(self, path: str, *, api_key: str = API_KEY, **kwargs) -> requests.Response:
        """A GET as the account of ``api_key`` (the sandbox's own routes take the control
        token instead)."""
        provider = {"Authorization": f"Bearer {api_key}"}
        headers = self._headers(path, provider, kwargs.pop("headers", {}))
        return requests.get(self.url + path, timeout=10, headers=headers, **kwargs)

    def order(self, order_id: str, *, api_key: str = API_KEY) -> dict:
        answer = self.get(f"/shop/orders/{order_id}", api_key=api_key)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def requests_of(self, api_key: str) -> list[dict]:
        """What the account of ``api_key`` asked the provider, oldest first (its own log)."""
        answer = self.get("/_sandbox/requests", params={"api_key": api_key})
        assert answer.status_code == 200, answer.text
        return answer.json()["requests"]

    def post(self, path: str, **kwargs) -> requests.Response:
        headers = self._headers(path, {}, kwargs.pop("headers", {}))
        return requests.post(self.url + path, timeout=10, headers=headers, **kwargs)

    def delete(self, path: str, **kwargs) -> requests.Response:
        headers = self._headers(path, {}, kwargs.pop("headers", {}))
        return requests.delete(self.url + path, timeout=10, headers=headers, **kwargs)

    def _headers(self, path: str, provider: dict, headers: dict) -> dict:
        """``provider``'s headers, or on a /_sandbox/ route the control token and JSON;
        then the caller's own ``headers``, which win."""
        if path.startswith("/_sandbox/"):
            provider = {
                "Authorization": f"Bearer {self.control_token}",
                "Content-Type": "application/json",
            }
        return {**provider, **headers}

    def stats(self) -> dict:
        return self.get("/_sandbox/stats").json()

    def arm(self, kind: str, path: str = "/v1/refunds", method: str = "POST", **extra) -> None:
        answer = self.post(
            "/_sandbox/faults", json={"kind": kind, "path": path, "method": method, **extra}
        )
        assert answer.status_code == 200, answer.text

    def client(self, api_key: str = API_KEY) -> stripe.StripeClient:
        return stripe.StripeClient(api_key, base_addresses={"api": self.url}, max_network_retries=0)


# --- the refund agent against the sandbox, in-process ---------------------------------


def run_task_inline(task: str, *args) -> None:
    """A sweeper's ``enqueue`` that runs the task at once, as a worker would take it."""
    import_string(task)(*args)


def point_at_sandbox(settings, sandbox) -> None:
    """Send the refund agent's tools to the sandbox: payments, shop and mail."""
    settings.PAYMENTS_API_BASE = sandbox.url
    settings.SHOP_API_BASE = sandbox.url
    # The test runner swaps in a memory backend; the agent must really send.
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = sandbox.smtp_port


def refund_harness(tenant, *agents) -> Harness:
    """A harness whose registry holds the refund-support agent and ``agents``."""
    harness = Harness(tenant)
    harness.registry = Registry([refund_support, *agents])
    harness.engine = harness.build()
    return harness


@dataclass
class ReconciliationWorld:
    """The refund agent in-process against the sandbox, as the reconciliation tests drive it."""

    harness: Harness
    sandbox: object
    order: dict
    settings: object

    def refunds(self) -> dict:
        return self.sandbox.stats()["refunds"]["by_payment_intent"].get(
            self.order["payment_intent"], {"count": 0, "amount": 0}
        )

    def listed_refunds(self) -> list:
        page = self.sandbox.client().v1.refunds.list(
            params={"payment_intent": self.order["payment_intent"], "limit": 100}
        )
        return list(page.data)

    def start(self, amount: int = AMOUNT, **extra):
        return self.harness.start("refund_support", {"order_id": ORDER, "amount": amount, **extra})

    def clear_faults(self) -> None:
        assert self.sandbox.delete("/_sandbox/faults").status_code == 200

    def lookups_unavailable(self) -> None:
        """The payments provider's listing of refunds answers 500 before doing anything."""
        self.sandbox.arm("error_before", path="/v1/refunds", method="GET", count=50)

    def until_unknown(self, run) -> Run:
        """Advance, making every wait due at once (sends backdated so absence could be
        judged), until the run needs a person or ends."""
        for _ in range(30):
            run.refresh_from_db()
            if run.status in ("waiting_for_retry", "sleeping"):
                self.harness.backdate_sends(run, 120)
                self.harness.make_due(run)
            elif run.status not in ("queued", "running"):
                return run
            elif run.status == "running":
                # Left running by a claim that gave up (on a loaded machine a send can
                # outlast its budget): recovered after its lease, as a worker would.
                self.harness.expire_lease(run)
            self.harness.advance(run)
        run.refresh_from_db()
        return run

    def case_of(self, run, tool: str = "issue_refund") -> ReconciliationCase:
        step = Step.objects.get(run=run, name=tool)
        return ReconciliationCase.objects.get(step_id=step.pk)


def resolve_as_seen(case, user, resolution, note="checked"):
    """Resolve the case the way an operator who just loaded it does: naming the
    version and the newest observation on the page."""
    case.refresh_from_db()
    newest = newest_lookup(case)
    return case_resolve(
        case=case,
        user=user,
        resolution=resolution,
        seen_version=case.version,
        seen_lookup_id=newest.pk if newest else None,
        note=note,
    )


def post_decision(client, approval, decision="approve", note="", args_hash=None, **extra):
    """POST a decision on ``approval`` as the card's form does, with the hash it shows."""
    return client.post(
        f"/approvals/{approval.pk}/decide",
        {
            "decision": decision,
            "note": note,
            "args_hash": approval.args_hash if args_hash is None else args_hash,
        },
        **extra,
    )


async def refused_with(socket) -> tuple[int, str]:
    """Connect a live socket the server refuses: it accepts only to say why, then
    closes with its code (a browser retries a handshake refused outright). The code
    and the notice the page shows."""
    # Generous timeouts: they only bound a failure, and a loaded CI machine is slow.
    connected, _ = await socket.connect(timeout=20)
    assert connected, "refused outright: a browser would retry it as an outage"
    notice = await socket.receive_from(timeout=20)
    assert 'id="live-notice"' in notice, notice
    closed = await socket.receive_output(timeout=20)
    assert closed["type"] == "websocket.close", closed
    return closed["code"], notice


# --- a live page's socket, as the page's own browser opens it -------------------------


def browser_headers(client) -> list[tuple[bytes, bytes]]:
    """A websocket handshake from the page's browser: same origin, every cookie the
    client holds (the session and the CSRF cookie pushed forms are given)."""
    cookies = "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())
    return [(b"origin", b"http://127.0.0.1"), (b"cookie", cookies.encode())]


def socket_address(page: str) -> str:
    """The address a rendered page opens its live socket on (its ws-connect)."""
    return re.search(r'ws-connect="([^"]+)"', page).group(1).replace("&amp;", "&")


async def pushed_until(socket, needle: str, timeout: float = 8.0) -> str:
    """Messages until one holds ``needle`` (a change may be pushed in several)."""
    received = ""
    while needle not in received:
        received += await socket.receive_from(timeout=timeout)
    return received
