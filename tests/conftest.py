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

    migration = importlib.import_module("accounts.migrations.0004_create_operator_groups")
    group.permissions.set(
        Permission.objects.filter(
            content_type__app_label="accounts", codename__in=migration.GROUPS[group.name]
        )
    )
