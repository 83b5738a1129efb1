from __future__ import annotations

import pytest
import stripe

from tests.harness import Sandbox


@pytest.fixture
def client(sandbox: Sandbox) -> stripe.StripeClient:
    return sandbox.client()
