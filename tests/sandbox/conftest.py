from __future__ import annotations

import pytest
import stripe

from tests.sandbox_service import Sandbox


@pytest.fixture
def client(sandbox: Sandbox) -> stripe.StripeClient:
    return sandbox.client()
