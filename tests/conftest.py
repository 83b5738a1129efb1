from __future__ import annotations

import pytest

from accounts.models import Tenant
from tests.sandbox_service import sandbox, sandbox_process  # noqa: F401  (fixtures)


@pytest.fixture
def tenant(db):
    # Transactional tests flush the database, data migrations included.
    return Tenant.objects.get_or_create(slug="default", defaults={"name": "Default"})[0]


@pytest.fixture
def other_tenant(db):
    return Tenant.objects.get_or_create(slug="other", defaults={"name": "Other"})[0]
