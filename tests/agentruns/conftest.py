from __future__ import annotations

import pytest

from tests.agentruns.runtime import agents
from tests.harness import Harness


@pytest.fixture(autouse=True)
def reset_provider():
    agents.PROVIDER.reset()
    yield
    agents.PROVIDER.reset()


@pytest.fixture
def harness(tenant) -> Harness:
    return Harness(tenant)


@pytest.fixture
def provider():
    return agents.PROVIDER
