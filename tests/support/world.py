"""The refund agent against the sandbox, driven in-process: shared by the test packages."""

from __future__ import annotations

from agentruns.runtime import Registry
from support.agents import refund_support
from tests.agentruns.conftest import Harness


def point_at_sandbox(settings, sandbox) -> None:
    """Send the refund agent's tools to the sandbox: payments, shop and mail."""
    settings.PAYMENTS_API_BASE = sandbox.url
    settings.SHOP_API_BASE = sandbox.url
    # The test runner swaps in a memory backend; the agent must really send.
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = sandbox.smtp_port


def refund_harness(tenant) -> Harness:
    """A harness whose registry holds only the refund-support agent."""
    harness = Harness(tenant)
    harness.registry = Registry([refund_support])
    harness.engine = harness.build()
    return harness
